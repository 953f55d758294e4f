//! Deterministic simulation of a skerry cluster: N members running the real node logic
//! (`skerry_raft::core::Core`) over in-memory logs and stores (`skerry_store::sync_store`, the
//! store's own apply code on an in-memory redb), a simulated network and a nemesis, in one
//! thread, on a virtual clock, from one seeded RNG. Every run's history goes through the
//! checkers (`crate::check`); a failing seed replays exactly with `SKERRY_SIM_SEED=<seed>`.
//!
//! What a run exercises: elections with drifting clocks, message loss, delay, duplication and
//! reordering, partitions (majority/minority, bridge, one-way), crashes that lose what was not
//! synced (log and store) and restarts from what was, log compaction and snapshots to members
//! that fell behind, and the replacement of a member (removed, wiped, added as a learner,
//! caught up, promoted), leadership moved on request (`MoveLeader`, refused as etcd refuses
//! it or carried out), alarms raised and cleared (writes refused alike on every member
//! meanwhile), under concurrent clients doing gets, puts, deletes, CAS txns and range
//! reads.
//!
//! What it does not: watches (the watch hub is the threaded store's and is judged in the
//! real-process runs), leases (expiry runs on the wall clock), TLS and the TCP transport.

pub mod host;
pub mod world;

use std::time::Duration;

pub use host::DiskStall;
pub use world::{RunResult, RunStats, SimConfig, World};

use crate::check::{CommittedHistory, Report, check_all};

/// How long the linearizability search may take per run before it answers "unknown".
pub const CHECK_BUDGET: Duration = Duration::from_secs(10);

/// One seed's run and its verdict.
pub struct SeedOutcome {
    pub run: RunResult,
    pub report: Report,
}

impl SeedOutcome {
    /// Valid: the checkers found nothing and the replicas agree.
    pub fn is_valid(&self) -> bool {
        self.report.is_valid() && self.run.divergences.is_empty()
    }

    /// A one-paragraph account, with the seed to replay it.
    pub fn summary(&self) -> String {
        let s = &self.run.stats;
        let mut out = format!(
            "seed {}: {} ops, {} messages ({} dropped), {} partitions, {} crashes, {} snapshots \
             sent, {} members replaced, leadership moved {} times ({} refused, {} timed out), \
             {} alarms raised and {} cleared, {} virtual ms\n{}",
            self.run.seed,
            self.run.history.len(),
            s.messages,
            s.dropped,
            s.partitions,
            s.crashes,
            s.snapshots_installed,
            s.members_replaced,
            s.leaders_moved,
            s.transfers_refused,
            s.transfers_timed_out,
            s.alarms_raised,
            s.alarms_cleared,
            s.virtual_ms,
            self.report
        );
        for d in &self.run.divergences {
            out.push_str(&format!("divergence: {d}\n"));
        }
        out.push_str(&format!(
            "replay: SKERRY_SIM_SEED={} cargo test -p skerry-tests --test sim\n",
            self.run.seed
        ));
        out
    }
}

/// Runs one seed and checks it.
pub fn run_seed(seed: u64, config: &SimConfig) -> Result<SeedOutcome, String> {
    let run = World::new(seed, config.clone())?.run();
    let report = check_all(
        &run.history,
        &[],
        &CommittedHistory::default(),
        &run.final_state,
        CHECK_BUDGET,
    );
    Ok(SeedOutcome { run, report })
}
