//! The member processes of one run and the Cluster API calls the nemesis makes.
//!
//! skerry and etcd 3.4 get the same flags (etcd's names): a new cluster from
//! `--initial-cluster`, watch progress notifications every `PROGRESS_NOTIFY_INTERVAL`, and a
//! low `--snapshot-count` so the Raft log is compacted during a run. Each member's output goes
//! to `logs/<name>.log` in the report folder, with a line from the harness before each start.
//!
//! Invariant: a `Cluster` owns its children; dropping it SIGKILLs every one (paused ones
//! included, SIGKILL needs no SIGCONT), so no member outlives a run that failed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rustix::process::Signal;
use skerry_store::pb::etcdserverpb::cluster_client::ClusterClient;
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use skerry_store::pb::etcdserverpb::{
    Member, MemberAddRequest, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest,
    RangeRequest, StatusRequest, StatusResponse,
};
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};
use tracing::{debug, info};

use super::client::lazy_channel;
use super::lock::signal;
use super::net::{MemberAddr, Network};
use super::{Clock, Config, MEMBERS, Target};

/// Interval of watch progress notifications on every member. Short, so the watch checker sees
/// many of them, and watchers notice a dead stream (`client::WATCH_IDLE_TIMEOUT`) quickly.
pub const PROGRESS_NOTIFY_INTERVAL: &str = "1s";

/// How long a fresh cluster gets to elect a leader and answer a linearizable read on every
/// member. etcd 3.4 needs about an election timeout (1 s); a debug skerry build on a busy
/// 2-core machine a few seconds.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between polls while waiting for a member or the cluster.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Bound on one Cluster or Maintenance API call, and on a readiness probe: a few healthy
/// round trips. A frozen or cut-off member is given up on, not waited for.
const ADMIN_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Lines of a member's log quoted when it fails to start.
const LOG_TAIL_LINES: usize = 20;

/// How long `Drop` waits for killed children to be reaped before moving on.
const DROP_REAP_MAX: Duration = Duration::from_secs(2);

/// The running members; see the module doc.
pub struct Cluster {
    target: Target,
    bin: PathBuf,
    clock: Clock,
    members: Vec<MemberAddr>,
    data_dirs: Vec<PathBuf>,
    log_paths: Vec<PathBuf>,
    /// Flags every member gets after the cluster ones.
    extra_flags: Vec<String>,
    /// `Some(initial cluster)` once member `i` must join an existing cluster (after it was
    /// removed and added back).
    join: Vec<Option<String>>,
    children: Vec<Option<Child>>,
    paused: Vec<bool>,
    /// Shared with the proxies, which tell members apart by process; see `proxy`.
    pids: Option<Arc<Mutex<Vec<Option<u32>>>>>,
}

impl Cluster {
    /// Starts every member in `work_dir` and waits until each answers a linearizable read.
    pub async fn start(
        config: &Config,
        network: &Network,
        work_dir: &Path,
        clock: Clock,
    ) -> Result<Cluster> {
        let logs = config.out_dir.join("logs");
        std::fs::create_dir_all(&logs).context("create logs dir")?;
        let members = network.members().to_vec();
        let mut cluster = Cluster {
            target: config.target,
            bin: config.bin.clone(),
            clock,
            data_dirs: members.iter().map(|m| work_dir.join(&m.name)).collect(),
            log_paths: members
                .iter()
                .map(|m| logs.join(format!("{}.log", m.name)))
                .collect(),
            members,
            extra_flags: vec![
                "--experimental-watch-progress-notify-interval".into(),
                PROGRESS_NOTIFY_INTERVAL.into(),
                "--snapshot-count".into(),
                config.snapshot_count.to_string(),
            ],
            join: vec![None; MEMBERS],
            children: (0..MEMBERS).map(|_| None).collect(),
            paused: vec![false; MEMBERS],
            pids: network.pid_registry(),
        };
        for i in 0..MEMBERS {
            cluster.spawn(i)?;
        }
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        for i in 0..MEMBERS {
            cluster.wait_ready(i, deadline).await?;
        }
        info!(target = %cluster.target, members = ?cluster.client_urls(), "cluster ready");
        Ok(cluster)
    }

    pub fn name(&self, i: usize) -> &str {
        &self.members[i].name
    }

    pub fn peer_url(&self, i: usize) -> &str {
        &self.members[i].peer_url
    }

    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// `n1=url,n2=url,...` for every member, as a new cluster starts.
    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s command line (without `ip netns exec`).
    fn args(&self, i: usize) -> Vec<String> {
        let member = &self.members[i];
        let mut args: Vec<String> = match self.target {
            Target::Skerry => vec!["server".into(), "--secure-port=0".into()],
            Target::Etcd => Vec::new(),
        };
        let (initial_cluster, state) = match &self.join[i] {
            Some(initial) => (initial.clone(), "existing"),
            None => (self.initial_cluster(), "new"),
        };
        args.extend([
            "--name".into(),
            member.name.clone(),
            "--data-dir".into(),
            self.data_dirs[i].display().to_string(),
            "--listen-client-urls".into(),
            member.client_url.clone(),
            "--advertise-client-urls".into(),
            member.client_url.clone(),
            "--listen-peer-urls".into(),
            member.listen_peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            member.peer_url.clone(),
            "--initial-cluster".into(),
            initial_cluster,
            "--initial-cluster-state".into(),
            state.into(),
        ]);
        if self.target == Target::Etcd {
            // etcd 3.4's default logger is deprecated and warns about it on every start.
            args.extend(["--logger".into(), "zap".into()]);
        }
        args.extend(self.extra_flags.iter().cloned());
        args
    }

    /// Starts member `i` on its data dir (it must not be running).
    pub fn spawn(&mut self, i: usize) -> Result<()> {
        assert!(
            self.children[i].is_none(),
            "member {i} started while running"
        );
        let args = self.args(i);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_paths[i])
            .context("open member log")?;
        writeln!(
            log,
            "=== torture: starting {} at t={:.3}s: {} {}",
            self.members[i].name,
            self.clock.now_ns() as f64 / 1e9,
            self.bin.display(),
            args.join(" ")
        )
        .context("write member log")?;
        let log_err = log.try_clone().context("clone member log handle")?;
        let mut command = match &self.members[i].netns {
            // `ip netns exec` execs the binary in place, so the child's pid is the member's.
            Some(ns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns]).arg(&self.bin);
                command
            }
            None => Command::new(&self.bin),
        };
        let child = command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {} ({})", self.members[i].name, self.bin.display()))?;
        debug!(member = %self.members[i].name, pid = ?child.id(), "member started");
        self.set_pid(i, child.id());
        self.children[i] = Some(child);
        self.paused[i] = false;
        Ok(())
    }

    fn set_pid(&self, i: usize, pid: Option<u32>) {
        if let Some(pids) = &self.pids {
            match pids.lock() {
                Ok(mut pids) => pids[i] = pid,
                Err(poisoned) => poisoned.into_inner()[i] = pid,
            }
        }
    }

    /// Whether member `i`'s process is alive (paused counts as alive).
    pub fn is_running(&mut self, i: usize) -> bool {
        match &mut self.children[i] {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Members whose process exited without being killed or removed (a crash), with the exit
    /// status; they are forgotten, so the next `is_running` is false and a restart works.
    pub fn take_crashes(&mut self) -> Vec<String> {
        let mut crashes = Vec::new();
        for i in 0..MEMBERS {
            let exited = match &mut self.children[i] {
                Some(child) => child.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = exited {
                self.children[i] = None;
                self.set_pid(i, None);
                self.paused[i] = false;
                crashes.push(format!(
                    "{} exited by itself with {status}; log tail:\n{}",
                    self.members[i].name,
                    log_tail(&self.log_paths[i])
                ));
            }
        }
        crashes
    }

    pub fn is_paused(&self, i: usize) -> bool {
        self.paused[i]
    }

    /// SIGKILLs member `i` and reaps it.
    pub async fn kill(&mut self, i: usize) -> Result<()> {
        if let Some(mut child) = self.children[i].take() {
            child
                .kill()
                .await
                .with_context(|| format!("kill {}", self.members[i].name))?;
        }
        self.set_pid(i, None);
        self.paused[i] = false;
        Ok(())
    }

    /// Freezes member `i` with SIGSTOP: its sockets stay open and silent.
    pub fn pause(&mut self, i: usize) -> Result<()> {
        let pid = self.pid(i)?;
        signal(pid, Signal::STOP)?;
        self.paused[i] = true;
        Ok(())
    }

    /// Thaws member `i` with SIGCONT.
    pub fn resume(&mut self, i: usize) -> Result<()> {
        let pid = self.pid(i)?;
        signal(pid, Signal::CONT)?;
        self.paused[i] = false;
        Ok(())
    }

    fn pid(&self, i: usize) -> Result<u32> {
        self.children[i]
            .as_ref()
            .and_then(Child::id)
            .with_context(|| format!("{} is not running", self.members[i].name))
    }

    /// Waits up to `limit` for member `i` to exit by itself (as a removed member does), then
    /// kills it; returns whether it exited by itself.
    pub async fn wait_exit(&mut self, i: usize, limit: Duration) -> Result<bool> {
        let exited = match &mut self.children[i] {
            Some(child) => matches!(timeout(limit, child.wait()).await, Ok(Ok(_))),
            None => true,
        };
        self.kill(i).await?;
        Ok(exited)
    }

    /// Deletes member `i`'s data dir (it must be stopped), as a replacement box starts empty.
    pub fn wipe(&mut self, i: usize) -> Result<()> {
        assert!(self.children[i].is_none(), "member {i} wiped while running");
        match std::fs::remove_dir_all(&self.data_dirs[i]) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("wipe {}", self.data_dirs[i].display()))
            }
            _ => Ok(()),
        }
    }

    /// From now on member `i` starts with `--initial-cluster-state existing` and
    /// `initial_cluster`.
    pub fn set_join(&mut self, i: usize, initial_cluster: String) {
        self.join[i] = Some(initial_cluster);
    }

    /// Member `i`'s status, if it answers in time.
    pub async fn status(&self, i: usize) -> Result<StatusResponse> {
        let channel = lazy_channel(&self.members[i].client_url)?;
        let mut client = MaintenanceClient::new(channel);
        let call = client.status(StatusRequest::default());
        let response = timeout(ADMIN_CALL_TIMEOUT, call)
            .await
            .context("status timed out")?
            .context("status")?;
        Ok(response.into_inner())
    }

    /// The member every answering member (at least a majority) names as leader, if they
    /// agree. Paused and stopped members are not asked.
    pub async fn leader(&mut self) -> Option<usize> {
        // (member index, its id) of each member that answered, and whom it names leader.
        let mut ids = Vec::new();
        let mut leaders = Vec::new();
        for i in 0..MEMBERS {
            if !self.is_running(i) || self.paused[i] {
                continue;
            }
            if let Ok(status) = self.status(i).await {
                ids.push((i, status.header.map_or(0, |header| header.member_id)));
                leaders.push(status.leader);
            }
        }
        let first = *leaders.first()?;
        let agreed = first != 0
            && leaders.len() > MEMBERS / 2
            && leaders.iter().all(|leader| *leader == first);
        if !agreed {
            return None;
        }
        ids.iter().find(|(_, id)| *id == first).map(|(i, _)| *i)
    }

    /// Waits up to `limit` for `leader`.
    pub async fn wait_leader(&mut self, limit: Duration) -> Option<usize> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(leader) = self.leader().await {
                return Some(leader);
            }
            if Instant::now() > deadline {
                return None;
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// The member list, from the first of `order` that answers.
    pub async fn member_list(&self, order: &[usize]) -> Result<Vec<Member>> {
        let mut last = None;
        for &i in order {
            let channel = lazy_channel(&self.members[i].client_url)?;
            let mut client = ClusterClient::new(channel);
            let call = client.member_list(MemberListRequest::default());
            match timeout(ADMIN_CALL_TIMEOUT, call).await {
                Ok(Ok(response)) => return Ok(response.into_inner().members),
                Ok(Err(status)) => last = Some(status.message().to_owned()),
                Err(_) => last = Some("timed out".into()),
            }
        }
        bail!("no member listed the members: {}", last.unwrap_or_default())
    }

    /// `MemberRemove` of `id`, sent to member `via`.
    pub async fn remove_member(&self, via: usize, id: u64) -> Result<()> {
        let channel = lazy_channel(&self.members[via].client_url)?;
        let mut client = ClusterClient::new(channel);
        let call = client.member_remove(MemberRemoveRequest { id });
        timeout(ADMIN_CALL_TIMEOUT, call)
            .await
            .context("member remove timed out")?
            .context("member remove")?;
        Ok(())
    }

    /// `MemberAdd` of a learner at member `i`'s peer URL, sent to member `via`; returns the
    /// new member's id and the members after the change.
    pub async fn add_learner(&self, via: usize, i: usize) -> Result<(u64, Vec<Member>)> {
        let channel = lazy_channel(&self.members[via].client_url)?;
        let mut client = ClusterClient::new(channel);
        let call = client.member_add(MemberAddRequest {
            peer_urls: vec![self.members[i].peer_url.clone()],
            is_learner: true,
        });
        let response = timeout(ADMIN_CALL_TIMEOUT, call)
            .await
            .context("member add timed out")?
            .context("member add")?
            .into_inner();
        let id = response
            .member
            .map(|m| m.id)
            .context("no member in reply")?;
        Ok((id, response.members))
    }

    /// `MemberPromote` of `id`, sent to member `via`.
    pub async fn promote(&self, via: usize, id: u64) -> Result<()> {
        let channel = lazy_channel(&self.members[via].client_url)?;
        let mut client = ClusterClient::new(channel);
        let call = client.member_promote(MemberPromoteRequest { id });
        timeout(ADMIN_CALL_TIMEOUT, call)
            .await
            .context("member promote timed out")?
            .context("member promote")?;
        Ok(())
    }

    /// Waits until member `i` answers a linearizable read, failing with its log's tail if
    /// it exits or `deadline` passes.
    async fn wait_ready(&mut self, i: usize, deadline: Instant) -> Result<()> {
        loop {
            if !self.is_running(i) {
                bail!(
                    "{} exited; log tail:\n{}",
                    self.members[i].name,
                    log_tail(&self.log_paths[i])
                );
            }
            let last = match self.probe(i).await {
                Ok(()) => return Ok(()),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer a read in time (last: {last}); log tail:\n{}",
                    self.members[i].name,
                    log_tail(&self.log_paths[i])
                );
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    /// One linearizable read on member `i`.
    async fn probe(&self, i: usize) -> Result<()> {
        let channel = lazy_channel(&self.members[i].client_url)?;
        let mut client = KvClient::new(channel);
        let call = client.range(RangeRequest {
            key: "torture-probe".into(),
            ..Default::default()
        });
        timeout(ADMIN_CALL_TIMEOUT, call)
            .await
            .context("read timed out")?
            .context("read")?;
        Ok(())
    }

    /// Waits until every member runs, all agree on a leader, none is a learner, and each
    /// answers a linearizable read.
    pub async fn wait_healthy(&mut self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.healthy().await {
                Ok(()) => return Ok(()),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!("{last}");
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    async fn healthy(&mut self) -> Result<()> {
        let mut leaders = Vec::new();
        for i in 0..MEMBERS {
            if !self.is_running(i) {
                bail!("{} is not running", self.members[i].name);
            }
            if self.paused[i] {
                bail!("{} is paused", self.members[i].name);
            }
            let status = self.status(i).await?;
            if status.is_learner {
                bail!("{} is a learner", self.members[i].name);
            }
            leaders.push(status.leader);
        }
        if leaders[0] == 0 || leaders.iter().any(|leader| *leader != leaders[0]) {
            bail!("members disagree on the leader: {leaders:x?}");
        }
        for i in 0..MEMBERS {
            self.probe(i)
                .await
                .with_context(|| format!("{} does not answer reads", self.members[i].name))?;
        }
        Ok(())
    }

    /// Kills every member and waits for them to exit.
    pub async fn stop(&mut self) {
        for i in 0..MEMBERS {
            let _ = self.kill(i).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + DROP_REAP_MAX;
        for child in self.children.iter_mut().flatten() {
            let _ = child.start_kill();
        }
        for child in self.children.iter_mut().flatten() {
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}
