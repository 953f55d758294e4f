//! The node's logic apart from threads, files, sockets and clocks: what a member does with
//! each peer message, client request, clock tick and raft-rs `Ready`. [`Core`] is driven by
//! the production loop in [`crate::node`] (a thread, the store, the segment-file log, the TCP
//! transport, the real clock) and by the deterministic simulation in `skerry-tests`
//! (in-memory log and store, a simulated network, a virtual clock, one seeded RNG), through
//! the [`Host`] trait: the same code runs in both.
//!
//! Each `Ready` is handled in raft-rs's order:
//!
//! 1. messages that need nothing durable (the leader's appends, heartbeats and a follower's
//!    answers to them, forwarded proposals) go out at once, in parallel with the fsync;
//! 2. a snapshot from the leader is installed (store, then log);
//! 3. entries committed (and durable here) are handed to the store, in order, with the
//!    replies of the clients on this member that proposed them;
//! 4. the Ready's entries and hard state are handed to the log's writer, which makes them
//!    durable on its own thread (`advance_append_async`): the loop does not wait;
//! 5. read states answer the ReadIndex round they belong to;
//! 6. once the writer reports the Ready durable (`on_persist_ready`), the votes and append
//!    acknowledgements held for it go out; the log is compacted if enough entries were
//!    applied.
//!
//! So nothing on the loop waits on the disk (issue 21): a leader on a stalling SD card keeps
//! its heartbeats on time, and only a stall longer than [`LEADER_DISK_STALL_MAX`] makes it
//! hand leadership to a follower whose disk keeps up.
//!
//! Proposals carry `(member id, proposal id)` as their context, so the member a client asked
//! recognises its entry when it applies it and answers with the entry's result. Followers
//! forward proposals to the leader (raft-rs does), so any member takes writes. Concurrent
//! linearizable reads share one ReadIndex round per turn.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType,
    HardState, Message, MessageType, Snapshot,
};
use raft::{RawNode, StateRole};
use skerry_store::StoreError;
use skerry_store::pb::command::{
    Command, Member as MemberRecord, Membership, command::Command as Cmd,
};
use skerry_store::replication::{Committed, MembershipChange, ReplicaStatus, Reply};
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::error::RaftError;
use crate::log::MemLog;
use crate::transport::Received;

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

/// Whether fast failover campaigns at the `tick`-th tick since the leader's connection closed:
/// always at the first, then as a fair coin drawn from the member's id and the tick
/// (splitmix64), so that survivors ticking in step stop splitting the vote. Deterministic,
/// so that the simulation replays it; different ids give unrelated draws.
fn retry_campaign(id: u64, tick: u64) -> bool {
    if tick == 0 {
        return true;
    }
    let mut z = id ^ tick.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z & 1 == 1
}

/// How long a leadership transfer a client asked for (`etcdctl move-leader`) may take before
/// the client is told it took too long: etcd's request timeout (`ServerConfig.ReqTimeout`,
/// 5 s + 2 x the 1 s election timeout), which etcd also gives the transfers it starts itself
/// (`EtcdServer.TransferLeadership`). etcd's `MoveLeader` otherwise waits for the client's
/// deadline; a wait without a bound is not taken from a client here. raft-rs gives up a
/// transfer after one election timeout, so one still pending by then will not happen unless
/// an election picks the target anyway.
pub const LEADER_TRANSFER_WAIT: Duration = Duration::from_secs(7);

/// Readies handled per loop turn: each may produce the next (the leader's own write made
/// durable commits entries, which apply), so a few are handled at once, but a turn stays
/// short enough for the next tick.
pub const READIES_PER_TURN_MAX: usize = 4;

/// Messages a Ready holds for after its writes that depend on nothing written, sent at once:
/// a follower's answer to a heartbeat (so a follower's slow disk never looks like a dead
/// follower), and proposals, read requests, transfer requests and pre-votes it passes on (a
/// pre-vote binds nobody). Votes and append acknowledgements wait: they promise what the
/// disk holds. etcd's raft holds back the same kinds when its storage writes are
/// asynchronous (`msgsAfterAppend`).
fn needs_nothing_durable(m: &Message) -> bool {
    matches!(
        m.get_msg_type(),
        MessageType::MsgHeartbeatResponse
            | MessageType::MsgPropose
            | MessageType::MsgReadIndex
            | MessageType::MsgTransferLeader
            | MessageType::MsgRequestPreVote
    )
}

/// A leader whose log sync has been under way this long hands leadership to the follower with
/// the most of the log. raft-rs applies on a member only what that member made durable, so
/// while the leader's disk stalls its own clients' writes and reads wait on it, although the
/// followers commit and serve without it. Twice the longest stall an SD card or eMMC shows in
/// normal use (hundreds of milliseconds, k3s-io/k3s#8956), so such stalls never move
/// leadership; etcd's default election timeout, so a disk that has stopped costs clients no
/// more than an etcd election would.
pub const LEADER_DISK_STALL_MAX: Duration = Duration::from_secs(1);

/// A linearizable reader waiting for the read index of its round.
pub type ReadWaiter = oneshot::Sender<Result<u64, StoreError>>;

/// A client waiting for leadership to move (etcd's `MoveLeader`).
pub type TransferWaiter = oneshot::Sender<Result<(), StoreError>>;

/// Work for the node's logic.
pub enum Input {
    /// From the network: peer messages, snapshot outcomes, forwarded requests.
    Received(Box<Received>),
    /// A client's write on this member.
    Propose { command: Command, reply: Reply },
    /// A client's linearizable read on this member: wants a read index.
    ReadIndex(ReadWaiter),
    /// A membership change asked for by a client of this member.
    Membership {
        change: MembershipChange,
        reply: Reply,
    },
    /// A lease renewal by our clients, passed to the leader when we follow.
    RenewLease(i64),
    /// A client asks this member, which must lead, to hand leadership to voter `target`
    /// (etcd's `MoveLeader`); answered once this member sees `target` lead, or with why not.
    MoveLeader { target: u64, reply: TransferWaiter },
}

/// What the node's logic needs from the machine it runs on.
pub trait Host {
    /// The log as raft-rs reads it (entries, states, snapshots).
    type Storage: raft::Storage;

    /// Starts making Ready `number`'s entries (replacing any suffix from the first one's
    /// index) and hard state durable, and returns at once: raft-rs reads them through
    /// `Storage` from then on; they are durable (synced when `sync`) once
    /// [`Host::persisted`] reaches `number`. Readies are made durable in order.
    fn persist(
        &mut self,
        number: u64,
        entries: &[Entry],
        hard: Option<&HardState>,
        sync: bool,
    ) -> Result<(), RaftError>;
    /// The highest Ready number made durable so far (every lower one too), or why the log
    /// can take no more.
    fn persisted(&mut self) -> Result<u64, RaftError>;
    /// Waits until everything handed to `persist` is durable (before a snapshot replaces the
    /// log).
    fn flush(&mut self) -> Result<(), RaftError>;
    /// How long the log's sync under way has taken, if one is under way.
    fn sync_running_for(&self) -> Option<Duration>;
    /// Records the membership after a change was applied.
    fn set_conf_state(&mut self, conf: &ConfState) -> Result<(), RaftError>;
    fn log_first_index(&self) -> u64;
    /// Drops the log's entries before `index`.
    fn compact_log(&mut self, index: u64) -> Result<(), RaftError>;
    /// Installs a snapshot the leader sent: the store's data, then the log's floor.
    fn install_snapshot(&mut self, snap: &Snapshot) -> Result<(), RaftError>;

    /// Hands committed entries to the state machine, in index order.
    fn apply(&mut self, batch: Vec<Committed>) -> Result<(), RaftError>;
    /// The members the state machine records.
    fn members(&self) -> Result<Vec<MemberRecord>, RaftError>;
    /// The last applied index the state machine has made durable: the log keeps what follows.
    fn durable_applied_index(&self) -> u64;
    /// Leadership changed: the state machine's lessor decides expiry only on the leader.
    fn set_leadership(&mut self, leader: bool, term: u64);
    /// A follower's client renewed lease `id` (we lead).
    fn lease_renewed_elsewhere(&mut self, id: i64);

    /// Sends messages; returns the peers they could not be queued for.
    fn send(&mut self, messages: Vec<Message>) -> Vec<u64>;
    fn add_peer(&mut self, id: u64, peer_url: &str);
    fn remove_peer(&mut self, id: u64);
    fn peer_ids(&self) -> Vec<u64>;
    fn forward_membership(&mut self, leader: u64, proposal: u64, change: MembershipChange) -> bool;
    fn refuse_membership(&mut self, peer: u64, proposal: u64, reason: String);
    fn send_lease_renewals(&mut self, leader: u64, ids: Vec<i64>);

    /// The clock.
    fn now(&self) -> Instant;
    /// A number no earlier run and no other member will draw, for new member ids and the
    /// first proposal id of a run: the wall clock in nanoseconds in production (etcd mixes
    /// the time into `member add`'s ids), the seeded RNG in the simulation.
    fn id_salt(&mut self) -> u64;
}

/// The settings the logic needs.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub id: u64,
    pub cluster_id: u64,
    /// Peer URLs are `https://` (a member added must use the same scheme).
    pub peer_https: bool,
    pub election: Duration,
    /// Compact the log every this many applied entries ...
    pub snapshot_count: u64,
    /// ... keeping this many below the applied index.
    pub catchup_entries: u64,
}

/// The node's logic: what to do with each input, tick and Ready. Single-threaded; the
/// production loop and the simulation drive it.
pub struct Core<H: Host> {
    raw: RawNode<H::Storage>,
    host: H,
    id: u64,
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
    leaderless: Vec<(Instant, Input)>,
    /// The leader whose connection to us dropped: campaign at once, then at about every
    /// other tick until another leads (see `campaign_if_leader_gone`).
    suspect: Option<u64>,
    /// Ticks since `suspect` was set, for `retry_campaign`'s draw.
    suspect_ticks: u64,
    /// Lease renewals by our clients, passed on to the leader once per loop turn.
    renewals: Vec<i64>,
    /// Clients waiting for leadership to move to a member: the target, and until when.
    transfers: Vec<(u64, Instant, TransferWaiter)>,
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
    /// Peer URLs of the members added (`Some`) or removed (`None`) by configuration changes
    /// this process applied. raft-rs's membership changes at once when the entry is applied,
    /// the store's member table only when its writer gets to the entry; a leader checking a
    /// new member's URLs reads both, so that a member just added is never missed (etcd's
    /// `ErrPeerURLexists`) while the table lags.
    applied_members: HashMap<u64, Option<Vec<String>>>,
    status: ReplicaStatus,
    /// When the heartbeat each peer has not answered yet left (we lead): its answer gives
    /// the round trip (`etcd_network_peer_round_trip_time_seconds`).
    heartbeats_sent: HashMap<u64, Instant>,
    /// Readies handed to the log and not yet durable, in order: their numbers and the
    /// messages that must wait for them.
    unpersisted: std::collections::VecDeque<(u64, Vec<Message>)>,
    /// Proposals waiting for the log's write under way (see `should_hold_proposals`).
    held_proposals: Vec<HeldProposal>,
}

/// A proposal held back for the next batch: a client's on this member, or one a follower
/// forwarded.
enum HeldProposal {
    Local(Command, Reply),
    Forwarded(Message),
}

/// A proposal's (or ReadIndex round's) context: the member and its proposal (round) id.
pub fn proposal_context(member: u64, proposal: u64) -> Vec<u8> {
    let mut ctx = member.to_le_bytes().to_vec();
    ctx.extend_from_slice(&proposal.to_le_bytes());
    ctx
}

pub fn parse_context(ctx: &[u8]) -> Option<(u64, u64)> {
    if ctx.len() != 16 {
        return None;
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&ctx[..8]);
    let member = u64::from_le_bytes(word);
    word.copy_from_slice(&ctx[8..]);
    Some((member, u64::from_le_bytes(word)))
}

/// The snapshot message raft-rs sends for store data pinned at applied index `index`: its
/// term from the log, its membership the one the store recorded with the data. When the
/// data cannot serve (nothing applied, older than raft-rs asked for, no term or membership)
/// raft-rs is told to ask again later.
pub fn snapshot_message(
    log: &MemLog,
    index: u64,
    request_index: u64,
    conf: Option<&[u8]>,
) -> raft::Result<Snapshot> {
    let unavailable = || raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable);
    if index == 0 || index < request_index {
        return Err(unavailable());
    }
    let term = log.term_of(index).ok_or_else(unavailable)?;
    let conf = conf
        .and_then(|b| ConfState::parse_from_bytes(b).ok())
        .ok_or_else(unavailable)?;
    let mut snap = Snapshot::default();
    snap.mut_metadata().index = index;
    snap.mut_metadata().term = term;
    snap.mut_metadata().set_conf_state(conf);
    Ok(snap)
}

/// How a member's log is brought in line with its store at start (see [`start_repair`]).
#[derive(Debug, Default, PartialEq)]
pub struct StartRepair {
    /// A snapshot the store installed that the log does not record yet (a crash came
    /// between the two): its index, term and membership, to install in the log.
    pub install: Option<(u64, u64, ConfState)>,
    /// The commit index the hard state must be raised to: the store applies only committed
    /// entries, so all it applied is committed, even if the hard state that said so was not
    /// synced before a crash.
    pub commit: Option<u64>,
    /// The membership to record: the store's, as of its applied index (membership takes
    /// effect when applied; the entries after it apply their changes again).
    pub conf: Option<ConfState>,
}

/// Works out [`StartRepair`] from the log as it is and what the store holds: its applied
/// index, the snapshot it last installed, and its recorded membership. The production start
/// and the simulation's restarts apply the answer to their logs alike.
pub fn start_repair(
    log: &MemLog,
    applied: u64,
    installed: Option<(u64, u64)>,
    store_conf: Option<&[u8]>,
) -> Result<StartRepair, RaftError> {
    let conf = store_conf
        .map(ConfState::parse_from_bytes)
        .transpose()
        .map_err(|e| RaftError::Corrupt(format!("store's conf state: {e}")))?;
    let mut repair = StartRepair::default();
    let (mut last, mut commit) = (log.last_index(), log.hard.commit);
    if let Some((index, term)) = installed
        && index >= log.first_index()
        && log.term_of(index) != Some(term)
    {
        let conf = conf
            .clone()
            .ok_or_else(|| RaftError::Corrupt("installed snapshot without membership".into()))?;
        warn!(
            index,
            term, "finishing a snapshot install a crash interrupted"
        );
        repair.install = Some((index, term, conf));
        last = index;
        commit = commit.max(index);
    }
    if applied > commit {
        if applied > last {
            return Err(RaftError::Corrupt(format!(
                "the store applied entry {applied} but the log ends at {last}"
            )));
        }
        repair.commit = Some(applied);
    }
    repair.conf = conf.filter(|c| *c != log.conf || repair.install.is_some());
    Ok(repair)
}

/// A new cluster's first entries: one committed membership change per member, in id order,
/// at term 1, identical on every member (they derive the same ids from the same flags). Each
/// carries the member's record (id, name, peer URLs), so the store's member list and a later
/// member's transport learn them from the log. Returns the entries, the hard state that
/// commits them, and the membership they make.
pub fn bootstrap_entries(
    members: &[MemberRecord],
) -> Result<(Vec<Entry>, HardState, ConfState), RaftError> {
    let mut members = members.to_vec();
    members.sort_by_key(|m| m.id);
    let mut entries = Vec::with_capacity(members.len());
    for (i, record) in members.iter().enumerate() {
        let mut cc = ConfChange::default();
        cc.set_change_type(ConfChangeType::AddNode);
        cc.node_id = record.id;
        cc.context = conf_change_context(0, 0, record).into();
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
    let conf = ConfState {
        voters: members.iter().map(|m| m.id).collect(),
        ..Default::default()
    };
    Ok((entries, hard, conf))
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

pub fn in_conf(conf: &ConfState, id: u64) -> bool {
    conf.voters.contains(&id) || conf.learners.contains(&id)
}

impl<H: Host> Core<H> {
    /// The node's logic over `raw` (built on `host`'s storage) and `host`. `compacted_at` is
    /// the applied index the log was last compacted at (its first index - 1, or the applied
    /// index at start).
    pub fn new(
        config: &CoreConfig,
        raw: RawNode<H::Storage>,
        mut host: H,
        compacted_at: u64,
    ) -> Self {
        // Proposal ids continue from a number no earlier run of this member used: entries
        // it proposed before a restart may still be applied after it, and must not be taken
        // for the new run's proposals (whose callers would get another write's result).
        // Within a run ids only increase, so one salt at start is enough.
        let next_proposal = (host.id_salt() >> 1).max(1);
        Core {
            raw,
            host,
            id: config.id,
            next_proposal,
            pending: HashMap::new(),
            read_waiters: Vec::new(),
            read_rounds: HashMap::new(),
            next_round: 1,
            leader: 0,
            term: 0,
            stopping: None,
            leaderless: Vec::new(),
            suspect: None,
            suspect_ticks: 0,
            renewals: Vec::new(),
            transfers: Vec::new(),
            election: config.election,
            cluster_id: config.cluster_id,
            peer_https: config.peer_https,
            snapshot_count: config.snapshot_count.max(1),
            catchup_entries: config.catchup_entries,
            compacted_at,
            removed: false,
            applied_members: HashMap::new(),
            status: ReplicaStatus::default(),
            heartbeats_sent: HashMap::new(),
            unpersisted: std::collections::VecDeque::new(),
            held_proposals: Vec::new(),
        }
    }

    /// One clock tick (a heartbeat interval): raft-rs's tick, fast failover's campaign, and
    /// the expiry of waits that took too long.
    pub fn tick(&mut self) {
        self.release_held_proposals();
        self.raw.tick();
        self.campaign_if_leader_gone();
        self.hand_over_if_disk_stalled();
        self.expire();
    }

    /// A leader whose log sync has been under way for [`LEADER_DISK_STALL_MAX`] hands
    /// leadership to the follower with the most of the log (which raft-rs first catches up
    /// from memory, then tells to campaign at once). Once per stall: raft-rs gives a transfer
    /// one election timeout, after which a stall still under way starts another.
    fn hand_over_if_disk_stalled(&mut self) {
        if self.raw.raft.state != StateRole::Leader
            || self.stopping.is_some()
            || self.raw.raft.lead_transferee.is_some()
        {
            return;
        }
        let Some(stalled) = self.host.sync_running_for() else {
            return;
        };
        if stalled < LEADER_DISK_STALL_MAX {
            return;
        }
        let Some(transferee) = self.most_caught_up_follower() else {
            return;
        };
        warn!(
            stalled_ms = stalled.as_millis() as u64,
            to = format_args!("{transferee:x}"),
            "the log's disk has stalled; handing leadership to a follower"
        );
        skerry_store::metrics::DISK_STALL_HANDOVERS.fetch_add(1, Ordering::Relaxed);
        self.raw.transfer_leader(transferee);
    }

    /// The voting follower whose log matches the most of ours.
    fn most_caught_up_follower(&self) -> Option<u64> {
        let me = self.id;
        let voters = self.raw.raft.prs().conf().voters().ids();
        self.raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != me && voters.contains(**id))
            .max_by_key(|(_, progress)| progress.matched)
            .map(|(id, _)| *id)
    }

    /// The end of a loop turn, after its inputs were handled: one ReadIndex round for the
    /// readers that arrived, lease renewals passed on, and the Ready handled.
    pub fn turn(&mut self) -> Result<(), RaftError> {
        self.start_read_round();
        if !self.renewals.is_empty() && self.leader != 0 {
            let ids = std::mem::take(&mut self.renewals);
            self.host.send_lease_renewals(self.leader, ids);
        }
        self.on_ready()
    }

    /// A stop that waited for a leadership transfer may finish: leadership moved, or the
    /// wait ran out.
    pub fn stop_due(&self) -> bool {
        match self.stopping {
            None => false,
            Some(deadline) => {
                if self.raw.raft.state == StateRole::Leader && self.host.now() < deadline {
                    return false;
                }
                if self.raw.raft.state == StateRole::Leader {
                    warn!("leadership transfer did not finish in time; stopping anyway");
                } else {
                    info!(
                        leader = format_args!("{:x}", self.raw.raft.leader_id),
                        "handed leadership over; stopping"
                    );
                }
                true
            }
        }
    }

    /// Answers every waiting caller with `error` (the node is stopping).
    pub fn fail_pending(&mut self, error: StoreError) {
        for (_, reply) in self.pending.drain() {
            let _ = reply.send(Err(error.clone()));
        }
        for held in self.held_proposals.drain(..) {
            if let HeldProposal::Local(_, reply) = held {
                let _ = reply.send(Err(error.clone()));
            }
        }
        for (_, (_, waiters)) in self.read_rounds.drain() {
            for w in waiters {
                let _ = w.send(Err(error.clone()));
            }
        }
        for w in self.read_waiters.drain(..) {
            let _ = w.send(Err(error.clone()));
        }
        for (_, _, w) in self.transfers.drain(..) {
            let _ = w.send(Err(error.clone()));
        }
    }

    /// This member applied its own removal from the cluster.
    pub fn removed(&self) -> bool {
        self.removed
    }

    /// The leader, term and commit index as this member sees them.
    pub fn status(&self) -> ReplicaStatus {
        self.status
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// raft-rs's node, for inspection (the simulation and tests).
    pub fn raw(&self) -> &RawNode<H::Storage> {
        &self.raw
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }
    pub fn handle(&mut self, msg: Input) {
        match msg {
            Input::Received(received) => self.received(*received),
            msg @ (Input::Propose { .. } | Input::ReadIndex(_) | Input::Membership { .. })
                if self.leader == 0 =>
            {
                // Held until a leader is known rather than refused at once: an election (or
                // this member's start) takes about one election timeout.
                self.leaderless.push((self.host.now(), msg));
            }
            Input::Propose { command, reply } if self.should_hold_proposals() => {
                self.held_proposals
                    .push(HeldProposal::Local(command, reply));
            }
            Input::Propose { command, reply } => self.propose(command, reply),
            Input::ReadIndex(reply) => self.read_waiters.push(reply),
            Input::Membership { change, reply } => {
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
                } else if self.host.forward_membership(self.leader, proposal, change) {
                    self.pending.insert(proposal, reply);
                } else {
                    let _ = reply.send(Err(StoreError::NoLeader));
                }
            }
            Input::RenewLease(id) => {
                if self.leader != 0 && self.leader != self.id {
                    self.renewals.push(id);
                }
            }
            Input::MoveLeader { target, reply } => self.move_leader(target, reply),
        }
    }

    /// etcd's `MoveLeader`: only the leader takes it (`etcdserver: not leader`), the target
    /// must be a voting member (`etcdserver: bad leader transferee`), a target that already
    /// leads is answered at once; otherwise raft-rs starts the transfer (it catches the target
    /// up, then tells it to campaign) and the client waits until this member sees the target
    /// lead, or [`LEADER_TRANSFER_WAIT`].
    fn move_leader(&mut self, target: u64, reply: TransferWaiter) {
        if self.raw.raft.state != StateRole::Leader {
            let _ = reply.send(Err(StoreError::NotLeader));
            return;
        }
        if !self.raw.raft.prs().conf().voters().contains(target) {
            let _ = reply.send(Err(StoreError::BadLeaderTransferee));
            return;
        }
        if target == self.id {
            let _ = reply.send(Ok(()));
            return;
        }
        if self.stopping.is_some() {
            // Stopping hands leadership to a follower of its own choosing already.
            let _ = reply.send(Err(StoreError::Stopped));
            return;
        }
        info!(
            to = format_args!("{target:x}"),
            "moving leadership as a client asked"
        );
        self.raw.transfer_leader(target);
        let deadline = self.host.now() + LEADER_TRANSFER_WAIT;
        self.transfers.push((target, deadline, reply));
    }

    fn received(&mut self, received: Received) {
        match received {
            Received::Message(m) => {
                if Some(m.from) == self.suspect {
                    // It speaks: alive after all (a broken link, since mended).
                    self.suspect = None;
                }
                if m.get_msg_type() == MessageType::MsgHeartbeatResponse
                    && let Some(sent) = self.heartbeats_sent.remove(&m.from)
                {
                    let rtt = self.host.now().duration_since(sent);
                    skerry_store::metrics::observe_peer_rtt(m.from, rtt);
                }
                if m.get_msg_type() == MessageType::MsgPropose && self.should_hold_proposals() {
                    self.held_proposals.push(HeldProposal::Forwarded(m));
                    return;
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
                    self.host.lease_renewed_elsewhere(id);
                }
            }
            Received::PeerDown(peer) => {
                if peer == self.leader && self.raw.raft.state != StateRole::Leader {
                    info!(
                        leader = format_args!("{peer:x}"),
                        "the leader's connection closed; campaigning as soon as the others agree"
                    );
                    self.suspect = Some(peer);
                    self.suspect_ticks = 0;
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
                    self.host.refuse_membership(from, proposal, e.to_string());
                }
            }
            Received::MembershipRefused { proposal, reason } => {
                if let Some(reply) = self.pending.remove(&proposal) {
                    let _ = reply.send(Err(membership_error(&reason)));
                }
            }
            Received::Removed { by } => {
                // A member of our cluster (its hello authenticated) applied our removal: the
                // entry may never reach us (see `Transport::remove_peer`).
                info!(
                    by = format_args!("{by:x}"),
                    "membership: a peer applied this member's removal"
                );
                self.removed = true;
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
        let members = self
            .host
            .members()
            .map_err(|e| StoreError::Storage(e.to_string()))?;
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
                let taken = |urls: &[String]| urls.iter().any(|u| peer_urls.contains(u));
                if members
                    .iter()
                    .filter(|m| !self.applied_members.contains_key(&m.id))
                    .any(|m| taken(&m.peer_urls))
                    || self
                        .applied_members
                        .values()
                        .flatten()
                        .any(|urls| taken(urls))
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
    fn new_member_id(&mut self, peer_urls: &[String], conf: &ConfState) -> u64 {
        let mut urls = peer_urls.to_vec();
        urls.sort();
        let salt = self.host.id_salt();
        let mut attempt = 0u64;
        loop {
            let token = format!("{:x}/{salt}/{attempt}", self.cluster_id);
            let id = crate::config::member_id(&urls, &token);
            if !in_conf(conf, id) && id != self.id {
                return id;
            }
            attempt += 1;
        }
    }

    /// Fast failover: the leader's process is gone (its connection closed), so rather than
    /// wait out a randomized election timeout (1-2 s by default), stand for election at the
    /// next tick, and again at later ticks until someone leads. Pre-vote keeps this harmless:
    /// the others refuse while they still hear from a leader (their lease, one election
    /// timeout), so a live leader is never disturbed; a survivor that campaigns forgets the
    /// old leader, so once both survivors have campaigned one of them wins.
    ///
    /// The retries are drawn, not made at every tick. Survivors see the leader's connections
    /// close at the same instant, and members started together tick in step (each ticks on
    /// a fixed schedule from its start). Two that campaign in the same tick grant each other
    /// the pre-vote, then each votes for itself: a split vote. Retrying at every tick split
    /// it again at every tick for as long as their ticks stayed within a round trip of each
    /// other, and the forced campaigns kept raft-rs's randomized timeout from ever breaking
    /// the tie (the simulation's `survivors_ticking_in_step_elect_a_leader_within_a_second`:
    /// no leader 30 s after the kill). It is the likely cause of a 12.9 s outage after one
    /// kill -9 in `skerry-loadgen compare --members 3`. With each retry drawn at even odds
    /// per member, two survivors in step both campaign in a tick with odds 1/4 and one alone
    /// with odds 1/2, and one alone wins.
    fn campaign_if_leader_gone(&mut self) {
        let Some(suspect) = self.suspect else {
            return;
        };
        let leader = self.raw.raft.leader_id;
        if (leader != 0 && leader != suspect) || self.raw.raft.state == StateRole::Leader {
            self.suspect = None;
            return;
        }
        let tick = self.suspect_ticks;
        self.suspect_ticks += 1;
        if !retry_campaign(self.id, tick) {
            return;
        }
        if let Err(e) = self.raw.campaign() {
            tracing::debug!(error = %e, "campaign refused");
        }
    }

    /// Starts stopping. Returns true while the loop must go on (a leadership transfer is under
    /// way), false to stop now.
    pub fn begin_stop(&mut self, transfer: bool) -> bool {
        if self.stopping.is_some() {
            return true;
        }
        if !transfer || self.raw.raft.state != StateRole::Leader {
            return false;
        }
        // The follower with the most of the log takes over soonest.
        let Some(transferee) = self.most_caught_up_follower() else {
            return false;
        };
        info!(
            to = format_args!("{transferee:x}"),
            "stopping: handing leadership over"
        );
        self.raw.transfer_leader(transferee);
        self.stopping = Some(self.host.now() + self.election);
        true
    }

    /// Whether a proposal arriving now waits for the log's write under way (we lead, and
    /// the log is busy): proposals gathered meanwhile go into one Ready, one append per
    /// follower and one sync, as they did when the loop itself waited on the disk. Without
    /// this the loop, free of the disk, turned each proposal into a Ready of its own, and
    /// the followers handled an append, a write and an acknowledgement per proposal.
    fn should_hold_proposals(&self) -> bool {
        self.raw.raft.state == StateRole::Leader && !self.unpersisted.is_empty()
    }

    /// Proposes what waited for the log: once it has caught up, or at a tick whatever it
    /// is doing (so a stalling disk delays proposals by a heartbeat interval at most, and the
    /// followers commit them without the leader's disk).
    fn release_held_proposals(&mut self) {
        for held in std::mem::take(&mut self.held_proposals) {
            match held {
                HeldProposal::Local(command, reply) => self.propose(command, reply),
                HeldProposal::Forwarded(m) => {
                    if let Err(e) = self.raw.step(m) {
                        tracing::debug!(error = %e, "raft refused a forwarded proposal");
                    }
                }
            }
        }
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
        self.read_rounds.insert(round, (self.host.now(), waiters));
    }

    /// Answers rounds raft-rs dropped, and forgets proposals whose callers gave up.
    fn expire(&mut self) {
        let now = self.host.now();
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
        let (expired, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.transfers)
            .into_iter()
            .filter(|(_, _, reply)| !reply.is_closed())
            .partition(|(_, deadline, _)| now >= *deadline);
        self.transfers = waiting;
        for (target, _, reply) in expired {
            warn!(
                to = format_args!("{target:x}"),
                "leadership did not move in time"
            );
            let _ = reply.send(Err(StoreError::LeaderTransferTimeout));
        }
        let wait = self.election * LEADERLESS_WAIT_ELECTIONS;
        let (expired, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.leaderless)
            .into_iter()
            .partition(|(arrived, _)| now.duration_since(*arrived) >= wait);
        self.leaderless = waiting;
        for (_, msg) in expired {
            match msg {
                Input::Propose { reply, .. } => {
                    let _ = reply.send(Err(StoreError::NoLeader));
                }
                Input::ReadIndex(reply) => {
                    let _ = reply.send(Err(StoreError::NoLeader));
                }
                Input::Membership { reply, .. } => {
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
        self.note_heartbeats(&messages);
        for peer in self.host.send(messages) {
            self.raw.report_unreachable(peer);
        }
    }

    /// Notes when each heartbeat left, for the round trip its answer closes. A heartbeat
    /// still unanswered keeps its time, so a late answer is never measured against a later
    /// heartbeat; one unanswered for an election timeout is taken as lost.
    fn note_heartbeats(&mut self, messages: &[Message]) {
        let mut now = None;
        for m in messages {
            if m.get_msg_type() != MessageType::MsgHeartbeat {
                continue;
            }
            let now = *now.get_or_insert_with(|| self.host.now());
            let election = self.election;
            self.heartbeats_sent
                .entry(m.to)
                .and_modify(|sent| {
                    if now.duration_since(*sent) >= election {
                        *sent = now;
                    }
                })
                .or_insert(now);
        }
    }

    fn observe_leadership(&mut self) {
        let leader = self.raw.raft.leader_id;
        let term = self.raw.raft.term;
        let is_leader = self.raw.raft.state == StateRole::Leader;
        if leader != self.leader || term != self.term {
            if leader != self.leader && leader != 0 {
                // etcd's `leaderChanges`: a new leader is known (not the loss of one).
                skerry_store::metrics::LEADER_CHANGES.fetch_add(1, Ordering::Relaxed);
            }
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
            self.host.set_leadership(is_leader, term);
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
        if leader != 0
            && self
                .transfers
                .iter()
                .any(|(target, _, _)| *target == leader)
        {
            let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.transfers)
                .into_iter()
                .partition(|(target, _, _)| *target == leader);
            self.transfers = waiting;
            for (_, _, reply) in done {
                let _ = reply.send(Ok(()));
            }
        }
        self.status = ReplicaStatus {
            leader,
            term,
            commit_index: self.raw.raft.raft_log.committed,
        };
    }

    fn on_ready(&mut self) -> Result<(), RaftError> {
        self.collect_persisted()?;
        if !self.held_proposals.is_empty() && !self.should_hold_proposals() {
            self.release_held_proposals();
        }
        // Readies produced by the one before (a durable write lets the leader commit, a
        // commit lets entries apply) are handled in the same turn, up to a bound.
        for _ in 0..READIES_PER_TURN_MAX {
            if !self.raw.has_ready() {
                break;
            }
            self.handle_ready()?;
        }
        self.observe_leadership();
        self.maybe_compact()?;
        Ok(())
    }

    /// Hands a Ready's writes to the log, and sends and applies what needs nothing durable.
    fn handle_ready(&mut self) -> Result<(), RaftError> {
        let mut rd = self.raw.ready();
        self.send(rd.take_messages());
        if !rd.snapshot().is_empty() {
            // The snapshot replaces the log: what was queued before goes to disk first.
            self.host.flush()?;
            self.collect_persisted()?;
            self.install_snapshot(rd.snapshot().clone())?;
        }
        let committed = rd.take_committed_entries();
        self.apply(committed)?;
        let (now, held): (Vec<Message>, Vec<Message>) = rd
            .take_persisted_messages()
            .into_iter()
            .partition(needs_nothing_durable);
        self.send(now);
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
        let number = rd.number();
        let snapshot = !rd.snapshot().is_empty();
        let writes = !rd.entries().is_empty() || rd.hs().is_some() || snapshot;
        if writes {
            self.host
                .persist(number, rd.entries(), rd.hs(), rd.must_sync())?;
        }
        self.raw.advance_append_async(rd);
        if !writes && self.unpersisted.is_empty() {
            // Nothing to wait for: durable as it stands.
            self.raw.on_persist_ready(number);
            self.send(held);
        } else {
            self.unpersisted.push_back((number, held));
            if !writes {
                // Held behind earlier writes only: the log reports it with the next one.
                self.host.persist(number, &[], None, false)?;
            }
        }
        if snapshot {
            // raft-rs counts the snapshot as applied, which it allows only once it is
            // persisted: this Ready is made durable before going on (snapshots are rare).
            self.host.flush()?;
            self.collect_persisted()?;
        }
        self.raw.advance_apply();
        Ok(())
    }

    /// Tells raft-rs which Readies the log made durable, and sends the messages that waited
    /// for them.
    fn collect_persisted(&mut self) -> Result<(), RaftError> {
        let durable = self.host.persisted()?;
        let mut last = None;
        while let Some((number, _)) = self.unpersisted.front()
            && *number <= durable
        {
            let Some((number, held)) = self.unpersisted.pop_front() else {
                break;
            };
            last = Some(number);
            self.send(held);
        }
        if let Some(number) = last {
            self.raw.on_persist_ready(number);
        }
        Ok(())
    }

    /// Installs a snapshot from the leader: the store first (its data replaced and durable,
    /// with the snapshot's index and term recorded), then the log (dropped up to the
    /// snapshot, which becomes its floor). A crash in between is finished at the next start
    /// from what the store recorded. Only this member's own loop waits meanwhile; the others
    /// go on without it.
    fn install_snapshot(&mut self, snap: Snapshot) -> Result<(), RaftError> {
        let (index, term) = (snap.get_metadata().index, snap.get_metadata().term);
        let started = self.host.now();
        self.host.install_snapshot(&snap)?;
        self.compacted_at = index;
        self.sync_peers()?;
        info!(
            index,
            term,
            ms = self.host.now().duration_since(started).as_millis() as u64,
            "installed a snapshot from the leader"
        );
        Ok(())
    }

    /// Points the transport at every member the store lists (after a snapshot replaced the
    /// member list), and away from members no longer in it.
    fn sync_peers(&mut self) -> Result<(), RaftError> {
        let members = self.host.members()?;
        for member in &members {
            if let Some(url) = member.peer_urls.first() {
                self.host.add_peer(member.id, url);
            }
        }
        for peer in self.host.peer_ids() {
            if !members.iter().any(|m| m.id == peer) {
                self.host.remove_peer(peer);
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
            .min(self.host.durable_applied_index());
        if floor < self.host.log_first_index() {
            // The store's durable point lags; try again after its next checkpoint.
            return Ok(());
        }
        let before = self.host.log_first_index();
        self.host.compact_log(floor + 1)?;
        self.compacted_at = applied;
        info!(
            applied,
            dropped = floor + 1 - before,
            first_index = self.host.log_first_index(),
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
        self.host.apply(batch)?;
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
        self.host.set_conf_state(&conf)?;
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
                    if let Some(url) = record.peer_urls.first() {
                        self.host.add_peer(id, url);
                    }
                    info!(
                        member = format_args!("{id:x}"),
                        learner = record.is_learner,
                        index = entry.index,
                        "membership: member added"
                    );
                    // A promotion carries no URLs: the member keeps the ones it was added with.
                    if !record.peer_urls.is_empty() {
                        self.applied_members
                            .insert(id, Some(record.peer_urls.clone()));
                    }
                    membership.upsert.push(record);
                }
                ConfChangeType::RemoveNode => {
                    info!(
                        member = format_args!("{id:x}"),
                        index = entry.index,
                        "membership: member removed"
                    );
                    membership.removed.push(id);
                    self.applied_members.insert(id, None);
                    if id == self.id {
                        self.removed = true;
                    } else {
                        self.host.remove_peer(id);
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

    /// Two survivors ticking in step: the first tick both campaign (the fast path), and
    /// from then on they soon differ, which is what ends a split vote.
    #[test]
    fn survivors_in_step_stop_campaigning_together() {
        // Member ids as the cluster derives them are hashes; any distinct u64s will do.
        let ids: Vec<u64> = (1..=200u64)
            .map(|i| i.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x1234_5678)
            .collect();
        let (mut both, mut alone, mut draws) = (0u64, 0u64, 0u64);
        let (mut waits, mut pairs) = (0u64, 0u64);
        for (n, &a) in ids.iter().enumerate() {
            for &b in &ids[n + 1..] {
                assert!(retry_campaign(a, 0) && retry_campaign(b, 0));
                // The first later tick where exactly one campaigns: a geometric wait with
                // odds 1/2, two ticks on average; 24 in a row would be odds 2^-24.
                let first_alone = (1..=24)
                    .find(|&t| retry_campaign(a, t) != retry_campaign(b, t))
                    .unwrap_or_else(|| panic!("{a:x} and {b:x} agree for 24 ticks"));
                waits += first_alone;
                pairs += 1;
                for t in 1..=16 {
                    let (x, y) = (retry_campaign(a, t), retry_campaign(b, t));
                    both += u64::from(x && y);
                    alone += u64::from(x != y);
                    draws += 1;
                }
            }
        }
        // Fair coins: both campaign in a quarter of the ticks, one alone in half.
        let both = both as f64 / draws as f64;
        let alone = alone as f64 / draws as f64;
        assert!((0.22..0.28).contains(&both), "both {both}");
        assert!((0.47..0.53).contains(&alone), "alone {alone}");
        let mean_wait = waits as f64 / pairs as f64;
        assert!(
            (1.8..2.2).contains(&mean_wait),
            "mean wait {mean_wait} ticks"
        );
    }
}
