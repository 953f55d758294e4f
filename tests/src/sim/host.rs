//! A simulated member's machine: the log and the store in memory with a durability model, a
//! network outbox, and the virtual clock. [`SimHost`] implements `skerry_raft::core::Host`, so
//! the simulation runs the same node logic as a real member.
//!
//! Durability: the log keeps what was written and, separately, what was last synced; a crash
//! keeps only the synced part, as a power loss keeps only what reached the disk. The store's
//! durability is the `SyncStore`'s checkpoint (the real store's durable redb commit).
//!
//! The disk takes time, as the real log's writer thread does: each write the node hands over
//! becomes durable after a modelled sync latency (plus, on a member given a [`DiskStall`], a
//! stall now and then, a slow SD card), in order, with writes queued behind a sync sharing
//! the next one (group commit). The world wakes the member when its next write is done.
//!
//! The host drives its store through `skerry_store::replication::StateMachine`, as the
//! production node drives the real store: the same calls, on a `SyncStore`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use raft::eraftpb::{ConfState, Entry, HardState, Message, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use rand::Rng;
use rand::rngs::StdRng;
use skerry_raft::RaftError;
use skerry_raft::core::{Host, snapshot_message};
use skerry_raft::log::MemLog;
use skerry_store::pb::command::Member as MemberRecord;
use skerry_store::replication::{Committed, MembershipChange, StateMachine};
use skerry_store::sync_store::SyncStore;

/// Stalls of a member's disk: this share of its syncs take up to `max` longer.
#[derive(Debug, Clone, Copy)]
pub struct DiskStall {
    pub percent: u64,
    /// Virtual nanoseconds.
    pub max: u64,
}

/// One write handed to the disk: its Ready number, what it writes, whether it syncs, and
/// when it started and will be done (virtual nanoseconds).
#[derive(Debug)]
pub struct PendingWrite {
    number: u64,
    entries: Vec<Entry>,
    hard: Option<HardState>,
    sync: bool,
    start: u64,
    pub done_at: u64,
}

/// The log with its durability: `written` is what the member sees, `synced` what a crash
/// leaves; `pending` the writes on their way to disk.
#[derive(Debug, Default)]
pub struct SimLog {
    pub written: MemLog,
    pub synced: MemLog,
    pub pending: VecDeque<PendingWrite>,
    /// Writes done without a sync (a commit index alone): synced with the next sync.
    unsynced: Vec<(Vec<Entry>, Option<HardState>)>,
    /// The highest Ready number durable.
    durable: u64,
    /// Stalls this member's disk suffers, if any.
    pub stall: Option<DiskStall>,
}

impl SimLog {
    fn sync(&mut self) {
        self.synced = self.written.clone();
    }

    /// A power loss: what was not synced is gone, and so is every write under way.
    pub fn crash(&mut self) {
        self.written = self.synced.clone();
        self.pending.clear();
        self.unsynced.clear();
        self.durable = 0;
    }

    /// Completes the writes done by `now` (all of them with `None`), in order.
    fn complete(&mut self, now: Option<u64>) {
        while let Some(front) = self.pending.front() {
            if now.is_some_and(|now| front.done_at > now) {
                break;
            }
            let Some(write) = self.pending.pop_front() else {
                break;
            };
            self.unsynced.push((write.entries, write.hard));
            if write.sync {
                for (entries, hard) in std::mem::take(&mut self.unsynced) {
                    // `append` only fails on a gap, which `written` already refused.
                    let _ = self.synced.append(entries);
                    if let Some(hard) = hard {
                        self.synced.hard = hard;
                    }
                }
            }
            self.durable = self.durable.max(write.number);
        }
    }
}

/// A sync's latency without stalls (virtual nanoseconds): a fast card's `fdatasync`.
pub const SYNC_LATENCY_MIN: u64 = 200_000;
pub const SYNC_LATENCY_MAX: u64 = 3_000_000;

/// Snapshots pinned for sending, by receiving member (as the real transport's
/// `OutgoingSnapshots`): the store's stream bytes at the snapshot's index.
pub type Outgoing = Rc<RefCell<BTreeMap<u64, Vec<u8>>>>;

/// raft-rs's view: the simulated log for entries, the store for snapshots.
#[derive(Clone)]
pub struct SimStorage {
    pub log: Rc<RefCell<SimLog>>,
    pub store: Rc<RefCell<SyncStore>>,
    pub outgoing: Outgoing,
}

fn unavailable() -> raft::Error {
    raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable)
}

impl Storage for SimStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let log = self.log.borrow();
        Ok(RaftState::new(
            log.written.hard.clone(),
            log.written.conf.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.log
            .borrow()
            .written
            .read_entries(low, high, max_size.into())
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.log.borrow().written.read_term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.log.borrow().written.first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.log.borrow().written.last_index())
    }

    /// The store as it is now (its applied index is the snapshot's), as the real node's
    /// storage pins a read transaction.
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let pinned = self
            .store
            .borrow()
            .pin_snapshot()
            .map_err(|_| unavailable())?;
        let mut bytes = Vec::new();
        pinned.write(&mut bytes).map_err(|_| unavailable())?;
        let snap = snapshot_message(
            &self.log.borrow().written,
            pinned.applied_index,
            request_index,
            pinned.conf_state.as_deref(),
        )?;
        self.outgoing.borrow_mut().insert(to, bytes);
        Ok(snap)
    }
}

/// What a simulated member sends: raft messages, forwarded membership changes and their
/// refusals. Drained by the world after every step of the member.
#[derive(Debug)]
pub enum Sent {
    Raft(Message),
    /// A snapshot message with its store stream bytes (the real transport's own connection).
    Snapshot(Message, Vec<u8>),
    Membership {
        to: u64,
        proposal: u64,
        change: MembershipChange,
    },
    MembershipRefused {
        to: u64,
        proposal: u64,
        reason: String,
    },
}

/// One member's machine.
pub struct SimHost {
    pub id: u64,
    pub storage: SimStorage,
    pub outbox: Vec<Sent>,
    pub peers: BTreeMap<u64, String>,
    pub clock: Rc<Cell<u64>>,
    pub base: Instant,
    /// Seeds new member ids; shared with the world so every draw is in the run's order.
    pub rng: Rc<RefCell<StdRng>>,
}

impl SimHost {
    /// One sync's latency on this member's disk, with a stall drawn when it has them.
    fn sync_latency(&self, stall: Option<DiskStall>) -> u64 {
        let mut rng = self.rng.borrow_mut();
        let mut latency = rng.random_range(SYNC_LATENCY_MIN..=SYNC_LATENCY_MAX);
        if let Some(stall) = stall
            && rng.random_range(0..100) < stall.percent
        {
            latency += rng.random_range(0..=stall.max);
        }
        latency
    }
}

impl Host for SimHost {
    type Storage = SimStorage;

    fn persist(
        &mut self,
        number: u64,
        entries: &[Entry],
        hard: Option<&HardState>,
        sync: bool,
    ) -> Result<(), RaftError> {
        let now = self.clock.get();
        let mut log = self.storage.log.borrow_mut();
        log.written.append(entries.to_vec())?;
        if let Some(hard) = hard {
            log.written.hard = hard.clone();
        }
        let (start, done_at) = match log.pending.back() {
            // Queued behind a write not started yet: written and synced with it.
            Some(last) if last.start > now => (last.start, last.done_at),
            // Behind the sync under way: the next sync, once it is done.
            Some(last) => {
                let start = last.done_at.max(now);
                (start, start + self.sync_latency(log.stall))
            }
            None => (now, now + self.sync_latency(log.stall)),
        };
        log.pending.push_back(PendingWrite {
            number,
            entries: entries.to_vec(),
            hard: hard.cloned(),
            sync,
            start,
            done_at,
        });
        Ok(())
    }

    fn persisted(&mut self) -> Result<u64, RaftError> {
        let now = self.clock.get();
        let mut log = self.storage.log.borrow_mut();
        log.complete(Some(now));
        Ok(log.durable)
    }

    /// Done at once: the simulation does not model the time a flush (before a snapshot
    /// install, a rare event) waits.
    fn flush(&mut self) -> Result<(), RaftError> {
        self.storage.log.borrow_mut().complete(None);
        Ok(())
    }

    fn sync_running_for(&self) -> Option<Duration> {
        let now = self.clock.get();
        let log = self.storage.log.borrow();
        let front = log.pending.front()?;
        (front.start <= now).then(|| Duration::from_nanos(now - front.start))
    }

    fn set_conf_state(&mut self, conf: &ConfState) -> Result<(), RaftError> {
        let mut log = self.storage.log.borrow_mut();
        log.written.conf = conf.clone();
        // The real log queues a record synced with the next batch; taken as durable at once.
        log.synced.conf = conf.clone();
        Ok(())
    }

    fn log_first_index(&self) -> u64 {
        self.storage.log.borrow().written.first_index()
    }

    fn compact_log(&mut self, index: u64) -> Result<(), RaftError> {
        let mut log = self.storage.log.borrow_mut();
        if let Some((floor, term)) = log.written.floor_before(index) {
            log.written.compact(floor, term);
            // The floor is at or below the applied index, which is durable.
            log.synced.compact(floor, term);
        }
        Ok(())
    }

    fn install_snapshot(&mut self, snap: &Snapshot) -> Result<(), RaftError> {
        let meta = snap.get_metadata();
        self.storage
            .store
            .borrow_mut()
            .install_snapshot(&snap.data, meta.index, meta.term)?;
        let mut log = self.storage.log.borrow_mut();
        let state = &mut log.written;
        state.install(meta.index, meta.term);
        state.conf = meta.get_conf_state().clone();
        state.hard.commit = state.hard.commit.max(meta.index);
        state.hard.term = state.hard.term.max(meta.term);
        log.sync();
        Ok(())
    }

    fn apply(&mut self, batch: Vec<Committed>) -> Result<(), RaftError> {
        Ok(self.storage.store.borrow_mut().apply_committed(batch)?)
    }

    fn members(&self) -> Result<Vec<MemberRecord>, RaftError> {
        Ok(self.storage.store.borrow().members()?)
    }

    fn durable_applied_index(&self) -> u64 {
        self.storage.store.borrow().durable_applied_index()
    }

    fn set_leadership(&mut self, leader: bool, term: u64) {
        self.storage.store.borrow_mut().set_leadership(leader, term);
    }

    fn lease_renewed_elsewhere(&mut self, id: i64) {
        self.storage.store.borrow_mut().lease_renewed_elsewhere(id);
    }

    fn send(&mut self, messages: Vec<Message>) -> Vec<u64> {
        let mut unknown = Vec::new();
        for m in messages {
            if !self.peers.contains_key(&m.to) {
                if !unknown.contains(&m.to) {
                    unknown.push(m.to);
                }
                continue;
            }
            if m.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot {
                let bytes = self.storage.outgoing.borrow_mut().remove(&m.to);
                match bytes {
                    Some(bytes) => self.outbox.push(Sent::Snapshot(m, bytes)),
                    None => unknown.push(m.to),
                }
                continue;
            }
            self.outbox.push(Sent::Raft(m));
        }
        unknown
    }

    fn add_peer(&mut self, id: u64, peer_url: &str) {
        if id != self.id {
            self.peers.insert(id, peer_url.to_string());
        }
    }

    fn remove_peer(&mut self, id: u64) {
        self.peers.remove(&id);
    }

    fn peer_ids(&self) -> Vec<u64> {
        self.peers.keys().copied().collect()
    }

    fn forward_membership(&mut self, leader: u64, proposal: u64, change: MembershipChange) -> bool {
        if !self.peers.contains_key(&leader) {
            return false;
        }
        self.outbox.push(Sent::Membership {
            to: leader,
            proposal,
            change,
        });
        true
    }

    fn refuse_membership(&mut self, peer: u64, proposal: u64, reason: String) {
        self.outbox.push(Sent::MembershipRefused {
            to: peer,
            proposal,
            reason,
        });
    }

    fn send_lease_renewals(&mut self, _leader: u64, _ids: Vec<i64>) {}

    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.clock.get())
    }

    fn id_salt(&mut self) -> u64 {
        self.rng.borrow_mut().random()
    }
}
