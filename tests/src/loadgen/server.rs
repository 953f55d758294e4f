//! Starts one skerry or etcd server on loopback, in a fresh temp dir, for one run.
//!
//! Invariant: a `Server` owns its child process and its temp dir. Dropping it (on error, panic
//! or Ctrl-C) kills the child (`kill_on_drop`) and then removes the dir; `stop` does the same
//! but waits for the child to exit first.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use skerry_store::pb::etcdserverpb::RangeRequest;
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};
use tracing::{debug, info};

use super::stats::{Extra, SERVER_CPU_EXTRA};
use super::workloads::connect;

/// How long a fresh server gets to answer its first Range. etcd 3.4 on one node elects itself
/// in about a second (its default election timeout is 1 s); the rest is slack for a slow disk.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between readiness probes: short enough not to add to the measured setup, long enough
/// not to spin while the server opens its data dir.
const STARTUP_PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Bound on one readiness probe, so a server that accepts but never answers cannot stall
/// startup past `STARTUP_TIMEOUT` by more than this.
const STARTUP_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Lines of the server's log quoted when it fails to start or dies: enough for a Go or Rust
/// panic's headline, short enough to read in a terminal.
const LOG_TAIL_LINES: usize = 30;

/// Which command line a binary understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `skerry server --data-dir ... --listen-client-urls ... --advertise-client-urls ...`.
    Skerry,
    /// etcd's single-member flags, peer URL included.
    Etcd,
}

/// What to start: a label for reports, the binary, and its command-line flavor.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub label: String,
    pub bin: PathBuf,
    pub flavor: Flavor,
}

/// A running server. See the module doc for the drop invariant.
pub struct Server {
    label: String,
    /// Declared before `dir` so that a drop kills the process before removing its files.
    child: Child,
    endpoint: String,
    log_path: PathBuf,
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts the server in a fresh temp dir on free loopback ports and waits until a Range
    /// succeeds.
    pub async fn start(spec: &ServerSpec) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("skerry-loadgen-")
            .tempdir()
            .context("create temp dir for server")?;
        let data_dir = dir.path().join("data");
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path).context("create server log")?;
        let log_err = log.try_clone().context("clone server log handle")?;

        let [client_port, peer_port] = free_loopback_ports()?;
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let data_dir_arg = data_dir.display().to_string();
        let args: Vec<String> = match spec.flavor {
            Flavor::Skerry => vec![
                "server".into(),
                "--data-dir".into(),
                data_dir_arg,
                "--listen-client-urls".into(),
                client_url.clone(),
                "--advertise-client-urls".into(),
                client_url.clone(),
            ],
            Flavor::Etcd => vec![
                "--name".into(),
                "default".into(),
                "--data-dir".into(),
                data_dir_arg,
                "--listen-client-urls".into(),
                client_url.clone(),
                "--advertise-client-urls".into(),
                client_url.clone(),
                "--listen-peer-urls".into(),
                peer_url.clone(),
                "--initial-advertise-peer-urls".into(),
                peer_url.clone(),
                "--initial-cluster".into(),
                format!("default={peer_url}"),
            ],
        };
        debug!(target = %spec.label, bin = %spec.bin.display(), ?args, "spawning server");
        let child = Command::new(&spec.bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {} ({})", spec.label, spec.bin.display()))?;
        let mut server = Self {
            label: spec.label.clone(),
            child,
            endpoint: client_url,
            log_path,
            dir,
        };
        server.wait_ready().await?;
        info!(target = %server.label, endpoint = %server.endpoint, "server ready");
        Ok(server)
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The child's process id, `None` once it has been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Fails with the log's tail if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait().context("poll server process")? {
            bail!(
                "{} exited with {status}; log tail:\n{}",
                self.label,
                log_tail(&self.log_path)
            );
        }
        Ok(())
    }

    /// Kills the server, waits for it to exit and removes its temp dir.
    pub async fn stop(mut self) -> Result<()> {
        self.child
            .kill()
            .await
            .with_context(|| format!("kill {}", self.label))?;
        let path = self.dir.path().to_path_buf();
        self.dir
            .close()
            .with_context(|| format!("remove {}", path.display()))
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut last_error = String::from("no probe finished");
        while Instant::now() < deadline {
            self.check_alive()?;
            match timeout(STARTUP_PROBE_TIMEOUT, probe(&self.endpoint)).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last_error = format!("{e:#}"),
                Err(_) => last_error = format!("probe took over {STARTUP_PROBE_TIMEOUT:?}"),
            }
            sleep(STARTUP_PROBE_INTERVAL).await;
        }
        bail!(
            "{} did not answer a Range within {STARTUP_TIMEOUT:?} (last: {last_error}); log \
             tail:\n{}",
            self.label,
            log_tail(&self.log_path)
        )
    }
}

/// Clock ticks per second in /proc/<pid>/stat. libc is not a dependency, so rather than
/// `sysconf(_SC_CLK_TCK)` this assumes USER_HZ = 100, which Linux fixes on every mainstream
/// architecture (x86, arm, riscv, ...) as part of its user-space ABI.
const CLOCK_TICKS_PER_SECOND: u64 = 100;

/// A process's user + system CPU time (all threads) from /proc/<pid>/stat, or `None` if it
/// cannot be read or parsed (not Linux, process gone).
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_time_from_stat(&stat)
}

/// Parses utime and stime (fields 14 and 15) out of a /proc/<pid>/stat line. Field 2, the
/// command name, is parenthesized and may itself hold spaces and ')', so fields are counted
/// from after the last ')': there field 3 (state) comes first, so utime is the 12th.
fn cpu_time_from_stat(stat: &str) -> Option<Duration> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = utime.checked_add(stime)?;
    Some(Duration::from_micros(
        ticks.checked_mul(1_000_000 / CLOCK_TICKS_PER_SECOND)?,
    ))
}

/// Measures a server's CPU time over one workload's measured phase. Without a pid (`run`
/// mode) or when /proc cannot be read, it yields no figure rather than an error.
pub struct CpuMeter {
    pid: Option<u32>,
    start: Option<Duration>,
}

impl CpuMeter {
    /// Starts measuring `pid`'s CPU time now.
    pub fn start(pid: Option<u32>) -> Self {
        Self {
            pid,
            start: pid.and_then(process_cpu_time),
        }
    }

    /// Starts over, so a workload can leave its setup (such as range's preload) out.
    pub fn restart(&mut self) {
        self.start = self.pid.and_then(process_cpu_time);
    }

    /// The server's CPU microseconds per operation since the start, as an `Extra`; `None`
    /// without a pid, a /proc reading, or a completed operation. The resolution is one clock
    /// tick (10 ms), so short workloads read coarsely.
    pub fn finish(&self, ops: u64) -> Option<Extra> {
        let end = process_cpu_time(self.pid?)?;
        let used = end.checked_sub(self.start?)?;
        (ops > 0).then(|| Extra {
            name: SERVER_CPU_EXTRA,
            value: used.as_secs_f64() * 1_000_000.0 / ops as f64,
            unit: " us/op",
        })
    }
}

/// One linearizable Range of a key that need not exist.
async fn probe(endpoint: &str) -> Result<()> {
    let channel = connect(endpoint, Some(STARTUP_PROBE_TIMEOUT)).await?;
    KvClient::new(channel)
        .range(RangeRequest {
            key: "loadgen/probe".into(),
            ..Default::default()
        })
        .await
        .context("range probe key")?;
    Ok(())
}

/// Two distinct free loopback ports (client and peer). The listeners are held until both are
/// chosen so the two differ; another process can still take one before the server binds it,
/// which shows up as a startup failure naming the port in the log.
fn free_loopback_ports() -> Result<[u16; 2]> {
    let first = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind a free port")?;
    let second = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind a free port")?;
    Ok([
        first.local_addr().context("read bound port")?.port(),
        second.local_addr().context("read bound port")?.port(),
    ])
}

fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                return "(empty log)".to_owned();
            }
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_survives_odd_comm() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0";
        assert_eq!(cpu_time_from_stat(stat), Some(Duration::from_millis(3_250)));
        assert_eq!(cpu_time_from_stat("4242 (x) S 1 2"), None);
        assert_eq!(cpu_time_from_stat("garbage"), None);
    }

    #[test]
    fn reads_own_cpu_time() {
        assert!(process_cpu_time(std::process::id()).is_some());
    }
}
