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

/// What to start: a label for reports, the binary, its command-line flavor, and how many
/// members (1, or a cluster of 3 on loopback).
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub label: String,
    pub bin: PathBuf,
    pub flavor: Flavor,
    pub members: usize,
}

/// A running server (one process per member). See the module doc for the drop invariant.
pub struct Server {
    label: String,
    bin: PathBuf,
    /// Each member's command line, to restart it where it was.
    member_args: Vec<Vec<String>>,
    /// Declared before `dir` so that a drop kills the processes before removing their files.
    children: Vec<Child>,
    /// Every member's client URL, comma-separated.
    endpoint: String,
    log_paths: Vec<PathBuf>,
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
        let members = spec.members.max(1);
        let mut ports = Vec::with_capacity(members);
        for _ in 0..members {
            ports.push(free_loopback_ports()?);
        }
        let names: Vec<String> = (1..=members).map(|i| format!("m{i}")).collect();
        let initial_cluster = names
            .iter()
            .zip(&ports)
            .map(|(name, [_, peer])| format!("{name}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut children = Vec::with_capacity(members);
        let mut member_args = Vec::with_capacity(members);
        let mut log_paths = Vec::with_capacity(members);
        let mut endpoints = Vec::with_capacity(members);
        for (name, [client_port, peer_port]) in names.iter().zip(&ports) {
            let data_dir = dir.path().join(name);
            let log_path = dir.path().join(format!("{name}.log"));
            let log = std::fs::File::create(&log_path).context("create server log")?;
            let log_err = log.try_clone().context("clone server log handle")?;
            let client_url = format!("http://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let data_dir_arg = data_dir.display().to_string();
            let mut args: Vec<String> = match spec.flavor {
                Flavor::Skerry => vec!["server".into(), "--secure-port=0".into()],
                Flavor::Etcd => Vec::new(),
            };
            args.extend([
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                data_dir_arg,
                "--listen-client-urls".into(),
                client_url.clone(),
                "--advertise-client-urls".into(),
                client_url.clone(),
            ]);
            // etcd always takes its peer flags; skerry only as a cluster member.
            if spec.flavor == Flavor::Etcd || members > 1 {
                args.extend([
                    "--listen-peer-urls".into(),
                    peer_url.clone(),
                    "--initial-advertise-peer-urls".into(),
                    peer_url.clone(),
                    "--initial-cluster".into(),
                    initial_cluster.clone(),
                ]);
            }
            debug!(target = %spec.label, bin = %spec.bin.display(), ?args, "spawning server");
            let child = Command::new(&spec.bin)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("spawn {} ({})", spec.label, spec.bin.display()))?;
            children.push(child);
            member_args.push(args);
            log_paths.push(log_path);
            endpoints.push(client_url);
        }
        let mut server = Self {
            label: spec.label.clone(),
            bin: spec.bin.clone(),
            member_args,
            children,
            endpoint: endpoints.join(","),
            log_paths,
            dir,
        };
        for endpoint in endpoints {
            server.wait_ready(&endpoint).await?;
        }
        info!(target = %server.label, endpoint = %server.endpoint, "server ready");
        Ok(server)
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Each member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoint.split(',').map(str::to_owned).collect()
    }

    /// Kills member `i` with SIGKILL, as a crash would, and reaps it.
    pub async fn kill_member(&mut self, i: usize) -> Result<()> {
        self.children[i]
            .kill()
            .await
            .with_context(|| format!("kill {} member {i}", self.label))
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to member `i` with kill(1).
    pub async fn signal_member(&mut self, i: usize, signal: &str) -> Result<()> {
        let pid = self.children[i]
            .id()
            .with_context(|| format!("{} member {i} has exited", self.label))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await
            .context("run kill")?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed");
        }
        Ok(())
    }

    /// Starts member `i` again on its data dir and ports and waits until it answers.
    pub async fn restart_member(&mut self, i: usize) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_paths[i])
            .context("open server log")?;
        let log_err = log.try_clone().context("clone server log handle")?;
        let child = Command::new(&self.bin)
            .args(&self.member_args[i])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("restart {} member {i}", self.label))?;
        self.children[i] = child;
        let endpoint = self.endpoints()[i].clone();
        self.wait_ready(&endpoint).await
    }

    /// The members' process ids (those not yet reaped).
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().filter_map(Child::id).collect()
    }

    /// Fails with the log's tail if a member's process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for (child, log_path) in self.children.iter_mut().zip(&self.log_paths) {
            if let Some(status) = child.try_wait().context("poll server process")? {
                bail!(
                    "{} exited with {status}; log tail:\n{}",
                    self.label,
                    log_tail(log_path)
                );
            }
        }
        Ok(())
    }

    /// Kills the server, waits for it to exit and removes its temp dir.
    pub async fn stop(mut self) -> Result<()> {
        for child in &mut self.children {
            child
                .kill()
                .await
                .with_context(|| format!("kill {}", self.label))?;
        }
        let path = self.dir.path().to_path_buf();
        self.dir
            .close()
            .with_context(|| format!("remove {}", path.display()))
    }

    async fn wait_ready(&mut self, endpoint: &str) -> Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut last_error = String::from("no probe finished");
        while Instant::now() < deadline {
            self.check_alive()?;
            match timeout(STARTUP_PROBE_TIMEOUT, probe(endpoint)).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last_error = format!("{e:#}"),
                Err(_) => last_error = format!("probe took over {STARTUP_PROBE_TIMEOUT:?}"),
            }
            sleep(STARTUP_PROBE_INTERVAL).await;
        }
        bail!(
            "{} ({endpoint}) did not answer a Range within {STARTUP_TIMEOUT:?} (last: \
             {last_error}); log tail:\n{}",
            self.label,
            self.log_paths
                .iter()
                .map(|p| log_tail(p))
                .collect::<Vec<_>>()
                .join("\n---\n")
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
    /// The server's processes (every member of a cluster); their CPU times add up.
    pids: Vec<u32>,
    start: Option<Duration>,
}

/// The CPU time of all `pids` together; `None` without pids or when one cannot be read.
fn total_cpu_time(pids: &[u32]) -> Option<Duration> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|pid| process_cpu_time(*pid))
        .sum::<Option<Duration>>()
}

impl CpuMeter {
    /// Starts measuring the CPU time of `pids` now.
    pub fn start(pids: &[u32]) -> Self {
        Self {
            pids: pids.to_vec(),
            start: total_cpu_time(pids),
        }
    }

    /// Starts over, so a workload can leave its setup (such as range's preload) out.
    pub fn restart(&mut self) {
        self.start = total_cpu_time(&self.pids);
    }

    /// The server's CPU microseconds per operation since the start, as an `Extra`; `None`
    /// without a pid, a /proc reading, or a completed operation. The resolution is one clock
    /// tick (10 ms), so short workloads read coarsely.
    pub fn finish(&self, ops: u64) -> Option<Extra> {
        let end = total_cpu_time(&self.pids)?;
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
