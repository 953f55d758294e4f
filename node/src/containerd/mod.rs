//! containerd supervised by skerry: the node's container runtime when no
//! `--container-runtime-endpoint` is given (then this module is not used at all and any CRI
//! runtime serves).
//!
//! [`Containerd::start`] checks that `containerd`, its runc shim and `runc` are installed,
//! writes the config ([`config::config_toml`]) under the data dir, stops a containerd left
//! behind by a skerry that died (its pid file), starts `containerd` with its output appended
//! to a log file, and returns once CRI answers `Version`. A supervisor task then restarts it
//! with a doubling backoff whenever it exits, until [`Containerd::stop`] sends SIGTERM, waits
//! [`STOP_GRACE`] and sends SIGKILL. Containers survive a containerd restart or stop: their
//! shims are separate processes, as with containerd's own systemd unit (`KillMode=process`).

pub mod api;
pub mod config;

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::cri::Cri;
pub use config::Layout;

/// How long a starting containerd gets to answer CRI `Version`. It usually answers in well
/// under a second; a loaded edge box replaying a large metadata database after a crash needs
/// more. Past it, start fails with the tail of containerd's log.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a starting containerd is asked for its version.
const READY_POLL: Duration = Duration::from_millis(50);

/// The SIGTERM-to-SIGKILL grace of a stop. containerd shuts down in milliseconds (it leaves
/// the shims running); systemd's default `TimeoutStopSec` is 90 s, too long for a node agent
/// that stops with its server.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The first restart delay after containerd dies, doubled per consecutive death up to
/// [`RESTART_BACKOFF_MAX`] and reset once a containerd has run for [`RESTART_BACKOFF_RESET`].
/// Short, because while containerd is down no pod can be started or probed; the doubling
/// keeps a containerd that cannot start (a full disk) from spinning.
pub const RESTART_BACKOFF_INITIAL: Duration = Duration::from_millis(500);

/// The largest restart delay (systemd would give up after 5 restarts in 10 s; skerry keeps
/// trying, slowly, because a node without a runtime is useless anyway).
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How long a containerd must run before its death counts as the first again. The kubelet
/// forgets a container's CrashLoopBackOff after 10 minutes of running; a daemon that starts in
/// a second and serves every pod needs a shorter memory, or one crash an hour would keep it
/// at the 30 s ceiling.
pub const RESTART_BACKOFF_RESET: Duration = Duration::from_secs(60);

/// How much of containerd's log a start failure quotes.
const LOG_TAIL_BYTES: u64 = 2048;

/// The binaries a supervised containerd needs, with the Debian package that installs each.
pub const REQUIRED_BINARIES: &[(&str, &str)] = &[
    ("containerd", "containerd"),
    ("containerd-shim-runc-v2", "containerd"),
    ("runc", "runc"),
];

/// How to start containerd.
#[derive(Clone, Debug)]
pub struct ContainerdConfig {
    /// skerry's data dir; containerd's files go under `<data_dir>/agent` ([`Layout`]).
    pub data_dir: PathBuf,
    /// The CRI plugin's `sandbox_image` (the kubelet's `--pod-infra-container-image`).
    pub sandbox_image: String,
    /// The `containerd` binary, found on `PATH` when `None`.
    pub binary: Option<PathBuf>,
}

/// Why containerd could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error(
        "{binary} is not installed (not found on PATH): install the Debian package(s) {packages}"
    )]
    NotInstalled { binary: String, packages: String },
    #[error("{0}")]
    Endpoint(#[from] crate::cri::EndpointError),
    #[error("containerd's files under {path}: {source}")]
    Files {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("containerd exited ({status}) before answering CRI; the end of {log}:\n{tail}")]
    Exited {
        status: std::process::ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error(
        "containerd did not answer CRI Version within {timeout:?} ({last}); the end of {log}:\n{tail}"
    )]
    NotReady {
        timeout: Duration,
        last: String,
        log: PathBuf,
        tail: String,
    },
}

/// A running, supervised containerd.
#[derive(Debug)]
pub struct Containerd {
    layout: Layout,
    cri: Cri,
    stop: watch::Sender<bool>,
    supervisor: tokio::task::JoinHandle<()>,
    pid: Arc<AtomicU32>,
    restarts: Arc<AtomicU64>,
}

impl Containerd {
    /// Starts containerd and returns once CRI answers.
    pub async fn start(config: ContainerdConfig) -> Result<Self, ContainerdError> {
        let binary = match &config.binary {
            Some(binary) => binary.clone(),
            None => find_on_path("containerd").ok_or_else(|| not_installed("containerd"))?,
        };
        for (name, _) in REQUIRED_BINARIES
            .iter()
            .filter(|(name, _)| *name != "containerd")
        {
            if find_on_path(name).is_none() {
                return Err(not_installed(name));
            }
        }
        let layout = Layout::new(&config.data_dir);
        let cri = Cri::new(&layout.endpoint())?;
        prepare_files(&layout, &config.sandbox_image)?;
        stop_leftover(&layout).await;

        let (child, _) = spawn_ready(&binary, &layout, &cri).await?;
        let pid = Arc::new(AtomicU32::new(child.id().unwrap_or(0)));
        let restarts = Arc::new(AtomicU64::new(0));
        let (stop, stop_rx) = watch::channel(false);
        let supervisor = tokio::spawn(supervise(
            child,
            binary,
            layout.clone(),
            cri.clone(),
            stop_rx,
            pid.clone(),
            restarts.clone(),
        ));
        Ok(Self {
            layout,
            cri,
            stop,
            supervisor,
            pid,
            restarts,
        })
    }

    /// A CRI handle on this containerd.
    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    /// Its files.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Its CRI endpoint (`unix:///.../containerd.sock`).
    pub fn endpoint(&self) -> String {
        self.layout.endpoint()
    }

    /// The pid of the current containerd process (0 while it is being restarted).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// How many times the supervisor has restarted containerd.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::SeqCst)
    }

    /// Stops containerd (SIGTERM, [`STOP_GRACE`], SIGKILL) and its supervisor.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(err) = self.supervisor.await {
            warn!(%err, "containerd supervisor panicked");
        }
    }
}

fn not_installed(binary: &str) -> ContainerdError {
    let packages: Vec<&str> =
        REQUIRED_BINARIES
            .iter()
            .map(|(_, package)| *package)
            .fold(Vec::new(), |mut acc, p| {
                if !acc.contains(&p) {
                    acc.push(p);
                }
                acc
            });
    ContainerdError::NotInstalled {
        binary: binary.to_string(),
        packages: packages.join(" "),
    }
}

/// The first executable file named `name` in `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn prepare_files(layout: &Layout, sandbox_image: &str) -> Result<(), ContainerdError> {
    let files = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ContainerdError::Files { path, source }
    };
    for dir in [
        &layout.root,
        &layout.state,
        &layout.cni_conf_dir,
        &layout.registry_config_dir,
        &layout.images_dir,
    ] {
        std::fs::create_dir_all(dir).map_err(files(dir))?;
    }
    for parent in [layout.config.parent(), layout.socket.parent()]
        .into_iter()
        .flatten()
    {
        std::fs::create_dir_all(parent).map_err(files(parent))?;
    }
    let toml = config::config_toml(
        layout,
        sandbox_image,
        &config::cni_bin_dir(),
        !config::has_cap_sys_resource(),
    );
    std::fs::write(&layout.config, toml).map_err(files(&layout.config))?;
    Ok(())
}

/// Stops a containerd that a previous skerry started on this data dir and left running (it
/// died without stopping it): two containerds on one root would fight over its database.
async fn stop_leftover(layout: &Layout) {
    let Ok(text) = std::fs::read_to_string(&layout.pid_file) else {
        return;
    };
    let Ok(pid) = text.trim().parse::<u32>() else {
        return;
    };
    // Only if that pid is still a containerd running our config: pids are reused.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let config = layout.config.display().to_string();
    let ours = cmdline
        .split(|b| *b == 0)
        .any(|arg| arg == config.as_bytes());
    if ours {
        warn!(pid, "stopping a containerd left running on this data dir");
        terminate(pid, STOP_GRACE).await;
    }
    let _ = std::fs::remove_file(&layout.pid_file);
}

/// SIGTERM, up to `grace` for the process to go, then SIGKILL. For a process that is not our
/// child (a leftover): it is polled through /proc.
async fn terminate(pid: u32, grace: Duration) {
    let Some(pid) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !Path::new(&format!("/proc/{}", pid.as_raw_nonzero())).exists() {
            return;
        }
        tokio::time::sleep(READY_POLL).await;
    }
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
}

/// Starts containerd and waits until CRI answers `Version`.
async fn spawn_ready(
    binary: &Path,
    layout: &Layout,
    cri: &Cri,
) -> Result<(Child, Duration), ContainerdError> {
    let started = Instant::now();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&layout.log)
        .map_err(|source| ContainerdError::Files {
            path: layout.log.clone(),
            source,
        })?;
    let log_err = log.try_clone().map_err(|source| ContainerdError::Files {
        path: layout.log.clone(),
        source,
    })?;
    let mut child = Command::new(binary)
        .arg("--config")
        .arg(&layout.config)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log_err)
        // Its own process group: a Ctrl-C at skerry's terminal reaches skerry, which stops
        // containerd in order, not containerd directly.
        .process_group(0)
        .spawn()
        .map_err(|source| ContainerdError::Spawn {
            binary: binary.to_path_buf(),
            source,
        })?;
    if let Some(pid) = child.id() {
        let _ = std::fs::write(&layout.pid_file, format!("{pid}\n"));
    }
    let mut last = String::from("no answer yet");
    while started.elapsed() < STARTUP_TIMEOUT {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(ContainerdError::Exited {
                status,
                log: layout.log.clone(),
                tail: log_tail(&layout.log),
            });
        }
        match tokio::time::timeout(Duration::from_secs(5), cri.version()).await {
            Ok(Ok(version)) => {
                let took = started.elapsed();
                info!(
                    pid = child.id(),
                    version = %version.runtime_version,
                    ?took,
                    "containerd answers CRI"
                );
                return Ok((child, took));
            }
            Ok(Err(err)) => last = err.to_string(),
            Err(_) => last = "CRI Version timed out".to_string(),
        }
        tokio::time::sleep(READY_POLL).await;
    }
    let pid = child.id();
    if let Some(pid) = pid {
        terminate(pid, STOP_GRACE).await;
    }
    let _ = child.wait().await;
    Err(ContainerdError::NotReady {
        timeout: STARTUP_TIMEOUT,
        last,
        log: layout.log.clone(),
        tail: log_tail(&layout.log),
    })
}

/// Restarts containerd whenever it exits, until told to stop; then stops it.
async fn supervise(
    mut child: Child,
    binary: PathBuf,
    layout: Layout,
    cri: Cri,
    mut stop: watch::Receiver<bool>,
    pid: Arc<AtomicU32>,
    restarts: Arc<AtomicU64>,
) {
    let mut backoff = RESTART_BACKOFF_INITIAL;
    let mut running_since = Instant::now();
    loop {
        tokio::select! {
            status = child.wait() => {
                pid.store(0, Ordering::SeqCst);
                warn!(?status, log = %layout.log.display(), "containerd exited; restarting it");
                if running_since.elapsed() >= RESTART_BACKOFF_RESET {
                    backoff = RESTART_BACKOFF_INITIAL;
                }
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => return,
                    }
                    backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
                    let started = tokio::select! {
                        started = spawn_ready(&binary, &layout, &cri) => started,
                        _ = stop.changed() => return,
                    };
                    match started {
                        Ok((new_child, took)) => {
                            child = new_child;
                            pid.store(child.id().unwrap_or(0), Ordering::SeqCst);
                            restarts.fetch_add(1, Ordering::SeqCst);
                            running_since = Instant::now();
                            info!(?took, "containerd restarted");
                            break;
                        }
                        Err(err) => warn!(%err, ?backoff, "containerd did not restart; retrying"),
                    }
                }
            }
            _ = stop.changed() => {
                if let Some(id) = child.id() {
                    let _ = rustix::process::Pid::from_raw(id as i32).map(|p| {
                        rustix::process::kill_process(p, rustix::process::Signal::TERM)
                    });
                    if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                        warn!(grace = ?STOP_GRACE, "containerd ignored SIGTERM; killing it");
                        let _ = child.kill().await;
                    }
                }
                let _ = std::fs::remove_file(&layout.pid_file);
                pid.store(0, Ordering::SeqCst);
                info!("containerd stopped");
                return;
            }
        }
    }
}

/// The last [`LOG_TAIL_BYTES`] of containerd's log.
fn log_tail(path: &Path) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_debian_packages() {
        let err = not_installed("runc");
        assert_eq!(
            err.to_string(),
            "runc is not installed (not found on PATH): install the Debian package(s) containerd \
             runc"
        );
    }

    #[tokio::test]
    async fn start_fails_clearly_without_containerd() {
        let dir = tempfile::tempdir().expect("temp dir");
        let err = Containerd::start(ContainerdConfig {
            data_dir: dir.path().to_path_buf(),
            sandbox_image: "skerry.local/pause:1".into(),
            binary: Some(dir.path().join("no-such-containerd")),
        })
        .await
        .expect_err("no binary");
        assert!(err.to_string().starts_with("starting "), "{err}");
    }
}
