//! Jepsen-style torture of a real three-member cluster: `skerry server` processes (or etcd 3.4,
//! to show the checkers are not tuned to skerry) driven over the real gRPC API by concurrent
//! clients and watchers while a nemesis injects faults, judged afterwards by [`crate::check`].
//!
//! - `lock`: one run at a time on a machine, and removal of an earlier crashed run's leftovers.
//! - `net`: where members live and how they are cut apart: a network namespace per member with
//!   `nft` drop rules (as root), or a fault-injecting TCP proxy per ordered member pair.
//! - `proxy`: that proxy.
//! - `cluster`: the member processes: start, kill -9, SIGSTOP/SIGCONT, restart, and the
//!   Cluster API (leader, member remove/add/promote).
//! - `client`: the workload clients recording [`Op`]s and the watchers recording
//!   [`WatchLog`]s, on one monotonic clock.
//! - `nemesis`: the fault schedule, recording each fault's window.
//! - `compactor`: compacts the store every few seconds and reads at past revisions,
//!   recording [`Compaction`]s and [`PastRead`]s, under the nemesis like any client.
//! - `reader`: the history readers, which record the committed history while the run goes
//!   (the compactor never compacts what the following reader has not read) and each
//!   member's own history for the replicas check.
//! - `collect`: the final state, read with faults healed.
//! - `failover`: not part of a torture run: the cut-link failover measurement (issue 21), a
//!   leader cut off from its peers by nft rules, on the same namespaces and members.
//! - `report`, `plot`: the report folder (`history.txt`, `watches.txt`, `compactions.txt`,
//!   `faults.txt`, `verdict.txt`, `plot.svg`).
//!
//! Start at [`run`]. Every resource a run creates (processes, namespaces, nft tables, proxies,
//! data dirs) is owned by a value whose `Drop` removes it, so a run that fails or panics still
//! cleans up; a run killed outright leaves leftovers that the next run's `lock` removes.
//!
//! Invariants the history keeps for the checkers (`check::history`): every key the clients
//! touch starts absent (each run starts fresh data dirs, and keys rotate to fresh ones every
//! generation), only the recorded clients write them, and every timestamp comes from one
//! [`Clock`].

pub mod client;
pub mod cluster;
pub mod collect;
pub mod compactor;
pub mod failover;
pub mod lock;
pub mod nemesis;
pub mod net;
pub mod plot;
pub mod proxy;
pub mod reader;
pub mod report;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::check::{
    self, CommittedHistory, Compaction, FinalState, Op, PastRead, Report, WatchItem, WatchLog,
};
use client::{ClientSpec, KeySpace, WatcherSpec};
use cluster::Cluster;
use compactor::{CompactorRecord, CompactorSpec};
use nemesis::{FaultKind, FaultWindow, Nemesis};
use net::{Network, NetworkMode};
use reader::{ReadHistory, ReaderMode, ReaderSpec};

/// Members of the tortured cluster: the smallest that survives losing one, and what the
/// appliance ships.
pub const MEMBERS: usize = 3;

/// After the last fault is healed, clients keep running this long before they stop, so the
/// plot shows the recovery and the last unknown writes have a chance to be read. Semi-arbitrary:
/// three election timeouts.
const HEALED_TAIL: Duration = Duration::from_secs(3);

/// How long a healed cluster gets to elect a leader, restart, catch up and answer on every
/// member before the run is declared not recovered. A snapshot install after a membership
/// change on a slow debug build is the slowest case seen (a few seconds); this leaves margin.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long watchers get to reach the final revision before they are stopped. Progress
/// notifications come every second, so a healthy watcher needs about one.
const WATCH_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// What to torture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Skerry,
    Etcd,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Target::Skerry => "skerry",
            Target::Etcd => "etcd",
        })
    }
}

/// One run's settings. `Config::new` gives the defaults the CLI uses.
#[derive(Debug, Clone)]
pub struct Config {
    pub target: Target,
    /// The `skerry` or `etcd` binary.
    pub bin: PathBuf,
    /// How long clients run with the nemesis active (the healed tail and checks come after).
    pub duration: Duration,
    /// The faults the nemesis picks from, in turn.
    pub nemeses: Vec<FaultKind>,
    pub clients: usize,
    pub watchers: usize,
    pub network: NetworkMode,
    /// The report folder.
    pub out_dir: PathBuf,
    /// Seeds the clients' and the nemesis's choices (the processes themselves are not
    /// deterministic, so a seed reproduces the schedule, not the run).
    pub seed: u64,
    /// How long an op may take before the client gives up on it: a write becomes
    /// `Outcome::Unknown`, a read `Outcome::Failed`. Larger waits out more elections (fewer
    /// unknown writes, which the linearizability search must branch on); smaller keeps
    /// clients busy during faults.
    pub op_timeout: Duration,
    /// Quiet time between two faults.
    pub fault_interval: Duration,
    /// How long a fault (other than a membership change, which takes what it takes) lasts.
    pub fault_duration: Duration,
    /// Time the linearizability search may take before it gives up (an inconclusive run).
    pub check_budget: Duration,
    /// `--snapshot-count` for every member: low enough that a run compacts the Raft log and
    /// a re-added member may need a snapshot.
    pub snapshot_count: u64,
    /// How often the compactor compacts the store (jittered ±50 %); zero turns it off.
    /// Shorter cuts off more watchers and history readers, longer exercises the compacted
    /// paths less.
    pub compact_interval: Duration,
    pub keys: KeySpace,
}

impl Config {
    /// The defaults: 60 s, every fault, 8 clients, 3 watchers.
    pub fn new(target: Target, bin: PathBuf, out_dir: PathBuf) -> Config {
        Config {
            target,
            bin,
            duration: Duration::from_secs(60),
            nemeses: FaultKind::ALL.to_vec(),
            clients: 8,
            watchers: 3,
            network: NetworkMode::Auto,
            out_dir,
            seed: 0,
            op_timeout: Duration::from_secs(2),
            fault_interval: Duration::from_secs(4),
            fault_duration: Duration::from_secs(6),
            check_budget: Duration::from_secs(60),
            snapshot_count: 5_000,
            compact_interval: compactor::COMPACT_INTERVAL_DEFAULT,
            keys: KeySpace::default(),
        }
    }

    /// Checks the settings a run depends on.
    pub fn validate(&self) -> Result<()> {
        if self.clients == 0 {
            bail!("--clients must be at least 1");
        }
        if self.nemeses.is_empty() {
            bail!("--nemesis names no fault");
        }
        if self.duration < Duration::from_secs(1) {
            bail!("--duration must be at least 1s");
        }
        if self.keys.keys_per_generation == 0 || self.keys.generation_period.is_zero() {
            bail!("the key space needs at least one key and a nonzero generation period");
        }
        if !self.bin.exists() {
            bail!("{} binary {} not found", self.target, self.bin.display());
        }
        Ok(())
    }
}

/// The one clock of a run: nanoseconds since the run started, monotonic. Every op's invoke
/// and complete time and every fault window come from it, as the checkers require.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            origin: Instant::now(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// What a run recorded, whether or not it got as far as checking.
#[derive(Debug, Default)]
pub struct Recorded {
    pub history: Vec<Op>,
    pub watches: Vec<WatchLog>,
    pub faults: Vec<FaultWindow>,
    /// When the clients stopped, on the run's clock.
    pub end_ns: u64,
    /// Op id -> the member (index) it was sent to.
    pub op_members: HashMap<u64, usize>,
    /// Per watch log (same order): where each stream began, as (first item index, member).
    pub watch_segments: Vec<Vec<(usize, usize)>>,
    /// The members' names, by index.
    pub member_names: Vec<String>,
    /// Every compaction the compactor asked for, and the member (index) it went to.
    pub compactions: Vec<Compaction>,
    pub compaction_members: Vec<usize>,
    /// Every read at a past revision, and the member it went to.
    pub past_reads: Vec<PastRead>,
    pub past_read_members: Vec<usize>,
    /// What each history reader went through, the following one first.
    pub readers: Vec<ReaderFigures>,
}

impl Recorded {
    /// How many times a watcher's stream was cut off by a compaction.
    pub fn watchers_compacted(&self) -> usize {
        self.watches
            .iter()
            .flat_map(|log| &log.items)
            .filter(|item| matches!(item, WatchItem::Compacted { .. }))
            .count()
    }
}

/// One history reader's figures for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderFigures {
    /// `cluster` for the following reader, else the member's name.
    pub name: String,
    pub resumes: usize,
    /// Times it was cut off by a compaction, and the revisions that cost it.
    pub holes: usize,
    pub revisions_lost: i64,
}

impl ReaderFigures {
    fn of(name: String, history: &ReadHistory) -> ReaderFigures {
        ReaderFigures {
            name,
            resumes: history.resumes,
            holes: history.holes.len(),
            revisions_lost: history
                .holes
                .iter()
                .map(|(low, high)| high.saturating_sub(*low).saturating_add(1))
                .sum(),
        }
    }
}

/// What the end of a run read with faults healed.
#[derive(Debug)]
pub struct Observed {
    pub final_state: FinalState,
    pub final_revision: i64,
    /// The committed history as the following history reader read it during the run, with
    /// the compactions and past reads the compactor made.
    pub committed: CommittedHistory,
    /// Whether every member holds the same committed history wherever its own reader read
    /// it: `Err` names the first difference; `Ok` how many revisions each member was
    /// compared on.
    pub replicas: Result<Vec<(String, i64)>, String>,
}

/// A finished run: what was recorded and read, and the verdict.
#[derive(Debug)]
pub struct RunSummary {
    pub config: Config,
    pub network: NetworkMode,
    pub recorded: Recorded,
    /// `Err` when the run could not be checked: the cluster did not recover, or the final
    /// reads failed.
    pub observed: Result<Observed, String>,
    pub report: Option<Report>,
    pub check_time: Duration,
    /// A fault the nemesis could not inject or heal.
    pub nemesis_error: Option<String>,
    /// Members that exited without being killed or removed.
    pub crashes: Vec<String>,
}

impl RunSummary {
    /// Whether the run is judged correct: every check passed, every member holds the same
    /// committed history, no member crashed, and the run got as far as checking.
    pub fn is_valid(&self) -> bool {
        self.report.as_ref().is_some_and(Report::is_valid)
            && self
                .observed
                .as_ref()
                .is_ok_and(|observed| observed.replicas.is_ok())
            && self.nemesis_error.is_none()
            && self.crashes.is_empty()
    }
}

/// Runs one torture: start the cluster and the history readers, drive it with clients,
/// watchers and the compactor under the nemesis for `config.duration`, heal, read the final
/// state, check, and write the report folder. Returns `Err` only when the run could not be
/// set up; a run that went wrong later still writes its report and says so in the summary.
pub async fn run(config: &Config) -> Result<RunSummary> {
    config.validate()?;
    std::fs::create_dir_all(&config.out_dir)
        .with_context(|| format!("create report dir {}", config.out_dir.display()))?;
    let run_lock = lock::RunLock::acquire().await?;
    let mode = config.network.resolve();
    info!(target = %config.target, network = %mode, out = %config.out_dir.display(), "torture starting");
    let clock = Clock::new();
    let network = Network::setup(mode)?;
    let mut cluster = Cluster::start(config, &network, run_lock.work_dir(), clock).await?;

    let endpoints = cluster.client_urls();
    // The readers start before any client, so they read from revision 1 before anything can
    // be compacted. Each returns its mode with its history.
    let (stop_readers, readers_stopped) = watch::channel(false);
    let mut readers = JoinSet::new();
    let mut reader_progress = Vec::new();
    let modes = std::iter::once(ReaderMode::Follow).chain((0..MEMBERS).map(ReaderMode::Pinned));
    for reader_mode in modes {
        let confirmed = Arc::new(AtomicI64::new(0));
        reader_progress.push(confirmed.clone());
        let spec = ReaderSpec {
            mode: reader_mode,
            endpoints: endpoints.clone(),
            keys: config.keys.clone(),
            confirmed,
        };
        let stopped = readers_stopped.clone();
        readers.spawn(async move { (reader_mode, reader::run_reader(spec, stopped).await) });
    }
    let ids = Arc::new(AtomicU64::new(1));
    let (stop_clients, clients_stopped) = watch::channel(false);
    let (stop_watchers, watchers_stopped) = watch::channel(false);
    let mut clients = JoinSet::new();
    for client in 0..config.clients {
        let spec = ClientSpec {
            id: client as u64,
            endpoints: endpoints.clone(),
            clock,
            op_timeout: config.op_timeout,
            seed: config.seed.wrapping_add(client as u64),
            keys: config.keys.clone(),
            ids: ids.clone(),
        };
        clients.spawn(client::run_client(spec, clients_stopped.clone()));
    }
    let mut compactor = JoinSet::new();
    let compactor_spec = CompactorSpec {
        endpoints: endpoints.clone(),
        clock,
        op_timeout: config.op_timeout,
        interval: config.compact_interval,
        // Its own stream, apart from the clients' (seed + id) and watchers' (seed + 1000 + id).
        seed: config.seed.wrapping_add(2_000),
        keys: config.keys.clone(),
        confirmed: reader_progress[0].clone(),
    };
    compactor.spawn(compactor::run_compactor(
        compactor_spec,
        clients_stopped.clone(),
    ));
    let mut watchers = JoinSet::new();
    let mut watcher_progress = Vec::new();
    for watcher in 0..config.watchers {
        let seen = Arc::new(AtomicI64::new(0));
        watcher_progress.push(seen.clone());
        let spec = WatcherSpec {
            id: watcher as u64,
            endpoints: endpoints.clone(),
            keys: config.keys.clone(),
            seed: config.seed.wrapping_add(1_000 + watcher as u64),
            // Staggered over the first third of the run so they start at different revisions.
            start_delay: config.duration / 3 * watcher as u32 / config.watchers.max(1) as u32,
            seen,
            clock,
        };
        watchers.spawn(client::run_watcher(spec, watchers_stopped.clone()));
    }

    let deadline = tokio::time::Instant::now() + config.duration;
    let mut nemesis = Nemesis::new(config, clock, &network);
    let nemesis_error = match nemesis.run(&mut cluster, deadline).await {
        Ok(()) => None,
        Err(e) => {
            warn!("nemesis failed: {e:#}");
            Some(format!("{e:#}"))
        }
    };
    let heal_error = nemesis.heal_all(&mut cluster).await.err();
    let (faults, mut crashes) = nemesis.into_record();
    tokio::time::sleep(HEALED_TAIL).await;
    let _ = stop_clients.send(true);
    let mut history = Vec::new();
    let mut op_members = HashMap::new();
    while let Some(record) = clients.join_next().await {
        let record = record.context("join client task")?;
        op_members.extend(record.ops.iter().map(|op| op.id).zip(record.members));
        history.extend(record.ops);
    }
    history.sort_by_key(|op| op.invoke);
    let compacted = match compactor.join_next().await {
        Some(record) => record.context("join compactor task")?,
        None => CompactorRecord::default(),
    };
    let end_ns = clock.now_ns();
    info!(
        ops = history.len(),
        faults = faults.len(),
        compactions = compacted.compactions.len(),
        "clients stopped"
    );

    let final_read = match heal_error {
        Some(e) => Err(format!("could not heal the cluster: {e:#}")),
        None => {
            observe(
                &mut cluster,
                &endpoints,
                &config.keys,
                &watcher_progress,
                &stop_watchers,
                &reader_progress,
            )
            .await
        }
    };
    let _ = stop_watchers.send(true);
    let _ = stop_readers.send(true);
    crashes.extend(cluster.take_crashes());
    let mut records = Vec::new();
    while let Some(record) = watchers.join_next().await {
        records.push(record.context("join watcher task")?);
    }
    records.sort_by_key(|record| record.log.watcher);
    let (watches, watch_segments) = records
        .into_iter()
        .map(|record| (record.log, record.segments))
        .unzip();
    let member_names: Vec<String> = (0..MEMBERS).map(|i| cluster.name(i).to_owned()).collect();
    let mut follow = ReadHistory::default();
    let mut pinned = Vec::new();
    while let Some(reader) = readers.join_next().await {
        match reader.context("join history reader task")? {
            (ReaderMode::Follow, history) => follow = history,
            (ReaderMode::Pinned(index), history) => pinned.push((index, history)),
        }
    }
    pinned.sort_by_key(|(index, _)| *index);
    let pinned: Vec<(String, ReadHistory)> = pinned
        .into_iter()
        .map(|(index, history)| (member_names[index].clone(), history))
        .collect();
    cluster.stop().await;
    drop(network);

    let readers = std::iter::once(ReaderFigures::of("cluster".into(), &follow))
        .chain(
            pinned
                .iter()
                .map(|(name, history)| ReaderFigures::of(name.clone(), history)),
        )
        .collect();
    let observed = final_read.and_then(|(final_state, final_revision)| {
        assemble(final_state, final_revision, follow, &pinned, &compacted)
    });
    let recorded = Recorded {
        history,
        watches,
        faults,
        end_ns,
        op_members,
        watch_segments,
        member_names,
        compactions: compacted.compactions,
        compaction_members: compacted.compaction_members,
        past_reads: compacted.past_reads,
        past_read_members: compacted.past_read_members,
        readers,
    };
    let (report, check_time) = match &observed {
        Ok(observed) => {
            let started = Instant::now();
            let report = check_recorded(&recorded, observed, config.check_budget).await?;
            (Some(report), started.elapsed())
        }
        Err(_) => (None, Duration::ZERO),
    };
    let summary = RunSummary {
        config: config.clone(),
        network: mode,
        recorded,
        observed,
        report,
        check_time,
        nemesis_error,
        crashes,
    };
    report::write(&summary).context("write the report folder")?;
    drop(run_lock);
    Ok(summary)
}

/// Runs the checkers off the async threads: the linearizability search is CPU-bound.
async fn check_recorded(
    recorded: &Recorded,
    observed: &Observed,
    budget: Duration,
) -> Result<Report> {
    let history = recorded.history.clone();
    let watches = recorded.watches.clone();
    let committed = observed.committed.clone();
    let final_state = observed.final_state.clone();
    tokio::task::spawn_blocking(move || {
        check::check_all(&history, &watches, &committed, &final_state, budget)
    })
    .await
    .context("run the checkers")
}

/// With faults healed and clients stopped: waits for a healthy cluster, lets the watchers and
/// the history readers catch up and stops the watchers, then reads the final state and waits
/// for the readers to reach its revision.
async fn observe(
    cluster: &mut Cluster,
    endpoints: &[String],
    keys: &KeySpace,
    watcher_progress: &[Arc<AtomicI64>],
    stop_watchers: &watch::Sender<bool>,
    reader_progress: &[Arc<AtomicI64>],
) -> Result<(FinalState, i64), String> {
    cluster
        .wait_healthy(RECOVERY_TIMEOUT)
        .await
        .map_err(|e| format!("the cluster did not recover: {e:#}"))?;
    let (_, revision) = collect::final_state(endpoints, keys)
        .await
        .map_err(|e| format!("read the revision: {e:#}"))?;
    let everyone: Vec<Arc<AtomicI64>> = watcher_progress
        .iter()
        .chain(reader_progress)
        .cloned()
        .collect();
    client::wait_watchers(&everyone, revision, WATCH_CATCH_UP_TIMEOUT).await;
    let _ = stop_watchers.send(true);
    let (final_state, final_revision) = collect::final_state(endpoints, keys)
        .await
        .map_err(|e| format!("read the final state: {e:#}"))?;
    client::wait_watchers(reader_progress, final_revision, WATCH_CATCH_UP_TIMEOUT).await;
    Ok((final_state, final_revision))
}

/// The committed history up to `final_revision` from the following reader, with the
/// compactor's record, and the members' histories compared with it. `Err` when the following
/// reader's history cannot be trusted whole: it saw an anomaly or did not get that far.
fn assemble(
    final_state: FinalState,
    final_revision: i64,
    follow: ReadHistory,
    pinned: &[(String, ReadHistory)],
    compacted: &CompactorRecord,
) -> Result<Observed, String> {
    if follow.anomaly_count > 0 {
        return Err(format!(
            "the history reader saw what a store must never do ({} times): {}",
            follow.anomaly_count,
            follow.anomalies.join("; ")
        ));
    }
    if follow.confirmed < final_revision {
        return Err(format!(
            "the history reader reached only revision {} of the final {final_revision}",
            follow.confirmed
        ));
    }
    let anomalies: Vec<String> = pinned
        .iter()
        .filter(|(_, history)| history.anomaly_count > 0)
        .map(|(name, history)| format!("{name}: {}", history.anomalies.join("; ")))
        .collect();
    let replicas = if anomalies.is_empty() {
        reader::compare_replicas(&follow, pinned, final_revision)
    } else {
        Err(format!(
            "a member's history reader saw what a store must never do: {}",
            anomalies.join(" | ")
        ))
    };
    let mut events = follow.events;
    events.retain(|event| event.revision <= final_revision);
    Ok(Observed {
        final_state,
        final_revision,
        committed: CommittedHistory {
            from_revision: 1,
            events,
            compactions: compacted.compactions.clone(),
            past_reads: compacted.past_reads.clone(),
        },
        replicas,
    })
}

/// The workspace's `target` dir, as seen from a test binary (which runs from
/// `target/<profile>/deps/`).
pub fn target_dir() -> std::path::PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .find(|dir| dir.file_name().is_some_and(|name| name == "target"))
                .map(std::path::Path::to_path_buf)
        })
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// The debug `skerry` binary for the CI tests that run real members, built if missing.
pub fn debug_skerry_bin() -> std::path::PathBuf {
    let bin = target_dir().join("debug").join("skerry");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "-p", "skerry"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build -p skerry");
        assert!(status.success(), "cargo build -p skerry failed");
    }
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}
