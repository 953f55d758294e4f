//! The seam between the store and a replicated log (the Raft layer in `skerry-raft`).
//!
//! A store opened with [`crate::StoreConfig::replicated`] keeps no log of its own: writes are
//! handed to a [`Replicator`], which orders them in its log and, once they are committed,
//! feeds them back with their log index through [`crate::Store::apply_committed`]. The store
//! applies them in index order (skipping indexes it has already applied, so replay after a
//! restart is harmless), commits redb without an fsync (the log is durable) and answers the
//! waiting caller. Linearizable reads ask the replicator for a read index and wait until the
//! store has applied it.
//!
//! The other direction is [`StateMachine`]: what the log needs of the store it drives
//! (entries to apply, snapshots to pin and install, what the store applied and made durable,
//! the membership it recorded), and [`Proposer`], which connects a store with clients of its
//! own to the log. The Raft layer's production node is written against these traits only;
//! [`crate::Store`] implements both, and the simulation's [`crate::sync_store::SyncStore`]
//! implements [`StateMachine`], so the simulated host drives its store through the same
//! calls.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::apply::CommandResult;
use crate::error::StoreError;
use crate::pb::command::{Command, Member};
use crate::read::PinnedSnapshot;

/// Where a command's result goes once it is applied on this member.
pub type Reply = oneshot::Sender<Result<CommandResult, StoreError>>;

/// What a replicated log offers the store.
pub trait Replicator: Send + Sync + 'static {
    /// Submits `command` to the log. `reply` gets the result when this member applies the
    /// entry, or an error ([`StoreError::NoLeader`], [`StoreError::Stopped`]) if it cannot be
    /// proposed. A command whose entry is lost in a leader change gets no reply: the store's
    /// caller times out, as etcd's does.
    fn submit(&self, command: Command, reply: Reply);

    /// Starts a ReadIndex round; `reply` gets the log index a linearizable read must wait for.
    fn read_index(&self, reply: oneshot::Sender<Result<u64, StoreError>>);

    /// The log's state as this member sees it, for `Maintenance.Status`.
    fn status(&self) -> ReplicaStatus;

    /// A client renewed lease `id` on this member. Expiry is decided by the leader alone, so
    /// a follower passes the renewal on to it (etcd forwards keep-alives to its leader too).
    fn renew_lease(&self, id: i64);

    /// Submits a membership change. `reply` gets [`CommandResult::Membership`] once this
    /// member has applied it, or why it was refused. A log without membership (a test
    /// double) refuses every change.
    fn change_membership(&self, change: MembershipChange, reply: Reply) {
        let _ = change;
        let _ = reply.send(Err(StoreError::Unsupported(
            "this replicated log has no membership changes".into(),
        )));
    }

    /// Hands leadership to member `target` (etcd's `MoveLeader`). This member must lead;
    /// `reply` gets `Ok` once it sees `target` lead, or why not ([`StoreError::NotLeader`],
    /// [`StoreError::BadLeaderTransferee`], [`StoreError::LeaderTransferTimeout`]). A log
    /// without leaders to move (a test double) refuses.
    fn move_leader(&self, target: u64, reply: oneshot::Sender<Result<(), StoreError>>) {
        let _ = target;
        let _ = reply.send(Err(StoreError::Unsupported(
            "this replicated log cannot move its leader".into(),
        )));
    }
}

/// What a replicated log needs of the state machine it drives (raft-rs and etcd call the
/// application a log feeds its state machine): committed entries applied in index order,
/// snapshots pinned for a member too far behind and installed from the leader, and what the
/// log must know at start and at compaction.
///
/// Implemented by [`crate::Store`] (the production node drives it) and by
/// [`crate::sync_store::SyncStore`] (the simulation's hosts drive it).
pub trait StateMachine {
    /// Where an installed snapshot's stream is read from: the file the transport received
    /// ([`crate::Store`]), or the stream's bytes ([`crate::sync_store::SyncStore`]).
    type SnapshotSource: ?Sized;

    /// The last applied log index.
    fn applied_index(&self) -> u64;

    /// The applied index of the last durable commit: the log must keep every entry after
    /// it, since a crash makes the state machine apply them again.
    fn durable_applied_index(&self) -> u64;

    /// The log index and term of the last snapshot installed, if any. Recorded in the
    /// install's own commit, so after a crash between the state machine's install and the
    /// log's own update they tell the log where the state machine stands.
    fn installed_snapshot(&self) -> Result<Option<(u64, u64)>, StoreError>;

    /// raft-rs's encoded `ConfState` as of the last applied membership change (or installed
    /// snapshot); `None` before there was one.
    fn conf_state(&self) -> Result<Option<Vec<u8>>, StoreError>;

    /// The members as the log recorded them, sorted by id.
    fn members(&self) -> Result<Vec<Member>, StoreError>;

    /// Applies committed entries in index order; each entry's result goes to its `reply`.
    /// Entries at or below the applied index are skipped (the log re-delivers them after a
    /// restart); the rest must follow it with no gap.
    fn apply_committed(&mut self, entries: Vec<Committed>) -> Result<(), StoreError>;

    /// Pins the state machine as it is now for a snapshot; see [`PinnedSnapshot`].
    fn pin_snapshot(&self) -> Result<PinnedSnapshot, StoreError>;

    /// Replaces the whole state with the snapshot in `source`, which holds the state after
    /// log entry `index` of term `term`: durable at once, after every entry handed over
    /// before it; the next entry to apply is `index + 1`. On error nothing has changed.
    fn install_snapshot(
        &mut self,
        source: &Self::SnapshotSource,
        index: u64,
        term: u64,
    ) -> Result<(), StoreError>;

    /// Whether this member leads, and the term: only the leader decides lease expiry.
    fn set_leadership(&mut self, leader: bool, term: u64);

    /// A follower's client renewed lease `id`, and this member leads.
    fn lease_renewed_elsewhere(&mut self, id: i64);
}

/// A state machine with clients of its own, whose writes, linearizable reads and membership
/// changes go through the log: the log connects itself once it has started.
/// ([`crate::sync_store::SyncStore`] has no clients: the simulation proposes to its nodes
/// directly.)
pub trait Proposer: StateMachine {
    /// Connects the log. Once only; later calls are ignored.
    fn set_replicator(&self, replicator: Arc<dyn Replicator>);
}

/// The log's state as one member sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// The leader's member id; 0 when there is none.
    pub leader: u64,
    pub term: u64,
    /// The highest log index known committed.
    pub commit_index: u64,
}

/// One committed log entry for [`crate::Store::apply_committed`].
pub struct Committed {
    /// The entry's log index; consecutive across calls.
    pub index: u64,
    /// The command, or `None` for an entry that carries none (a new leader's empty entry, a
    /// membership change): it only moves the applied index.
    pub command: Option<Command>,
    /// The caller waiting on this member, if it proposed the entry.
    pub reply: Option<Reply>,
}

/// A membership change a client asked for through the Cluster API (`etcdctl member ...`).
/// The replicated log validates it on its leader and commits it as a Raft configuration
/// change; the store applies the resulting membership (see `Command::Membership`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipChange {
    /// A new member reachable at `peer_urls`; as a learner (no vote until promoted) or as a
    /// voter.
    Add {
        peer_urls: Vec<String>,
        learner: bool,
    },
    /// Makes learner `id` a voter, once it has caught up with the leader.
    Promote {
        id: u64,
    },
    Remove {
        id: u64,
    },
}
