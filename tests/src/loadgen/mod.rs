//! The load generator's parts, included by `src/bin/skerry-loadgen.rs`.
//!
//! - `server`: starts skerry or etcd on loopback in a temp dir and kills it on drop.
//! - `workloads`: the six workloads and the bounded client loop they share.
//! - `stats`: latency percentiles, one workload's result, and medians across runs.
//! - `unary`: the lean gRPC unary client over `h2` that the put, get, txn and range loops use.
//! - `failover`: kill -9 (or freeze) the leader of a cluster, time until writes resume.
//! - `report`: the stdout table, the markdown table and the JSON document.
//!
//! Start at `workloads::run_workload`.

pub mod failover;
pub mod report;
pub mod server;
pub mod stats;
pub mod unary;
pub mod workloads;
