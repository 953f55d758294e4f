//! Checkers for Jepsen-style torture runs: pure functions over a recorded history of client
//! operations and watch streams against an etcd-v3-compatible store, with etcd 3.4 semantics.
//! They do no I/O, so the same checks judge the deterministic simulation, real skerry
//! processes and real etcd.
//!
//! - `history`: the recorded types: [`Op`], [`Call`], [`Outcome`], [`Answer`], [`WatchLog`],
//!   [`CommittedHistory`], [`FinalState`].
//! - `linearizable`: per-key linearizability, including mod_revisions (Lowe / Porcupine).
//! - `revisions`: the global revision invariants across keys, and reads seeing exactly the
//!   writes at or below their revision.
//! - `watch`: watch streams against the committed history.
//! - `compaction`: the answers to compactions and to reads at past revisions.
//! - `lost`: no acknowledged write lost from the final state.
//!
//! Start at [`check_all`].

pub mod compaction;
pub mod history;
pub mod linearizable;
pub mod lost;
pub mod revisions;
pub mod watch;

use std::fmt;
use std::time::Duration;

pub use compaction::{CompactionViolation, check_compactions};
pub use history::{
    Answer, Call, CommittedEvent, CommittedHistory, CompactOutcome, Compaction, EventKind, Expect,
    FinalState, HistoryError, KeyValue, Op, Outcome, PastRead, PastReadOutcome, Versioned,
    WatchItem, WatchLog, range_contains, validate,
};
pub use linearizable::{Verdict, check_linearizable};
pub use lost::{LostWrite, check_lost_writes};
pub use revisions::{RevisionViolation, check_revisions};
pub use watch::{EventAt, Events, WatchViolation, check_watches};

/// Violations of one kind shown by `Report`'s `Display`; the rest are counted. Enough to see
/// the first failures without burying the summary. Semi-arbitrary.
const VIOLATIONS_SHOWN_MAX: usize = 10;

/// Everything the checkers found about one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Why the history is malformed (a harness bug); empty when it is well formed.
    pub malformed: Vec<HistoryError>,
    pub linearizability: Verdict,
    pub revisions: Vec<RevisionViolation>,
    pub watches: Vec<WatchViolation>,
    pub compactions: Vec<CompactionViolation>,
    pub lost_writes: Vec<LostWrite>,
}

impl Report {
    /// Whether every check finished and found nothing wrong.
    pub fn is_valid(&self) -> bool {
        self.malformed.is_empty()
            && self.linearizability == Verdict::Linearizable
            && !self.has_violation()
    }

    /// Whether some check found the store misbehaving. A report can be neither valid nor
    /// violated: when the history is malformed or linearizability ran out of budget.
    pub fn has_violation(&self) -> bool {
        matches!(self.linearizability, Verdict::Violation { .. })
            || !self.revisions.is_empty()
            || !self.watches.is_empty()
            || !self.compactions.is_empty()
            || !self.lost_writes.is_empty()
    }
}

/// Writes a titled list of violations, at most `VIOLATIONS_SHOWN_MAX` of them.
fn write_section<T: fmt::Display>(
    f: &mut fmt::Formatter<'_>,
    title: &str,
    violations: &[T],
) -> fmt::Result {
    if violations.is_empty() {
        return writeln!(f, "{title}: ok");
    }
    writeln!(f, "{title}: {} violations", violations.len())?;
    for violation in violations.iter().take(VIOLATIONS_SHOWN_MAX) {
        writeln!(f, "  {violation}")?;
    }
    if violations.len() > VIOLATIONS_SHOWN_MAX {
        writeln!(
            f,
            "  ... and {} more",
            violations.len() - VIOLATIONS_SHOWN_MAX
        )?;
    }
    Ok(())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.is_valid() {
            "VALID"
        } else if self.has_violation() {
            "INVALID"
        } else {
            "INCONCLUSIVE"
        };
        writeln!(f, "{verdict}")?;
        if !self.malformed.is_empty() {
            write_section(f, "malformed history", &self.malformed)?;
        }
        writeln!(f, "linearizability: {}", self.linearizability)?;
        write_section(f, "revisions", &self.revisions)?;
        write_section(f, "watches", &self.watches)?;
        write_section(f, "compactions", &self.compactions)?;
        write_section(f, "lost writes", &self.lost_writes)
    }
}

/// Runs every checker: linearizability (giving up after `budget`), the revision invariants,
/// the watch logs against `committed`, its compactions and past reads against its events,
/// and lost writes against `final_state`.
pub fn check_all(
    history: &[Op],
    watches: &[WatchLog],
    committed: &CommittedHistory,
    final_state: &FinalState,
    budget: Duration,
) -> Report {
    Report {
        malformed: validate(history),
        linearizability: check_linearizable(history, budget),
        revisions: check_revisions(history),
        watches: check_watches(watches, committed),
        compactions: check_compactions(committed),
        lost_writes: check_lost_writes(history, final_state),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::history::build::*;

    const BUDGET: Duration = Duration::from_secs(10);

    /// A simulated run: its history, one watch over everything from revision 1 that saw
    /// exactly the committed events, the committed history and the final state.
    fn run(seed: u64) -> (Vec<Op>, Vec<WatchLog>, CommittedHistory, FinalState) {
        run_of(seed, 3, 300)
    }

    fn run_of(
        seed: u64,
        keys: usize,
        ops: usize,
    ) -> (Vec<Op>, Vec<WatchLog>, CommittedHistory, FinalState) {
        let (history, events, final_state) = linearizable::sim::history(seed, keys, ops, 6);
        let watch = WatchLog {
            watcher: 1,
            range: (Vec::new(), vec![0]),
            start_revision: 1,
            items: events
                .iter()
                .map(|event| WatchItem::Event {
                    revision: event.revision,
                    key: event.key.clone(),
                    kind: event.kind,
                    value: event.value.clone(),
                })
                .collect(),
        };
        let committed = CommittedHistory {
            from_revision: 1,
            events,
            ..CommittedHistory::default()
        };
        (history, vec![watch], committed, final_state)
    }

    #[test]
    fn accepts_simulated_runs() {
        for seed in 0..30 {
            let (history, watches, committed, final_state) = run(seed);
            let report = check_all(&history, &watches, &committed, &final_state, BUDGET);
            assert!(report.is_valid(), "seed {seed}:\n{report}");
        }
    }

    #[test]
    fn a_large_run_is_checked_quickly() {
        let (history, watches, committed, final_state) = run_of(9, 5, 10_000);
        let started = std::time::Instant::now();
        let report = check_all(&history, &watches, &committed, &final_state, BUDGET);
        let elapsed = started.elapsed();
        assert!(report.is_valid(), "{report}");
        assert!(
            elapsed < Duration::from_secs(1),
            "10,000 ops took {elapsed:?}"
        );
    }

    #[test]
    fn rejects_a_simulated_run_that_lost_a_write() {
        let (history, watches, committed, mut final_state) = run(1);
        // Drop a key whose final value an acknowledged write made (and that no delete with a
        // lost answer could have removed), as if that write had been lost.
        let acknowledged = |key: &[u8], revision: i64| {
            history
                .iter()
                .any(|op| op.call.key() == Some(key) && op.write_revision() == Some(revision))
        };
        let maybe_deleted = |key: &[u8]| {
            history.iter().any(|op| {
                op.result == Outcome::Unknown
                    && matches!(&op.call, Call::Delete { key: k } if k == key)
            })
        };
        let victim = final_state
            .iter()
            .find(|(key, kv)| acknowledged(key, kv.mod_revision) && !maybe_deleted(key))
            .map(|(key, _)| key.clone())
            .expect("some key holds an acknowledged write");
        final_state.remove(&victim);
        let report = check_all(&history, &watches, &committed, &final_state, BUDGET);
        assert!(report.has_violation(), "{report}");
        assert!(!report.lost_writes.is_empty(), "{report}");
    }

    #[test]
    fn arbitrary_input_never_panics() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};

        // Revisions and times a broken server or harness might hand in, extremes included.
        fn revision(rng: &mut StdRng) -> i64 {
            [i64::MIN, -1, 0, 1, 2, 3, 64, 65, i64::MAX - 1, i64::MAX][rng.random_range(0..10)]
        }
        fn time(rng: &mut StdRng) -> u64 {
            [0, 1, 2, 3, u64::MAX - 1, u64::MAX][rng.random_range(0..6)]
        }
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..3_000 {
            let key = |rng: &mut StdRng| -> Vec<u8> {
                [&b""[..], b"a", b"b", b"\0"][rng.random_range(0..4)].to_vec()
            };
            let history: Vec<Op> = (0..rng.random_range(0..8))
                .map(|id| {
                    let call = match rng.random_range(0..5) {
                        0 => Call::Get { key: key(&mut rng) },
                        1 => Call::Put {
                            key: key(&mut rng),
                            value: key(&mut rng),
                        },
                        2 => Call::Delete { key: key(&mut rng) },
                        3 => Call::Cas {
                            key: key(&mut rng),
                            expect: Expect::ModRevision(revision(&mut rng)),
                            value: key(&mut rng),
                        },
                        _ => Call::Range {
                            start: key(&mut rng),
                            end: key(&mut rng),
                        },
                    };
                    let answer = match rng.random_range(0..5) {
                        0 => Answer::Get {
                            revision: revision(&mut rng),
                            kv: Some(Versioned {
                                value: key(&mut rng),
                                mod_revision: revision(&mut rng),
                            }),
                        },
                        1 => Answer::Put {
                            revision: revision(&mut rng),
                        },
                        2 => Answer::Delete {
                            revision: revision(&mut rng),
                            deleted: revision(&mut rng),
                        },
                        3 => Answer::Cas {
                            revision: revision(&mut rng),
                            succeeded: rng.random_bool(0.5),
                        },
                        _ => Answer::Range {
                            revision: revision(&mut rng),
                            kvs: vec![KeyValue {
                                key: key(&mut rng),
                                value: key(&mut rng),
                                mod_revision: revision(&mut rng),
                            }],
                        },
                    };
                    let result = match rng.random_range(0..3) {
                        0 => Outcome::Unknown,
                        1 => Outcome::Failed,
                        _ => Outcome::Ok(answer),
                    };
                    Op {
                        id: rng.random_range(0..4) + id,
                        client: 0,
                        call,
                        invoke: time(&mut rng),
                        complete: rng.random_bool(0.8).then(|| time(&mut rng)),
                        result,
                    }
                })
                .collect();
            let item = |rng: &mut StdRng| match rng.random_range(0..4) {
                0 => WatchItem::Event {
                    revision: revision(rng),
                    key: key(rng),
                    kind: if rng.random_bool(0.5) {
                        EventKind::Put
                    } else {
                        EventKind::Delete
                    },
                    value: key(rng),
                },
                1 => WatchItem::Progress {
                    revision: revision(rng),
                },
                2 => WatchItem::Compacted {
                    compact_revision: revision(rng),
                    received: time(rng),
                },
                _ => WatchItem::Resumed {
                    from_revision: revision(rng),
                },
            };
            let watch = WatchLog {
                watcher: 0,
                range: (key(&mut rng), key(&mut rng)),
                start_revision: revision(&mut rng),
                items: (0..rng.random_range(0..6))
                    .map(|_| item(&mut rng))
                    .collect(),
            };
            let committed = CommittedHistory {
                from_revision: revision(&mut rng),
                events: (0..rng.random_range(0..4))
                    .map(|_| CommittedEvent {
                        revision: revision(&mut rng),
                        key: key(&mut rng),
                        kind: EventKind::Put,
                        value: key(&mut rng),
                    })
                    .collect(),
                compactions: vec![Compaction {
                    id: 0,
                    revision: revision(&mut rng),
                    invoke: time(&mut rng),
                    complete: rng.random_bool(0.5).then(|| time(&mut rng)),
                    outcome: [
                        CompactOutcome::Ok,
                        CompactOutcome::AlreadyCompacted,
                        CompactOutcome::Failed,
                        CompactOutcome::Unknown,
                    ][rng.random_range(0..4)],
                }],
                past_reads: vec![PastRead {
                    id: 0,
                    revision: revision(&mut rng),
                    range: (key(&mut rng), key(&mut rng)),
                    invoke: time(&mut rng),
                    complete: time(&mut rng),
                    outcome: match rng.random_range(0..3) {
                        0 => PastReadOutcome::Compacted,
                        1 => PastReadOutcome::Failed,
                        _ => PastReadOutcome::Ok {
                            header_revision: revision(&mut rng),
                            kvs: vec![KeyValue {
                                key: key(&mut rng),
                                value: key(&mut rng),
                                mod_revision: revision(&mut rng),
                            }],
                        },
                    },
                }],
            };
            let final_state: FinalState = (0..rng.random_range(0..3))
                .map(|_| {
                    (
                        key(&mut rng),
                        Versioned {
                            value: key(&mut rng),
                            mod_revision: revision(&mut rng),
                        },
                    )
                })
                .collect();
            let report = check_all(&history, &[watch], &committed, &final_state, BUDGET);
            // Exercise the summary too.
            let _ = report.to_string();
        }
    }

    #[test]
    fn the_summary_names_each_check() {
        let history = vec![put(1, (0, 10), "a", "1", 2), get(2, (20, 30), "a", None, 2)];
        let report = check_all(
            &history,
            &[],
            &CommittedHistory::default(),
            &FinalState::new(),
            BUDGET,
        );
        assert!(!report.is_valid());
        let summary = report.to_string();
        assert!(summary.starts_with("INVALID\n"), "{summary}");
        assert!(
            summary.contains("linearizability: not linearizable on key a"),
            "{summary}"
        );
        assert!(summary.contains("revisions: 1 violations"), "{summary}");
        assert!(summary.contains("lost writes: 1 violations"), "{summary}");
        assert!(summary.contains("watches: ok"), "{summary}");
        assert!(summary.contains("compactions: ok"), "{summary}");
    }
}
