//! The slow-disk alarm end to end: a real `skerry server` whose disk is made slow for real,
//! and the `SlowDiskSync` Event on its Node read back with the real kubectl.
//!
//! The disk: once the server serves, the test moves the server process into a blkio cgroup
//! of its own (cgroup v1) throttled to [`WRITE_IOPS`] writes a second on the block device
//! under its data dir. `fdatasync` issues its writes from the calling thread, so the
//! throttle lands on the store's log syncs (hundreds of milliseconds each, as an SD card
//! that stalls), with no fault hook in the shipped binary. Reads are not throttled. The
//! guard moves the server back and removes the cgroup on drop, also on panic.
//!
//! Needs root and a cgroup v1 blkio hierarchy, and a data dir on a block device; under
//! `CI=true` their absence fails the test, otherwise it is skipped with a line.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::kube::{Kube, tail};
use common::node::missing;
use serde_json::Value;

/// The Node name the server is given (`--hostname-override`), which the Events must name.
const NODE: &str = "diskalarm-box";

/// Writes a second the throttled server may issue. A 4 KiB append plus its journal commit
/// then takes 130-530 ms to sync on this machine's virtio disk, past the alarm's 100 ms,
/// while the control plane's few writes a second still get through.
const WRITE_IOPS: u32 = 8;

/// Where cgroup v1 mounts the blkio hierarchy.
const BLKIO_MOUNT: &str = "/sys/fs/cgroup/blkio";

/// How long until the first Event: one alarm interval (10 s) and the Event's own write
/// through the slow disk, with slack for a loaded 2-core machine.
const FIRST_EVENT_TIMEOUT: Duration = Duration::from_secs(90);

/// How long until the correlator combines the Events: the tenth distinct message starts
/// the combined Event and the eleventh patches its count, eleven alarm intervals (110 s),
/// with slack for slow writes.
const COMBINED_TIMEOUT: Duration = Duration::from_secs(300);

/// client-go's `maxEvents` (`skerry_client::events::AGGREGATE_EVENTS_MAX`): distinct
/// messages of one (source, object, type, reason) before they are combined.
const AGGREGATE_EVENTS_MAX: usize = 10;

/// A blkio cgroup throttling one process's writes to one device; the process is moved back
/// to where the test runs and the cgroup removed on drop.
struct Throttle {
    dir: PathBuf,
    parent: PathBuf,
    pid: u32,
}

impl Throttle {
    /// Moves `pid` into a new blkio cgroup limited to `iops` writes a second on the block
    /// device holding `path`. `Err` says what this machine lacks.
    fn new(pid: u32, path: &Path, iops: u32) -> Result<Throttle, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let own = own
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "blkio")
                    .then(|| path.to_string())
            })
            .ok_or("no cgroup v1 blkio hierarchy")?;
        let parent = Path::new(BLKIO_MOUNT).join(own.trim_start_matches('/'));
        if !parent.join("blkio.throttle.write_iops_device").exists() {
            return Err(format!("no blkio throttle files in {}", parent.display()));
        }
        let device = whole_disk(path)?;
        let dir = parent.join(format!("skerry-diskalarm-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let throttle = Throttle { dir, parent, pid };
        std::fs::write(
            throttle.dir.join("blkio.throttle.write_iops_device"),
            format!("{device} {iops}"),
        )
        .map_err(|e| format!("throttle {device}: {e}"))?;
        std::fs::write(throttle.dir.join("cgroup.procs"), pid.to_string())
            .map_err(|e| format!("move the server into the cgroup: {e}"))?;
        Ok(throttle)
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = std::fs::write(self.parent.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `MAJOR:MINOR` of the disk holding `path` (a partition's parent disk: blkio throttles
/// whole disks).
fn whole_disk(path: &Path) -> Result<String, String> {
    let dev = std::fs::metadata(path).map_err(|e| e.to_string())?.dev();
    // glibc's `gnu_dev_major` and `gnu_dev_minor`.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    if major == 0 {
        return Err(format!("{} is on no block device", path.display()));
    }
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let sys = std::fs::canonicalize(&sys).map_err(|e| format!("{}: {e}", sys.display()))?;
    let disk = if sys.join("partition").exists() {
        sys.parent().map(Path::to_path_buf).unwrap_or(sys)
    } else {
        sys
    };
    let text = std::fs::read_to_string(disk.join("dev")).map_err(|e| e.to_string())?;
    Ok(text.trim().to_string())
}

/// The `SlowDiskSync` Events, as kubectl lists them with the field selector.
fn slow_disk_events(kube: &Kube) -> Vec<Value> {
    let out = kube.ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "reason=SlowDiskSync",
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&out).expect("event list JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// Polls until `done` holds of the Events; returns them.
fn wait_events(
    kube: &Kube,
    what: &str,
    within: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let events = slow_disk_events(kube);
        if done(&events) {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} in {within:?}: {}\nserver log tail:\n{}",
            serde_json::to_string_pretty(&events).unwrap_or_default(),
            tail(&kube.log())
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_slow_log_disk_is_a_warning_event_on_the_node_aggregated_as_upstream() {
    if missing(
        "the slow-disk test throttles the server's disk with a blkio cgroup: it needs root",
        rustix::process::geteuid().is_root(),
    ) {
        return;
    }
    let kube = Kube::start(&["--hostname-override", NODE]);
    let data = kube.dir.path().join("data");
    let throttle = match Throttle::new(kube._child.0.id(), &data, WRITE_IOPS) {
        Ok(t) => t,
        Err(why) => {
            missing(&format!("cannot slow the server's disk: {why}"), false);
            return;
        }
    };

    // The first alarm: a Warning on the Node, from the store, saying what was slow.
    let events = wait_events(&kube, "SlowDiskSync Event", FIRST_EVENT_TIMEOUT, |e| {
        !e.is_empty()
    });
    let e = &events[0];
    assert_eq!(e["type"], "Warning", "{e:#}");
    assert_eq!(e["reason"], "SlowDiskSync", "{e:#}");
    assert_eq!(e["metadata"]["namespace"], "default", "{e:#}");
    assert_eq!(e["involvedObject"]["kind"], "Node", "{e:#}");
    assert_eq!(e["involvedObject"]["name"], NODE, "{e:#}");
    assert_eq!(e["source"]["component"], "skerry-store", "{e:#}");
    assert_eq!(e["source"]["host"], NODE, "{e:#}");
    let message = e["message"].as_str().expect("a message");
    assert!(
        message.starts_with("the write-ahead log's fdatasync took ")
            && message.contains(" ms (alarm at 100 ms, ")
            && message.ends_with(" slow so far): every write to the cluster waits on this disk"),
        "{message}"
    );

    // A disk that stays slow: one Event per alarm, new figures each, until the correlator
    // combines them into one Event whose count grows; never more than its ten objects.
    let events = wait_events(
        &kube,
        "combined SlowDiskSync Event counted twice",
        COMBINED_TIMEOUT,
        |e| e.iter().any(|e| e["count"].as_i64().unwrap_or(0) >= 2),
    );
    assert!(
        events.len() <= AGGREGATE_EVENTS_MAX,
        "{} SlowDiskSync Events: {events:#?}",
        events.len()
    );
    let combined: Vec<&Value> = events
        .iter()
        .filter(|e| e["count"].as_i64().unwrap_or(0) >= 2)
        .collect();
    assert_eq!(combined.len(), 1, "{events:#?}");
    let c = combined[0];
    assert!(
        c["message"].as_str().is_some_and(|m| m
            .starts_with("(combined from similar events): the write-ahead log's fdatasync took ")),
        "{c:#}"
    );
    assert_eq!(c["involvedObject"]["name"], NODE, "{c:#}");
    assert_eq!(c["type"], "Warning", "{c:#}");
    let first = c["firstTimestamp"].as_str().expect("firstTimestamp");
    let last = c["lastTimestamp"].as_str().expect("lastTimestamp");
    assert!(
        last > first,
        "a combined event seen twice spans time: {c:#}"
    );

    // The counter behind it, on the member's /metrics.
    let port: u16 = kube
        .etcd
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("etcd port");
    let metrics = common::http_get(
        port,
        "/metrics",
        Duration::from_secs(10),
        Duration::from_secs(30),
    )
    .expect("/metrics");
    let slow: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("skerry_disk_wal_slow_fsyncs_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("skerry_disk_wal_slow_fsyncs_total");
    assert!(slow >= 11, "11 alarms need 11 slow syncs, counted {slow}");
    drop(throttle);
}
