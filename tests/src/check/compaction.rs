//! Compaction, checked against the requests the harness made: the compacted error is given
//! exactly when a compaction justifies it, and a read at a revision that was not compacted
//! still answers, with the store as it was at that revision.
//!
//! A compaction "may have happened" when it was acknowledged or its answer was lost; it
//! "is proven" by the time it completes when it was acknowledged, or refused because the
//! store was already compacted at or above it. etcd applies compactions in log order, and a
//! linearizable request sent after another completed is served after it, so:
//! - A compaction refused as already compacted at R needs some other compaction at R or
//!   above that may have happened and was sent before the refusal arrived.
//! - A compaction acknowledged at R must not follow (in real time) a proven floor at R or
//!   above: etcd refuses `rev <= compactMainRev`.
//! - A read at past revision R that answered must not follow a proven floor above R (etcd
//!   serves a read at exactly the floor), and must return the committed state at R: every key
//!   of its range with the value and mod_revision of the latest committed event at or below R
//!   that is a put. Its header revision is at least R.
//! - A read at R that answered "compacted" needs a compaction above R that may have happened
//!   and was sent before the answer arrived. This is the read side of "reads at or above a
//!   compacted revision still succeed".
//!
//! The watch side (a watch's compacted error names a compaction that happened before it) is
//! in `watch`, which judges the rest of each watch stream. The state at R is known only when
//! the committed history starts at revision 1 (or below); otherwise only the revision rules
//! are checked.

use std::collections::BTreeMap;
use std::fmt;

use super::history::{
    self, CommittedHistory, CompactOutcome, Compaction, EventKind, PastRead, PastReadOutcome,
    Versioned, show,
};

/// One broken compaction rule, naming the compaction or past read by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompactionViolation {
    /// Refused as already compacted, though no compaction at or above `revision` may have
    /// happened before the refusal arrived.
    RefusedWithoutCompaction { compaction: u64, revision: i64 },
    /// Acknowledged at `revision` after compaction `by` had proven the store compacted at
    /// `floor` >= `revision`.
    AcceptedBelowFloor {
        compaction: u64,
        revision: i64,
        floor: i64,
        by: u64,
    },
    /// A read at `revision` answered after compaction `by` had proven the store compacted at
    /// `floor` > `revision`.
    ReadBelowFloor {
        read: u64,
        revision: i64,
        floor: i64,
        by: u64,
    },
    /// A read at `revision` answered "compacted", though no compaction above `revision` may
    /// have happened before the answer arrived.
    CompactedWithoutCompaction { read: u64, revision: i64 },
    /// A read at `revision` returned `found` for `key` where the committed history holds
    /// `expected` (`None`: absent).
    WrongPastRead {
        read: u64,
        revision: i64,
        key: Vec<u8>,
        expected: Option<Versioned>,
        found: Option<Versioned>,
    },
    /// A read at `revision` answered with a lower header revision, or returned a key outside
    /// its range or with a mod_revision above `revision`.
    ImpossiblePastRead {
        read: u64,
        revision: i64,
        reason: String,
    },
}

impl fmt::Display for CompactionViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let versioned = |v: &Option<Versioned>| match v {
            Some(v) => format!("{}@{}", show(&v.value), v.mod_revision),
            None => "absent".to_owned(),
        };
        match self {
            CompactionViolation::RefusedWithoutCompaction {
                compaction,
                revision,
            } => write!(
                f,
                "compaction {compaction} at {revision} refused as already compacted, but no \
                 compaction at or above it was asked for before"
            ),
            CompactionViolation::AcceptedBelowFloor {
                compaction,
                revision,
                floor,
                by,
            } => write!(
                f,
                "compaction {compaction} at {revision} acknowledged after compaction {by} had \
                 compacted the store at {floor}"
            ),
            CompactionViolation::ReadBelowFloor {
                read,
                revision,
                floor,
                by,
            } => write!(
                f,
                "past read {read} at {revision} answered after compaction {by} had compacted \
                 the store at {floor}"
            ),
            CompactionViolation::CompactedWithoutCompaction { read, revision } => write!(
                f,
                "past read {read} at {revision} answered compacted, but no compaction above \
                 {revision} was asked for before"
            ),
            CompactionViolation::WrongPastRead {
                read,
                revision,
                key,
                expected,
                found,
            } => write!(
                f,
                "past read {read} at {revision} saw {} as {}, committed: {}",
                show(key),
                versioned(found),
                versioned(expected)
            ),
            CompactionViolation::ImpossiblePastRead {
                read,
                revision,
                reason,
            } => write!(f, "past read {read} at {revision}: {reason}"),
        }
    }
}

/// Checks `committed`'s compactions and past reads against each other and against its
/// events; see the module doc.
pub fn check_compactions(committed: &CommittedHistory) -> Vec<CompactionViolation> {
    let all = &committed.compactions;
    let mut violations = Vec::new();
    let refused_wrongly: Vec<&Compaction> = all
        .iter()
        .filter(|compaction| compaction.outcome == CompactOutcome::AlreadyCompacted)
        .filter(|compaction| {
            let complete = compaction.complete.unwrap_or(u64::MAX);
            !all.iter().any(|other| {
                other.id != compaction.id
                    && other.may_have_applied()
                    && other.revision >= compaction.revision
                    && other.invoke <= complete
            })
        })
        .collect();
    // A refusal proves a floor only when a compaction justifies it; an unjustified one is
    // reported once, here, and proves nothing.
    let compactions: Vec<Compaction> = all
        .iter()
        .filter(|compaction| {
            !refused_wrongly
                .iter()
                .any(|wrong| wrong.id == compaction.id)
        })
        .cloned()
        .collect();
    let compactions = compactions.as_slice();
    for compaction in all {
        match compaction.outcome {
            CompactOutcome::AlreadyCompacted => {
                if refused_wrongly
                    .iter()
                    .any(|wrong| wrong.id == compaction.id)
                {
                    violations.push(CompactionViolation::RefusedWithoutCompaction {
                        compaction: compaction.id,
                        revision: compaction.revision,
                    });
                }
            }
            CompactOutcome::Ok => {
                if let Some((by, floor)) = proven_floor(compactions, compaction.invoke)
                    && floor >= compaction.revision
                {
                    violations.push(CompactionViolation::AcceptedBelowFloor {
                        compaction: compaction.id,
                        revision: compaction.revision,
                        floor,
                        by,
                    });
                }
            }
            CompactOutcome::Failed | CompactOutcome::Unknown => {}
        }
    }
    for read in &committed.past_reads {
        match &read.outcome {
            PastReadOutcome::Ok { .. } => {
                if let Some((by, floor)) = proven_floor(compactions, read.invoke)
                    && floor > read.revision
                {
                    violations.push(CompactionViolation::ReadBelowFloor {
                        read: read.id,
                        revision: read.revision,
                        floor,
                        by,
                    });
                }
            }
            PastReadOutcome::Compacted => {
                let justified = compactions.iter().any(|compaction| {
                    compaction.may_have_applied()
                        && compaction.revision > read.revision
                        && compaction.invoke <= read.complete
                });
                if !justified {
                    violations.push(CompactionViolation::CompactedWithoutCompaction {
                        read: read.id,
                        revision: read.revision,
                    });
                }
            }
            PastReadOutcome::Failed => {}
        }
    }
    check_past_states(committed, &mut violations);
    violations
}

/// The highest floor proven by a compaction completed before `before`, and that compaction.
fn proven_floor(compactions: &[Compaction], before: u64) -> Option<(u64, i64)> {
    compactions
        .iter()
        .filter_map(|compaction| {
            let (complete, floor) = compaction.proven_floor()?;
            (complete < before).then_some((compaction.id, floor))
        })
        .max_by_key(|(_, floor)| *floor)
}

/// Checks what each answered past read returned against the committed state at its
/// revision, replaying the committed events once in revision order.
fn check_past_states(committed: &CommittedHistory, out: &mut Vec<CompactionViolation>) {
    let mut reads: Vec<(&PastRead, i64, &[history::KeyValue])> = committed
        .past_reads
        .iter()
        .filter_map(|read| match &read.outcome {
            PastReadOutcome::Ok {
                header_revision,
                kvs,
            } => Some((read, *header_revision, kvs.as_slice())),
            PastReadOutcome::Compacted | PastReadOutcome::Failed => None,
        })
        .collect();
    reads.sort_by_key(|(read, _, _)| read.revision);
    // The state is known only if the history holds every event from the first revision.
    let state_known = committed.from_revision <= 1;
    let mut events = committed.events.iter().peekable();
    // Key -> its latest put at or below the revision of the read being checked.
    let mut state: BTreeMap<&[u8], Versioned> = BTreeMap::new();
    for (read, header_revision, kvs) in reads {
        let (start, end) = (&read.range.0, &read.range.1);
        if header_revision < read.revision {
            out.push(CompactionViolation::ImpossiblePastRead {
                read: read.id,
                revision: read.revision,
                reason: format!("header revision {header_revision} below it"),
            });
        }
        let mut found: BTreeMap<&[u8], Versioned> = BTreeMap::new();
        for kv in kvs {
            let reason = if !history::range_contains(start, end, &kv.key) {
                Some(format!("{} is outside its range", show(&kv.key)))
            } else if kv.mod_revision > read.revision {
                Some(format!(
                    "{} at mod_revision {}",
                    show(&kv.key),
                    kv.mod_revision
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                out.push(CompactionViolation::ImpossiblePastRead {
                    read: read.id,
                    revision: read.revision,
                    reason,
                });
            }
            found.insert(
                &kv.key,
                Versioned {
                    value: kv.value.clone(),
                    mod_revision: kv.mod_revision,
                },
            );
        }
        if !state_known {
            continue;
        }
        while let Some(event) = events.next_if(|event| event.revision <= read.revision) {
            match event.kind {
                EventKind::Put => {
                    let versioned = Versioned {
                        value: event.value.clone(),
                        mod_revision: event.revision,
                    };
                    state.insert(&event.key, versioned);
                }
                EventKind::Delete => {
                    state.remove(event.key.as_slice());
                }
            }
        }
        let expected: BTreeMap<&[u8], &Versioned> = state
            .iter()
            .filter(|(key, _)| history::range_contains(start, end, key))
            .map(|(key, versioned)| (*key, versioned))
            .collect();
        let keys: std::collections::BTreeSet<&[u8]> =
            expected.keys().chain(found.keys()).copied().collect();
        for key in keys {
            let expected = expected.get(key).map(|versioned| (*versioned).clone());
            let got = found.get(key).cloned();
            if expected != got {
                out.push(CompactionViolation::WrongPastRead {
                    read: read.id,
                    revision: read.revision,
                    key: key.to_vec(),
                    expected,
                    found: got,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::history::{CommittedEvent, KeyValue};

    fn compaction(
        id: u64,
        revision: i64,
        span: (u64, Option<u64>),
        outcome: CompactOutcome,
    ) -> Compaction {
        Compaction {
            id,
            revision,
            invoke: span.0,
            complete: span.1,
            outcome,
        }
    }

    fn put(revision: i64, key: &str, value: &str) -> CommittedEvent {
        CommittedEvent {
            revision,
            key: key.into(),
            kind: EventKind::Put,
            value: value.into(),
        }
    }

    /// a=1 at 2, b=1 at 3, a=2 at 4, b deleted at 5, a=3 at 6; compacted at 4 during
    /// [100, 110].
    fn committed() -> CommittedHistory {
        CommittedHistory {
            from_revision: 1,
            events: vec![
                put(2, "a", "1"),
                put(3, "b", "1"),
                put(4, "a", "2"),
                CommittedEvent {
                    revision: 5,
                    key: "b".into(),
                    kind: EventKind::Delete,
                    value: Vec::new(),
                },
                put(6, "a", "3"),
            ],
            compactions: vec![compaction(1, 4, (100, Some(110)), CompactOutcome::Ok)],
            past_reads: Vec::new(),
        }
    }

    fn read(id: u64, revision: i64, span: (u64, u64), outcome: PastReadOutcome) -> PastRead {
        PastRead {
            id,
            revision,
            range: ("a".into(), "c".into()),
            invoke: span.0,
            complete: span.1,
            outcome,
        }
    }

    fn answered(header_revision: i64, kvs: &[(&str, &str, i64)]) -> PastReadOutcome {
        PastReadOutcome::Ok {
            header_revision,
            kvs: kvs
                .iter()
                .map(|(key, value, mod_revision)| KeyValue {
                    key: (*key).into(),
                    value: (*value).into(),
                    mod_revision: *mod_revision,
                })
                .collect(),
        }
    }

    fn check_reads(reads: Vec<PastRead>) -> Vec<CompactionViolation> {
        let mut history = committed();
        history.past_reads = reads;
        check_compactions(&history)
    }

    #[test]
    fn accepts_reads_that_match_the_compaction_and_the_history() {
        let reads = vec![
            // Before the compaction was asked for, revision 3 still answers.
            read(1, 3, (50, 60), answered(6, &[("a", "1", 2), ("b", "1", 3)])),
            // After it completed, 3 is compacted; 4 (the floor itself) and 5 answer.
            read(2, 3, (120, 130), PastReadOutcome::Compacted),
            read(
                3,
                4,
                (120, 130),
                answered(6, &[("a", "2", 4), ("b", "1", 3)]),
            ),
            read(4, 5, (120, 130), answered(6, &[("a", "2", 4)])),
            // While it was in flight, either answer is right.
            read(5, 2, (105, 108), PastReadOutcome::Compacted),
            read(6, 2, (105, 108), answered(6, &[("a", "1", 2)])),
            read(7, 1, (200, 210), PastReadOutcome::Failed),
        ];
        assert_eq!(check_reads(reads), vec![]);
    }

    #[test]
    fn rejects_a_compacted_error_nothing_justifies() {
        // At the floor: etcd serves a read at exactly the compact revision.
        let violations = check_reads(vec![read(1, 4, (120, 130), PastReadOutcome::Compacted)]);
        assert_eq!(
            violations,
            vec![CompactionViolation::CompactedWithoutCompaction {
                read: 1,
                revision: 4
            }]
        );
        // Before the compaction was asked for.
        let violations = check_reads(vec![read(2, 3, (50, 60), PastReadOutcome::Compacted)]);
        assert!(matches!(
            violations.as_slice(),
            [CompactionViolation::CompactedWithoutCompaction { read: 2, .. }]
        ));
        // A failed compaction compacted nothing.
        let mut history = committed();
        history.compactions[0].outcome = CompactOutcome::Failed;
        history.past_reads = vec![read(3, 3, (120, 130), PastReadOutcome::Compacted)];
        assert!(matches!(
            check_compactions(&history).as_slice(),
            [CompactionViolation::CompactedWithoutCompaction { read: 3, .. }]
        ));
        // An unknown one may have.
        history.compactions[0].outcome = CompactOutcome::Unknown;
        history.compactions[0].complete = None;
        assert_eq!(check_compactions(&history), vec![]);
    }

    #[test]
    fn rejects_a_read_below_the_floor_that_answered() {
        let violations = check_reads(vec![read(
            1,
            3,
            (120, 130),
            answered(6, &[("a", "1", 2), ("b", "1", 3)]),
        )]);
        assert_eq!(
            violations,
            vec![CompactionViolation::ReadBelowFloor {
                read: 1,
                revision: 3,
                floor: 4,
                by: 1
            }]
        );
    }

    #[test]
    fn rejects_a_past_read_that_differs_from_the_history() {
        // b was deleted at 5; a stale a; a key that did not exist yet; a future mod_revision.
        let violations = check_reads(vec![
            read(
                1,
                5,
                (120, 130),
                answered(6, &[("a", "2", 4), ("b", "1", 3)]),
            ),
            read(
                2,
                4,
                (120, 130),
                answered(6, &[("a", "1", 2), ("b", "1", 3)]),
            ),
            read(3, 6, (120, 130), answered(5, &[("a", "3", 6)])),
        ]);
        assert_eq!(
            violations,
            vec![
                CompactionViolation::WrongPastRead {
                    read: 2,
                    revision: 4,
                    key: "a".into(),
                    expected: Some(Versioned {
                        value: "2".into(),
                        mod_revision: 4
                    }),
                    found: Some(Versioned {
                        value: "1".into(),
                        mod_revision: 2
                    }),
                },
                CompactionViolation::WrongPastRead {
                    read: 1,
                    revision: 5,
                    key: "b".into(),
                    expected: None,
                    found: Some(Versioned {
                        value: "1".into(),
                        mod_revision: 3
                    }),
                },
                CompactionViolation::ImpossiblePastRead {
                    read: 3,
                    revision: 6,
                    reason: "header revision 5 below it".into(),
                },
            ]
        );
    }

    #[test]
    fn judges_the_answers_to_compactions() {
        let mut history = committed();
        history.compactions.extend([
            // Refused because 1 (at 4) was asked for first: right.
            compaction(2, 3, (120, Some(125)), CompactOutcome::AlreadyCompacted),
            // Acknowledged at 5 above the floor 4: right.
            compaction(3, 5, (130, Some(135)), CompactOutcome::Ok),
        ]);
        assert_eq!(check_compactions(&history), vec![]);
        // Refused at 6, but nothing at or above 6 was ever asked for.
        history.compactions.push(compaction(
            4,
            6,
            (140, Some(145)),
            CompactOutcome::AlreadyCompacted,
        ));
        // Acknowledged at 5 again after 3 proved the floor at 5.
        history
            .compactions
            .push(compaction(5, 5, (150, Some(155)), CompactOutcome::Ok));
        assert_eq!(
            check_compactions(&history),
            vec![
                CompactionViolation::RefusedWithoutCompaction {
                    compaction: 4,
                    revision: 6
                },
                CompactionViolation::AcceptedBelowFloor {
                    compaction: 5,
                    revision: 5,
                    floor: 5,
                    by: 3
                },
            ]
        );
    }

    #[test]
    fn state_is_not_judged_without_the_start_of_the_history() {
        let mut history = committed();
        history.events.retain(|event| event.revision >= 4);
        history.from_revision = 4;
        history.past_reads = vec![read(1, 5, (120, 130), answered(6, &[("a", "2", 4)]))];
        assert_eq!(check_compactions(&history), vec![]);
    }
}
