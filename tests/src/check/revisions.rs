//! etcd's revision invariants over a whole history, across keys: what the per-key
//! linearizability check cannot see because the revision is global.
//!
//! Checked, as Jepsen's etcd test and etcd's own robustness tests do:
//! - Real-time order: if op A completed before op B was invoked, B's header revision is at
//!   least A's, and above it if B is a write that changed the store. This is the global form
//!   of "acknowledged writes' revisions increase in real time" and of monotonic reads (for
//!   every client at once, which is what linearizable reads promise).
//! - No two acknowledged writes share a revision (each op here is one txn on one key).
//! - A read at header revision R sees exactly the writes at or below R. For each key it
//!   returns at mod_revision M: M <= R; the write at M is one that may have happened and wrote
//!   that key and value; and no known write to the key lies in (M, R]. For each key it does
//!   not return (a `Get` of nothing, a key of the history in a `Range`'s range, or a delete
//!   that deleted nothing): the latest known write to it at or below R is not a put, unless a
//!   delete whose answer was lost could lie between.
//!
//! "Known" writes are the acknowledged ones plus unknown ones some read observed, placed at
//! the revision that read saw. Assumes linearizable (etcd's default) reads, and, as
//! [`history`](super::history) says, that the history holds every write to its keys.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use super::history::{self, Answer, Call, Op, Outcome, show};

/// One broken invariant, naming the ops involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevisionViolation {
    /// `later` was invoked after `earlier` completed, yet its header revision is lower (or
    /// not higher, for a write).
    WentBackwards {
        earlier: u64,
        earlier_revision: i64,
        later: u64,
        later_revision: i64,
    },
    /// Two acknowledged writes got the same revision.
    SharedRevision {
        revision: i64,
        first: u64,
        second: u64,
    },
    /// A revision etcd never gives: a write below 2, or a mod_revision above the header
    /// revision of the read that returned it.
    ImpossibleRevision {
        op: u64,
        revision: i64,
        reason: &'static str,
    },
    /// A read at `revision` saw `key` at `mod_revision`, but `write` wrote the key at
    /// `write_revision`, in between.
    StaleRead {
        read: u64,
        key: Vec<u8>,
        revision: i64,
        mod_revision: i64,
        write: u64,
        write_revision: i64,
    },
    /// A read at `revision` did not see `key`, but `write` put it at `write_revision` at or
    /// below `revision` and no delete can lie between.
    MissedWrite {
        read: u64,
        key: Vec<u8>,
        revision: i64,
        write: u64,
        write_revision: i64,
    },
    /// A read saw `key` at `mod_revision` as no write that may have happened wrote it.
    /// `other` is the op whose claim on that revision conflicts, or the failed op that wrote
    /// the value, if any.
    PhantomRead {
        read: u64,
        key: Vec<u8>,
        mod_revision: i64,
        other: Option<u64>,
        reason: &'static str,
    },
    /// A range answer held a key outside its range.
    OutOfRange { read: u64, key: Vec<u8> },
}

impl RevisionViolation {
    /// The ops involved.
    pub fn op_ids(&self) -> Vec<u64> {
        match self {
            RevisionViolation::WentBackwards { earlier, later, .. } => vec![*earlier, *later],
            RevisionViolation::SharedRevision { first, second, .. } => vec![*first, *second],
            RevisionViolation::ImpossibleRevision { op, .. } => vec![*op],
            RevisionViolation::StaleRead { read, write, .. }
            | RevisionViolation::MissedWrite { read, write, .. } => vec![*write, *read],
            RevisionViolation::PhantomRead { read, other, .. } => {
                other.iter().copied().chain([*read]).collect()
            }
            RevisionViolation::OutOfRange { read, .. } => vec![*read],
        }
    }
}

impl fmt::Display for RevisionViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RevisionViolation::WentBackwards {
                earlier,
                earlier_revision,
                later,
                later_revision,
            } => write!(
                f,
                "revision went backwards in real time: op {earlier} at {earlier_revision} \
                 completed before op {later} at {later_revision} began"
            ),
            RevisionViolation::SharedRevision {
                revision,
                first,
                second,
            } => write!(
                f,
                "ops {first} and {second} both wrote at revision {revision}"
            ),
            RevisionViolation::ImpossibleRevision {
                op,
                revision,
                reason,
            } => write!(f, "op {op}: revision {revision}: {reason}"),
            RevisionViolation::StaleRead {
                read,
                key,
                revision,
                mod_revision,
                write,
                write_revision,
            } => write!(
                f,
                "stale read: op {read} at {revision} saw {} at {mod_revision}, but op {write} \
                 wrote it at {write_revision}",
                show(key)
            ),
            RevisionViolation::MissedWrite {
                read,
                key,
                revision,
                write,
                write_revision,
            } => write!(
                f,
                "missed write: op {read} at {revision} did not see {}, which op {write} put \
                 at {write_revision}",
                show(key)
            ),
            RevisionViolation::PhantomRead {
                read,
                key,
                mod_revision,
                other,
                reason,
            } => {
                write!(
                    f,
                    "phantom read: op {read} saw {} at {mod_revision}: {reason}",
                    show(key)
                )?;
                match other {
                    Some(other) => write!(f, " (op {other})"),
                    None => Ok(()),
                }
            }
            RevisionViolation::OutOfRange { read, key } => {
                write!(
                    f,
                    "op {read}: range returned {} outside its range",
                    show(key)
                )
            }
        }
    }
}

/// The highest header revision among acknowledged ops completed before a given time.
struct RealTime {
    /// (complete, running max of `Latest`), sorted by complete.
    by_complete: Vec<(u64, Latest)>,
}

/// An acknowledged op's header revision, whether it was a write that bumped it, and its id;
/// ordered so that at equal revisions a write wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Latest {
    revision: i64,
    bumped: bool,
    op: u64,
}

impl RealTime {
    fn new(history: &[Op]) -> RealTime {
        let mut acknowledged: Vec<(u64, Latest)> = history
            .iter()
            .filter_map(|op| {
                let answer = op.answer()?;
                let latest = Latest {
                    revision: answer.revision(),
                    bumped: answer.bumped_revision(),
                    op: op.id,
                };
                Some((op.complete?, latest))
            })
            .collect();
        acknowledged.sort_unstable_by_key(|&(complete, _)| complete);
        let mut running: Option<Latest> = None;
        for (_, entry) in &mut acknowledged {
            let max = running.map_or(*entry, |running| running.max(*entry));
            running = Some(max);
            *entry = max;
        }
        RealTime {
            by_complete: acknowledged,
        }
    }

    /// The latest of the ops that completed strictly before `time`.
    fn before(&self, time: u64) -> Option<Latest> {
        let count = self
            .by_complete
            .partition_point(|&(complete, _)| complete < time);
        count.checked_sub(1).map(|last| self.by_complete[last].1)
    }
}

/// A write known to have happened, at a known revision.
#[derive(Debug, Clone, Copy)]
struct KnownWrite {
    op: u64,
    is_put: bool,
}

/// Checks etcd's revision invariants over `history`; see the module doc.
pub fn check_revisions(history: &[Op]) -> Vec<RevisionViolation> {
    let mut violations = Vec::new();
    let real_time = RealTime::new(history);
    check_real_time(history, &real_time, &mut violations);
    let acknowledged = acknowledged_writes(history, &mut violations);
    let known = known_writes(history, &real_time, &acknowledged, &mut violations);
    check_reads(history, &real_time, &known, &mut violations);
    violations
}

fn check_real_time(history: &[Op], real_time: &RealTime, out: &mut Vec<RevisionViolation>) {
    for op in history {
        let Some(answer) = op.answer() else { continue };
        let Some(latest) = real_time.before(op.invoke) else {
            continue;
        };
        let (earlier, earlier_revision) = (latest.op, latest.revision);
        let revision = answer.revision();
        let backwards = if answer.bumped_revision() {
            // Equal revisions of two writes are `SharedRevision`'s to report.
            revision < earlier_revision || (revision == earlier_revision && !latest.bumped)
        } else {
            revision < earlier_revision
        };
        if backwards {
            out.push(RevisionViolation::WentBackwards {
                earlier,
                earlier_revision,
                later: op.id,
                later_revision: revision,
            });
        }
    }
}

/// Acknowledged writes by revision: (op, key, value written or `None` for a delete). More
/// than one per revision only when `SharedRevision` is reported.
type Acknowledged<'a> = HashMap<i64, Vec<(u64, &'a [u8], Option<&'a [u8]>)>>;

fn acknowledged_writes<'a>(
    history: &'a [Op],
    out: &mut Vec<RevisionViolation>,
) -> Acknowledged<'a> {
    let mut by_revision: Acknowledged<'a> = HashMap::new();
    for op in history {
        let (Some(revision), Some(key)) = (op.write_revision(), op.call.key()) else {
            continue;
        };
        // etcd starts at revision 1; the first write gets 2.
        if revision < 2 {
            out.push(RevisionViolation::ImpossibleRevision {
                op: op.id,
                revision,
                reason: "a write's revision is at least 2",
            });
        }
        let writes = by_revision.entry(revision).or_default();
        if let Some(&(first, _, _)) = writes.first() {
            out.push(RevisionViolation::SharedRevision {
                revision,
                first,
                second: op.id,
            });
        }
        writes.push((op.id, key, op.call.written_value()));
    }
    by_revision
}

/// The (key, value, mod_revision) triples an acknowledged read returned.
fn observations(op: &Op) -> Vec<(&[u8], &[u8], i64)> {
    match (op.answer(), &op.call) {
        (Some(Answer::Get { kv: Some(kv), .. }), Call::Get { key }) => {
            vec![(key.as_slice(), kv.value.as_slice(), kv.mod_revision)]
        }
        (Some(Answer::Range { kvs, .. }), Call::Range { .. }) => kvs
            .iter()
            .map(|kv| (kv.key.as_slice(), kv.value.as_slice(), kv.mod_revision))
            .collect(),
        _ => Vec::new(),
    }
}

/// Per key, the writes known to have happened, by revision: acknowledged ones, and unknown
/// ones placed where a read saw them. Reports reads no write can explain.
fn known_writes<'a>(
    history: &'a [Op],
    real_time: &RealTime,
    acknowledged: &Acknowledged<'a>,
    out: &mut Vec<RevisionViolation>,
) -> BTreeMap<&'a [u8], BTreeMap<i64, KnownWrite>> {
    let mut known: BTreeMap<&[u8], BTreeMap<i64, KnownWrite>> = BTreeMap::new();
    for (&revision, writes) in acknowledged {
        for &(op, key, value) in writes {
            known.entry(key).or_default().insert(
                revision,
                KnownWrite {
                    op,
                    is_put: value.is_some(),
                },
            );
        }
    }
    // Which (key, value) each revision was first seen as, and by which read.
    let mut seen: HashMap<i64, (&[u8], &[u8], u64)> = HashMap::new();
    // The put-like writes that were not acknowledged, by the (key, value) they would write.
    let mut unacknowledged: HashMap<(&[u8], &[u8]), Vec<&Op>> = HashMap::new();
    for op in history {
        if let (Some(key), Some(value), Outcome::Unknown | Outcome::Failed) =
            (op.call.key(), op.call.written_value(), &op.result)
        {
            unacknowledged.entry((key, value)).or_default().push(op);
        }
    }
    for read in history {
        let Some(answer) = read.answer() else {
            continue;
        };
        let read_complete = read.complete.unwrap_or(u64::MAX);
        for (key, value, mod_revision) in observations(read) {
            let phantom = |other, reason| RevisionViolation::PhantomRead {
                read: read.id,
                key: key.to_vec(),
                mod_revision,
                other,
                reason,
            };
            if mod_revision > answer.revision() {
                out.push(RevisionViolation::ImpossibleRevision {
                    op: read.id,
                    revision: mod_revision,
                    reason: "a mod_revision above the read's header revision",
                });
            }
            if let Some(writes) = acknowledged.get(&mod_revision) {
                let matches = writes
                    .iter()
                    .any(|&(_, written_key, written)| written_key == key && written == Some(value));
                if let (false, Some(&(write, _, _))) = (matches, writes.first()) {
                    out.push(phantom(
                        Some(write),
                        "that revision was acknowledged to another write",
                    ));
                }
                continue;
            }
            match seen.get(&mod_revision) {
                Some(&(seen_key, seen_value, _)) if seen_key == key && seen_value == value => {
                    continue;
                }
                Some(&(_, _, first)) => {
                    out.push(phantom(
                        Some(first),
                        "another read saw a different write at that revision",
                    ));
                    continue;
                }
                None => {}
            }
            seen.insert(mod_revision, (key, value, read.id));
            // An unknown put of this key and value, invoked before the read returned, whose
            // revision can be this one (it is above every revision completed before it began).
            let writers = unacknowledged.get(&(key, value));
            let candidate = writers.into_iter().flatten().find(|op| {
                op.result == Outcome::Unknown
                    && op.invoke <= read_complete
                    && real_time
                        .before(op.invoke)
                        .is_none_or(|latest| latest.revision < mod_revision)
            });
            match candidate {
                Some(op) => {
                    known.entry(key).or_default().insert(
                        mod_revision,
                        KnownWrite {
                            op: op.id,
                            is_put: true,
                        },
                    );
                }
                None => {
                    let failed = writers
                        .into_iter()
                        .flatten()
                        .find(|op| op.result == Outcome::Failed);
                    out.push(match failed {
                        Some(failed) => phantom(Some(failed.id), "only a failed op wrote it"),
                        None => phantom(None, "no write that may have happened wrote it"),
                    });
                }
            }
        }
    }
    known
}

fn check_reads<'a>(
    history: &'a [Op],
    real_time: &RealTime,
    known: &BTreeMap<&'a [u8], BTreeMap<i64, KnownWrite>>,
    out: &mut Vec<RevisionViolation>,
) {
    let mut keys: BTreeSet<&[u8]> = known.keys().copied().collect();
    keys.extend(history.iter().filter_map(|op| op.call.key()));
    // Unknown deletes per key, with the revision each one's must lie above.
    let mut unknown_deletes: HashMap<&[u8], Vec<i64>> = HashMap::new();
    for op in history {
        if let (Call::Delete { key }, Outcome::Unknown) = (&op.call, &op.result) {
            let floor = real_time
                .before(op.invoke)
                .map_or(0, |latest| latest.revision);
            unknown_deletes.entry(key).or_default().push(floor);
        }
    }
    let empty = BTreeMap::new();
    let present = |read: &Op, revision: i64, key: &[u8], mod_revision: i64| {
        if mod_revision >= revision {
            // Nothing lies between; a mod_revision above the header is reported apart.
            return None;
        }
        let writes = known.get(key).unwrap_or(&empty);
        writes
            .range(mod_revision + 1..=revision)
            .next()
            .map(|(&write_revision, write)| RevisionViolation::StaleRead {
                read: read.id,
                key: key.to_vec(),
                revision,
                mod_revision,
                write: write.op,
                write_revision,
            })
    };
    let absent = |read: &Op, revision: i64, key: &[u8]| {
        let writes = known.get(key).unwrap_or(&empty);
        let (&write_revision, write) = writes.range(..=revision).next_back()?;
        if !write.is_put {
            return None;
        }
        // A lost delete may lie in (write_revision, revision] if it may be above its floor.
        let deleted = unknown_deletes.get(key).is_some_and(|floors| {
            floors
                .iter()
                .any(|&floor| floor.max(write_revision) < revision)
        });
        (!deleted).then(|| RevisionViolation::MissedWrite {
            read: read.id,
            key: key.to_vec(),
            revision,
            write: write.op,
            write_revision,
        })
    };
    for read in history {
        let Some(answer) = read.answer() else {
            continue;
        };
        let revision = answer.revision();
        match (&read.call, answer) {
            (Call::Get { key }, Answer::Get { kv, .. }) => {
                out.extend(match kv {
                    Some(kv) => present(read, revision, key, kv.mod_revision),
                    None => absent(read, revision, key),
                });
            }
            (Call::Delete { key }, Answer::Delete { deleted: 0, .. }) => {
                out.extend(absent(read, revision, key));
            }
            (Call::Range { start, end }, Answer::Range { kvs, .. }) => {
                let mut returned = BTreeSet::new();
                for kv in kvs {
                    if !history::range_contains(start, end, &kv.key) {
                        out.push(RevisionViolation::OutOfRange {
                            read: read.id,
                            key: kv.key.clone(),
                        });
                        continue;
                    }
                    returned.insert(kv.key.as_slice());
                    out.extend(present(read, revision, &kv.key, kv.mod_revision));
                }
                for &key in keys.range::<&[u8], _>(start.as_slice()..) {
                    if !history::range_contains(start, end, key) {
                        break;
                    }
                    if !returned.contains(key) {
                        out.extend(absent(read, revision, key));
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::history::build::*;

    fn kinds(violations: &[RevisionViolation]) -> Vec<&'static str> {
        violations
            .iter()
            .map(|violation| match violation {
                RevisionViolation::WentBackwards { .. } => "backwards",
                RevisionViolation::SharedRevision { .. } => "shared",
                RevisionViolation::ImpossibleRevision { .. } => "impossible",
                RevisionViolation::StaleRead { .. } => "stale",
                RevisionViolation::MissedWrite { .. } => "missed",
                RevisionViolation::PhantomRead { .. } => "phantom",
                RevisionViolation::OutOfRange { .. } => "range",
            })
            .collect()
    }

    #[test]
    fn accepts_concurrent_writes_and_reads_across_keys() {
        let history = vec![
            put(1, (0, 50), "a", "1", 3),
            put(2, (10, 40), "b", "2", 2),
            get(3, (20, 30), "a", None, 2),
            range(4, (45, 60), ("a", "c"), &[("a", "1", 3), ("b", "2", 2)], 3),
            delete(5, (70, 80), "a", 1, 4),
            delete(6, (90, 95), "a", 0, 4),
            range(7, (100, 110), ("a", "\0"), &[("b", "2", 2)], 4),
        ];
        assert_eq!(check_revisions(&history), vec![]);
    }

    #[test]
    fn rejects_revisions_going_backwards_in_real_time() {
        let history = vec![put(1, (0, 10), "a", "1", 5), put(2, (20, 30), "b", "2", 4)];
        assert_eq!(
            check_revisions(&history),
            vec![RevisionViolation::WentBackwards {
                earlier: 1,
                earlier_revision: 5,
                later: 2,
                later_revision: 4,
            }]
        );
        // A read after a write must be served at or above the write's revision.
        let history = vec![put(1, (0, 10), "a", "1", 5), get(2, (20, 30), "b", None, 4)];
        assert_eq!(kinds(&check_revisions(&history)), ["backwards"]);
        // And a write after a read must be above the read's revision.
        let history = vec![get(1, (0, 10), "b", None, 5), put(2, (20, 30), "a", "1", 5)];
        assert_eq!(kinds(&check_revisions(&history)), ["backwards"]);
    }

    #[test]
    fn rejects_two_writes_sharing_a_revision() {
        let history = vec![put(1, (0, 10), "a", "1", 2), put(2, (5, 30), "b", "2", 2)];
        assert_eq!(
            check_revisions(&history),
            vec![RevisionViolation::SharedRevision {
                revision: 2,
                first: 1,
                second: 2,
            }]
        );
    }

    #[test]
    fn rejects_a_read_at_r_that_misses_a_write_at_or_below_r() {
        // Concurrent in real time, so only the revisions tell: the put is at 2, the read at 3.
        let history = vec![
            put(1, (0, 100), "a", "1", 2),
            get(2, (10, 20), "a", None, 3),
        ];
        assert_eq!(
            check_revisions(&history),
            vec![RevisionViolation::MissedWrite {
                read: 2,
                key: b"a".to_vec(),
                revision: 3,
                write: 1,
                write_revision: 2,
            }]
        );
        // A range must not miss it either.
        let history = vec![
            put(1, (0, 100), "a", "1", 2),
            put(2, (0, 100), "b", "2", 3),
            range(3, (10, 20), ("a", "c"), &[("b", "2", 3)], 3),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["missed"]);
        // A delete that deleted nothing claims the key was absent at its revision.
        let history = vec![
            put(1, (0, 100), "a", "1", 2),
            delete(2, (10, 20), "a", 0, 2),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["missed"]);
    }

    #[test]
    fn rejects_a_stale_read_in_revision_space() {
        let history = vec![
            put(1, (0, 100), "a", "1", 2),
            put(2, (0, 100), "a", "2", 3),
            get(3, (10, 20), "a", Some(("1", 2)), 3),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["stale"]);
        // Deletes count as writes too.
        let history = vec![
            put(1, (0, 100), "a", "1", 2),
            delete(2, (0, 100), "a", 1, 3),
            get(3, (10, 20), "a", Some(("1", 2)), 3),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["stale"]);
    }

    #[test]
    fn unknown_writes_are_known_once_observed() {
        let history = vec![
            put_unknown(1, 0, "a", "1"),
            get(2, (10, 20), "a", Some(("1", 2)), 2),
            // Saw the unknown put at 2, and a later read at 3 went back to "nothing".
            get(3, (30, 40), "a", None, 3),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["missed"]);
        // Unless a delete whose answer was lost may lie in between.
        let mut history = history;
        history.push(op(
            4,
            25,
            None,
            Call::Delete { key: "a".into() },
            Outcome::Unknown,
        ));
        assert_eq!(check_revisions(&history), vec![]);
        // An unknown write that nobody saw constrains nothing.
        let history = vec![put_unknown(1, 0, "a", "1"), get(2, (10, 20), "a", None, 1)];
        assert_eq!(check_revisions(&history), vec![]);
    }

    #[test]
    fn rejects_reads_no_write_explains() {
        // A failed write must never be seen.
        let history = vec![
            put_failed(1, (0, 10), "a", "1"),
            get(2, (20, 30), "a", Some(("1", 2)), 2),
        ];
        assert_eq!(
            check_revisions(&history),
            vec![RevisionViolation::PhantomRead {
                read: 2,
                key: b"a".to_vec(),
                mod_revision: 2,
                other: Some(1),
                reason: "only a failed op wrote it",
            }]
        );
        // A revision acknowledged to another key's write.
        let history = vec![
            put(1, (0, 10), "b", "1", 2),
            get(2, (20, 30), "a", Some(("1", 2)), 2),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["phantom"]);
        // Two reads disagreeing on what an unknown write at 2 was.
        let history = vec![
            put_unknown(1, 0, "a", "1"),
            put_unknown(2, 0, "a", "2"),
            get(3, (20, 30), "a", Some(("1", 2)), 2),
            get(4, (20, 30), "a", Some(("2", 2)), 2),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["phantom"]);
        // An unknown write seen below a revision that completed before it began.
        let history = vec![
            put(1, (0, 10), "b", "x", 5),
            put_unknown(2, 20, "a", "1"),
            get(3, (30, 40), "a", Some(("1", 4)), 6),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["phantom"]);
        // A mod_revision above the header.
        let history = vec![
            put(1, (0, 10), "a", "1", 2),
            get(2, (20, 30), "a", Some(("1", 2)), 1),
        ];
        assert!(kinds(&check_revisions(&history)).contains(&"impossible"));
    }

    #[test]
    fn rejects_range_answers_outside_the_range() {
        let history = vec![
            put(1, (0, 10), "z", "1", 2),
            range(2, (20, 30), ("a", "c"), &[("z", "1", 2)], 2),
        ];
        assert_eq!(kinds(&check_revisions(&history)), ["range"]);
    }

    #[test]
    fn accepts_random_histories_from_a_sequential_execution() {
        for seed in 0..100 {
            let (history, _, _) = crate::check::linearizable::sim::history(seed, 3, 200, 6);
            assert_eq!(check_revisions(&history), vec![], "seed {seed}");
        }
    }

    #[test]
    fn rejects_random_histories_with_one_read_of_a_value_never_written() {
        for seed in 0..100 {
            let (mut history, _, _) = crate::check::linearizable::sim::history(seed, 3, 200, 6);
            let read = history
                .iter_mut()
                .find_map(|op| match &mut op.result {
                    Outcome::Ok(Answer::Get { kv: Some(kv), .. }) => Some(kv),
                    _ => None,
                })
                .expect("200 ops include a get that found its key");
            read.value = b"never written".to_vec();
            assert!(
                kinds(&check_revisions(&history)).contains(&"phantom"),
                "seed {seed}"
            );
        }
    }
}
