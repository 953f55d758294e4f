//! No lost acknowledged write: every acknowledged write is still visible in the final state,
//! or was superseded by a later write to its key that is known to have happened.
//!
//! A later write is known when it was acknowledged at a higher revision, or when some read
//! (including the final read) saw the key at a higher mod_revision. A key found absent may
//! also have been removed by a delete whose answer was lost, since that delete can have taken
//! effect at any time after it was invoked.
//!
//! Whether the superseding writes themselves are real is `revisions`' business: a read that
//! saw a phantom write there is reported as such.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::ops::Bound;

use super::history::{Answer, Call, EventKind, FinalState, Op, Outcome, Versioned, show};

/// An acknowledged write the final state has lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostWrite {
    pub op: u64,
    pub key: Vec<u8>,
    /// The write's acknowledged revision.
    pub revision: i64,
    pub kind: EventKind,
    /// What the final state holds for the key.
    pub found: Option<Versioned>,
}

impl fmt::Display for LostWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            EventKind::Put => "put",
            EventKind::Delete => "delete",
        };
        write!(
            f,
            "lost write: op {} ({kind} of {} at {}), but the final state ",
            self.op,
            show(&self.key),
            self.revision
        )?;
        match &self.found {
            Some(found) => write!(f, "holds {} at {}", show(&found.value), found.mod_revision),
            None => write!(f, "does not hold the key"),
        }
    }
}

/// Checks that no acknowledged write in `history` is lost from `final_state`, which must
/// hold every key of the history that exists.
pub fn check_lost_writes(history: &[Op], final_state: &FinalState) -> Vec<LostWrite> {
    // Per key, every revision at which a write to it is known to have happened.
    let mut known: BTreeMap<&[u8], BTreeSet<i64>> = BTreeMap::new();
    let mut lost_deletes: HashSet<&[u8]> = HashSet::new();
    for op in history {
        match (&op.call, &op.result) {
            (Call::Delete { key }, Outcome::Unknown) => {
                lost_deletes.insert(key);
            }
            (_, Outcome::Ok(Answer::Get { kv: Some(kv), .. })) => {
                if let Some(key) = op.call.key() {
                    known.entry(key).or_default().insert(kv.mod_revision);
                }
            }
            (_, Outcome::Ok(Answer::Range { kvs, .. })) => {
                for kv in kvs {
                    known.entry(&kv.key).or_default().insert(kv.mod_revision);
                }
            }
            _ => {}
        }
        if let (Some(revision), Some(key)) = (op.write_revision(), op.call.key()) {
            known.entry(key).or_default().insert(revision);
        }
    }
    for (key, kv) in final_state {
        known.entry(key).or_default().insert(kv.mod_revision);
    }

    let mut lost = Vec::new();
    for op in history {
        let (Some(revision), Some(key)) = (op.write_revision(), op.call.key()) else {
            continue;
        };
        let found = final_state.get(key);
        let written = op.call.written_value();
        let superseded = known.get(key).is_some_and(|revisions| {
            revisions
                .range((Bound::Excluded(revision), Bound::Unbounded))
                .next()
                .is_some()
        });
        let kept = match (written, found) {
            // A put: visible as written, or superseded by a later write the final read saw.
            (Some(value), Some(found)) => {
                (found.mod_revision == revision && found.value == value)
                    || found.mod_revision > revision
            }
            // A put whose key is gone: something must have deleted it after.
            (Some(_), None) => superseded || lost_deletes.contains(key),
            // A delete: still absent, or written again after.
            (None, None) => true,
            (None, Some(found)) => found.mod_revision > revision,
        };
        if !kept {
            lost.push(LostWrite {
                op: op.id,
                key: key.to_vec(),
                revision,
                kind: if written.is_some() {
                    EventKind::Put
                } else {
                    EventKind::Delete
                },
                found: found.cloned(),
            });
        }
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::history::build::*;
    use crate::check::history::{Call, Expect};

    fn state(entries: &[(&str, &str, i64)]) -> FinalState {
        entries
            .iter()
            .map(|(key, value, mod_revision)| {
                (
                    key.as_bytes().to_vec(),
                    Versioned {
                        value: value.as_bytes().to_vec(),
                        mod_revision: *mod_revision,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn accepts_writes_that_are_visible_or_superseded() {
        let history = vec![
            put(1, (0, 10), "a", "1", 2),
            put(2, (20, 30), "a", "2", 3),
            put(3, (40, 50), "b", "1", 4),
            delete(4, (60, 70), "b", 1, 5),
            cas(5, (80, 90), "c", Expect::Absent, "1", Some((true, 6))),
            cas(6, (80, 90), "c", Expect::Absent, "2", Some((false, 6))),
            put_unknown(7, 100, "a", "3"),
        ];
        // The unknown put of "a" happened and the final read saw it.
        let final_state = state(&[("a", "3", 7), ("c", "1", 6)]);
        assert_eq!(check_lost_writes(&history, &final_state), vec![]);
    }

    #[test]
    fn rejects_a_lost_put() {
        let history = vec![put(1, (0, 10), "a", "1", 2), put(2, (20, 30), "a", "2", 3)];
        let final_state = state(&[("a", "1", 2)]);
        assert_eq!(
            check_lost_writes(&history, &final_state),
            vec![LostWrite {
                op: 2,
                key: b"a".to_vec(),
                revision: 3,
                kind: EventKind::Put,
                found: final_state.get(b"a".as_slice()).cloned(),
            }]
        );
        // Gone entirely, with nothing that deleted it.
        let history = vec![put(1, (0, 10), "a", "1", 2)];
        assert_eq!(check_lost_writes(&history, &state(&[])).len(), 1);
        // Same revision, different value: the write was replaced, not superseded.
        assert_eq!(
            check_lost_writes(&history, &state(&[("a", "x", 2)])).len(),
            1
        );
    }

    #[test]
    fn rejects_a_lost_delete() {
        let history = vec![put(1, (0, 10), "a", "1", 2), delete(2, (20, 30), "a", 1, 3)];
        let lost = check_lost_writes(&history, &state(&[("a", "1", 2)]));
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].op, 2);
        assert_eq!(lost[0].kind, EventKind::Delete);
    }

    #[test]
    fn an_absent_key_may_have_been_deleted_by_a_known_or_unknown_delete() {
        let history = vec![put(1, (0, 10), "a", "1", 2), delete(2, (20, 30), "a", 1, 3)];
        assert_eq!(check_lost_writes(&history, &state(&[])), vec![]);
        let history = vec![
            put(1, (0, 10), "a", "1", 2),
            op(
                2,
                20,
                None,
                Call::Delete { key: "a".into() },
                Outcome::Unknown,
            ),
        ];
        assert_eq!(check_lost_writes(&history, &state(&[])), vec![]);
        // A failed delete deleted nothing.
        let history = vec![
            put(1, (0, 10), "a", "1", 2),
            op(
                2,
                20,
                Some(30),
                Call::Delete { key: "a".into() },
                Outcome::Failed,
            ),
        ];
        assert_eq!(check_lost_writes(&history, &state(&[])).len(), 1);
    }

    #[test]
    fn accepts_random_histories_from_a_sequential_execution() {
        for seed in 0..100 {
            let (history, _, final_state) =
                crate::check::linearizable::sim::history(seed, 3, 200, 6);
            assert_eq!(
                check_lost_writes(&history, &final_state),
                vec![],
                "seed {seed}"
            );
        }
    }
}
