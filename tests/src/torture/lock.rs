//! One torture run at a time per user, and the removal of what a crashed run left behind.
//!
//! A user's runs share fixed names (the work dir; as root also the network namespaces and
//! the bridge), so they must not overlap: [`RunLock`] holds an exclusive `flock` on the user's
//! lock file for the whole run, and other runs (another test, another engineer's
//! `cargo test`) wait for it. Whoever holds the lock knows that anything under those names
//! belongs to a run that is gone, and removes it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rustix::fs::{FlockOperation, flock};
use rustix::process::{Pid, Signal, kill_process};
use tokio::time::{Instant, sleep};
use tracing::{info, warn};

use super::net;

/// How long a run waits for another to finish. A CI file of four runs takes about four
/// minutes, and a long manual run may hold it longer; past this something is stuck.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(20 * 60);

/// Pause between attempts to take the lock: runs last tens of seconds, so a second of
/// latency is nothing, and the retry costs nothing.
const LOCK_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The lock file's name in the temp dir, followed by the user id: users cannot remove each
/// other's leftovers, and only root's runs use the machine-wide names (namespaces), so runs
/// of different users need not wait for each other.
const LOCK_FILE_PREFIX: &str = "skerry-torture-";

/// The work dir's name in the temp dir (then the user id): member data dirs live here. Its
/// path also marks a run's member processes (they get it in `--data-dir`), which is how
/// leftovers are found.
const WORK_DIR_PREFIX: &str = "skerry-torture-work-";

/// The exclusive right to run, held until dropped; see the module doc.
pub struct RunLock {
    /// Holds the `flock`: the lock is released when the file is closed.
    _file: File,
    work_dir: PathBuf,
}

impl RunLock {
    /// Takes the lock (waiting for another run to finish), then removes any leftovers of an
    /// earlier run and creates an empty work dir.
    pub async fn acquire() -> Result<RunLock> {
        let temp = std::env::temp_dir();
        let uid = rustix::process::geteuid().as_raw();
        let path = temp.join(format!("{LOCK_FILE_PREFIX}{uid}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("open lock file {}", path.display()))?;
        let deadline = Instant::now() + LOCK_WAIT_MAX;
        let mut announced = false;
        loop {
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                    if !announced {
                        info!(lock = %path.display(), "another torture run is active; waiting");
                        announced = true;
                    }
                    if Instant::now() > deadline {
                        bail!(
                            "another torture run held {} for {LOCK_WAIT_MAX:?}",
                            path.display()
                        );
                    }
                    sleep(LOCK_RETRY_INTERVAL).await;
                }
                Err(e) => return Err(e).with_context(|| format!("lock {}", path.display())),
            }
        }
        let work_dir = temp.join(format!("{WORK_DIR_PREFIX}{uid}"));
        remove_leftovers(&work_dir);
        std::fs::create_dir_all(&work_dir)
            .with_context(|| format!("create work dir {}", work_dir.display()))?;
        Ok(RunLock {
            _file: file,
            work_dir,
        })
    }

    /// Where members keep their data dirs.
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.work_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!("failed to remove {}: {e}", self.work_dir.display());
        }
    }
}

/// Kills member processes of an earlier run, removes its namespaces, links and work dir.
/// Best effort: each failure is logged and the rest still runs.
fn remove_leftovers(work_dir: &Path) {
    let killed = kill_processes_mentioning(work_dir);
    if killed > 0 {
        warn!(
            killed,
            "killed member processes left by an earlier torture run"
        );
    }
    if rustix::process::geteuid().is_root() {
        net::remove_leftovers();
    }
    if work_dir.exists() {
        warn!(dir = %work_dir.display(), "removing an earlier torture run's work dir");
        if let Err(e) = std::fs::remove_dir_all(work_dir) {
            warn!("failed to remove {}: {e}", work_dir.display());
        }
    }
}

/// SIGKILLs every process (but this one) with an argument that mentions `marker`; returns
/// how many.
fn kill_processes_mentioning(marker: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let marker = marker.display().to_string();
    let me = std::process::id();
    let mut killed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let mentions = cmdline
            .split(|byte| *byte == 0)
            .any(|arg| String::from_utf8_lossy(arg).contains(&marker));
        if mentions && signal(pid, Signal::KILL).is_ok() {
            killed += 1;
        }
    }
    killed
}

/// Sends `sig` to process `pid`.
pub fn signal(pid: u32, sig: Signal) -> Result<()> {
    let raw = i32::try_from(pid).context("pid out of range")?;
    let pid = Pid::from_raw(raw).context("pid 0")?;
    kill_process(pid, sig).with_context(|| format!("signal process {raw}"))
}
