//! skerry's replicated log: raft-rs (tikv/raft-rs) driven over the store, so that three
//! boxes keep every acknowledged write through the loss of any one.
//!
//! # Layout
//! - [`config`]: the cluster description from etcd's flags (`--initial-cluster`, ...), its
//!   validation, and the member and cluster ids derived from it.
//! - [`log`]: the Raft log, hard state and conf state on segment files (one `fdatasync` per
//!   `Ready`).
//! - [`transport`]: TCP between members: framed, batched, reconnecting; [`tls`]: mutual TLS
//!   for it.
//! - [`core`]: the node's logic (inputs, ticks, each `Ready`, membership, compaction,
//!   snapshots) over a [`core::Host`]: the same code in production and in the deterministic
//!   simulation.
//! - [`node`]: production: the thread that drives the logic with the store, the log, the
//!   transport and the real clock; the [`node::RaftHandle`] the store submits writes,
//!   ReadIndex rounds and membership changes through.
//!
//! The store (`skerry-store`) knows nothing of Raft: opened replicated, it applies committed
//! entries by index (see `skerry_store::replication`). Leader election that does not trust
//! clocks lives here (the stance `docs/tricks.md` #14 takes for Lease election): pre-vote and
//! check-quorum on, ReadIndex (not lease-based reads) for linearizable reads.

pub mod config;
pub mod core;
pub mod error;
pub mod log;
mod logger;
pub mod node;
pub mod tls;
pub mod transport;

pub use config::{ClusterConfig, ClusterState};
pub use error::RaftError;
pub use node::{RaftHandle, RaftNode};
