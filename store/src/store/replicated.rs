//! The store driven by a replicated log (the Raft layer in `skerry-raft`; see
//! [`crate::replication`]): the [`StateMachine`] it drives, and what the store asks of the log.
//!
//! - Committed entries come in through [`Store::apply_committed`] and go to the writer's
//!   queue in index order, behind any snapshot install handed over before them.
//! - A member too far behind is sent a [`crate::PinnedSnapshot`]; one received is installed
//!   by the writer ([`Store::install_snapshot`]).
//! - Linearizable reads wait for a read index; membership changes and leadership transfers
//!   go to the log; the log tells the store who leads ([`StateMachine::set_leadership`]).
//!
//! A single store answers the same questions for itself: it leads, it is its only member, and
//! its log index is its applied index.
//!
//! Invariants: the applied index only moves forward (entries apply in index order with no
//! gap, and an install is never behind it); the log must keep every entry after the durable
//! applied index (that of the last durable redb commit), which a crash makes the store apply
//! again.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::ReadableDatabase;
use tokio::sync::oneshot;

use super::writer::{Pending, WriterMsg};
use super::{RAFT_TERM, REPLICATED_REQUEST_TIMEOUT, Store, unexpected};
use crate::apply::CommandResult;
use crate::error::StoreError;
use crate::mvcc::RAFT_CONF_STATE;
use crate::pb::command::Member;
use crate::read::{PinnedSnapshot, pin, raft_record, read_installed_snapshot, read_members};
use crate::replication::{Committed, Proposer, Replicator, StateMachine};

impl Store {
    /// Connects a replicated store to its log. Once only; later calls are ignored.
    pub fn set_replicator(&self, replicator: Arc<dyn Replicator>) {
        let _ = self.shared.replicator.set(replicator);
    }

    /// Hands committed log entries to the writer, in index order. Blocks while the writer's
    /// queue is full (back-pressure on the log's apply loop).
    pub fn apply_committed(&self, entries: Vec<Committed>) -> Result<(), StoreError> {
        for entry in entries {
            let msg = WriterMsg::Command(Pending {
                index: Some(entry.index),
                command: entry.command,
                physical: false,
                reply: entry.reply,
            });
            self.writer
                .blocking_send(msg)
                .map_err(|_| StoreError::Stopped)?;
        }
        Ok(())
    }

    /// The last applied (and published) log index.
    pub fn applied_index(&self) -> u64 {
        self.shared.applied_index.load(Ordering::Acquire)
    }

    /// The applied index of the last durable redb commit. A replicated log must keep the
    /// entries after it: they are what a crash would make the store replay.
    pub fn durable_applied_index(&self) -> u64 {
        self.shared.durable_applied.load(Ordering::Acquire)
    }

    /// Pins the store as it is now for a Raft snapshot: one read transaction, with the
    /// applied index, revision and `ConfState` it holds. Writes go on meanwhile; the pinned
    /// view does not move. See [`PinnedSnapshot`] for what holding it costs.
    pub fn pin_snapshot(&self) -> Result<PinnedSnapshot, StoreError> {
        pin(&self.shared.db.read())
    }

    /// Replaces this member's whole store with the snapshot file at `path`, which holds the
    /// state after log entry `index` of term `term` (a leader's [`PinnedSnapshot`]).
    /// Blocking: call it from the log's own thread, not from async code.
    ///
    /// The writer takes it in queue order, after every entry handed over before it. It checks
    /// the file's digest, replaces every table in one durable transaction (the member keeps
    /// its own cluster and member ids), records `(index, term)` for
    /// [`Store::installed_snapshot`], then swaps the in-memory state: reads and watchers
    /// continue from the snapshot's history, and the next entry to apply is `index + 1`.
    /// On error nothing has changed.
    ///
    /// Only a replicated store installs snapshots, and never one behind what it has applied.
    ///
    /// # Panics
    /// When called from inside an async runtime (it blocks on the writer, as
    /// [`Store::apply_committed`] does).
    pub fn install_snapshot(&self, path: &Path, index: u64, term: u64) -> Result<(), StoreError> {
        if !self.shared.replicated {
            return Err(StoreError::Storage(
                "only a replicated store installs snapshots".into(),
            ));
        }
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(StoreError::Stopped);
        }
        let (reply, rx) = oneshot::channel();
        self.writer
            .blocking_send(WriterMsg::InstallSnapshot {
                path: path.to_path_buf(),
                index,
                term,
                reply,
            })
            .map_err(|_| StoreError::Stopped)?;
        rx.blocking_recv().map_err(|_| StoreError::Stopped)?
    }

    /// The log index and term of the last snapshot installed into this store, if any. The
    /// store records them in the install's own transaction, so after a crash between the
    /// store's install and the log's own update they tell the log where the store stands.
    pub fn installed_snapshot(&self) -> Result<Option<(u64, u64)>, StoreError> {
        read_installed_snapshot(&self.shared.db.read().begin_read()?)
    }

    /// raft-rs's encoded `ConfState` as of the last applied membership change (or installed
    /// snapshot); `None` before there was one.
    pub fn conf_state(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.shared.db.read().begin_read()?;
        raft_record(&txn, RAFT_CONF_STATE)
    }

    /// The cluster's members as the log recorded them (membership changes, and the
    /// attributes members published), sorted by id.
    pub fn members(&self) -> Result<Vec<Member>, StoreError> {
        read_members(&self.shared.db.read().begin_read()?)
    }

    /// Whether this store is a member of a replicated cluster.
    pub fn is_replicated(&self) -> bool {
        self.shared.replicated
    }

    /// Waits until the store has applied (and published) `index`.
    pub async fn wait_applied(&self, index: u64) -> Result<(), StoreError> {
        let mut rx = self.shared.applied_watch.subscribe();
        let wait = rx.wait_for(|applied| *applied >= index);
        match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(StoreError::Stopped),
            Err(_) => Err(StoreError::Timeout),
        }
    }

    /// Makes the next read linearizable: in a cluster, one ReadIndex round and a wait until
    /// this member has applied that index (etcd's `linearizableReadNotify`). A single store
    /// publishes only what it committed, so every read is already linearizable.
    pub async fn linearizable_barrier(&self) -> Result<(), StoreError> {
        if !self.shared.replicated {
            return Ok(());
        }
        let result = self.read_index_wait().await;
        if result.is_err() {
            crate::metrics::READ_INDEXES_FAILED.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn read_index_wait(&self) -> Result<(), StoreError> {
        let replicator = self.shared.replicator.get().ok_or(StoreError::NoLeader)?;
        let (reply, rx) = oneshot::channel();
        replicator.read_index(reply);
        let index = match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, rx).await {
            Ok(result) => result.map_err(|_| StoreError::Timeout)??,
            Err(_) => return Err(StoreError::Timeout),
        };
        self.wait_applied(index).await
    }

    /// The log's state: from the replicated log, or this single store's own (it leads itself,
    /// and its log index is its applied index).
    pub fn replica_status(&self) -> crate::replication::ReplicaStatus {
        match self.shared.replicator.get() {
            Some(replicator) => replicator.status(),
            None => crate::replication::ReplicaStatus {
                leader: self.shared.member_id,
                term: RAFT_TERM,
                commit_index: self.applied_index(),
            },
        }
    }

    /// Adds, promotes or removes a cluster member (etcd's Cluster API), once the change is
    /// committed and applied on this member. The replicated log validates it on its leader.
    pub async fn change_membership(
        &self,
        change: crate::replication::MembershipChange,
    ) -> Result<(), StoreError> {
        if !self.shared.replicated {
            return Err(StoreError::Unsupported(
                "skerry: this member runs without replication; membership changes need a \
                 Raft cluster (--initial-cluster)"
                    .into(),
            ));
        }
        let replicator = self.shared.replicator.get().ok_or(StoreError::NoLeader)?;
        let (reply, rx) = oneshot::channel();
        replicator.change_membership(change, reply);
        match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, rx).await {
            Ok(Ok(Ok(CommandResult::Membership))) => Ok(()),
            Ok(Ok(Ok(other))) => Err(unexpected(&other)),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) | Err(_) => Err(StoreError::Timeout),
        }
    }

    /// Hands leadership to member `target` (etcd's `MoveLeader`, `etcdctl move-leader`):
    /// only the leader takes it, the target must be a voting member, and the answer comes
    /// once this member sees the target lead, or after [`REPLICATED_REQUEST_TIMEOUT`]
    /// (`etcdserver: request timed out, leader transfer took too long`). A single store is
    /// its own leader and only member: itself is the one target it accepts.
    pub async fn move_leader(&self, target: u64) -> Result<(), StoreError> {
        if !self.shared.replicated {
            return if target == self.shared.member_id {
                Ok(())
            } else {
                Err(StoreError::BadLeaderTransferee)
            };
        }
        let replicator = self.shared.replicator.get().ok_or(StoreError::NoLeader)?;
        let (reply, rx) = oneshot::channel();
        replicator.move_leader(target, reply);
        match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Stopped),
            Err(_) => Err(StoreError::LeaderTransferTimeout),
        }
    }

    /// Whether this member decides lease expiry (see [`StateMachine::set_leadership`]).
    pub fn is_lease_authority(&self) -> bool {
        self.shared.lease_authority.load(Ordering::Acquire)
    }
}

/// The store as the Raft layer drives it. Most methods are [`Store`]'s own public ones (the
/// store's tests call them too); `set_leadership` and `lease_renewed_elsewhere` are only here,
/// as only the log calls them.
impl StateMachine for Store {
    /// The file the transport wrote the leader's snapshot stream to.
    type SnapshotSource = Path;

    fn applied_index(&self) -> u64 {
        Store::applied_index(self)
    }

    fn durable_applied_index(&self) -> u64 {
        Store::durable_applied_index(self)
    }

    fn installed_snapshot(&self) -> Result<Option<(u64, u64)>, StoreError> {
        Store::installed_snapshot(self)
    }

    fn conf_state(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Store::conf_state(self)
    }

    fn members(&self) -> Result<Vec<Member>, StoreError> {
        Store::members(self)
    }

    fn apply_committed(&mut self, entries: Vec<Committed>) -> Result<(), StoreError> {
        Store::apply_committed(self, entries)
    }

    fn pin_snapshot(&self) -> Result<PinnedSnapshot, StoreError> {
        Store::pin_snapshot(self)
    }

    fn install_snapshot(&mut self, path: &Path, index: u64, term: u64) -> Result<(), StoreError> {
        Store::install_snapshot(self, path, index, term)
    }

    /// Sets the term response headers report. Only the leader proposes lease revocations; on
    /// becoming leader every lease gets its full TTL.
    fn set_leadership(&mut self, leader: bool, term: u64) {
        self.shared.raft_term.store(term, Ordering::Relaxed);
        let was = self.shared.lease_authority.swap(leader, Ordering::AcqRel);
        if leader && !was {
            self.shared.mvcc.lessor.lock().promote();
        }
    }

    /// Moves the deadline here, where expiry is decided.
    fn lease_renewed_elsewhere(&mut self, id: i64) {
        let _ = self.shared.mvcc.lessor.lock().keep_alive(id);
    }
}

impl Proposer for Store {
    fn set_replicator(&self, replicator: Arc<dyn Replicator>) {
        Store::set_replicator(self, replicator);
    }
}
