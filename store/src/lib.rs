//! skerry's store: an etcd-compatible MVCC keyspace on redb, served over etcd's v3 gRPC API.
//!
//! # Layout
//! - [`store`]: the handle ([`Store`]): opening a data dir, the group-commit writer thread,
//!   reads, client writes, what a replicated log drives, and the background syncer, lessor
//!   and checkpoint ticker, one file each. Start here.
//! - [`mvcc`]: the deterministic state machine: redb tables, rows, and how each command
//!   (put, delete-range, txn, compaction, lease grant/revoke) changes them.
//! - `apply`, `state`, `read`: what [`Store`]'s writer and readers share with
//!   [`sync_store::SyncStore`]: applying a batch of commands (with the alarms' appliers and
//!   the quota), compaction steps and snapshot installs; creating, checking and loading the
//!   tables; reading history, hashes, membership and pinned snapshots.
//! - [`wal`]: the write-ahead log that makes a batch durable with one `fdatasync`.
//! - [`index`]: the in-memory key index (etcd's `treeIndex`).
//! - [`gosort`]: Go's `sort.Sort`, so sorted ranges order ties as etcd does.
//! - [`watch`]: the watch hub (synced / unsynced watchers, progress notifications).
//! - [`lease`]: the lessor.
//! - [`quota`] and [`alarm`]: etcd's space quota, and the alarms (`NOSPACE`, `CORRUPT`) that
//!   stop writes cluster-wide until they are cleared.
//! - [`snapshot`]: snapshot stream format, restore, and install into a cluster member.
//! - [`sync_store`]: the same state machine without threads, files or clocks, over redb in
//!   memory, for the Raft layer's deterministic simulation.
//! - [`replication`]: the seam with a replicated log: [`replication::Replicator`] (what the
//!   log offers the store) and [`replication::StateMachine`] (what the log drives: [`Store`]
//!   in production, [`sync_store::SyncStore`] in the simulation).
//! - [`grpc`]: the tonic services for KV, Watch, Lease, Maintenance and Cluster.
//! - [`pb`]: the generated wire types.
//!
//! The store knows nothing of Raft: it applies an ordered stream of [`pb::command::Command`]s
//! with the applied index stored in the same redb transaction, and keeps redb durable only at
//! checkpoints because a log (its own write-ahead log, or the Raft log of a cluster member)
//! holds the rest. The Raft layer drives it through [`replication::StateMachine`].
//!
//! The store side of two tricks of `docs/tricks.md` lives here: the compacted-revision floor
//! that the apiserver's compactor (#13, a CAS on a magic key) moves, and `count` on limited
//! ranges that the apiserver's paged LIST (#8) depends on.

pub mod alarm;
mod apply;
pub mod error;
pub mod gosort;
pub mod grpc;
pub mod index;
pub mod lease;
pub mod metrics;
pub mod mvcc;
pub mod pb;
pub mod quota;
mod read;
pub mod replication;
pub mod rev;
pub mod snapshot;
mod state;
pub mod store;
pub mod sync_store;
pub mod validate;
pub mod wal;
pub mod watch;

pub use error::StoreError;
pub use store::{CommandResult, PinnedSnapshot, Store, StoreConfig, StoreStatus};
