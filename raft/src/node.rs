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
use raft::eraftpb::{ConfChange, ConfChangeV2, ConfState, Entry, EntryType, Message};
use raft::{RawNode, StateRole};
use skerry_store::pb::command::Command;
use skerry_store::replication::{Committed, ReplicaStatus, Replicator, Reply};
use skerry_store::{Store, StoreError};
use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::config::{ClusterConfig, ClusterState};
use crate::error::RaftError;
use crate::log::LogStore as RaftLog;
use crate::transport::{Received, Transport};

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

/// A linearizable reader waiting for the read index of its round.
type ReadWaiter = oneshot::Sender<Result<u64, StoreError>>;

enum NodeMsg {
    Raft(Box<Message>),
    Propose {
        command: Command,
        reply: Reply,
    },
    ReadIndex(oneshot::Sender<Result<u64, StoreError>>),
    /// A peer's connection to us closed.
    PeerDown(u64),
    /// Leases renewed by a follower's clients; a renewal by ours, when we follow.
    LeaseRenewals(Vec<i64>),
    RenewLease(i64),
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
}

/// A running node: its handle and its thread.
pub struct RaftNode {
    handle: RaftHandle,
    thread: Option<JoinHandle<()>>,
    transport: Transport,
}

impl RaftNode {
    /// Opens the log in `log_dir`, bootstraps it from `cluster` when it is new, starts the
    /// transport (on the current tokio runtime) and the Raft thread, and connects `store` to
    /// it. `store` must have been opened replicated, with this member's identity.
    pub async fn start(
        cluster: &ClusterConfig,
        log_dir: &Path,
        store: Store,
    ) -> Result<RaftNode, RaftError> {
        let log = RaftLog::open(log_dir)?;
        if !log.is_initialized() {
            match cluster.state {
                ClusterState::New => {
                    let conf = ConfState {
                        voters: cluster.members.keys().copied().collect(),
                        ..Default::default()
                    };
                    log.set_conf_state(&conf)?;
                    info!(members = conf.voters.len(), "bootstrapped a new cluster");
                }
                ClusterState::Existing => {
                    return Err(RaftError::Config(
                        "--initial-cluster-state existing: joining a running cluster needs \
                         member add, which skerry does not support yet"
                            .into(),
                    ));
                }
            }
        }
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
        let raw = RawNode::new(&config, log.clone(), &crate::logger::logger())
            .map_err(|e| RaftError::Raft(e.to_string()))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(NODE_QUEUE_MAX);
        let inbound_tx = tx.clone();
        let inbound: crate::transport::Inbound = Arc::new(move |received: Received| {
            let msg = match received {
                Received::Message(m) => NodeMsg::Raft(Box::new(m)),
                Received::PeerDown(peer) => NodeMsg::PeerDown(peer),
                Received::LeaseRenewals(ids) => NodeMsg::LeaseRenewals(ids),
            };
            !matches!(inbound_tx.try_send(msg), Err(TrySendError::Disconnected(_)))
        });
        let transport = Transport::start(
            cluster.cluster_id,
            cluster.id,
            cluster.listen_peer,
            cluster.peer_addrs()?,
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
        )
        .await?;
        let shared = Arc::new(Shared::default());
        let handle = RaftHandle {
            tx,
            shared: shared.clone(),
            id: cluster.id,
        };
        store.set_replicator(Arc::new(handle.clone()));
        let mut driver = Driver {
            raw,
            log,
            rx,
            transport: transport.clone(),
            store,
            shared,
            id: cluster.id,
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
        };
        let thread = std::thread::Builder::new()
            .name("skerry-raft".into())
            .spawn(move || driver.run())
            .map_err(|e| RaftError::Raft(format!("cannot start the raft thread: {e}")))?;
        Ok(RaftNode {
            handle,
            thread: Some(thread),
            transport,
        })
    }

    pub fn handle(&self) -> RaftHandle {
        self.handle.clone()
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
    raw: RawNode<RaftLog>,
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
            NodeMsg::Raft(m) => {
                if Some(m.from) == self.suspect {
                    // It speaks: alive after all (a broken link, since mended).
                    self.suspect = None;
                }
                // Messages from unknown members or stale terms are refused by raft-rs; that
                // is routine, not an error worth more than debug.
                if let Err(e) = self.raw.step(*m) {
                    tracing::debug!(error = %e, "raft refused a message");
                }
            }
            msg @ (NodeMsg::Propose { .. } | NodeMsg::ReadIndex(_)) if self.leader == 0 => {
                // Held until a leader is known rather than refused at once: an election (or
                // this member's start) takes about one election timeout.
                self.leaderless.push((Instant::now(), msg));
            }
            NodeMsg::Propose { command, reply } => self.propose(command, reply),
            NodeMsg::ReadIndex(reply) => self.read_waiters.push(reply),
            NodeMsg::LeaseRenewals(ids) => {
                for id in ids {
                    self.store.lease_renewed_elsewhere(id);
                }
            }
            NodeMsg::RenewLease(id) => {
                if self.leader != 0 && self.leader != self.id {
                    self.renewals.push(id);
                }
            }
            NodeMsg::PeerDown(peer) => {
                if peer == self.leader && self.raw.raft.state != StateRole::Leader {
                    info!(
                        leader = format_args!("{peer:x}"),
                        "the leader's connection closed; campaigning as soon as the others agree"
                    );
                    self.suspect = Some(peer);
                }
            }
            NodeMsg::Stop { .. } => {}
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
            return Err(RaftError::Raft(
                "received a snapshot, which this skerry cannot install yet".into(),
            ));
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
                EntryType::EntryConfChange => {
                    self.apply_conf_change::<ConfChange>(&entry)?;
                    batch.push(Committed {
                        index,
                        command: None,
                        reply: None,
                    });
                }
                EntryType::EntryConfChangeV2 => {
                    self.apply_conf_change::<ConfChangeV2>(&entry)?;
                    batch.push(Committed {
                        index,
                        command: None,
                        reply: None,
                    });
                }
            }
        }
        self.store.apply_committed(batch)?;
        Ok(())
    }

    /// Applies a membership change entry (either encoding) to raft-rs and persists the
    /// resulting membership.
    fn apply_conf_change<C>(&mut self, entry: &Entry) -> Result<(), RaftError>
    where
        C: protobuf::Message + raft_proto::ConfChangeI + Default,
    {
        let mut cc = C::default();
        cc.merge_from_bytes(&entry.data)
            .map_err(|e| RaftError::Corrupt(format!("conf change {}: {e}", entry.index)))?;
        let conf = self
            .raw
            .apply_conf_change(&cc)
            .map_err(|e| RaftError::Raft(e.to_string()))?;
        self.log.set_conf_state(&conf)
    }
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
