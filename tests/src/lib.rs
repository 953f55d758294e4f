//! skerry's end-to-end tests, crash tests, load generator and torture tests.
//!
//! - `check`: pure checkers (linearizability, revisions, watches, compactions, lost writes) over recorded
//!   histories; start at `check::check_all`.
//! - `sim`: the deterministic simulation of a cluster, judged by `check`.

pub mod apibench;
pub mod check;
pub mod nodebench;
pub mod sim;
pub mod torture;
