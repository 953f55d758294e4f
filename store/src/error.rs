//! The store's errors. Each variant's `Display` is the exact text etcd 3.4 puts in its gRPC
//! status, because clients (etcdctl, the Go client, the Kubernetes apiserver) match on it.

use thiserror::Error;

/// An error a store operation returns. The wire mapping (gRPC code) lives in [`crate::grpc`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted { compact_revision: i64 },
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    /// A member's backend is past its space quota, or the `NOSPACE` alarm is active.
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    /// The `CORRUPT` alarm is active.
    #[error("etcdserver: corrupt cluster")]
    Corrupt,
    #[error("etcdserver: server stopped")]
    Stopped,
    /// The cluster has no leader (an election is under way, or this member is cut off).
    #[error("etcdserver: no leader")]
    NoLeader,
    /// The leader changed while the request waited; it may or may not be applied.
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    /// A replicated request got no answer in time; it may still be applied later.
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExists,
    #[error("etcdserver: given member URLs are invalid")]
    MemberBadUrls,
    /// The change would leave fewer started voters than a quorum (etcd's strict
    /// reconfiguration check).
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughStarted,
    #[error("etcdserver: can only promote a learner member")]
    MemberNotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
    /// A request only the leader serves (`MoveLeader`) reached another member.
    #[error("etcdserver: not leader")]
    NotLeader,
    /// `MoveLeader`'s target is not a voting member.
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    /// Leadership did not move to `MoveLeader`'s target in time.
    #[error("etcdserver: request timed out, leader transfer took too long")]
    LeaderTransferTimeout,
    /// What this server cannot do; the text says what.
    #[error("{0}")]
    Unsupported(String),
    /// The disk said no, or what it holds is not what skerry wrote. Never caused by a client.
    #[error("storage: {0}")]
    Storage(String),
    /// The data dir belongs to another program, is corrupt, or is in use.
    #[error("{0}")]
    DataDir(String),
}

impl StoreError {
    pub(crate) fn storage(e: impl std::fmt::Display) -> Self {
        StoreError::Storage(e.to_string())
    }
}

macro_rules! storage_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::storage(e)
            }
        }
    )*};
}

storage_from!(
    redb::Error,
    redb::DatabaseError,
    redb::StorageError,
    redb::TransactionError,
    redb::TableError,
    redb::CommitError,
    prost::DecodeError,
    std::io::Error
);
