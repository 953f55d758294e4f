//! The deterministic simulation in CI: thousands of seeded fault schedules against the real
//! node logic, every history judged by the checkers. A failure prints its seed;
//! `SKERRY_SIM_SEED=<seed> cargo test -p skerry-tests --test sim` replays it exactly.
//! `SKERRY_SIM_SEEDS=<n>` changes how many seeds run (the long run is
//! `cargo run --release -p skerry-tests --bin sim -- --seeds 100000`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use skerry_tests::sim::{SimConfig, run_seed};

/// Seeds CI runs: the issue asks for at least 2,000 in under five minutes.
const CI_SEEDS: u64 = 2_000;
/// Where CI's seeds start; fixed, so CI is reproducible (the long run draws others).
const CI_FIRST_SEED: u64 = 1;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Every fifth seed runs five members instead of three.
fn config_for(seed: u64) -> SimConfig {
    SimConfig {
        members: if seed.is_multiple_of(5) { 5 } else { 3 },
        ..SimConfig::default()
    }
}

#[test]
fn thousands_of_seeded_fault_schedules_keep_every_guarantee() {
    if let Some(seed) = env_u64("SKERRY_SIM_SEED") {
        let outcome = run_seed(seed, &config_for(seed)).expect("run");
        if std::env::var_os("SKERRY_SIM_DUMP").is_some() {
            for op in &outcome.run.history {
                eprintln!("{op:?}");
            }
        }
        eprintln!("{}", outcome.summary());
        assert!(outcome.is_valid(), "seed {seed} failed");
        return;
    }
    let seeds = env_u64("SKERRY_SIM_SEEDS").unwrap_or(CI_SEEDS);
    let next = Arc::new(AtomicU64::new(CI_FIRST_SEED));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let totals = Arc::new(Mutex::new((0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64)));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let next = next.clone();
            let failures = failures.clone();
            let totals = totals.clone();
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= CI_FIRST_SEED + seeds {
                        return;
                    }
                    match run_seed(seed, &config_for(seed)) {
                        Ok(outcome) => {
                            let s = &outcome.run.stats;
                            if let Ok(mut t) = totals.lock() {
                                t.0 += outcome.run.history.len() as u64;
                                t.1 += s.crashes;
                                t.2 += s.partitions;
                                t.3 += s.snapshots_installed;
                                t.4 += s.members_replaced;
                                t.5 += s.leaders_moved;
                                t.6 += s.alarms_raised;
                            }
                            if !outcome.is_valid()
                                && let Ok(mut f) = failures.lock()
                            {
                                f.push(outcome.summary());
                            }
                        }
                        Err(e) => {
                            if let Ok(mut f) = failures.lock() {
                                f.push(format!("seed {seed}: could not run: {e}"));
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("sim thread");
    }
    let t = *totals.lock().expect("totals");
    eprintln!(
        "{seeds} seeds: {} ops, {} crashes, {} partitions, {} snapshots sent, {} members \
         replaced, leadership moved {} times on request, {} alarms raised",
        t.0, t.1, t.2, t.3, t.4, t.5, t.6
    );
    let failures = failures.lock().expect("failures");
    for f in failures.iter().take(3) {
        eprintln!("{f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {seeds} seeds failed",
        failures.len()
    );
}

#[test]
fn a_seed_replays_step_for_step() {
    let config = SimConfig::default();
    let a = run_seed(42, &config).expect("run");
    let b = run_seed(42, &config).expect("run");
    assert_eq!(
        format!("{:?}", a.run.history),
        format!("{:?}", b.run.history)
    );
    assert_eq!(a.run.stats.messages, b.run.stats.messages);
    assert_eq!(a.run.final_state, b.run.final_state);
    let c = run_seed(43, &config).expect("run");
    assert_ne!(
        format!("{:?}", a.run.history),
        format!("{:?}", c.run.history),
        "different seeds, same run"
    );
}

/// Virtual nanoseconds.
const SECOND: u64 = 1_000_000_000;

/// A three-member run with steady clients, no network faults, and from `from` on a leader
/// whose disk stalls: a quarter of its syncs take up to `max` longer.
fn stalled_leader_config(run_for: u64, max: u64) -> SimConfig {
    SimConfig {
        members: 3,
        faults: false,
        membership: false,
        ops: 0,
        keys: 16,
        run_for,
        leader_disk_stall: Some((
            5 * SECOND,
            skerry_tests::sim::DiskStall { percent: 25, max },
        )),
        ..SimConfig::default()
    }
}

/// Issue 21: ten virtual minutes of a leader whose disk stalls for up to 500 ms (an SD card
/// having a bad day) elect no one else, with the 400 ms election timeout: the leader's
/// heartbeats never wait on its disk, and a stall this short hands nothing over. It fails if
/// the leader's messages wait for its writes, or with a handover threshold under the stalls
/// (the real-process twin is `skerry-raft`'s `cluster` test of the same name).
#[test]
fn a_leader_whose_disk_stalls_half_a_second_keeps_leading_for_ten_minutes() {
    let seed = 11;
    let outcome = run_seed(seed, &stalled_leader_config(600 * SECOND, SECOND / 2)).expect("run");
    let stats = &outcome.run.stats;
    assert!(outcome.is_valid(), "seed {seed}: {}", outcome.summary());
    assert!(
        stats.stalled_member.is_some(),
        "seed {seed}: no leader to stall"
    );
    assert!(
        stats.virtual_ms >= 600_000,
        "seed {seed}: ran {} ms",
        stats.virtual_ms
    );
    assert!(
        outcome.run.history.len() > 5_000,
        "seed {seed}: {} ops",
        outcome.run.history.len()
    );
    assert_eq!(
        stats.leader_changes_while_stalled, 0,
        "seed {seed}: the stalling leader lost leadership"
    );
}

/// Issue 21: stalls of up to 3 s do move leadership (the leader hands over once a sync has
/// taken `LEADER_DISK_STALL_MAX`), and every guarantee holds: nothing acknowledged is lost.
#[test]
fn a_leader_whose_disk_stalls_three_seconds_hands_over_and_loses_nothing() {
    for seed in [21, 22] {
        let outcome = run_seed(seed, &stalled_leader_config(90 * SECOND, 3 * SECOND)).expect("run");
        let stats = &outcome.run.stats;
        assert!(outcome.is_valid(), "seed {seed}: {}", outcome.summary());
        assert!(
            stats.stalled_member.is_some(),
            "seed {seed}: no leader to stall"
        );
        assert!(
            stats.leader_changes_while_stalled >= 1,
            "seed {seed}: leadership never moved off the stalling disk"
        );
    }
}
