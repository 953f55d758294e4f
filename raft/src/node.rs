//! The Raft node in production: a thread that owns the node's logic ([`crate::core::Core`])
//! and drives it with the real clock, the store, the segment-file log and the TCP transport
//! (the [`Host`] implementation here), and [`RaftHandle`], through which the store submits
//! writes, ReadIndex rounds and membership changes.
//!
//! The node drives the store only through [`StateMachine`] (and connects it to the log through
//! [`Proposer`]): it is generic over them, and the appliance instantiates it with
//! `skerry_store::Store`, whose snapshots arrive as files.
//!
//! The loop takes up to [`MESSAGES_PER_TURN_MAX`] inputs per turn, so a burst of proposals
//! lands in one `Ready` and shares its fsync, ticks every heartbeat interval, and handles the
//! `Ready` at the end of each turn.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use raft::eraftpb::{ConfState, Entry, HardState, Message, Snapshot};
use raft::{GetEntriesContext, RaftState, RawNode, Storage, StorageError};
use skerry_store::StoreError;
use skerry_store::pb::command::{Command, Member as MemberRecord};
use skerry_store::replication::{
    Committed, MembershipChange, Proposer, ReplicaStatus, Replicator, Reply, StateMachine,
};
use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::config::{ClusterConfig, ClusterState};
use crate::core::{
    Core, CoreConfig, Host, Input, bootstrap_entries, snapshot_message, start_repair,
};
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
/// Written into the raft dir when this member applies its own removal: a removed member must
/// not come back with its old identity (its vote and log are no longer the cluster's).
pub const REMOVED_MARKER: &str = "removed";
/// Name of the directory (inside the raft dir) that holds incoming snapshot files.
pub const SNAPSHOT_DIR: &str = "snap";

enum NodeMsg {
    Input(Input),
    /// The log's writer made more Readies durable: the turn collects them.
    Wake,
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
        if let Err(NodeMsg::Input(Input::Propose { reply, .. })) =
            self.send(NodeMsg::Input(Input::Propose { command, reply }))
        {
            let _ = reply.send(Err(StoreError::Timeout));
        }
    }

    fn read_index(&self, reply: oneshot::Sender<Result<u64, StoreError>>) {
        if let Err(NodeMsg::Input(Input::ReadIndex(reply))) =
            self.send(NodeMsg::Input(Input::ReadIndex(reply)))
        {
            let _ = reply.send(Err(StoreError::Timeout));
        }
    }

    fn status(&self) -> ReplicaStatus {
        *self.shared.status.read()
    }

    fn renew_lease(&self, id: i64) {
        // Best effort: a renewal lost to a full queue is repeated by the client's next one.
        let _ = self.send(NodeMsg::Input(Input::RenewLease(id)));
    }

    fn change_membership(&self, change: MembershipChange, reply: Reply) {
        if let Err(NodeMsg::Input(Input::Membership { reply, .. })) =
            self.send(NodeMsg::Input(Input::Membership { change, reply }))
        {
            let _ = reply.send(Err(StoreError::Timeout));
        }
    }

    fn move_leader(&self, target: u64, reply: oneshot::Sender<Result<(), StoreError>>) {
        if let Err(NodeMsg::Input(Input::MoveLeader { reply, .. })) =
            self.send(NodeMsg::Input(Input::MoveLeader { target, reply }))
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
    pub async fn start<S>(
        cluster: &ClusterConfig,
        log_dir: &Path,
        store: S,
    ) -> Result<RaftNode, RaftError>
    where
        S: Proposer + StateMachine<SnapshotSource = Path> + Clone + Send + Sync + 'static,
    {
        let log = RaftLog::open(log_dir)?;
        if !log.is_initialized() && log.last_index() == 0 {
            match cluster.state {
                ClusterState::New => bootstrap(&log, cluster)?,
                ClusterState::Existing => {
                    info!("joining a running cluster: waiting for the leader to send the log")
                }
            }
        }
        let applied = store.applied_index();
        let installed = store.installed_snapshot()?;
        let store_conf = store.conf_state()?;
        let repair =
            log.read(|mem| start_repair(mem, applied, installed, store_conf.as_deref()))?;
        if let Some((index, term, conf)) = &repair.install {
            log.apply_snapshot(*index, *term, conf)?;
        }
        if let Some(commit) = repair.commit {
            let mut hard = log.hard_state();
            hard.commit = commit;
            log.persist(&[], Some(&hard), true)?;
        }
        if let Some(conf) = &repair.conf {
            log.set_conf_state(conf)?;
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
            // Proposals stepped in one turn extend the append already queued for a follower
            // instead of each queuing its own: with 512 appends allowed in flight, 20
            // proposals would otherwise go out as 20 one-entry appends per follower, each
            // encoded, sent, stepped and answered on its own.
            batch_append: true,
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
        let wake_tx = tx.clone();
        log.set_waker(Arc::new(move || {
            // A full queue wakes the loop anyway.
            let _ = wake_tx.try_send(NodeMsg::Wake);
        }));
        let inbound_tx = tx.clone();
        let inbound: crate::transport::Inbound = Arc::new(move |received: Received| {
            let msg = NodeMsg::Input(Input::Received(Box::new(received)));
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
        let core = Core::new(
            &CoreConfig {
                id: cluster.id,
                cluster_id: cluster.cluster_id,
                peer_https: cluster.peer_https,
                election: cluster.election,
                snapshot_count: cluster.snapshot_count,
                catchup_entries: cluster.snapshot_catchup_entries,
            },
            raw,
            ProdHost {
                log: log.clone(),
                store,
                transport: transport.clone(),
            },
            compacted_at,
        );
        let mut driver = Driver {
            core,
            rx,
            shared,
            tick_every: cluster.heartbeat,
            log_dir: log_dir.to_path_buf(),
        };
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

    /// Fault injection for tests: every sync of this member's log takes as much longer as
    /// `fault` says (a stalling SD card); `None` ends it.
    pub fn set_sync_fault(&self, fault: Option<skerry_store::wal::SyncFault>) {
        self.log.set_sync_fault(fault);
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

/// raft-rs's view of the log and of snapshots: the log for entries and states, the store
/// for snapshots. A snapshot is the store as one read transaction sees it, pinned until the
/// transport has streamed it: its index is the store's applied index in that transaction,
/// its membership the one the store recorded with it.
#[derive(Clone)]
struct NodeStorage<S> {
    log: RaftLog,
    store: S,
    outgoing: OutgoingSnapshots,
}

impl<S: StateMachine> Storage for NodeStorage<S> {
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
        let mut snap = self.log.read(|mem| {
            snapshot_message(mem, index, request_index, pinned.conf_state.as_deref())
        })?;
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

/// The production loop around the node's logic.
struct Driver<S: StateMachine<SnapshotSource = Path>> {
    core: Core<ProdHost<S>>,
    rx: Receiver<NodeMsg>,
    shared: Arc<Shared>,
    tick_every: Duration,
    log_dir: std::path::PathBuf,
}

impl<S: StateMachine<SnapshotSource = Path>> Driver<S> {
    fn run(&mut self) {
        let mut next_tick = Instant::now() + self.tick_every;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let mut stop = false;
            match self.rx.recv_timeout(wait) {
                Ok(NodeMsg::Stop { transfer }) => stop = !self.core.begin_stop(transfer),
                Ok(NodeMsg::Input(input)) => self.core.handle(input),
                Ok(NodeMsg::Wake) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            for _ in 0..MESSAGES_PER_TURN_MAX {
                if stop {
                    break;
                }
                match self.rx.try_recv() {
                    Ok(NodeMsg::Stop { transfer }) => stop = !self.core.begin_stop(transfer),
                    Ok(NodeMsg::Input(input)) => self.core.handle(input),
                    Ok(NodeMsg::Wake) => {}
                    Err(_) => break,
                }
            }
            if stop {
                break;
            }
            let now = Instant::now();
            if now >= next_tick {
                self.core.tick();
                next_tick += self.tick_every;
                if next_tick < now {
                    // The thread was held up for several ticks: do not replay them in a burst.
                    next_tick = now + self.tick_every;
                }
            }
            if let Err(e) = self.core.turn() {
                error!(error = %e, "raft loop failed; stopping this member's raft");
                break;
            }
            *self.shared.status.write() = self.core.status();
            if self.core.removed() {
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
            if self.core.stop_due() {
                break;
            }
        }
        self.core.fail_pending(StoreError::Stopped);
        info!("raft thread stopped");
    }
}

/// The production host: the store, the segment-file log, the TCP transport, the real clock.
struct ProdHost<S> {
    log: RaftLog,
    store: S,
    transport: Transport,
}

impl<S: StateMachine<SnapshotSource = Path>> Host for ProdHost<S> {
    type Storage = NodeStorage<S>;

    fn persist(
        &mut self,
        number: u64,
        entries: &[Entry],
        hard: Option<&HardState>,
        sync: bool,
    ) -> Result<(), RaftError> {
        self.log.persist_async(number, entries, hard, sync)
    }

    fn persisted(&mut self) -> Result<u64, RaftError> {
        self.log.durable_number()
    }

    fn flush(&mut self) -> Result<(), RaftError> {
        self.log.flush()
    }

    fn sync_running_for(&self) -> Option<Duration> {
        self.log.sync_running_for()
    }

    fn set_conf_state(&mut self, conf: &ConfState) -> Result<(), RaftError> {
        self.log.set_conf_state(conf)
    }

    fn log_first_index(&self) -> u64 {
        self.log.first_index()
    }

    fn compact_log(&mut self, index: u64) -> Result<(), RaftError> {
        self.log.compact(index)
    }

    /// The transport wrote the snapshot to a file and put its path in the message's data.
    fn install_snapshot(&mut self, snap: &Snapshot) -> Result<(), RaftError> {
        let meta = snap.get_metadata();
        let path = std::path::PathBuf::from(String::from_utf8_lossy(&snap.data).into_owned());
        self.store.install_snapshot(&path, meta.index, meta.term)?;
        self.log
            .apply_snapshot(meta.index, meta.term, meta.get_conf_state())?;
        let _ = std::fs::remove_file(&path);
        Ok(())
    }

    fn apply(&mut self, batch: Vec<Committed>) -> Result<(), RaftError> {
        Ok(self.store.apply_committed(batch)?)
    }

    fn members(&self) -> Result<Vec<MemberRecord>, RaftError> {
        Ok(self.store.members()?)
    }

    fn durable_applied_index(&self) -> u64 {
        self.store.durable_applied_index()
    }

    fn set_leadership(&mut self, leader: bool, term: u64) {
        self.store.set_leadership(leader, term);
    }

    fn lease_renewed_elsewhere(&mut self, id: i64) {
        self.store.lease_renewed_elsewhere(id);
    }

    fn send(&mut self, messages: Vec<Message>) -> Vec<u64> {
        self.transport.send(messages)
    }

    fn add_peer(&mut self, id: u64, peer_url: &str) {
        match crate::config::peer_addr(peer_url, "member list") {
            Ok(addr) => self.transport.add_peer(id, addr),
            Err(e) => warn!(member = format_args!("{id:x}"), error = %e, "cannot reach member"),
        }
    }

    fn remove_peer(&mut self, id: u64) {
        self.transport.remove_peer(id);
    }

    fn peer_ids(&self) -> Vec<u64> {
        self.transport.peer_ids()
    }

    fn forward_membership(&mut self, leader: u64, proposal: u64, change: MembershipChange) -> bool {
        self.transport.forward_membership(leader, proposal, change)
    }

    fn refuse_membership(&mut self, peer: u64, proposal: u64, reason: String) {
        self.transport.refuse_membership(peer, proposal, reason);
    }

    fn send_lease_renewals(&mut self, leader: u64, ids: Vec<i64>) {
        self.transport.send_lease_renewals(leader, ids);
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn id_salt(&mut self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// Writes a new cluster's first entries (see [`bootstrap_entries`]) and membership.
fn bootstrap(log: &RaftLog, cluster: &ClusterConfig) -> Result<(), RaftError> {
    let records: Vec<MemberRecord> = cluster
        .members
        .values()
        .map(|m| MemberRecord {
            id: m.id,
            name: m.name.clone(),
            peer_urls: m.peer_urls.clone(),
            ..Default::default()
        })
        .collect();
    let (entries, hard, conf) = bootstrap_entries(&records)?;
    log.persist(&entries, Some(&hard), true)?;
    log.set_conf_state(&conf)?;
    info!(members = conf.voters.len(), "bootstrapped a new cluster");
    Ok(())
}
