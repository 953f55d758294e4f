//! The Raft node: one thread owns the `RawNode` and drives it — ticks, steps peer messages,
//! proposes, starts ReadIndex rounds, and handles each `Ready` in raft-rs's order:
//!
//! 1. messages that need nothing durable (the leader's appends) go out at once, in parallel
//!    with its own fsync;
//! 2. entries committed earlier are handed to the store, in order, with the replies of the
//!    clients on this member that proposed them;
//! 3. the Ready's entries and hard state are persisted (one fsync when raft-rs says so);
//! 4. only then votes and append acknowledgements go out;
//! 5. read states answer the ReadIndex round they belong to;
//! 6. `advance`, and the same for the light Ready it returns.
//!
//! Proposals carry `(member id, proposal id)` as their context, so the member a client asked
//! recognises its entry when it applies it and answers with the entry's result. Followers
//! forward proposals to the leader (raft-rs does), so any member takes writes. Many client
//! proposals arriving together land in one Ready and share its fsync. Concurrent linearizable
//! reads share one ReadIndex round per loop turn.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType,
    HardState, Message, MessageType, Snapshot,
};
use raft::{GetEntriesContext, RaftState, RawNode, StateRole, Storage, StorageError};
use skerry_store::pb::command::{
    Command, Member as MemberRecord, Membership, command::Command as Cmd,
};
use skerry_store::replication::{Committed, MembershipChange, ReplicaStatus, Replicator, Reply};
use skerry_store::{Store, StoreError};
use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::config::{ClusterConfig, ClusterState};
use crate::error::RaftError;
use crate::log::LogStore as RaftLog;
use crate::transport::{JoinAnswer, OutgoingSnapshots, Received, SnapshotSetup, Transport};

/// Messages (peer traffic, proposals, reads) waiting for the Raft thread. Beyond it peer
/// messages are dropped (raft retransmits) and clients are told there is no leader to take
/// more, rather than memory growing without bound.
pub const NODE_QUEUE_MAX: usize = 65_536;
/// Messages handled per loop turn before the Ready is processed: enough to gather a burst of
/// proposals into one Ready (one fsync), few enough that ticks stay on time.
pub const MESSAGES_PER_TURN_MAX: usize = 4_096;
/// raft-rs's cap on one append message: big enough to move a batch of writes in one round
/// trip, small enough not to stall heartbeats behind it on a slow link (etcd uses 1 MiB).
pub const APPEND_BYTES_MAX: u64 = 1 << 20;
/// Appends in flight to one follower before waiting for acknowledgements (etcd: 512).
pub const APPENDS_IN_FLIGHT_MAX: usize = 512;
/// How long a proposal or read waits for a leader to be known (during an election, or
/// just after this member started) before it is refused with "no leader": two election
/// timeouts, time for one election and a retry.
pub const LEADERLESS_WAIT_ELECTIONS: u32 = 2;

/// How long a ReadIndex round may wait for its answer before its readers are told to retry:
/// raft-rs drops rounds silently when leadership changes.
pub const READ_ROUND_TIMEOUT: Duration = Duration::from_secs(3);

/// etcd allows one learner at a time (`maxLearners`): a learner is a member on its way in,
/// and two at once on a three-box appliance means a botched replacement.
pub const LEARNERS_MAX: usize = 1;
/// A learner is promoted only once it holds this share of the leader's log (etcd's
/// `readyPercent`): promoting a learner far behind would stall commits until it caught up.
pub const LEARNER_READY_PERCENT: u64 = 90;
/// Written into the raft dir when this member applies its own removal: a removed member must
/// not come back with its old identity (its vote and log are no longer the cluster's).
pub const REMOVED_MARKER: &str = "removed";
/// Name of the directory (inside the raft dir) that holds incoming snapshot files.
pub const SNAPSHOT_DIR: &str = "snap";

/// A linearizable reader waiting for the read index of its round.
type ReadWaiter = oneshot::Sender<Result<u64, StoreError>>;

enum NodeMsg {
    /// From the transport: peer messages, snapshot outcomes, forwarded requests.
    Received(Box<Received>),
    Propose {
        command: Command,
        reply: Reply,
    },
    ReadIndex(oneshot::Sender<Result<u64, StoreError>>),
    /// A lease renewal by our clients, passed to the leader when we follow.
    RenewLease(i64),
    /// A membership change asked for by a client of this member.
    Membership {
        change: MembershipChange,
        reply: Reply,
    },
    /// Stop; a leader first hands leadership to the most up-to-date follower (waiting at
    /// most one election timeout), so that a rolling restart costs no election.
    Stop {
        transfer: bool,
    },
}

/// What other threads can see of the node.
#[derive(Debug, Default)]
struct Shared {
    status: RwLock<ReplicaStatus>,
    /// This member was removed from the cluster; its Raft has stopped.
    removed: std::sync::atomic::AtomicBool,
}

/// The handle the store and the gRPC services use: submits proposals and reads.
#[derive(Clone)]
pub struct RaftHandle {
    tx: SyncSender<NodeMsg>,
    shared: Arc<Shared>,
    id: u64,
}

impl RaftHandle {
    pub fn id(&self) -> u64 {
        self.id
    }

    fn send(&self, msg: NodeMsg) -> Result<(), NodeMsg> {
        match self.tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(msg)) | Err(TrySendError::Disconnected(msg)) => Err(msg),
        }
    }
}

impl Replicator for RaftHandle {
    fn submit(&self, command: Command, reply: Reply) {
        if let Err(NodeMsg::Propose { reply, .. }) = self.send(NodeMsg::Propose { command, reply })
        {
            let _ = reply.send(Err(StoreError::Timeout));
        }
    }

    fn read_index(&self, reply: oneshot::Sender<Result<u64, StoreError>>) {
        if let Err(NodeMsg::ReadIndex(reply)) = self.send(NodeMsg::ReadIndex(reply)) {
            let _ = reply.send(Err(StoreError::Timeout));
        }
    }

    fn status(&self) -> ReplicaStatus {
        *self.shared.status.read()
    }

    fn renew_lease(&self, id: i64) {
        // Best effort: a renewal lost to a full queue is repeated by the client's next one.
        let _ = self.send(NodeMsg::RenewLease(id));
    }

    fn change_membership(&self, change: MembershipChange, reply: Reply) {
        if let Err(NodeMsg::Membership { reply, .. }) =
            self.send(NodeMsg::Membership { change, reply })
        {
            let _ = reply.send(Err(StoreError::Timeout));
        }
    }
}

impl RaftHandle {
    /// Whether this member has been removed from the cluster (and its Raft stopped).
    pub fn removed(&self) -> bool {
        self.shared
            .removed
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

/// A running node: its handle and its thread.
pub struct RaftNode {
    handle: RaftHandle,
    thread: Option<JoinHandle<()>>,
    transport: Transport,
    log: RaftLog,
}

impl RaftNode {
    /// Opens the log in `log_dir`, bootstraps it from `cluster` when it is new, starts the
    /// transport (on the current tokio runtime) and the Raft thread, and connects `store` to
    /// it. `store` must have been opened replicated, with this member's identity.
    ///
    /// A new cluster's log starts with one committed membership entry per member (etcd's
    /// bootstrap), so a member added later learns the initial membership from the log or
    /// from a snapshot like everything else. A member joining a running cluster
    /// (`--initial-cluster-state existing`) starts with an empty log and no membership and
    /// waits for the leader to send it one or the other.
    pub async fn start(
        cluster: &ClusterConfig,
        log_dir: &Path,
        store: Store,
    ) -> Result<RaftNode, RaftError> {
        let log = RaftLog::open(log_dir)?;
        if !log.is_initialized() && log.last_index() == 0 {
            match cluster.state {
                ClusterState::New => bootstrap(&log, cluster)?,
                ClusterState::Existing => {
                    info!("joining a running cluster: waiting for the leader to send the log")
                }
            }
        }
        repair_after_install(&log, &store)?;
        // The store applies only committed entries, so everything it applied is committed,
        // even if the hard state that said so was not synced before a crash.
        let applied = store.applied_index();
        let mut hard = log.hard_state();
        if applied > hard.commit {
            if applied > log.last_index() {
                return Err(RaftError::Corrupt(format!(
                    "the store applied entry {applied} but the log ends at {}",
                    log.last_index()
                )));
            }
            hard.commit = applied;
            log.persist(&[], Some(&hard), true)?;
        }
        // Membership takes effect when applied: start from the store's (as of its applied
        // index); the entries after it apply their changes again.
        if let Some(bytes) = store.conf_state()? {
            let conf = ConfState::parse_from_bytes(&bytes)
                .map_err(|e| RaftError::Corrupt(format!("store's conf state: {e}")))?;
            if conf != log.conf_state() {
                log.set_conf_state(&conf)?;
            }
        }
        if log_dir.join(REMOVED_MARKER).exists() {
            return Err(RaftError::Config(format!(
                "member {:x} was removed from the cluster; wipe its data dir and add it again \
                 (etcdctl member add, then --initial-cluster-state existing)",
                cluster.id
            )));
        }
        let config = raft::Config {
            id: cluster.id,
            election_tick: cluster.election_ticks(),
            heartbeat_tick: 1,
            applied,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: APPEND_BYTES_MAX,
            max_inflight_msgs: APPENDS_IN_FLIGHT_MAX,
            ..Default::default()
        };
        config
            .validate()
            .map_err(|e| RaftError::Config(format!("raft: {e}")))?;
        let outgoing = OutgoingSnapshots::default();
        let storage = NodeStorage {
            log: log.clone(),
            store: store.clone(),
            outgoing: outgoing.clone(),
        };
        let raw = RawNode::new(&config, storage, &crate::logger::logger())
            .map_err(|e| RaftError::Raft(e.to_string()))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(NODE_QUEUE_MAX);
        let inbound_tx = tx.clone();
        let inbound: crate::transport::Inbound = Arc::new(move |received: Received| {
            let msg = NodeMsg::Received(Box::new(received));
            !matches!(inbound_tx.try_send(msg), Err(TrySendError::Disconnected(_)))
        });
        let snap_dir = log_dir.join(SNAPSHOT_DIR);
        // Leftovers of transfers a crash interrupted.
        if let Ok(entries) = std::fs::read_dir(&snap_dir) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let directory_store = store.clone();
        let cluster_id = cluster.cluster_id;
        let directory: crate::transport::JoinDirectory = Arc::new(move |url: &str| {
            let members = directory_store.members().ok()?;
            if members.is_empty() {
                return None;
            }
            let member_id = members
                .iter()
                .find(|m| m.peer_urls.iter().any(|u| u == url))
                .map_or(0, |m| m.id);
            Some(JoinAnswer {
                cluster_id,
                member_id,
                members: members
                    .iter()
                    .filter_map(|m| m.peer_urls.first().map(|u| (m.id, u.clone())))
                    .collect(),
            })
        });
        let mut peers = cluster.peer_addrs()?;
        for member in store.members()? {
            if member.id == cluster.id || peers.iter().any(|(id, _)| *id == member.id) {
                continue;
            }
            if let Some(url) = member.peer_urls.first() {
                peers.push((member.id, crate::config::peer_addr(url, "member list")?));
            }
        }
        let transport = Transport::start(
            cluster.cluster_id,
            cluster.id,
            cluster.listen_peer,
            peers,
            inbound,
            match (&cluster.peer_tls, cluster.peer_https) {
                (Some(tls), true) => Some(tls.clone()),
                (None, false) => None,
                _ => {
                    return Err(RaftError::Config(
                        "https:// peer URLs and the peer TLS files go together".into(),
                    ));
                }
            },
            SnapshotSetup {
                dir: snap_dir,
                outgoing,
                directory,
            },
        )
        .await?;
        let shared = Arc::new(Shared::default());
        let handle = RaftHandle {
            tx,
            shared: shared.clone(),
            id: cluster.id,
        };
        store.set_replicator(Arc::new(handle.clone()));
        let compacted_at = log.first_index().saturating_sub(1).max(applied);
        let mut driver = Driver {
            raw,
            log,
            rx,
            transport: transport.clone(),
            store,
            shared,
            id: cluster.id,
            cluster_id: cluster.cluster_id,
            peer_https: cluster.peer_https,
            tick_every: cluster.heartbeat,
            next_proposal: 1,
            pending: HashMap::new(),
            read_waiters: Vec::new(),
            read_rounds: HashMap::new(),
            next_round: 1,
            leader: 0,
            term: 0,
            stopping: None,
            leaderless: Vec::new(),
            suspect: None,
            renewals: Vec::new(),
            election: cluster.election,
            snapshot_count: cluster.snapshot_count.max(1),
            catchup_entries: cluster.snapshot_catchup_entries,
            compacted_at,
            removed: false,
            log_dir: log_dir.to_path_buf(),
        };
        let log = driver.log.clone();
        let thread = std::thread::Builder::new()
            .name("skerry-raft".into())
            .spawn(move || driver.run())
            .map_err(|e| RaftError::Raft(format!("cannot start the raft thread: {e}")))?;
        Ok(RaftNode {
            handle,
            thread: Some(thread),
            transport,
            log,
        })
    }

    pub fn handle(&self) -> RaftHandle {
        self.handle.clone()
    }

    /// The first entry the log still holds: entries before it were compacted away, and a
    /// member that needs them gets a snapshot.
    pub fn log_first_index(&self) -> u64 {
        self.log.first_index()
    }

    /// Fault injection for tests and the torture suite: drops all traffic between this member
    /// and `peers` (member ids), as a network partition would; `&[]` heals. A partition
    /// between two members is two calls, one on each side.
    pub fn cut_off(&self, peers: &[u64]) {
        self.transport.cut(peers);
    }

    /// Stops the Raft thread and waits for it. A leader hands leadership over first (see
    /// [`RaftNode::stop_gracefully`] for the rolling-restart path); this one does not wait.
    pub fn stop(mut self) {
        self.stop_inner(false);
    }

    /// Stops after handing leadership to the most up-to-date follower, if this member leads:
    /// the others need not wait an election timeout to notice it is gone (SIGTERM).
    pub fn stop_gracefully(mut self) {
        self.stop_inner(true);
    }

    fn stop_inner(&mut self, transfer: bool) {
        let _ = self.handle.tx.send(NodeMsg::Stop { transfer });
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.transport.shutdown();
    }
}

impl Drop for RaftNode {
    fn drop(&mut self) {
        self.stop_inner(false);
    }
}

struct Driver {
    raw: RawNode<NodeStorage>,
    log: RaftLog,
    rx: Receiver<NodeMsg>,
    transport: Transport,
    store: Store,
    shared: Arc<Shared>,
    id: u64,
    tick_every: Duration,
    next_proposal: u64,
    /// Replies of clients on this member, by proposal id, until their entry is applied.
    pending: HashMap<u64, Reply>,
    /// Readers waiting for the next ReadIndex round.
    read_waiters: Vec<ReadWaiter>,
    /// Rounds started and not yet answered, by round id: when each started, and its readers.
    read_rounds: HashMap<u64, (Instant, Vec<ReadWaiter>)>,
    next_round: u64,
    leader: u64,
    term: u64,
    /// Stopping after a leadership transfer: stop once leadership moved or at this instant.
    stopping: Option<Instant>,
    /// Proposals and reads that arrived while no leader was known, with their arrival.
    leaderless: Vec<(Instant, NodeMsg)>,
    /// The leader whose connection to us dropped: campaign every tick until another leads.
    suspect: Option<u64>,
    /// Lease renewals by our clients, passed on to the leader once per loop turn.
    renewals: Vec<i64>,
    election: Duration,
    cluster_id: u64,
    peer_https: bool,
    /// Compact the log every this many applied entries ...
    snapshot_count: u64,
    /// ... keeping this many below the applied index.
    catchup_entries: u64,
    /// The applied index at the last compaction.
    compacted_at: u64,
    /// This member applied its own removal: stop.
    removed: bool,
    log_dir: std::path::PathBuf,
}

/// A proposal's (or ReadIndex round's) context: the member and its proposal (round) id.
fn proposal_context(member: u64, proposal: u64) -> Vec<u8> {
    let mut ctx = member.to_le_bytes().to_vec();
    ctx.extend_from_slice(&proposal.to_le_bytes());
    ctx
}

fn parse_context(ctx: &[u8]) -> Option<(u64, u64)> {
    if ctx.len() != 16 {
        return None;
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&ctx[..8]);
    let member = u64::from_le_bytes(word);
    word.copy_from_slice(&ctx[8..]);
    Some((member, u64::from_le_bytes(word)))
}

/// Writes a new cluster's first entries: one committed membership change per member, in
/// id order, at term 1, identical on every member (they derive the same ids from the same
/// flags). Each carries the member's record (id, name, peer URLs) so the store's member list
/// and a later member's transport learn them from the log.
fn bootstrap(log: &RaftLog, cluster: &ClusterConfig) -> Result<(), RaftError> {
    let mut entries = Vec::with_capacity(cluster.members.len());
    for (i, member) in cluster.members.values().enumerate() {
        let record = MemberRecord {
            id: member.id,
            name: member.name.clone(),
            peer_urls: member.peer_urls.clone(),
            ..Default::default()
        };
        let mut cc = ConfChange::default();
        cc.set_change_type(ConfChangeType::AddNode);
        cc.node_id = member.id;
        cc.context = conf_change_context(0, 0, &record).into();
        let mut entry = Entry::default();
        entry.set_entry_type(EntryType::EntryConfChange);
        entry.index = i as u64 + 1;
        entry.term = 1;
        entry.data = cc
            .write_to_bytes()
            .map_err(|e| RaftError::Raft(format!("encode: {e}")))?
            .into();
        entries.push(entry);
    }
    let hard = HardState {
        term: 1,
        commit: entries.len() as u64,
        ..Default::default()
    };
    log.persist(&entries, Some(&hard), true)?;
    let conf = ConfState {
        voters: cluster.members.keys().copied().collect(),
        ..Default::default()
    };
    log.set_conf_state(&conf)?;
    info!(members = conf.voters.len(), "bootstrapped a new cluster");
    Ok(())
}

/// A crash between the store installing a snapshot and the log recording it leaves the store
/// ahead of the log: finish the log's part from what the store recorded.
fn repair_after_install(log: &RaftLog, store: &Store) -> Result<(), RaftError> {
    let Some((index, term)) = store.installed_snapshot()? else {
        return Ok(());
    };
    if index < log.first_index() || log.has_entry(index, term) {
        return Ok(());
    }
    let conf = match store.conf_state()? {
        Some(bytes) => ConfState::parse_from_bytes(&bytes)
            .map_err(|e| RaftError::Corrupt(format!("store's conf state: {e}")))?,
        None => {
            return Err(RaftError::Corrupt(
                "installed snapshot without membership".into(),
            ));
        }
    };
    warn!(
        index,
        term, "finishing a snapshot install a crash interrupted"
    );
    log.apply_snapshot(index, term, &conf)
}

/// A membership entry's context: the proposing member and its proposal id (as for commands),
/// then the record of the member the change is about.
fn conf_change_context(member: u64, proposal: u64, record: &MemberRecord) -> Vec<u8> {
    let mut ctx = proposal_context(member, proposal);
    ctx.extend_from_slice(&record.encode_to_vec());
    ctx
}

fn parse_conf_change_context(ctx: &[u8]) -> Option<((u64, u64), MemberRecord)> {
    if ctx.len() < 16 {
        return None;
    }
    let origin = parse_context(&ctx[..16])?;
    let record = MemberRecord::decode(&ctx[16..]).ok()?;
    Some((origin, record))
}

fn in_conf(conf: &ConfState, id: u64) -> bool {
    conf.voters.contains(&id) || conf.learners.contains(&id)
}

/// raft-rs's view of the log and of snapshots: the log for entries and states, the store
/// for snapshots. A snapshot is the store as one read transaction sees it, pinned until the
/// transport has streamed it: its index is the store's applied index in that transaction,
/// its membership the one the store recorded with it.
#[derive(Clone)]
struct NodeStorage {
    log: RaftLog,
    store: Store,
    outgoing: OutgoingSnapshots,
}

impl Storage for NodeStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.log.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.log.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.log.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Storage::first_index(&self.log)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Storage::last_index(&self.log)
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let unavailable = || raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable);
        let pinned = match self.store.pin_snapshot() {
            Ok(pinned) => pinned,
            Err(e) => {
                warn!(error = %e, "cannot read the store for a snapshot");
                return Err(unavailable());
            }
        };
        let index = pinned.applied_index;
        if index == 0 || index < request_index {
            return Err(unavailable());
        }
        let term = self.log.term(index).map_err(|_| unavailable())?;
        let Some(conf) = pinned
            .conf_state
            .as_deref()
            .and_then(|b| ConfState::parse_from_bytes(b).ok())
        else {
            return Err(unavailable());
        };
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = index;
        snap.mut_metadata().term = term;
        snap.mut_metadata().set_conf_state(conf);
        // The data travels on the snapshot stream; the message names what it carries.
        snap.data = format!(
            "skerry store at index {index}, revision {}",
            pinned.revision
        )
        .into_bytes()
        .into();
        info!(
            to = format_args!("{to:x}"),
            index,
            revision = pinned.revision,
            "pinned the store for a snapshot"
        );
        self.outgoing.lock().insert(to, pinned);
        Ok(snap)
    }
}

impl Driver {
    fn run(&mut self) {
        let mut next_tick = Instant::now() + self.tick_every;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(NodeMsg::Stop { transfer }) => {
                    if !self.begin_stop(transfer) {
                        break;
                    }
                }
                Ok(msg) => self.handle(msg),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let mut stop = false;
            for _ in 0..MESSAGES_PER_TURN_MAX {
                match self.rx.try_recv() {
                    Ok(NodeMsg::Stop { transfer }) => {
                        if !self.begin_stop(transfer) {
                            stop = true;
                            break;
                        }
                    }
                    Ok(msg) => self.handle(msg),
                    Err(_) => break,
                }
            }
            if stop {
                break;
            }
            self.start_read_round();
            if !self.renewals.is_empty() && self.leader != 0 {
                let ids = std::mem::take(&mut self.renewals);
                self.transport.send_lease_renewals(self.leader, ids);
            }
            let now = Instant::now();
            if now >= next_tick {
                self.raw.tick();
                self.campaign_if_leader_gone();
                next_tick += self.tick_every;
                if next_tick < now {
                    // The thread was held up for several ticks: do not replay them in a burst.
                    next_tick = now + self.tick_every;
                }
                self.expire();
            }
            if let Err(e) = self.on_ready() {
                error!(error = %e, "raft loop failed; stopping this member's raft");
                break;
            }
            if self.removed {
                let marker = self.log_dir.join(REMOVED_MARKER);
                if let Err(e) = std::fs::write(&marker, b"removed from the cluster\n") {
                    warn!(error = %e, path = %marker.display(), "cannot record the removal");
                }
                self.shared
                    .removed
                    .store(true, std::sync::atomic::Ordering::Release);
                error!("this member was removed from the cluster; stopping its raft");
                break;
            }
            if let Some(deadline) = self.stopping
                && (self.raw.raft.state != StateRole::Leader || Instant::now() >= deadline)
            {
                if self.raw.raft.state == StateRole::Leader {
                    warn!("leadership transfer did not finish in time; stopping anyway");
                } else {
                    info!(
                        leader = format_args!("{:x}", self.raw.raft.leader_id),
                        "handed leadership over; stopping"
                    );
                }
                break;
            }
        }
        for (_, reply) in self.pending.drain() {
            let _ = reply.send(Err(StoreError::Stopped));
        }
        info!("raft thread stopped");
    }

    fn handle(&mut self, msg: NodeMsg) {
        match msg {
            NodeMsg::Received(received) => self.received(*received),
            msg
            @ (NodeMsg::Propose { .. } | NodeMsg::ReadIndex(_) | NodeMsg::Membership { .. })
                if self.leader == 0 =>
            {
                // Held until a leader is known rather than refused at once: an election (or
                // this member's start) takes about one election timeout.
                self.leaderless.push((Instant::now(), msg));
            }
            NodeMsg::Propose { command, reply } => self.propose(command, reply),
            NodeMsg::ReadIndex(reply) => self.read_waiters.push(reply),
            NodeMsg::Membership { change, reply } => {
                let proposal = self.next_proposal;
                self.next_proposal += 1;
                if self.raw.raft.state == StateRole::Leader {
                    match self.propose_membership(self.id, proposal, change) {
                        Ok(()) => {
                            self.pending.insert(proposal, reply);
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                } else if self
                    .transport
                    .forward_membership(self.leader, proposal, change)
                {
                    self.pending.insert(proposal, reply);
                } else {
                    let _ = reply.send(Err(StoreError::NoLeader));
                }
            }
            NodeMsg::RenewLease(id) => {
                if self.leader != 0 && self.leader != self.id {
                    self.renewals.push(id);
                }
            }
            NodeMsg::Stop { .. } => {}
        }
    }

    fn received(&mut self, received: Received) {
        match received {
            Received::Message(m) => {
                if Some(m.from) == self.suspect {
                    // It speaks: alive after all (a broken link, since mended).
                    self.suspect = None;
                }
                let snapshot_file = (m.get_msg_type() == MessageType::MsgSnapshot).then(|| {
                    std::path::PathBuf::from(
                        String::from_utf8_lossy(&m.get_snapshot().data).into_owned(),
                    )
                });
                // Messages from unknown members or stale terms are refused by raft-rs; that
                // is routine, not an error worth more than debug.
                if let Err(e) = self.raw.step(m) {
                    tracing::debug!(error = %e, "raft refused a message");
                }
                if let Some(path) = snapshot_file {
                    // A snapshot raft-rs did not take (stale, or not for a member of its
                    // membership) will not be installed: its file goes now.
                    let taken = self
                        .raw
                        .raft
                        .raft_log
                        .unstable_snapshot()
                        .as_ref()
                        .is_some_and(|snap| {
                            snap.data.as_ref() == path.to_string_lossy().as_bytes()
                        });
                    if !taken {
                        info!(path = %path.display(), "raft-rs passed over a snapshot; dropping it");
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            Received::LeaseRenewals(ids) => {
                for id in ids {
                    self.store.lease_renewed_elsewhere(id);
                }
            }
            Received::PeerDown(peer) => {
                if peer == self.leader && self.raw.raft.state != StateRole::Leader {
                    info!(
                        leader = format_args!("{peer:x}"),
                        "the leader's connection closed; campaigning as soon as the others agree"
                    );
                    self.suspect = Some(peer);
                }
            }
            Received::SnapshotSent { peer, ok } => {
                let status = if ok {
                    raft::SnapshotStatus::Finish
                } else {
                    raft::SnapshotStatus::Failure
                };
                self.raw.report_snapshot(peer, status);
            }
            Received::Membership {
                from,
                proposal,
                change,
            } => {
                let result = if self.raw.raft.state == StateRole::Leader {
                    self.propose_membership(from, proposal, change)
                } else {
                    Err(StoreError::LeaderChanged)
                };
                if let Err(e) = result {
                    self.transport
                        .refuse_membership(from, proposal, e.to_string());
                }
            }
            Received::MembershipRefused { proposal, reason } => {
                if let Some(reply) = self.pending.remove(&proposal) {
                    let _ = reply.send(Err(membership_error(&reason)));
                }
            }
        }
    }

    /// Validates a membership change as etcd's leader does and proposes it as a Raft
    /// configuration change whose context names the member and proposal to answer.
    fn propose_membership(
        &mut self,
        origin: u64,
        proposal: u64,
        change: MembershipChange,
    ) -> Result<(), StoreError> {
        if self.raw.raft.has_pending_conf() {
            return Err(StoreError::Unsupported(
                "etcdserver: a membership change is already in progress; retry".into(),
            ));
        }
        let conf = self.raw.raft.prs().conf().to_conf_state();
        let members = self.store.members()?;
        let me = self.id;
        let prs = self.raw.raft.prs();
        // Voters heard from within the last election timeout (check-quorum keeps this
        // current), this leader included: etcd's "started" members.
        let active = |except: u64| {
            conf.voters
                .iter()
                .filter(|id| **id != except)
                .filter(|id| **id == me || prs.get(**id).is_some_and(|p| p.recent_active))
                .count()
        };
        let quorum = |voters: usize| voters / 2 + 1;
        let (change_type, record) = match change {
            MembershipChange::Add { peer_urls, learner } => {
                if peer_urls.is_empty() {
                    return Err(StoreError::MemberBadUrls);
                }
                for url in &peer_urls {
                    let scheme_ok = url.starts_with("https://") == self.peer_https;
                    if !scheme_ok || crate::config::peer_addr(url, "peer URL").is_err() {
                        return Err(StoreError::MemberBadUrls);
                    }
                }
                if members
                    .iter()
                    .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)))
                {
                    return Err(StoreError::PeerUrlExists);
                }
                if learner && conf.learners.len() >= LEARNERS_MAX {
                    return Err(StoreError::TooManyLearners);
                }
                if !learner && active(0) < quorum(conf.voters.len() + 1) {
                    return Err(StoreError::NotEnoughStarted);
                }
                let id = self.new_member_id(&peer_urls, &conf);
                let change_type = if learner {
                    ConfChangeType::AddLearnerNode
                } else {
                    ConfChangeType::AddNode
                };
                (
                    change_type,
                    MemberRecord {
                        id,
                        peer_urls,
                        is_learner: learner,
                        ..Default::default()
                    },
                )
            }
            MembershipChange::Promote { id } => {
                if conf.voters.contains(&id) {
                    return Err(StoreError::MemberNotLearner);
                }
                if !conf.learners.contains(&id) {
                    return Err(StoreError::MemberNotFound);
                }
                let matched = prs.get(id).map_or(0, |p| p.matched);
                let last = self.raw.raft.raft_log.last_index();
                if matched * 100 < last * LEARNER_READY_PERCENT {
                    return Err(StoreError::LearnerNotReady);
                }
                (
                    ConfChangeType::AddNode,
                    MemberRecord {
                        id,
                        ..Default::default()
                    },
                )
            }
            MembershipChange::Remove { id } => {
                if !in_conf(&conf, id) {
                    return Err(StoreError::MemberNotFound);
                }
                if conf.voters.contains(&id) && active(id) < quorum(conf.voters.len() - 1) {
                    return Err(StoreError::NotEnoughStarted);
                }
                (
                    ConfChangeType::RemoveNode,
                    MemberRecord {
                        id,
                        ..Default::default()
                    },
                )
            }
        };
        let mut single = ConfChangeSingle::default();
        single.set_change_type(change_type);
        single.node_id = record.id;
        let mut cc = ConfChangeV2::default();
        cc.mut_changes().push(single);
        info!(
            member = format_args!("{:x}", record.id),
            change = ?change_type,
            "proposing a membership change"
        );
        self.raw
            .propose_conf_change(conf_change_context(origin, proposal, &record), cc)
            .map_err(|e| match e {
                raft::Error::ProposalDropped => StoreError::NoLeader,
                other => StoreError::Storage(format!("raft: {other}")),
            })
    }

    /// A fresh member id: from the peer URLs, the cluster and the time, as etcd's `member add`
    /// does, so a member removed and added again at the same URL is a new member.
    fn new_member_id(&self, peer_urls: &[String], conf: &ConfState) -> u64 {
        let mut urls = peer_urls.to_vec();
        urls.sort();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut salt = 0u64;
        loop {
            let token = format!("{:x}/{nanos}/{salt}", self.cluster_id);
            let id = crate::config::member_id(&urls, &token);
            if !in_conf(conf, id) && id != self.id {
                return id;
            }
            salt += 1;
        }
    }

    /// Fast failover: the leader's process is gone (its connection closed), so rather than
    /// wait out a randomized election timeout (1-2 s by default), stand for election at every
    /// tick. Pre-vote keeps this harmless: the others refuse while they still hear from a
    /// leader (their lease, one election timeout), so a live leader is never disturbed, and
    /// once their lease lapses the first pre-vote wins.
    fn campaign_if_leader_gone(&mut self) {
        let Some(suspect) = self.suspect else {
            return;
        };
        let leader = self.raw.raft.leader_id;
        if (leader != 0 && leader != suspect) || self.raw.raft.state == StateRole::Leader {
            self.suspect = None;
            return;
        }
        if let Err(e) = self.raw.campaign() {
            tracing::debug!(error = %e, "campaign refused");
        }
    }

    /// Starts stopping. Returns true while the loop must go on (a leadership transfer is under
    /// way), false to stop now.
    fn begin_stop(&mut self, transfer: bool) -> bool {
        if self.stopping.is_some() {
            return true;
        }
        if !transfer || self.raw.raft.state != StateRole::Leader {
            return false;
        }
        // The follower with the most of the log takes over soonest.
        let me = self.id;
        let best = self
            .raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != me)
            .max_by_key(|(_, progress)| progress.matched)
            .map(|(id, _)| *id);
        let Some(transferee) = best else {
            return false;
        };
        info!(
            to = format_args!("{transferee:x}"),
            "stopping: handing leadership over"
        );
        self.raw.transfer_leader(transferee);
        self.stopping = Some(Instant::now() + self.election);
        true
    }

    fn propose(&mut self, command: Command, reply: Reply) {
        let id = self.next_proposal;
        self.next_proposal += 1;
        let data = command.encode_to_vec();
        match self.raw.propose(proposal_context(self.id, id), data) {
            Ok(()) => {
                self.pending.insert(id, reply);
            }
            Err(raft::Error::ProposalDropped) => {
                let _ = reply.send(Err(StoreError::NoLeader));
            }
            Err(e) => {
                let _ = reply.send(Err(StoreError::Storage(format!("raft: {e}"))));
            }
        }
    }

    /// One ReadIndex round for every reader that arrived since the last one.
    fn start_read_round(&mut self) {
        if self.read_waiters.is_empty() {
            return;
        }
        let round = self.next_round;
        self.next_round += 1;
        let waiters = std::mem::take(&mut self.read_waiters);
        // The leader keeps pending reads by context and ignores a context it already holds,
        // so rounds of different members must never share one: the member id goes in too.
        self.raw.read_index(proposal_context(self.id, round));
        self.read_rounds.insert(round, (Instant::now(), waiters));
    }

    /// Answers rounds raft-rs dropped, and forgets proposals whose callers gave up.
    fn expire(&mut self) {
        let now = Instant::now();
        self.read_rounds.retain(|_, (started, waiters)| {
            if now.duration_since(*started) < READ_ROUND_TIMEOUT {
                return true;
            }
            for w in waiters.drain(..) {
                let _ = w.send(Err(StoreError::Timeout));
            }
            false
        });
        self.pending.retain(|_, reply| !reply.is_closed());
        let wait = self.election * LEADERLESS_WAIT_ELECTIONS;
        let (expired, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.leaderless)
            .into_iter()
            .partition(|(arrived, _)| now.duration_since(*arrived) >= wait);
        self.leaderless = waiting;
        for (_, msg) in expired {
            match msg {
                NodeMsg::Propose { reply, .. } => {
                    let _ = reply.send(Err(StoreError::NoLeader));
                }
                NodeMsg::ReadIndex(reply) => {
                    let _ = reply.send(Err(StoreError::NoLeader));
                }
                NodeMsg::Membership { reply, .. } => {
                    let _ = reply.send(Err(StoreError::NoLeader));
                }
                _ => {}
            }
        }
    }

    fn send(&mut self, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        for peer in self.transport.send(messages) {
            self.raw.report_unreachable(peer);
        }
    }

    fn observe_leadership(&mut self) {
        let leader = self.raw.raft.leader_id;
        let term = self.raw.raft.term;
        let is_leader = self.raw.raft.state == StateRole::Leader;
        if leader != self.leader || term != self.term {
            if leader != self.leader {
                info!(
                    leader = format_args!("{leader:x}"),
                    term,
                    me = is_leader,
                    "raft leader changed"
                );
            }
            if term != self.term && self.term != 0 {
                // Proposals made under the old term may have died with its leader; their
                // callers hear so now instead of at their timeout (the entry may still be
                // committed by the new leader: the outcome is unknown, as etcd says).
                for (_, reply) in self.pending.drain() {
                    let _ = reply.send(Err(StoreError::LeaderChanged));
                }
            }
            self.leader = leader;
            self.term = term;
            self.store.set_leadership(is_leader, term);
            if leader != 0 {
                for (_, msg) in std::mem::take(&mut self.leaderless) {
                    self.handle(msg);
                }
            }
            if leader == 0 {
                // Rounds started under the old leader will not be answered.
                for (_, (_, waiters)) in self.read_rounds.drain() {
                    for w in waiters {
                        let _ = w.send(Err(StoreError::NoLeader));
                    }
                }
            }
        }
        let mut status = self.shared.status.write();
        status.leader = leader;
        status.term = term;
        status.commit_index = self.raw.raft.raft_log.committed;
    }

    fn on_ready(&mut self) -> Result<(), RaftError> {
        if !self.raw.has_ready() {
            self.observe_leadership();
            return Ok(());
        }
        let mut rd = self.raw.ready();
        self.send(rd.take_messages());
        if !rd.snapshot().is_empty() {
            self.install_snapshot(rd.snapshot().clone())?;
        }
        let committed = rd.take_committed_entries();
        self.apply(committed)?;
        self.log.persist(rd.entries(), rd.hs(), rd.must_sync())?;
        self.send(rd.take_persisted_messages());
        for state in rd.take_read_states() {
            let Some((member, round)) = parse_context(&state.request_ctx) else {
                continue;
            };
            if member != self.id {
                continue;
            }
            if let Some((_, waiters)) = self.read_rounds.remove(&round) {
                for w in waiters {
                    let _ = w.send(Ok(state.index));
                }
            }
        }
        let mut light = self.raw.advance(rd);
        self.send(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(committed)?;
        self.raw.advance_apply();
        self.observe_leadership();
        self.maybe_compact()?;
        Ok(())
    }

    /// Installs a snapshot from the leader: the store first (its data replaced and durable,
    /// with the snapshot's index and term recorded), then the log (dropped up to the
    /// snapshot, which becomes its floor). A crash in between is finished at the next start
    /// from what the store recorded. Only this member's own loop waits meanwhile; the others
    /// go on without it.
    fn install_snapshot(&mut self, snap: Snapshot) -> Result<(), RaftError> {
        let meta = snap.get_metadata();
        let (index, term) = (meta.index, meta.term);
        let path = std::path::PathBuf::from(String::from_utf8_lossy(&snap.data).into_owned());
        let started = Instant::now();
        self.store.install_snapshot(&path, index, term)?;
        self.log
            .apply_snapshot(index, term, meta.get_conf_state())?;
        let _ = std::fs::remove_file(&path);
        self.compacted_at = index;
        self.sync_peers()?;
        info!(
            index,
            term,
            revision = self.store.revision(),
            ms = started.elapsed().as_millis() as u64,
            "installed a snapshot from the leader"
        );
        Ok(())
    }

    /// Points the transport at every member the store lists (after a snapshot replaced the
    /// member list), and away from members no longer in it.
    fn sync_peers(&mut self) -> Result<(), RaftError> {
        let members = self.store.members()?;
        for member in &members {
            if let Some(url) = member.peer_urls.first()
                && let Ok(addr) = crate::config::peer_addr(url, "member list")
            {
                self.transport.add_peer(member.id, addr);
            }
        }
        for peer in self.transport.peer_ids() {
            if !members.iter().any(|m| m.id == peer) {
                self.transport.remove_peer(peer);
            }
        }
        Ok(())
    }

    /// Compacts the log once `snapshot_count` entries were applied since the last time,
    /// keeping `catchup_entries` below the applied index for followers a little behind, and
    /// never dropping an entry the store has not made durable (it would replay it after a
    /// crash).
    fn maybe_compact(&mut self) -> Result<(), RaftError> {
        let applied = self.raw.raft.raft_log.applied;
        if applied < self.compacted_at + self.snapshot_count {
            return Ok(());
        }
        let floor = applied
            .saturating_sub(self.catchup_entries)
            .min(self.store.durable_applied_index());
        if floor < self.log.first_index() {
            // The store's durable point lags; try again after its next checkpoint.
            return Ok(());
        }
        let before = self.log.first_index();
        self.log.compact(floor + 1)?;
        self.compacted_at = applied;
        info!(
            applied,
            dropped = floor + 1 - before,
            first_index = self.log.first_index(),
            "compacted the raft log"
        );
        Ok(())
    }

    /// Hands committed entries to the store in order, with the replies of this member's
    /// clients; applies membership changes to raft-rs.
    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), RaftError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut batch = Vec::with_capacity(entries.len());
        for entry in entries {
            let index = entry.index;
            match entry.entry_type {
                EntryType::EntryNormal => {
                    if entry.data.is_empty() {
                        batch.push(Committed {
                            index,
                            command: None,
                            reply: None,
                        });
                        continue;
                    }
                    let reply = match parse_context(&entry.context) {
                        Some((member, proposal)) if member == self.id => {
                            self.pending.remove(&proposal)
                        }
                        _ => None,
                    };
                    let command = match Command::decode(entry.data.as_ref()) {
                        // Membership reaches the store only from configuration entries.
                        Ok(Command {
                            command: Some(Cmd::Membership(_)),
                        }) => {
                            warn!(index, "a normal log entry carries a membership command");
                            None
                        }
                        Ok(command) => Some(command),
                        Err(e) => {
                            // Every member refuses the same bytes the same way, so the
                            // stores stay equal; the entry only takes its index.
                            warn!(index, error = %e, "log entry is not a command");
                            None
                        }
                    };
                    batch.push(Committed {
                        index,
                        command,
                        reply,
                    });
                }
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    let (command, reply) = self.apply_conf_change(&entry)?;
                    batch.push(Committed {
                        index,
                        command,
                        reply,
                    });
                }
            }
        }
        self.store.apply_committed(batch)?;
        Ok(())
    }

    /// Applies a membership change entry (either encoding) to raft-rs, persists the resulting
    /// membership, points the transport at a new member, and returns the store's command for
    /// it (the membership and the member's record, applied with the entry's index) with the
    /// reply of this member's client that asked for it.
    fn apply_conf_change(
        &mut self,
        entry: &Entry,
    ) -> Result<(Option<Command>, Option<Reply>), RaftError> {
        let corrupt = |e: protobuf::ProtobufError| {
            RaftError::Corrupt(format!("conf change {}: {e}", entry.index))
        };
        let cc: ConfChangeV2 = if entry.get_entry_type() == EntryType::EntryConfChange {
            let mut v1 = ConfChange::parse_from_bytes(&entry.data).map_err(corrupt)?;
            // A v1 change carries its context inside; move it out so both read alike.
            let context = v1.take_context();
            let mut v2 = raft_proto::ConfChangeI::into_v2(v1);
            v2.context = context;
            v2
        } else {
            ConfChangeV2::parse_from_bytes(&entry.data).map_err(corrupt)?
        };
        let context = if cc.context.is_empty() {
            entry.context.as_ref()
        } else {
            cc.context.as_ref()
        };
        let parsed = parse_conf_change_context(context);
        let conf = self
            .raw
            .apply_conf_change(&cc)
            .map_err(|e| RaftError::Raft(e.to_string()))?;
        self.log.set_conf_state(&conf)?;
        let mut membership = Membership {
            conf_state: conf
                .write_to_bytes()
                .map_err(|e| RaftError::Raft(format!("encode: {e}")))?
                .into(),
            ..Default::default()
        };
        for change in cc.get_changes() {
            let id = change.node_id;
            match change.get_change_type() {
                ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                    let mut record = match &parsed {
                        Some((_, record)) if record.id == id => record.clone(),
                        _ => MemberRecord {
                            id,
                            ..Default::default()
                        },
                    };
                    record.is_learner = change.get_change_type() == ConfChangeType::AddLearnerNode;
                    if let Some(url) = record.peer_urls.first()
                        && let Ok(addr) = crate::config::peer_addr(url, "member add")
                    {
                        self.transport.add_peer(id, addr);
                    }
                    info!(
                        member = format_args!("{id:x}"),
                        learner = record.is_learner,
                        index = entry.index,
                        "membership: member added"
                    );
                    membership.upsert.push(record);
                }
                ConfChangeType::RemoveNode => {
                    info!(
                        member = format_args!("{id:x}"),
                        index = entry.index,
                        "membership: member removed"
                    );
                    membership.removed.push(id);
                    if id == self.id {
                        self.removed = true;
                    } else {
                        self.transport.remove_peer(id);
                    }
                }
            }
        }
        let reply = match parsed {
            Some(((member, proposal), _)) if member == self.id && proposal != 0 => {
                self.pending.remove(&proposal)
            }
            _ => None,
        };
        let command = Command {
            command: Some(Cmd::Membership(membership)),
        };
        Ok((Some(command), reply))
    }
}

/// The store error a leader's refusal text stands for (the texts are etcd's, one per error).
fn membership_error(reason: &str) -> StoreError {
    [
        StoreError::MemberNotFound,
        StoreError::PeerUrlExists,
        StoreError::MemberBadUrls,
        StoreError::NotEnoughStarted,
        StoreError::MemberNotLearner,
        StoreError::LearnerNotReady,
        StoreError::TooManyLearners,
        StoreError::NoLeader,
        StoreError::LeaderChanged,
    ]
    .into_iter()
    .find(|e| e.to_string() == reason)
    .unwrap_or_else(|| StoreError::Unsupported(reason.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposal_contexts_round_trip_and_foreign_ones_are_ignored() {
        assert_eq!(
            parse_context(&proposal_context(0xabc, 42)),
            Some((0xabc, 42))
        );
        assert_eq!(parse_context(b"short"), None);
    }
}
