//! skerry's scheduler (`docs/tricks.md`, part 1: snapshots, sampling, preemption):
//! one scheduling cycle at a time over a snapshot of a cache that informers write to, never
//! locking the cache during a cycle and never looking at more nodes than it needs.
//!
//! - [`framework`]: the types every plugin sees ([`framework::NodeInfo`],
//!   [`framework::PodInfo`], [`framework::Snapshot`], [`framework::CycleState`]) and the
//!   plugin traits.
//! - [`cache`]: NodeInfos on a recency-ordered list stamped with generations; a cycle's
//!   snapshot update clones only the NodeInfos whose generation moved. Assumed pods.
//! - [`queue`]: active / backoff / unschedulable sub-queues.
//! - [`plugins`]: the filters and scores.
//! - [`preemption`]: remove every victim, then reprieve.
//! - [`scheduler`]: the cycle: sampling with `percentageOfNodesToScore`, a rotating start
//!   index, scoring, assume, asynchronous bind.

pub mod cache;
pub mod framework;
pub mod metrics;
pub mod plugins;
pub mod preemption;
pub mod queue;
pub mod scheduler;
