//! The seam between the store and a replicated log (the Raft layer in `skerry-raft`).
//!
//! A store opened with [`crate::StoreConfig::replicated`] keeps no log of its own: writes are
//! handed to a [`Replicator`], which orders them in its log and, once they are committed,
//! feeds them back with their log index through [`crate::Store::apply_committed`]. The store
//! applies them in index order (skipping indexes it has already applied, so replay after a
//! restart is harmless), commits redb without an fsync (the log is durable) and answers the
//! waiting caller. Linearizable reads ask the replicator for a read index and wait until the
//! store has applied it.

use tokio::sync::oneshot;

use crate::apply::CommandResult;
use crate::error::StoreError;
use crate::pb::command::Command;

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
