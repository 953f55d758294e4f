//! Memory pressure without polling: the kernel wakes the eviction manager when memory crosses
//! its threshold (upstream `pkg/kubelet/eviction/memory_threshold_notifier.go`,
//! `threshold_notifier_linux.go`, and `eviction_manager.go` for the intervals).
//!
//! The trick, on cgroup v1: a memcg threshold. An eventfd, the open `memory.usage_in_bytes`
//! and a byte count written as one line `"<eventfd> <usage fd> <bytes>"` to the cgroup's
//! `cgroup.event_control`; the kernel signals the eventfd each time usage crosses that count
//! (either way), and the loop sleeps on it through epoll (tokio's [`AsyncFd`]). Eviction
//! thresholds speak of `memory.available` = capacity − working set, and the working set is
//! usage minus the reclaimable page cache (`total_inactive_file`), while the kernel only
//! watches usage: so the threshold registered is the working-set threshold converted to a
//! usage threshold by adding back the inactive file pages of the moment,
//! `capacity − eviction threshold + inactive_file` ([`memcg_threshold`]). The page cache
//! moves, so the threshold is recomputed and registered again after every notification and
//! on every housekeeping pass ([`HOUSEKEEPING_INTERVAL`], upstream's refresh), the only
//! periodic wake-up. As upstream, two cgroups are watched: the root memcg for
//! `memory.available` and the pods' cgroup (`--cgroup-root`'s `kubepods`, capped at
//! allocatable) for `allocatableMemory.available`.
//!
//! cgroup v2 has no `cgroup.event_control` (upstream's kubelet then has no notifier at all).
//! skerry writes a PSI trigger (`some <stall µs> <window µs>`, [`PSI_STALL`] in
//! [`PSI_WINDOW`]) into the cgroup's `memory.pressure` and waits for `POLLPRI`. Chosen over an
//! inotify watch of `memory.events` because the root cgroup, the one `memory.available` is
//! about, has no `memory.events` (it counts `high` / `max` / `oom` events of a limit, and the
//! root has none), while every v2 cgroup, the root included, has `memory.pressure`; and
//! because a stall is the kernel saying reclaim is hurting, not merely that a number moved.
//! A PSI trigger does not know the threshold: it wakes the loop, and the eviction manager's
//! synchronize reads the stats and decides.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use crate::cgroups::{CgroupManager, Layout};

/// How often thresholds are recomputed and registered again without a notification, and
/// the loop's only timer: upstream's `notifierRefreshInterval` (10 s in `eviction_manager.go`),
/// equal to the kubelet's `evictionMonitoringPeriod`. Shorter makes the usage threshold track
/// the page cache more closely at the cost of more wake-ups of an idle kubelet; longer lets a
/// stale `inactive_file` shift the real crossing point for longer.
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);
/// The file a v1 memcg threshold watches (`memoryUsageAttribute`).
pub const MEMORY_USAGE_ATTRIBUTE: &str = "memory.usage_in_bytes";
/// Where a v1 memcg event is registered.
pub const EVENT_CONTROL: &str = "cgroup.event_control";
/// The v2 file a PSI trigger is written to.
pub const MEMORY_PRESSURE: &str = "memory.pressure";
/// A PSI trigger fires when tasks of the cgroup stalled on memory this long within
/// [`PSI_WINDOW`]: 150 ms in 1 s (15 %), the kernel's own example (`Documentation/accounting/
/// psi.rst`). Lower wakes the loop on brief reclaim bursts that pass by themselves; higher
/// lets a box thrash longer before the kubelet looks.
pub const PSI_STALL: Duration = Duration::from_millis(150);
/// The PSI window (see [`PSI_STALL`]); the kernel allows 500 ms to 10 s.
pub const PSI_WINDOW: Duration = Duration::from_secs(1);
/// Without `CAP_SYS_RESOURCE` the kernel (6.5 and later) accepts only windows that are a
/// multiple of 2 s (`psi_trigger_create`: unprivileged triggers are rate-limited), else
/// `EINVAL`; [`PsiTrigger::unprivileged`] rounds up to it, keeping the stall ratio.
pub const PSI_UNPRIVILEGED_WINDOW: Duration = Duration::from_secs(2);

/// An eviction threshold's value (upstream `ThresholdValue`): a quantity of bytes or a
/// fraction of capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    /// Bytes.
    Quantity(u64),
    /// A fraction (0.1 for `10%`).
    Percentage(f64),
}

impl ThresholdValue {
    /// The value in bytes against `capacity` (`GetThresholdQuantity`: a percentage of the
    /// capacity, truncated).
    pub fn bytes(&self, capacity: u64) -> u64 {
        match *self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::Percentage(p) => (capacity as f64 * p) as u64,
        }
    }
}

/// The usage at which the working set leaves less than `eviction_threshold` of `capacity`
/// available (`UpdateThreshold`: capacity − threshold + inactive file). Saturating: a
/// threshold above capacity gives `inactive_file`, the lowest usage there can be pressure at.
pub fn memcg_threshold(capacity: u64, eviction_threshold: u64, inactive_file: u64) -> u64 {
    capacity
        .saturating_sub(eviction_threshold)
        .saturating_add(inactive_file)
}

/// One threshold to watch (upstream: one `memoryThresholdNotifier` per `memory.available` or
/// `allocatableMemory.available` threshold).
#[derive(Clone, Debug, PartialEq)]
pub struct Watch {
    /// The cgroup by name: `""` for the root (the node), the pods' cgroup (`/kubepods` under
    /// the cgroup root) for allocatable.
    pub cgroup: String,
    /// `allocatableMemory.available` rather than `memory.available`.
    pub allocatable: bool,
    /// A hard threshold (`--eviction-hard`) rather than a soft one.
    pub hard: bool,
    /// The threshold.
    pub threshold: ThresholdValue,
}

impl Watch {
    /// Upstream's `Description()`: `hard allocatable memory eviction threshold`.
    pub fn description(&self) -> String {
        format!(
            "{}{}memory eviction threshold",
            if self.hard { "hard " } else { "soft " },
            if self.allocatable { "allocatable " } else { "" }
        )
    }
}

/// A PSI trigger line (`some <stall µs> <window µs>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PsiTrigger {
    /// Stall time within the window.
    pub stall: Duration,
    /// The window.
    pub window: Duration,
}

impl Default for PsiTrigger {
    fn default() -> Self {
        PsiTrigger {
            stall: PSI_STALL,
            window: PSI_WINDOW,
        }
    }
}

impl PsiTrigger {
    /// What is written to `memory.pressure`.
    pub fn line(&self) -> String {
        format!(
            "some {} {}",
            self.stall.as_micros(),
            self.window.as_micros()
        )
    }

    /// The trigger a process without `CAP_SYS_RESOURCE` may write: the window rounded up to
    /// a multiple of [`PSI_UNPRIVILEGED_WINDOW`], the stall scaled by the same factor.
    pub fn unprivileged(self) -> PsiTrigger {
        let unit = PSI_UNPRIVILEGED_WINDOW.as_micros();
        let window = self.window.as_micros();
        let rounded = window.div_ceil(unit).max(1) * unit;
        if rounded == window {
            return self;
        }
        let stall = self.stall.as_micros() * rounded / window.max(1);
        PsiTrigger {
            stall: Duration::from_micros(u64::try_from(stall).unwrap_or(u64::MAX)),
            window: Duration::from_micros(u64::try_from(rounded).unwrap_or(u64::MAX)),
        }
    }
}

/// One line of a PSI file (`some avg10=0.00 avg60=0.13 avg300=0.08 total=432185`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PressureLine {
    /// Percent of the last 10 s stalled.
    pub avg10: f64,
    /// Percent of the last 60 s.
    pub avg60: f64,
    /// Percent of the last 300 s.
    pub avg300: f64,
    /// Total stall time, µs.
    pub total: u64,
}

/// A `memory.pressure` file: `some` (at least one task stalled) and `full` (all of them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pressure {
    /// `some`.
    pub some: PressureLine,
    /// `full` (absent on old kernels' CPU files; present for memory).
    pub full: Option<PressureLine>,
}

/// Parses a PSI file; `None` when the `some` line is missing or malformed.
pub fn parse_pressure(text: &str) -> Option<Pressure> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let kind = fields.next()?;
        let mut p = PressureLine::default();
        let mut seen = 0;
        for f in fields {
            let (k, v) = f.split_once('=')?;
            match k {
                "avg10" => p.avg10 = v.parse().ok()?,
                "avg60" => p.avg60 = v.parse().ok()?,
                "avg300" => p.avg300 = v.parse().ok()?,
                "total" => p.total = v.parse().ok()?,
                _ => continue,
            }
            seen += 1;
        }
        if seen != 4 {
            return None;
        }
        match kind {
            "some" => some = Some(p),
            "full" => full = Some(p),
            _ => {}
        }
    }
    Some(Pressure { some: some?, full })
}

/// A failure to register with the kernel, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum NotifierError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("eviction manager: no memory cgroup {0} to watch")]
    NoCgroup(String),
    #[error("eviction manager: cannot read the memory stats of cgroup {0:?}")]
    NoStats(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NotifierError + '_ {
    move |source| NotifierError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One registration with the kernel; dropping it unregisters (closing the eventfd removes a
/// memcg event, closing the file a PSI trigger).
#[derive(Debug)]
pub enum KernelEvent {
    /// A v1 memcg threshold on an eventfd.
    Threshold {
        /// The eventfd, in epoll through tokio.
        eventfd: AsyncFd<OwnedFd>,
        /// The usage it fires at, bytes.
        bytes: u64,
    },
    /// A v2 PSI trigger on an open `memory.pressure`.
    Psi {
        /// The file, in epoll for `POLLPRI`.
        file: AsyncFd<File>,
        /// The trigger written.
        trigger: PsiTrigger,
    },
}

impl KernelEvent {
    /// Registers a memcg threshold at `bytes` of usage on the v1 memory cgroup directory
    /// `dir` (`linuxCgroupNotifier`: eventfd, the usage file, one line to `event_control`).
    /// Needs a tokio runtime.
    pub fn memcg_threshold(dir: &Path, bytes: u64) -> Result<KernelEvent, NotifierError> {
        let control = dir.join(EVENT_CONTROL);
        let usage_path = dir.join(MEMORY_USAGE_ATTRIBUTE);
        let eventfd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| io(&control)(e.into()))?;
        // The kernel takes its own reference to the usage file; ours is closed after the write.
        let usage = File::open(&usage_path).map_err(io(&usage_path))?;
        let line = format!("{} {} {}", eventfd.as_raw_fd(), usage.as_raw_fd(), bytes);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&control)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(io(&control))?;
        drop(usage);
        let eventfd = register(eventfd, Interest::READABLE).map_err(io(&control))?;
        Ok(KernelEvent::Threshold { eventfd, bytes })
    }

    /// Writes `trigger` into `dir`'s `memory.pressure` (v2) and keeps the file open; a
    /// process without `CAP_SYS_RESOURCE` writes [`PsiTrigger::unprivileged`] instead.
    /// Needs a tokio runtime.
    pub fn psi(dir: &Path, trigger: PsiTrigger) -> Result<KernelEvent, NotifierError> {
        let path = dir.join(MEMORY_PRESSURE);
        let trigger = if crate::containerd::config::has_cap_sys_resource() {
            trigger
        } else {
            trigger.unprivileged()
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        // One write, with the terminating NUL the kernel's example writes.
        let mut line = trigger.line().into_bytes();
        line.push(0);
        file.write_all(&line).map_err(io(&path))?;
        let file = register(file, Interest::PRIORITY).map_err(io(&path))?;
        Ok(KernelEvent::Psi { file, trigger })
    }

    /// The usage a threshold fires at (`None` for a PSI trigger).
    pub fn threshold_bytes(&self) -> Option<u64> {
        match self {
            KernelEvent::Threshold { bytes, .. } => Some(*bytes),
            KernelEvent::Psi { .. } => None,
        }
    }

    /// Sleeps until the kernel signals: the eventfd's counter (notifications since the last
    /// read), or 1 for a PSI event.
    pub async fn wait(&self) -> std::io::Result<u64> {
        match self {
            KernelEvent::Threshold { eventfd, .. } => loop {
                let mut guard = eventfd.readable().await?;
                let mut buf = [0u8; 8];
                match guard.try_io(|fd| {
                    rustix::io::read(fd.get_ref(), &mut buf).map_err(std::io::Error::from)
                }) {
                    Ok(Ok(8)) => return Ok(u64::from_ne_bytes(buf)),
                    Ok(Ok(n)) => {
                        return Err(std::io::Error::other(format!(
                            "eventfd: a read of {n} bytes"
                        )));
                    }
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => continue,
                }
            },
            KernelEvent::Psi { file, .. } => {
                let mut guard = file.ready(Interest::PRIORITY).await?;
                guard.clear_ready();
                Ok(1)
            }
        }
    }
}

/// Puts an fd the [`AsyncFd`] will own into tokio's epoll. tokio 1.54 deprecates the safe
/// constructor because a caller could close a borrowed fd while it is registered; here the
/// `AsyncFd` owns the `OwnedFd` or `File`, which closes only when the registration is dropped,
/// so that cannot happen, and the unsafe `register` (which the workspace forbids) would add
/// nothing.
#[allow(deprecated)]
fn register<T: std::os::fd::AsRawFd>(inner: T, interest: Interest) -> std::io::Result<AsyncFd<T>> {
    AsyncFd::with_interest(inner, interest)
}

/// The loop's wake-ups, for the eviction manager's metrics and the tests.
#[derive(Debug, Default)]
pub struct Wakeups {
    kernel: AtomicU64,
    housekeeping: AtomicU64,
    armed: AtomicU64,
}

impl Wakeups {
    /// Wake-ups by the kernel (a threshold crossed, a PSI event).
    pub fn kernel(&self) -> u64 {
        self.kernel.load(Ordering::Relaxed)
    }

    /// Wake-ups by the housekeeping timer.
    pub fn housekeeping(&self) -> u64 {
        self.housekeeping.load(Ordering::Relaxed)
    }

    /// Registrations with the kernel made (first ones and re-arms).
    pub fn armed(&self) -> u64 {
        self.armed.load(Ordering::Relaxed)
    }
}

/// Why the loop woke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The housekeeping timer: thresholds were refreshed.
    Housekeeping,
    /// The kernel: watch `watch` (index into the watches given) crossed its threshold or saw
    /// pressure; `message` is upstream's log line.
    Crossed { watch: usize, message: String },
}

/// The memory pressure notifier: its watches armed in the kernel, the housekeeping timer, and
/// the wake-up counters. [`MemoryThresholdNotifier::next`] is the eviction manager's sleep.
#[derive(Debug)]
pub struct MemoryThresholdNotifier {
    cgroups: CgroupManager,
    machine_capacity: u64,
    watches: Vec<(Watch, Option<KernelEvent>)>,
    interval: Duration,
    psi: PsiTrigger,
    next_housekeeping: Instant,
    wakeups: Arc<Wakeups>,
}

impl MemoryThresholdNotifier {
    /// A notifier over `watches` on the host's cgroups; `machine_capacity` is the node's
    /// memory (the capacity of a watched cgroup without a limit, the root's). Nothing is
    /// registered until [`arm`](Self::arm).
    pub fn new(
        cgroups: CgroupManager,
        machine_capacity: u64,
        watches: Vec<Watch>,
        interval: Duration,
    ) -> MemoryThresholdNotifier {
        MemoryThresholdNotifier {
            cgroups,
            machine_capacity,
            watches: watches.into_iter().map(|w| (w, None)).collect(),
            interval,
            psi: PsiTrigger::default(),
            next_housekeeping: Instant::now() + interval,
            wakeups: Arc::new(Wakeups::default()),
        }
    }

    /// Another PSI trigger for the v2 watches (tests lower the stall to see one fire).
    pub fn with_psi_trigger(mut self, trigger: PsiTrigger) -> Self {
        self.psi = trigger;
        self
    }

    /// The counters, shared.
    pub fn wakeups(&self) -> Arc<Wakeups> {
        self.wakeups.clone()
    }

    /// Each watch's registered usage threshold (v1), `None` where none is armed or on v2.
    pub fn thresholds(&self) -> Vec<Option<u64>> {
        self.watches
            .iter()
            .map(|(_, e)| e.as_ref().and_then(KernelEvent::threshold_bytes))
            .collect()
    }

    /// Registers every watch with the kernel, replacing what was there. A watch that fails
    /// is left unarmed (the housekeeping pass tries again) and its error returned.
    pub fn arm(&mut self) -> Vec<NotifierError> {
        let mut errors = Vec::new();
        for i in 0..self.watches.len() {
            if let Err(e) = self.arm_one(i) {
                errors.push(e);
            }
        }
        errors
    }

    /// Registers watch `i` again (`UpdateThreshold`): v1 computes the usage threshold from the
    /// cgroup's stats now; v2 writes the PSI trigger once and keeps it.
    fn arm_one(&mut self, i: usize) -> Result<(), NotifierError> {
        let Some((watch, current)) = self.watches.get(i) else {
            return Ok(());
        };
        let (watch, armed) = (watch.clone(), current.is_some());
        let event = match self.cgroups.layout() {
            Layout::V1(_) => {
                let dir = self
                    .cgroups
                    .path("memory", &watch.cgroup)
                    .filter(|d| d.is_dir())
                    .ok_or_else(|| NotifierError::NoCgroup(watch.cgroup.clone()))?;
                let memory = crate::stats::cgroup::sample(&self.cgroups, &watch.cgroup)
                    .1
                    .ok_or_else(|| NotifierError::NoStats(watch.cgroup.clone()))?;
                let capacity = memory.limit.unwrap_or(self.machine_capacity);
                let inactive_file = memory.usage.saturating_sub(memory.working_set);
                let bytes =
                    memcg_threshold(capacity, watch.threshold.bytes(capacity), inactive_file);
                // The old registration goes first (closing its eventfd unregisters it).
                self.watches[i].1 = None;
                KernelEvent::memcg_threshold(&dir, bytes)?
            }
            Layout::V2(_) => {
                if armed {
                    return Ok(());
                }
                let dir = self
                    .cgroups
                    .path("memory", &watch.cgroup)
                    .filter(|d| d.is_dir())
                    .ok_or_else(|| NotifierError::NoCgroup(watch.cgroup.clone()))?;
                KernelEvent::psi(&dir, self.psi)?
            }
        };
        self.watches[i].1 = Some(event);
        self.wakeups.armed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sleeps until the kernel signals a watch or the housekeeping timer expires, re-arms
    /// what that calls for (the watch that fired; every watch on housekeeping), counts the
    /// wake-up and says why. No other timer runs: an idle node wakes once per interval.
    pub async fn next(&mut self) -> Wake {
        let fired = {
            let armed: Vec<_> = self
                .watches
                .iter()
                .enumerate()
                .filter_map(|(i, (_, e))| e.as_ref().map(|e| e.wait().map(move |r| (i, r))))
                .map(Box::pin)
                .collect();
            let kernel = async move {
                if armed.is_empty() {
                    futures::future::pending::<(usize, std::io::Result<u64>)>().await
                } else {
                    futures::future::select_all(armed).await.0
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(self.next_housekeeping) => None,
                fired = kernel => Some(fired),
            }
        };
        match fired {
            None => {
                self.next_housekeeping = Instant::now() + self.interval;
                self.wakeups.housekeeping.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(reason = "housekeeping", "memory threshold notifier: woke");
                for e in self.arm() {
                    tracing::warn!(
                        "eviction manager: failed to update the memory threshold notifier: {e}"
                    );
                }
                Wake::Housekeeping
            }
            Some((i, result)) => {
                self.wakeups.kernel.fetch_add(1, Ordering::Relaxed);
                let description = self
                    .watches
                    .get(i)
                    .map(|(w, _)| w.description())
                    .unwrap_or_default();
                if let Err(e) = &result {
                    // A broken registration: dropped, so it cannot spin; housekeeping re-arms.
                    tracing::warn!("eviction manager: {description}: {e}");
                    if let Some(w) = self.watches.get_mut(i) {
                        w.1 = None;
                    }
                }
                if result.is_ok()
                    && let Err(e) = self.arm_one(i)
                {
                    tracing::warn!(
                        "eviction manager: failed to update the memory threshold notifier: {e}"
                    );
                }
                let message = format!("eviction manager: {description} crossed");
                tracing::info!("{message}");
                Wake::Crossed { watch: i, message }
            }
        }
    }

    /// Arms, then calls `handler` on every wake-up, forever (abort the task to stop).
    pub async fn run(mut self, mut handler: impl FnMut(&Wake) + Send) {
        for e in self.arm() {
            tracing::warn!("eviction manager: failed to create the memory threshold notifier: {e}");
        }
        loop {
            let wake = self.next().await;
            handler(&wake);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_threshold_adds_back_inactive_file() {
        // 1 GiB capacity, evict below 100 MiB available, 200 MiB of inactive page cache:
        // the working set may reach 924 MiB, so usage may reach 1124 MiB.
        assert_eq!(
            memcg_threshold(1 << 30, 100 << 20, 200 << 20),
            (1024 - 100 + 200) << 20
        );
        assert_eq!(memcg_threshold(1 << 20, 2 << 20, 7), 7, "saturates");
        assert_eq!(ThresholdValue::Percentage(0.1).bytes(1000), 100);
        assert_eq!(ThresholdValue::Quantity(5).bytes(1000), 5);
    }

    #[test]
    fn descriptions_as_upstream() {
        let w = Watch {
            cgroup: String::new(),
            allocatable: false,
            hard: true,
            threshold: ThresholdValue::Quantity(1),
        };
        assert_eq!(w.description(), "hard memory eviction threshold");
        let w = Watch {
            allocatable: true,
            hard: false,
            ..w
        };
        assert_eq!(
            w.description(),
            "soft allocatable memory eviction threshold"
        );
    }

    #[test]
    fn psi_trigger_lines() {
        let t = PsiTrigger::default();
        assert_eq!(t.line(), "some 150000 1000000");
        let u = t.unprivileged();
        assert_eq!(u.line(), "some 300000 2000000", "2 s windows, same ratio");
        let already = PsiTrigger {
            stall: Duration::from_millis(10),
            window: Duration::from_secs(4),
        };
        assert_eq!(already.unprivileged(), already);
    }

    #[test]
    fn pressure_files_parse() {
        let p = parse_pressure(
            "some avg10=1.50 avg60=0.13 avg300=0.08 total=432185\n\
             full avg10=0.00 avg60=0.03 avg300=0.01 total=146695\n",
        )
        .expect("parses");
        assert_eq!(p.some.total, 432_185);
        assert!((p.some.avg10 - 1.5).abs() < 1e-9);
        assert_eq!(p.full.map(|f| f.total), Some(146_695));
        assert_eq!(
            parse_pressure("full avg10=0 avg60=0 avg300=0 total=1"),
            None
        );
        assert_eq!(
            parse_pressure("some avg10=x avg60=0 avg300=0 total=1"),
            None
        );
        assert_eq!(parse_pressure("some avg10=0 total=1"), None);
    }
}
