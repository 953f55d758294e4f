//! Linearizability of the single-key operations, checked per key against a register model
//! that also tracks the key's `mod_revision` and a lower bound on the global revision.
//!
//! The search is Wing & Gong's, made just-in-time by Lowe ("Testing for linearizability",
//! 2017) and memoised on (linearized set, model state) as Porcupine does: only ops whose
//! call precedes the first pending return can go next, and a return whose op has not been
//! linearized forces a backtrack. Keys are checked apart (P-compositionality, Horn & Kroening
//! 2015), since a history is linearizable iff each key's sub-history is.
//!
//! - Failed ops never happened and are dropped.
//! - Unknown ops may take effect at any time after their invoke, or never: their return is at
//!   +infinity. Because an op linearized after every acknowledged op is unobservable, "never"
//!   needs no separate case. They are tried only when the search is stuck, so a history whose
//!   unknown writes nobody observed is checked without ever branching on them.
//! - A `Range` is projected onto every key of the history in its range, as a read at the
//!   range's header revision. That is a necessary condition only: the range's atomicity across
//!   keys is `revisions`' business.
//!
//! The model knows the global revision only as seen through one key, so it checks that
//! revisions rise along each key's linearization (a read at R sees the write at its
//! mod_revision and is followed only by writes above R), not that keys agree with each other.
//!
//! Invariant: a `Violation` is returned only after the search is exhausted; running out of
//! budget gives `Unknown`, never a wrong `Violation`. Where the model cannot tell, it
//! over-approximates: an unknown write's revision is kept as a range that later ops narrow,
//! and the one imprecision left is a false compare on a revision far above the bottom of that
//! range (`EXCLUDED_SPAN`), which leaves the revision possible.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::time::{Duration, Instant};

use super::history::{self, Answer, Call, Expect, KeyValue, Op, Outcome, show};

/// The result of a linearizability check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No linearization of `key`'s sub-history exists. `ops` is the window where the deepest
    /// attempt got stuck: the op that fixed the model state last, the ops linearized after it,
    /// every op that could have gone next, and the ops those would have left impossible.
    Violation {
        key: Vec<u8>,
        ops: Vec<u64>,
    },
    /// The check could not finish: budget exhausted, or a malformed history.
    Unknown {
        reason: String,
    },
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Linearizable => write!(f, "linearizable"),
            Verdict::Violation { key, ops } => {
                write!(f, "not linearizable on key {}: ops {ops:?}", show(key))
            }
            Verdict::Unknown { reason } => write!(f, "unknown: {reason}"),
        }
    }
}

/// Search steps between two reads of the clock. A read costs ~20 ns and a step from ~100 ns
/// to a few µs, so this keeps the overhead under 1% while overshooting the budget by a few
/// milliseconds at most. Semi-arbitrary.
const STEPS_PER_CLOCK_READ: u64 = 1_024;

/// Checks that the single-key ops of `history` (and the per-key projections of its ranges)
/// are linearizable, giving up with `Unknown` after `budget`.
///
/// Assumes, as [`history`] says, that every key starts absent and that the history holds
/// every write to its keys.
pub fn check_linearizable(history: &[Op], budget: Duration) -> Verdict {
    let errors = history::validate(history);
    if let Some(error) = errors.first() {
        return Verdict::Unknown {
            reason: format!("malformed history: {error}"),
        };
    }
    let deadline = Instant::now() + budget;
    let partitions = partition(history);
    let mut steps = 0u64;
    let mut exhausted = false;
    for (key, entries) in &partitions {
        match check_key(entries, deadline, &mut steps) {
            Search::Linearizable => {}
            Search::Violation(ops) => {
                return Verdict::Violation {
                    key: key.to_vec(),
                    ops,
                };
            }
            Search::BudgetExhausted => {
                // Keep going: a small key may still be decided. Each later key stops at its
                // first clock read, so this ends promptly.
                exhausted = true;
            }
        }
    }
    if exhausted {
        Verdict::Unknown {
            reason: "budget exhausted".to_string(),
        }
    } else {
        Verdict::Linearizable
    }
}

/// A value, interned: the model compares and hashes integers instead of byte strings.
type ValueId = usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Compare {
    ModRevision(i64),
    Value(ValueId),
    Absent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Input {
    Read,
    Put { value: ValueId },
    Delete,
    Cas { expect: Compare, value: ValueId },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Unknown,
    Read {
        revision: i64,
        kv: Option<(ValueId, i64)>,
    },
    Put {
        revision: i64,
    },
    Delete {
        revision: i64,
        deleted: i64,
    },
    Cas {
        revision: i64,
        succeeded: bool,
    },
}

/// One op of a key's sub-history.
#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    input: Input,
    output: Output,
    invoke: u64,
    /// `u64::MAX` for unknown ops.
    complete: u64,
}

impl Entry {
    fn is_unknown(&self) -> bool {
        self.output == Output::Unknown
    }

    /// Where it sorts among candidates: by the revision its answer puts it at, a write
    /// before the reads at its revision. etcd linearizes in revision order, so trying
    /// candidates in this order makes the first choice right almost always.
    fn order(&self) -> (i64, u8) {
        match self.output {
            Output::Put { revision } => (revision, 0),
            Output::Delete { revision, deleted } => (revision, u8::from(deleted == 0)),
            Output::Cas {
                revision,
                succeeded,
            } => (revision, u8::from(!succeeded)),
            Output::Read { revision, .. } => (revision, 1),
            Output::Unknown => (i64::MAX, 2),
        }
    }

    /// The highest floor (lower bound on the global revision) at which it can still be
    /// linearized: a write needs its revision above the floor, anything else its header
    /// revision at or above it. Floors never fall, so past this the op is impossible.
    fn deadline(&self) -> i64 {
        match self.order() {
            (revision, 0) => revision.saturating_sub(1),
            (revision, _) => revision,
        }
    }

    /// Whether linearizing it can change the register's value.
    fn may_write(&self) -> bool {
        match (self.input, self.output) {
            (Input::Read, _) => false,
            (_, Output::Unknown) => true,
            (Input::Put { .. }, _) => true,
            (_, Output::Delete { deleted, .. }) => deleted > 0,
            (_, Output::Cas { succeeded, .. }) => succeeded,
            _ => false,
        }
    }
}

/// The id of every value no op can tell apart from another: one that no read returned and
/// no `Cas` compares against. Registers holding two such values behave alike under every op
/// of the history, so merging them loses nothing and lets the memo see equal states.
const OPAQUE: ValueId = 0;

/// Splits the history into per-key sub-histories, dropping failed ops and unknown reads
/// (neither has an effect or an observation), and projecting ranges onto keys.
fn partition<'a>(history: &'a [Op]) -> BTreeMap<&'a [u8], Vec<Entry>> {
    let mut values: HashMap<&'a [u8], ValueId> = HashMap::new();
    for op in history {
        let observed: Vec<&[u8]> = match (&op.call, &op.result) {
            (
                Call::Cas {
                    expect: Expect::Value(value),
                    ..
                },
                _,
            ) => vec![value],
            (_, Outcome::Ok(Answer::Get { kv: Some(kv), .. })) => vec![&kv.value],
            (_, Outcome::Ok(Answer::Range { kvs, .. })) => {
                kvs.iter().map(|kv| kv.value.as_slice()).collect()
            }
            _ => Vec::new(),
        };
        for value in observed {
            let next = values.len() + 1;
            values.entry(value).or_insert(next);
        }
    }
    let intern = |value: &[u8]| -> ValueId { values.get(value).copied().unwrap_or(OPAQUE) };
    let mut partitions: BTreeMap<&'a [u8], Vec<Entry>> = BTreeMap::new();
    for op in history {
        if let Some(key) = op.call.key() {
            partitions.entry(key).or_default();
        }
    }
    for op in history {
        let output = match &op.result {
            Outcome::Failed => continue,
            Outcome::Unknown if !op.call.is_write() => continue,
            Outcome::Unknown => Output::Unknown,
            Outcome::Ok(answer) => match answer {
                Answer::Get { revision, kv } => Output::Read {
                    revision: *revision,
                    kv: kv.as_ref().map(|kv| (intern(&kv.value), kv.mod_revision)),
                },
                Answer::Put { revision } => Output::Put {
                    revision: *revision,
                },
                Answer::Delete { revision, deleted } => Output::Delete {
                    revision: *revision,
                    deleted: *deleted,
                },
                Answer::Cas {
                    revision,
                    succeeded,
                } => Output::Cas {
                    revision: *revision,
                    succeeded: *succeeded,
                },
                Answer::Range { revision, kvs } => {
                    let Call::Range { start, end } = &op.call else {
                        continue;
                    };
                    let returned: HashMap<&[u8], &KeyValue> =
                        kvs.iter().map(|kv| (kv.key.as_slice(), kv)).collect();
                    for (key, entries) in partitions.range_mut::<&[u8], _>(start.as_slice()..) {
                        if !history::range_contains(start, end, key) {
                            // Keys are sorted, so once one is past the range all are, except
                            // for the single-key form whose only key is `start` itself.
                            break;
                        }
                        let kv = returned
                            .get(key)
                            .map(|kv| (intern(&kv.value), kv.mod_revision));
                        entries.push(Entry {
                            id: op.id,
                            input: Input::Read,
                            output: Output::Read {
                                revision: *revision,
                                kv,
                            },
                            invoke: op.invoke,
                            complete: op.effective_complete(),
                        });
                    }
                    continue;
                }
            },
        };
        let input = match &op.call {
            Call::Get { .. } => Input::Read,
            Call::Put { value, .. } => Input::Put {
                value: intern(value),
            },
            Call::Delete { .. } => Input::Delete,
            Call::Cas { expect, value, .. } => Input::Cas {
                expect: match expect {
                    Expect::ModRevision(revision) => Compare::ModRevision(*revision),
                    Expect::Value(value) => Compare::Value(intern(value)),
                    Expect::Absent => Compare::Absent,
                },
                value: intern(value),
            },
            Call::Range { .. } => continue,
        };
        let Some(key) = op.call.key() else { continue };
        if let Some(entries) = partitions.get_mut(key) {
            entries.push(Entry {
                id: op.id,
                input,
                output,
                invoke: op.invoke,
                complete: op.effective_complete(),
            });
        }
    }
    for entries in partitions.values_mut() {
        // Acknowledged ops first, in invoke order, so that a linearized set is mostly a
        // prefix of them (see `Linearized`); unknown ops after.
        entries.sort_by_key(|entry| (entry.is_unknown(), entry.invoke));
    }
    partitions
}

/// What the model knows of the key's mod_revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ModRevision {
    Known(i64),
    /// Written by an unknown op: some revision in `low..=high` (`high` is `i64::MAX` until an
    /// op shows the global revision), except `low + i` for each bit `i` set in `excluded`
    /// (compares that came out false). Never a single revision: that is `Known`.
    Between {
        low: i64,
        high: i64,
        excluded: u64,
    },
}

/// Revisions past `low + 63` cannot be excluded (the mask has 64 bits), so a false compare on
/// one of them leaves it possible, which over-approximates. Compares that name a revision are
/// almost always about the last few writes, which sit at the bottom of the range.
const EXCLUDED_SPAN: i64 = 64;

impl ModRevision {
    /// `low..=high` without `excluded`, normalized; `None` when nothing is left.
    fn between(mut low: i64, mut high: i64, mut excluded: u64) -> Option<ModRevision> {
        while excluded & 1 == 1 {
            if low >= high {
                return None;
            }
            low += 1;
            excluded >>= 1;
        }
        if low > high {
            return None;
        }
        let span = high.saturating_sub(low);
        if span < EXCLUDED_SPAN {
            // Bits past `high` mean nothing; clear them so equal ranges compare equal, then
            // drop excluded revisions from the top (the bottom one is not excluded).
            excluded &= u64::MAX >> (EXCLUDED_SPAN - 1 - span);
            while excluded & (1u64 << (high - low)) != 0 {
                excluded &= !(1u64 << (high - low));
                high -= 1;
            }
        }
        if low == high {
            Some(ModRevision::Known(low))
        } else {
            Some(ModRevision::Between {
                low,
                high,
                excluded,
            })
        }
    }

    fn admits(self, revision: i64) -> bool {
        match self {
            ModRevision::Known(known) => known == revision,
            ModRevision::Between {
                low,
                high,
                excluded,
            } => {
                (low..=high).contains(&revision)
                    && (revision - low >= EXCLUDED_SPAN
                        || excluded & (1u64 << (revision - low)) == 0)
            }
        }
    }

    /// What is left once the global revision is known to be `revision`: the key was written
    /// at or below it.
    fn at_most(self, revision: i64) -> Option<ModRevision> {
        match self {
            ModRevision::Known(known) => (known <= revision).then_some(self),
            ModRevision::Between {
                low,
                high,
                excluded,
            } => ModRevision::between(low, high.min(revision), excluded),
        }
    }

    /// What is left once it is known not to be `revision`.
    fn excluding(self, revision: i64) -> Option<ModRevision> {
        match self {
            ModRevision::Known(known) => (known != revision).then_some(self),
            ModRevision::Between { .. } if !self.admits(revision) => Some(self),
            ModRevision::Between {
                low,
                high,
                excluded,
            } if revision - low < EXCLUDED_SPAN => {
                ModRevision::between(low, high, excluded | (1u64 << (revision - low)))
            }
            ModRevision::Between { .. } => Some(self),
        }
    }
}

/// The register model of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Register {
    value: Option<ValueId>,
    /// `Known(0)` whenever `value` is `None`, so absent states compare equal.
    mod_revision: ModRevision,
    /// A lower bound on the global revision at this point of the linearization: the highest
    /// revision an op linearized so far has shown (or implied, for unknown writes). Exact
    /// right after an acknowledged op, which shows the global revision.
    floor: i64,
}

/// etcd's revision before the first write.
const INITIAL_REVISION: i64 = 1;

impl Register {
    const INITIAL: Register = Register {
        value: None,
        mod_revision: ModRevision::Known(0),
        floor: INITIAL_REVISION,
    };

    /// After a put whose revision is unknown but above `above`.
    fn put_unknown(value: ValueId, above: i64) -> Register {
        Register {
            value: Some(value),
            mod_revision: ModRevision::Between {
                low: above.saturating_add(1),
                high: i64::MAX,
                excluded: 0,
            },
            floor: above.saturating_add(1),
        }
    }

    fn put(value: ValueId, revision: i64) -> Register {
        Register {
            value: Some(value),
            mod_revision: ModRevision::Known(revision),
            floor: revision,
        }
    }

    fn absent(floor: i64) -> Register {
        Register {
            value: None,
            mod_revision: ModRevision::Known(0),
            floor,
        }
    }

    /// This state as seen by an acknowledged op that did not write and was served at
    /// `revision`, the exact global revision then; `None` if that is impossible.
    fn served_at(self, revision: i64) -> Option<Register> {
        if revision < self.floor {
            return None;
        }
        Some(Register {
            mod_revision: self.mod_revision.at_most(revision)?,
            floor: revision,
            ..self
        })
    }

    /// Evaluates a `Cas` compare with etcd's rules for missing keys.
    fn compare(&self, expect: Compare) -> Truth {
        match (expect, self.value) {
            (Compare::Absent, value) => Truth::from(value.is_none()),
            (Compare::Value(_), None) => Truth::False,
            (Compare::Value(expected), Some(value)) => Truth::from(expected == value),
            (Compare::ModRevision(expected), None) => Truth::from(expected == 0),
            (Compare::ModRevision(expected), Some(_)) => match self.mod_revision {
                ModRevision::Known(known) => Truth::from(known == expected),
                ModRevision::Between { .. } if self.mod_revision.admits(expected) => {
                    Truth::Maybe(expected)
                }
                ModRevision::Between { .. } => Truth::False,
            },
        }
    }

    /// This state once a compare came out false; `None` if it cannot have.
    fn compare_failed(self, expect: Compare) -> Option<Register> {
        match self.compare(expect) {
            Truth::True => None,
            Truth::False => Some(self),
            Truth::Maybe(revision) => Some(Register {
                mod_revision: self.mod_revision.excluding(revision)?,
                ..self
            }),
        }
    }

    /// Pushes every state the model can reach by linearizing `entry` here.
    fn step(self, entry: &Entry, next: &mut Vec<Register>) {
        let s = self;
        match (entry.input, entry.output) {
            (Input::Read, Output::Unknown) => next.push(s),
            (Input::Put { value }, Output::Unknown) => {
                next.push(Register::put_unknown(value, s.floor))
            }
            (Input::Delete, Output::Unknown) => match s.value {
                Some(_) => next.push(Register::absent(s.floor.saturating_add(1))),
                None => next.push(s),
            },
            (Input::Cas { expect, value }, Output::Unknown) => {
                if let Some(unchanged) = s.compare_failed(expect) {
                    next.push(unchanged);
                }
                match s.compare(expect) {
                    Truth::True => next.push(Register::put_unknown(value, s.floor)),
                    Truth::Maybe(mod_revision) => {
                        next.push(Register::put_unknown(value, s.floor.max(mod_revision)));
                    }
                    Truth::False => {}
                }
            }
            (Input::Read, Output::Read { revision, kv }) => {
                let Some(served) = s.served_at(revision) else {
                    return;
                };
                match (served.value, kv) {
                    (None, None) => next.push(served),
                    (Some(value), Some((seen, mod_revision)))
                        if value == seen && served.mod_revision.admits(mod_revision) =>
                    {
                        next.push(Register {
                            mod_revision: ModRevision::Known(mod_revision),
                            ..served
                        });
                    }
                    _ => {}
                }
            }
            (Input::Put { value }, Output::Put { revision }) if revision > s.floor => {
                next.push(Register::put(value, revision));
            }
            (Input::Delete, Output::Delete { revision, deleted }) => match (deleted, s.value) {
                (1, Some(_)) if revision > s.floor => next.push(Register::absent(revision)),
                (0, None) if revision >= s.floor => next.push(Register::absent(revision)),
                _ => {}
            },
            (
                Input::Cas { expect, value },
                Output::Cas {
                    revision,
                    succeeded: true,
                },
            ) => {
                let above = match s.compare(expect) {
                    Truth::True => s.floor,
                    Truth::Maybe(mod_revision) => s.floor.max(mod_revision),
                    Truth::False => return,
                };
                if revision > above {
                    next.push(Register::put(value, revision));
                }
            }
            (
                Input::Cas { expect, .. },
                Output::Cas {
                    revision,
                    succeeded: false,
                },
            ) => {
                // The compare ran at `revision`, so the key was written at or below it.
                if let Some(failed) = s
                    .served_at(revision)
                    .and_then(|served| served.compare_failed(expect))
                {
                    next.push(failed);
                }
            }
            // The op cannot go here, or its answer is of the wrong kind (which `validate`
            // rejects).
            _ => {}
        }
    }
}

/// A compare's outcome when the model cannot always tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Truth {
    True,
    False,
    /// True iff the unknown mod_revision is this one.
    Maybe(i64),
}

impl From<bool> for Truth {
    fn from(value: bool) -> Truth {
        if value { Truth::True } else { Truth::False }
    }
}

/// The set of states the (nondeterministic) model may be in, sorted and deduplicated so that
/// equal sets hash equally (Porcupine's power-set construction).
type States = Vec<Register>;

fn step_all(states: &[Register], entry: &Entry) -> States {
    let mut next = Vec::with_capacity(states.len());
    for state in states {
        state.step(entry, &mut next);
    }
    next.sort_unstable();
    next.dedup();
    next
}

enum Search {
    Linearizable,
    Violation(Vec<u64>),
    BudgetExhausted,
}

/// The end of the entry list.
const NIL: usize = usize::MAX;
/// The list's head sentinel.
const HEAD: usize = 0;

/// The ops that may go next at a point of the search, and how far it has tried them.
#[derive(Debug, Clone, Default)]
struct Point {
    /// The acknowledged ops whose call precedes the first pending return (Lowe's minimal
    /// ops), in `Entry::order`.
    candidates: Vec<usize>,
    /// The first pending return's time: unknown ops invoked by then may go next too.
    stuck_at: u64,
    /// The next of `candidates` to try; once past them, unknown ops are tried.
    next: usize,
    /// The next position in `UnknownOps::sorted` to try.
    unknown_next: usize,
    /// Acknowledged ops whose deadline a candidate tried here would have passed.
    blockers: Vec<usize>,
}

impl Point {
    fn new(nodes: &Nodes, entries: &[Entry]) -> Point {
        let mut candidates = Vec::new();
        let mut stuck_at = u64::MAX;
        let mut node = nodes.next[HEAD];
        while node != NIL {
            let (op, is_call) = nodes.op[node];
            if !is_call {
                stuck_at = entries[op].complete;
                break;
            }
            candidates.push(op);
            node = nodes.next[node];
        }
        candidates.sort_by_key(|&op| (entries[op].order(), entries[op].invoke));
        Point {
            candidates,
            stuck_at,
            next: 0,
            unknown_next: 0,
            blockers: Vec::new(),
        }
    }

    /// Moves past the candidate last tried.
    fn advance(&mut self) {
        if self.next < self.candidates.len() {
            self.next += 1;
        } else {
            self.unknown_next += 1;
        }
    }
}

struct Frame {
    op: usize,
    /// The states before `op` was linearized.
    states: States,
    /// The point `op` was tried at, to go on with the next candidate on backtrack.
    point: Point,
    /// Whether the op before `op` was unknown.
    after_unknown: bool,
}

/// The doubly linked list of call and return nodes of acknowledged ops, in time order, from
/// which linearized ops are lifted and restored in LIFO order (dancing links).
struct Nodes {
    next: Vec<usize>,
    prev: Vec<usize>,
    /// Per node: the op and whether it is the op's call.
    op: Vec<(usize, bool)>,
    call: Vec<usize>,
    ret: Vec<usize>,
}

impl Nodes {
    fn new(entries: &[Entry]) -> Nodes {
        let mut events: Vec<(u64, bool, usize)> = Vec::new();
        for (index, entry) in entries.iter().enumerate() {
            if !entry.is_unknown() {
                // Calls sort before returns at equal times: touching ops count as concurrent,
                // which can only make more histories linearizable.
                events.push((entry.invoke, false, index));
                events.push((entry.complete, true, index));
            }
        }
        events.sort_unstable();
        let count = events.len() + 1;
        let mut nodes = Nodes {
            next: vec![NIL; count],
            prev: vec![NIL; count],
            op: vec![(0, false); count],
            call: vec![NIL; entries.len()],
            ret: vec![NIL; entries.len()],
        };
        for (position, &(_, is_return, index)) in events.iter().enumerate() {
            let node = position + 1;
            nodes.prev[node] = node - 1;
            nodes.next[node - 1] = node;
            nodes.op[node] = (index, !is_return);
            if is_return {
                nodes.ret[index] = node;
            } else {
                nodes.call[index] = node;
            }
        }
        nodes
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        if next != NIL {
            self.prev[next] = node;
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call[op]);
        self.unlink(self.ret[op]);
    }

    fn unlift(&mut self, op: usize) {
        self.relink(self.ret[op]);
        self.relink(self.call[op]);
    }
}

/// The deepest point the search reached before it had to backtrack.
struct Deepest {
    linearized: Vec<usize>,
    stuck_at: u64,
    /// Acknowledged ops that every way forward from there would have left impossible.
    blockers: Vec<usize>,
}

/// The set of linearized ops: a bitset over the acknowledged ops (entries `0..acknowledged`,
/// in invoke order) and one over the unknown ops (the entries after them), with Zobrist
/// hashes kept up to date so memo lookups hash in O(1).
///
/// Linearizations follow invoke order closely, so the acknowledged bitset is all ones up
/// to a frontier a few words wide and all zeros after it. Memo keys store only the frontier
/// (`full` and the words up to `end`), which keeps them small however long the history.
struct Linearized {
    acknowledged_count: usize,
    acknowledged: Vec<u64>,
    unknown: Vec<u64>,
    /// Words of `acknowledged` before this one are full.
    full: usize,
    /// Words of `acknowledged` from this one on are zero.
    end: usize,
    hash: u64,
}

impl Linearized {
    fn new(entries: &[Entry]) -> Linearized {
        let acknowledged_count = entries.iter().filter(|entry| !entry.is_unknown()).count();
        Linearized {
            acknowledged_count,
            acknowledged: vec![0; acknowledged_count.div_ceil(64)],
            unknown: vec![0; (entries.len() - acknowledged_count).div_ceil(64)],
            full: 0,
            end: 0,
            hash: 0,
        }
    }

    fn contains(&self, op: usize) -> bool {
        match op.checked_sub(self.acknowledged_count) {
            None => is_set(&self.acknowledged, op),
            Some(unknown) => is_set(&self.unknown, unknown),
        }
    }

    /// The value of `acknowledged[word]` when every op it covers is linearized.
    fn full_word(&self, word: usize) -> u64 {
        let bits = self.acknowledged_count - word * 64;
        if bits >= 64 {
            u64::MAX
        } else {
            (1 << bits) - 1
        }
    }

    fn set(&mut self, op: usize, zobrist: &Zobrist) {
        self.hash ^= zobrist.keys[op];
        let Some(unknown) = op.checked_sub(self.acknowledged_count) else {
            set(&mut self.acknowledged, op);
            self.end = self.end.max(op / 64 + 1);
            while self.full < self.acknowledged.len()
                && self.acknowledged[self.full] == self.full_word(self.full)
            {
                self.full += 1;
            }
            return;
        };
        set(&mut self.unknown, unknown);
    }

    fn clear(&mut self, op: usize, zobrist: &Zobrist) {
        self.hash ^= zobrist.keys[op];
        let Some(unknown) = op.checked_sub(self.acknowledged_count) else {
            clear(&mut self.acknowledged, op);
            self.full = self.full.min(op / 64);
            while self.end > 0 && self.acknowledged[self.end - 1] == 0 {
                self.end -= 1;
            }
            return;
        };
        clear(&mut self.unknown, unknown);
    }

    /// The acknowledged bitset in compact form: the count of full words and the rest up to
    /// the last non-zero word.
    fn acknowledged_key(&self) -> (usize, Vec<u64>) {
        let tail = self.acknowledged[self.full..self.end.max(self.full)].to_vec();
        (self.full, tail)
    }

    /// The unknown bitset without its trailing zero words.
    fn unknown_key(&self) -> Vec<u64> {
        let used = self
            .unknown
            .iter()
            .rposition(|&word| word != 0)
            .map_or(0, |last| last + 1);
        self.unknown[..used].to_vec()
    }

    /// Whether every unknown op of `subset` (in `unknown_key` form) is linearized here.
    fn has_unknown(&self, subset: &[u64]) -> bool {
        subset
            .iter()
            .enumerate()
            .all(|(index, &word)| word & !self.unknown.get(index).copied().unwrap_or(0) == 0)
    }
}

/// A random key per entry for Zobrist hashing.
struct Zobrist {
    keys: Vec<u64>,
}

impl Zobrist {
    fn new(entries: &[Entry]) -> Zobrist {
        // splitmix64 from a fixed seed: deterministic, and any fixed sequence of distinct
        // well-mixed keys hashes as well as random ones here.
        let mut state = 0u64;
        let keys = entries
            .iter()
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            })
            .collect();
        Zobrist { keys }
    }
}

/// A memo key: the linearized set (hashed by its Zobrist hash, compared in full), the
/// model's states, and whether the last op linearized was unknown (which restricts the
/// next unknown op, so points that differ in it are different points).
#[derive(Debug, PartialEq, Eq)]
struct SeenKey {
    hash: u64,
    acknowledged: (usize, Vec<u64>),
    unknown: Vec<u64>,
    states: States,
    after_unknown: bool,
}

impl std::hash::Hash for SeenKey {
    fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
        self.hash.hash(hasher);
        self.states.hash(hasher);
        self.after_unknown.hash(hasher);
    }
}

/// The points explored to failure that had unknown ops linearized, by (acknowledged ops,
/// states, after unknown): the unknown ops linearized at each.
type Failed = HashMap<((usize, Vec<u64>), States, bool), Vec<Vec<u64>>>;

/// Lowe's just-in-time linearization of one key's sub-history.
///
/// Two orderings keep a correct history cheap:
///
/// - Candidates are tried in revision order (`Entry::order`), the order etcd linearizes in,
///   so the first choice is almost always right.
/// - A point where an acknowledged op not yet linearized can no longer go is dropped at
///   once: every state's floor is past the op's `Entry::deadline`, and floors never fall.
///
/// Unknown ops make the plain search exponential: each may go anywhere after its invoke, and
/// every subset of them linearized so far is a new memo key. The reductions below keep it
/// polynomial in practice. Each is sound because of one dominance order on states: `s`
/// dominates `s'` when they hold the same value, `s` allows every mod_revision `s'` allows,
/// and its floor is no higher. Every step from `s'` is matched by a step from `s` to a state
/// that again dominates, so whatever completes from `s'` also completes from `s`; and unknown
/// ops never linearized can go last, where nothing observes them. (The brute-force test at
/// the bottom of this file checks the result against the specification itself.)
///
/// - Unknown ops are tried only when the scan is stuck (a return is reached whose op is not
///   linearized). That changes the order candidates are tried in, not the set.
/// - Interchangeable unknown ops (same input, values as interned) are tried earliest-invoked
///   first only: any linearization can be rewritten to use them in invoke order.
/// - An unknown op that leaves the states as they were is not linearized: doing nothing is
///   at least as good, and keeps the op for later.
/// - In a run of consecutive unknown ops, a put or delete only goes first: moving the ops
///   before it to the end leaves a dominating state. So after an unknown op, only an
///   unknown `Cas`, whose outcome depends on what came before, is tried.
/// - A point is skipped when a point already explored to failure had the same acknowledged
///   ops, the same states, a subset of its unknown ops, and a run rule no stricter: that
///   point could do everything this one can.
fn check_key(entries: &[Entry], deadline: Instant, steps: &mut u64) -> Search {
    let acknowledged_total = entries.iter().filter(|entry| !entry.is_unknown()).count();
    let unknown = UnknownOps::new(entries);
    let zobrist = Zobrist::new(entries);
    let mut nodes = Nodes::new(entries);
    let mut linearized = Linearized::new(entries);
    let mut states: States = vec![Register::INITIAL];
    let mut after_unknown = false;
    let mut stack: Vec<Frame> = Vec::new();
    let mut seen: HashSet<SeenKey> = HashSet::new();
    let mut failed: Failed = HashMap::new();
    let mut acknowledged_done = 0usize;
    let mut unknown_done = 0usize;
    let mut deepest: Option<Deepest> = None;
    let mut here = Point::new(&nodes, entries);
    // The deadlines of the acknowledged ops not yet linearized, to drop points where one of
    // them can no longer go (revisions only rise along a linearization).
    let mut deadlines: BTreeSet<(i64, usize)> = (0..entries.len())
        .filter(|&op| !entries[op].is_unknown())
        .map(|op| (entries[op].deadline(), op))
        .collect();

    loop {
        if acknowledged_done == acknowledged_total {
            // The unknown ops left can all go last, where nothing observes them.
            return Search::Linearizable;
        }
        *steps += 1;
        if steps.is_multiple_of(STEPS_PER_CLOCK_READ) && Instant::now() >= deadline {
            return Search::BudgetExhausted;
        }
        // The next candidate: acknowledged ones first, then unknown ones.
        let candidate = match here.candidates.get(here.next) {
            Some(&op) => Some(op),
            None => unknown
                .next_candidate(
                    here.unknown_next,
                    here.stuck_at,
                    &linearized,
                    after_unknown,
                    entries,
                )
                .map(|position| {
                    here.unknown_next = position;
                    unknown.sorted[position]
                }),
        };
        match candidate {
            Some(op) => {
                let next_states = step_all(&states, &entries[op]);
                let is_unknown = entries[op].is_unknown();
                let floor = next_states.iter().map(|state| state.floor).min();
                let blocker = deadlines
                    .iter()
                    .find(|&&(_, other)| other != op)
                    .filter(|&&(deadline, _)| floor.is_some_and(|floor| floor > deadline))
                    .map(|&(_, blocker)| blocker);
                if let Some(blocker) = blocker
                    && !here.blockers.contains(&blocker)
                {
                    here.blockers.push(blocker);
                }
                // An unknown op that changes nothing is better left for later.
                let no_op = is_unknown && next_states.iter().all(|state| states.contains(state));
                let rejected = next_states.is_empty() || no_op || blocker.is_some();
                let fresh = !rejected && {
                    linearized.set(op, &zobrist);
                    let unknown_linearized = unknown_done + usize::from(is_unknown) > 0;
                    let fresh = !(unknown_linearized
                        && unknown.dominated(&failed, &linearized, &next_states, is_unknown))
                        && seen.insert(SeenKey {
                            hash: linearized.hash,
                            acknowledged: linearized.acknowledged_key(),
                            unknown: linearized.unknown_key(),
                            states: next_states.clone(),
                            after_unknown: is_unknown,
                        });
                    if !fresh {
                        linearized.clear(op, &zobrist);
                    }
                    fresh
                };
                if fresh {
                    if is_unknown {
                        unknown_done += 1;
                    } else {
                        nodes.lift(op);
                        deadlines.remove(&(entries[op].deadline(), op));
                        acknowledged_done += 1;
                    }
                    stack.push(Frame {
                        op,
                        states: std::mem::replace(&mut states, next_states),
                        point: std::mem::replace(&mut here, Point::new(&nodes, entries)),
                        after_unknown,
                    });
                    after_unknown = is_unknown;
                } else {
                    here.advance();
                }
            }
            None => {
                // Nothing can go next: this point is explored and failed. Backtrack.
                if deepest
                    .as_ref()
                    .is_none_or(|deepest| stack.len() > deepest.linearized.len())
                {
                    deepest = Some(Deepest {
                        linearized: stack.iter().map(|frame| frame.op).collect(),
                        stuck_at: here.stuck_at,
                        blockers: here.blockers.clone(),
                    });
                }
                let Some(frame) = stack.pop() else {
                    return Search::Violation(explain(entries, &unknown, deepest));
                };
                let explored = std::mem::replace(&mut states, frame.states);
                if unknown_done > 0 {
                    failed
                        .entry((linearized.acknowledged_key(), explored, after_unknown))
                        .or_default()
                        .push(linearized.unknown_key());
                }
                after_unknown = frame.after_unknown;
                linearized.clear(frame.op, &zobrist);
                if entries[frame.op].is_unknown() {
                    unknown_done -= 1;
                } else {
                    nodes.unlift(frame.op);
                    deadlines.insert((entries[frame.op].deadline(), frame.op));
                    acknowledged_done -= 1;
                }
                here = frame.point;
                here.advance();
            }
        }
    }
}

/// The unknown ops of a key's sub-history, in invoke order, grouped into classes of
/// interchangeable ops.
struct UnknownOps {
    /// Entry indices, by invoke.
    sorted: Vec<usize>,
    /// Per position in `sorted`: the previous position of an op with the same input.
    previous_alike: Vec<Option<usize>>,
}

impl UnknownOps {
    fn new(entries: &[Entry]) -> UnknownOps {
        let mut sorted: Vec<usize> = (0..entries.len())
            .filter(|&index| entries[index].is_unknown())
            .collect();
        sorted.sort_by_key(|&index| entries[index].invoke);
        let mut last_alike: HashMap<Input, usize> = HashMap::new();
        let previous_alike = sorted
            .iter()
            .enumerate()
            .map(|(position, &index)| last_alike.insert(entries[index].input, position))
            .collect();
        UnknownOps {
            sorted,
            previous_alike,
        }
    }

    /// The first position at or after `from` whose op may be tried at a point stuck at
    /// `stuck_at`: invoked by then, not yet linearized, the earliest of its class not yet
    /// linearized, and a `Cas` if the last op linearized was unknown.
    fn next_candidate(
        &self,
        from: usize,
        stuck_at: u64,
        linearized: &Linearized,
        after_unknown: bool,
        entries: &[Entry],
    ) -> Option<usize> {
        let invoked = self
            .sorted
            .partition_point(|&index| entries[index].invoke <= stuck_at);
        (from..invoked).find(|&position| {
            let entry = &entries[self.sorted[position]];
            if linearized.contains(self.sorted[position]) {
                return false;
            }
            if after_unknown && !matches!(entry.input, Input::Cas { .. }) {
                return false;
            }
            // Linearized ops of a class are always its earliest ones, so walking back over
            // them is short.
            let mut previous = self.previous_alike[position];
            while let Some(earlier) = previous {
                if !linearized.contains(self.sorted[earlier]) {
                    return false;
                }
                previous = self.previous_alike[earlier];
            }
            true
        })
    }

    /// Whether a point explored to failure dominates the point (`linearized`, `states`,
    /// `after_unknown`): the same acknowledged ops and states, a subset of its unknown ops,
    /// and a run rule no stricter.
    fn dominated(
        &self,
        failed: &Failed,
        linearized: &Linearized,
        states: &States,
        after_unknown: bool,
    ) -> bool {
        // A point reached by an acknowledged op may try any unknown op next, so it
        // dominates points of either kind; one reached by an unknown op only its own kind.
        let kinds: &[bool] = if after_unknown {
            &[false, true]
        } else {
            &[false]
        };
        let mut key = (linearized.acknowledged_key(), states.clone(), false);
        kinds.iter().any(|&kind| {
            key.2 = kind;
            failed.get(&key).is_some_and(|explored| {
                explored.iter().any(|subset| linearized.has_unknown(subset))
            })
        })
    }
}

fn is_set(bits: &[u64], index: usize) -> bool {
    bits[index / 64] & (1 << (index % 64)) != 0
}

fn set(bits: &mut [u64], index: usize) {
    bits[index / 64] |= 1 << (index % 64);
}

fn clear(bits: &mut [u64], index: usize) {
    bits[index / 64] &= !(1 << (index % 64));
}

/// The ops around the deepest point the search reached: from the last op there that could
/// write, through the rest of that linearization; every acknowledged op that could have gone
/// next or that the candidates would have left impossible; and one unknown op of each kind
/// that could have gone next.
fn explain(entries: &[Entry], unknown: &UnknownOps, deepest: Option<Deepest>) -> Vec<u64> {
    let Some(deepest) = deepest else {
        return entries.iter().map(|entry| entry.id).collect();
    };
    let mut ops = Vec::new();
    let last_write = deepest
        .linearized
        .iter()
        .rposition(|&op| entries[op].may_write())
        .unwrap_or(deepest.linearized.len());
    ops.extend(
        deepest.linearized[last_write..]
            .iter()
            .map(|&op| entries[op].id),
    );
    let zobrist = Zobrist::new(entries);
    let mut linearized = Linearized::new(entries);
    for &op in &deepest.linearized {
        linearized.set(op, &zobrist);
    }
    ops.extend(
        entries
            .iter()
            .enumerate()
            .filter(|&(index, entry)| {
                !entry.is_unknown()
                    && !linearized.contains(index)
                    && entry.invoke <= deepest.stuck_at
            })
            .map(|(_, entry)| entry.id),
    );
    ops.extend(deepest.blockers.iter().map(|&op| entries[op].id));
    let mut position = 0;
    while let Some(found) =
        unknown.next_candidate(position, deepest.stuck_at, &linearized, false, entries)
    {
        ops.push(entries[unknown.sorted[found]].id);
        position = found + 1;
    }
    ops.sort_unstable();
    ops.dedup();
    ops
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::check::history::Versioned;
    use crate::check::history::build::*;

    const BUDGET: Duration = Duration::from_secs(10);

    fn check(history: &[Op]) -> Verdict {
        check_linearizable(history, BUDGET)
    }

    fn assert_violation(history: &[Op], key: &str, must_name: &[u64]) {
        match check(history) {
            Verdict::Violation { key: found, ops } => {
                assert_eq!(found, key.as_bytes());
                for id in must_name {
                    assert!(ops.contains(id), "explanation {ops:?} lacks op {id}");
                }
            }
            other => panic!("expected a violation, got {other}"),
        }
    }

    #[test]
    fn accepts_overlapping_ops_in_any_legal_order() {
        // One legal order: get(5), put(1), get(4), put(2), get(3).
        let history = vec![
            put(1, (0, 100), "k", "a", 2),
            put(2, (10, 90), "k", "b", 3),
            get(3, (20, 80), "k", Some(("b", 3)), 3),
            get(4, (5, 95), "k", Some(("a", 2)), 2),
            get(5, (0, 3), "k", None, 1),
        ];
        assert_eq!(check(&history), Verdict::Linearizable);
    }

    #[test]
    fn rejects_a_stale_read() {
        let history = vec![
            put(1, (0, 10), "k", "a", 2),
            put(2, (20, 30), "k", "b", 3),
            get(3, (40, 50), "k", Some(("a", 2)), 3),
        ];
        assert_violation(&history, "k", &[2, 3]);
    }

    #[test]
    fn rejects_a_read_of_a_value_never_written() {
        let history = vec![
            put(1, (0, 10), "k", "a", 2),
            get(2, (5, 50), "k", Some(("x", 2)), 2),
        ];
        assert_violation(&history, "k", &[2]);
    }

    #[test]
    fn rejects_a_read_with_the_wrong_mod_revision() {
        let history = vec![
            put(1, (0, 10), "k", "a", 2),
            get(2, (20, 30), "k", Some(("a", 5)), 5),
        ];
        assert_violation(&history, "k", &[1, 2]);
    }

    #[test]
    fn rejects_a_write_below_an_earlier_read_revision() {
        // The get at revision 7 finished before the put began, so the put's revision must be
        // above 7.
        let history = vec![
            put(1, (0, 10), "k", "a", 7),
            get(2, (20, 30), "k", Some(("a", 7)), 7),
            put(3, (40, 50), "k", "b", 6),
        ];
        assert_violation(&history, "k", &[3]);
    }

    #[test]
    fn rejects_a_lost_write() {
        let history = vec![put(1, (0, 10), "k", "a", 2), get(2, (20, 30), "k", None, 2)];
        assert_violation(&history, "k", &[1, 2]);
    }

    #[test]
    fn unknown_writes_may_or_may_not_happen() {
        let happened = vec![
            put_unknown(1, 0, "k", "a"),
            get(2, (20, 30), "k", Some(("a", 2)), 2),
        ];
        assert_eq!(check(&happened), Verdict::Linearizable);
        let never = vec![put_unknown(1, 0, "k", "a"), get(2, (20, 30), "k", None, 1)];
        assert_eq!(check(&never), Verdict::Linearizable);
        // It may take effect long after the client gave up on it.
        let late = vec![
            put_unknown(1, 0, "k", "a"),
            get(2, (20, 30), "k", None, 1),
            put(3, (40, 50), "k", "b", 2),
            get(4, (60, 70), "k", Some(("a", 3)), 3),
        ];
        assert_eq!(check(&late), Verdict::Linearizable);
        // But not before it was invoked.
        let early = vec![
            get(1, (0, 10), "k", Some(("a", 2)), 2),
            put_unknown(2, 20, "k", "a"),
        ];
        assert_violation(&early, "k", &[1]);
    }

    #[test]
    fn failed_writes_never_happen() {
        let ignored = vec![
            put_failed(1, (0, 10), "k", "a"),
            get(2, (20, 30), "k", None, 1),
        ];
        assert_eq!(check(&ignored), Verdict::Linearizable);
        let observed = vec![
            put_failed(1, (0, 10), "k", "a"),
            get(2, (5, 30), "k", Some(("a", 2)), 2),
        ];
        assert_violation(&observed, "k", &[2]);
    }

    #[test]
    fn cas_follows_etcd_compare_rules() {
        let history = vec![
            cas(1, (0, 10), "k", Expect::Absent, "a", Some((true, 2))),
            cas(2, (20, 30), "k", Expect::Absent, "b", Some((false, 2))),
            cas(
                3,
                (40, 50),
                "k",
                Expect::ModRevision(2),
                "c",
                Some((true, 3)),
            ),
            cas(
                4,
                (60, 70),
                "k",
                Expect::Value("a".into()),
                "d",
                Some((false, 3)),
            ),
            cas(
                5,
                (80, 90),
                "k",
                Expect::Value("c".into()),
                "e",
                Some((true, 4)),
            ),
            delete(6, (100, 110), "k", 1, 5),
            cas(
                7,
                (120, 130),
                "k",
                Expect::ModRevision(0),
                "f",
                Some((true, 6)),
            ),
            delete(8, (140, 150), "k", 1, 7),
            delete(9, (160, 170), "k", 0, 7),
            cas(
                10,
                (180, 190),
                "k",
                Expect::Value("f".into()),
                "g",
                Some((false, 7)),
            ),
        ];
        assert_eq!(check(&history), Verdict::Linearizable);
        let wrong = vec![
            cas(1, (0, 10), "k", Expect::Absent, "a", Some((true, 2))),
            cas(
                2,
                (20, 30),
                "k",
                Expect::Value("a".into()),
                "b",
                Some((false, 2)),
            ),
        ];
        assert_violation(&wrong, "k", &[2]);
    }

    #[test]
    fn unknown_cas_on_an_unknown_revision_may_apply() {
        // The put's revision is unknown; the cas compares on revision 2, which it may have had.
        let history = vec![
            put_unknown(1, 0, "k", "a"),
            cas(2, (10, 20), "k", Expect::ModRevision(2), "b", None),
            get(3, (30, 40), "k", Some(("b", 3)), 3),
        ];
        assert_eq!(check(&history), Verdict::Linearizable);
    }

    #[test]
    fn ranges_are_projected_onto_keys() {
        let history = vec![
            put(1, (0, 10), "a", "1", 2),
            put(2, (20, 30), "b", "2", 3),
            range(3, (40, 50), ("a", "c"), &[("a", "1", 2)], 3),
        ];
        assert_violation(&history, "b", &[2, 3]);
        let history = vec![
            put(1, (0, 10), "a", "1", 2),
            put(2, (20, 30), "b", "2", 3),
            range(3, (40, 50), ("a", "c"), &[("a", "1", 2), ("b", "2", 3)], 3),
        ];
        assert_eq!(check(&history), Verdict::Linearizable);
    }

    #[test]
    fn malformed_histories_are_unknown() {
        let history = vec![put(1, (0, 10), "k", "a", 2), put(1, (0, 10), "k", "a", 3)];
        assert!(matches!(check(&history), Verdict::Unknown { .. }));
    }

    #[test]
    fn an_exhausted_budget_is_unknown_not_a_violation() {
        // A long history whose last read saw a value never written: finding that takes more
        // steps than one clock read covers, so a zero budget stops the search first.
        let mut history = random_history(3, 1, 3_000, 4);
        history.push(get(
            10_000,
            (u64::MAX - 1, u64::MAX),
            "k0",
            Some(("never", 2)),
            i64::MAX,
        ));
        assert_eq!(
            check_linearizable(&history, Duration::ZERO),
            Verdict::Unknown {
                reason: "budget exhausted".to_string()
            }
        );
        assert!(matches!(check(&history), Verdict::Violation { .. }));
    }

    /// A random history of single-key ops on `keys` keys by `clients` clients, generated from
    /// a sequential execution of etcd's semantics; see `sim` for how windows are widened.
    fn random_history(seed: u64, keys: usize, ops: usize, clients: u64) -> Vec<Op> {
        sim::history(seed, keys, ops, clients).0
    }

    #[test]
    fn accepts_random_histories_from_a_sequential_execution() {
        for seed in 0..200 {
            let history = random_history(seed, 2, 60, 4);
            assert_eq!(check(&history), Verdict::Linearizable, "seed {seed}");
        }
    }

    #[test]
    fn rejects_random_histories_with_one_read_of_a_value_never_written() {
        let mut rejected = 0;
        for seed in 0..200 {
            let mut history = random_history(seed, 2, 60, 4);
            let Some(read) = history
                .iter_mut()
                .find(|op| matches!(op.result, Outcome::Ok(Answer::Get { .. })) && op.id % 3 == 0)
            else {
                continue;
            };
            let Outcome::Ok(Answer::Get { revision, kv }) = &mut read.result else {
                unreachable!("found a get above");
            };
            let mod_revision = kv.as_ref().map_or(*revision, |kv| kv.mod_revision);
            *kv = Some(Versioned {
                value: b"never written".to_vec(),
                mod_revision,
            });
            match check(&history) {
                Verdict::Violation { .. } => rejected += 1,
                other => panic!("seed {seed}: expected a violation, got {other}"),
            }
        }
        assert!(
            rejected > 150,
            "only {rejected} histories had a read to mutate"
        );
    }

    #[test]
    fn a_large_history_is_checked_quickly() {
        // 5 keys x 2,000 ops by 8 clients, about 5% of writes unknown.
        let history = random_history(7, 5, 10_000, 8);
        let started = Instant::now();
        assert_eq!(check(&history), Verdict::Linearizable);
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(1),
            "10,000 ops took {elapsed:?}"
        );
        // And one hot key: 10,000 ops on a single register, all 8 clients contending.
        let history = random_history(8, 1, 10_000, 8);
        let started = Instant::now();
        assert_eq!(check(&history), Verdict::Linearizable);
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(1),
            "10,000 ops on one key took {elapsed:?}"
        );
    }

    /// The specification, checked by brute force: some order of the acknowledged ops and
    /// some of the unknown ones, respecting real time, that etcd's sequential semantics
    /// accept with a concrete revision for every write. An unknown write's revision only
    /// matters through the ops that name it (a read's mod_revision, a compare's) and through
    /// the floor it sets, so trying the next revision, every named one, and the lowest
    /// unnamed one covers every case.
    fn brute_force(history: &[Op]) -> bool {
        let ops: Vec<&Op> = history
            .iter()
            .filter(|op| match op.result {
                Outcome::Failed => false,
                Outcome::Unknown => op.call.is_write(),
                Outcome::Ok(_) => true,
            })
            .collect();
        let mut named: Vec<i64> = Vec::new();
        for op in &ops {
            if let Outcome::Ok(Answer::Get { kv: Some(kv), .. }) = &op.result {
                named.push(kv.mod_revision);
            }
            if let Call::Cas {
                expect: Expect::ModRevision(revision),
                ..
            } = &op.call
            {
                named.push(*revision);
            }
        }
        let mut placed = vec![false; ops.len()];
        search(&ops, &named, &mut placed, None, 1)
    }

    /// The brute force's register: the value and its mod_revision, or absent.
    type Concrete = Option<(Vec<u8>, i64)>;

    /// Places the remaining ops after state `current` at revision `revision`.
    fn search(
        ops: &[&Op],
        named: &[i64],
        placed: &mut [bool],
        current: Concrete,
        revision: i64,
    ) -> bool {
        let pending = |index: usize, placed: &[bool]| !placed[index];
        if (0..ops.len()).all(|index| !pending(index, placed) || ops[index].complete.is_none()) {
            return true;
        }
        for index in 0..ops.len() {
            if !pending(index, placed) {
                continue;
            }
            // Another pending acknowledged op that returned before this one was invoked
            // must go first.
            let blocked = (0..ops.len()).any(|other| {
                pending(other, placed)
                    && other != index
                    && ops[other].result != Outcome::Unknown
                    && ops[other]
                        .complete
                        .is_some_and(|complete| complete < ops[index].invoke)
            });
            if blocked {
                continue;
            }
            let op = ops[index];
            let mut outcomes: Vec<(Concrete, i64)> = Vec::new();
            // The next revision, any named one above it, and the lowest unnamed one (other
            // keys' writes may have taken those between).
            let unnamed = (revision + 1..).find(|candidate| !named.contains(candidate));
            let write_revisions: Vec<i64> = std::iter::once(revision + 1)
                .chain(named.iter().copied().filter(|&named| named > revision + 1))
                .chain(unnamed)
                .collect();
            let holds = |expect: &Expect| match (expect, &current) {
                (Expect::Absent, current) => current.is_none(),
                (Expect::Value(_), None) => false,
                (Expect::Value(value), Some((current, _))) => value == current,
                (Expect::ModRevision(expected), None) => *expected == 0,
                (Expect::ModRevision(expected), Some((_, mod_revision))) => {
                    expected == mod_revision
                }
            };
            match (&op.call, &op.result) {
                (Call::Get { .. }, Outcome::Ok(Answer::Get { revision: read, kv })) => {
                    let seen = kv.as_ref().map(|kv| (kv.value.clone(), kv.mod_revision));
                    let consistent = seen.as_ref().is_none_or(|(_, m)| m <= read);
                    if *read >= revision && seen == current && consistent {
                        outcomes.push((current.clone(), *read));
                    }
                }
                (Call::Put { value, .. }, Outcome::Ok(Answer::Put { revision: write }))
                    if *write > revision =>
                {
                    outcomes.push((Some((value.clone(), *write)), *write));
                }
                (Call::Put { value, .. }, Outcome::Unknown) => {
                    for &write in &write_revisions {
                        outcomes.push((Some((value.clone(), write)), write));
                    }
                }
                (
                    Call::Delete { .. },
                    Outcome::Ok(Answer::Delete {
                        revision: at,
                        deleted,
                    }),
                ) => match (deleted, &current) {
                    (1, Some(_)) if *at > revision => outcomes.push((None, *at)),
                    (0, None) if *at >= revision => outcomes.push((None, *at)),
                    _ => {}
                },
                (Call::Delete { .. }, Outcome::Unknown) => match current {
                    Some(_) => outcomes.push((None, revision + 1)),
                    None => outcomes.push((None, revision)),
                },
                (
                    Call::Cas { expect, value, .. },
                    Outcome::Ok(Answer::Cas {
                        revision: at,
                        succeeded,
                    }),
                ) => {
                    if *succeeded && holds(expect) && *at > revision {
                        outcomes.push((Some((value.clone(), *at)), *at));
                    }
                    if !*succeeded && !holds(expect) && *at >= revision {
                        outcomes.push((current.clone(), *at));
                    }
                }
                (Call::Cas { expect, value, .. }, Outcome::Unknown) => {
                    if holds(expect) {
                        for &write in &write_revisions {
                            outcomes.push((Some((value.clone(), write)), write));
                        }
                    } else {
                        outcomes.push((current.clone(), revision));
                    }
                }
                _ => {}
            }
            for (next, next_revision) in outcomes {
                placed[index] = true;
                let found = search(ops, named, placed, next, next_revision);
                placed[index] = false;
                if found {
                    return true;
                }
            }
        }
        false
    }

    /// A small random single-key history: arbitrary calls, answers drawn from small domains
    /// (mostly wrong), random overlapping windows.
    fn arbitrary_history(rng: &mut StdRng) -> Vec<Op> {
        let values = ["a", "b"];
        let count = rng.random_range(1..=6);
        (0..count)
            .map(|id| {
                let value = values[rng.random_range(0..values.len())];
                let revision = rng.random_range(1..6);
                let call = match rng.random_range(0..4) {
                    0 => Call::Get { key: "k".into() },
                    1 => Call::Put {
                        key: "k".into(),
                        value: value.into(),
                    },
                    2 => Call::Delete { key: "k".into() },
                    _ => Call::Cas {
                        key: "k".into(),
                        expect: match rng.random_range(0..3) {
                            0 => Expect::Absent,
                            1 => Expect::Value(values[rng.random_range(0..2)].into()),
                            _ => Expect::ModRevision(rng.random_range(0..5)),
                        },
                        value: value.into(),
                    },
                };
                let answer = match &call {
                    Call::Get { .. } => Answer::Get {
                        revision,
                        kv: rng.random_bool(0.6).then(|| Versioned {
                            value: values[rng.random_range(0..2)].into(),
                            mod_revision: rng.random_range(1..=revision),
                        }),
                    },
                    Call::Put { .. } => Answer::Put { revision },
                    Call::Delete { .. } => Answer::Delete {
                        revision,
                        deleted: rng.random_range(0..2),
                    },
                    _ => Answer::Cas {
                        revision,
                        succeeded: rng.random_bool(0.5),
                    },
                };
                let result = match rng.random_range(0..10) {
                    0 | 1 => Outcome::Unknown,
                    2 => Outcome::Failed,
                    _ => Outcome::Ok(answer),
                };
                let invoke = rng.random_range(0..20);
                let complete = invoke + rng.random_range(0..10);
                Op {
                    id,
                    client: id,
                    call,
                    invoke,
                    complete: (result != Outcome::Unknown).then_some(complete),
                    result,
                }
            })
            .collect()
    }

    #[test]
    fn agrees_with_brute_force_on_small_histories() {
        let mut rng = StdRng::seed_from_u64(11);
        let (mut linearizable, mut not) = (0, 0);
        for round in 0..30_000 {
            let history = if round % 2 == 0 {
                arbitrary_history(&mut rng)
            } else {
                // Valid histories with one field perturbed, near the boundary.
                let mut history = random_history(round, 1, rng.random_range(2..7), 3);
                let index = rng.random_range(0..history.len());
                if let Outcome::Ok(answer) = &mut history[index].result {
                    match answer {
                        Answer::Get { revision, .. }
                        | Answer::Put { revision }
                        | Answer::Delete { revision, .. }
                        | Answer::Cas { revision, .. } => *revision += rng.random_range(-1..=1),
                        Answer::Range { .. } => {}
                    }
                }
                history
            };
            let expected = brute_force(&history);
            let verdict = check(&history);
            match (&verdict, expected) {
                (Verdict::Linearizable, true) => linearizable += 1,
                (Verdict::Violation { .. }, false) => not += 1,
                _ => panic!(
                    "round {round}: checker says {verdict}, brute force {expected}:\n{history:?}"
                ),
            }
        }
        // Both answers must be well represented for the comparison to mean anything.
        assert!(
            linearizable > 3_000 && not > 3_000,
            "{linearizable} / {not}"
        );
    }
}

/// A sequential simulation of etcd's key-value semantics that produces random concurrent
/// histories which are linearizable by construction, for the checkers' property tests.
#[cfg(test)]
pub(crate) mod sim {
    use std::collections::BTreeMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use crate::check::history::{
        Answer, Call, CommittedEvent, EventKind, Expect, FinalState, Op, Outcome, Versioned,
    };

    /// Nanoseconds between two consecutive linearization points.
    const STEP_NS: u64 = 100;

    /// Generates `ops` ops over `keys` keys: a random sequential execution whose i-th op takes
    /// effect at time `i * STEP_NS`, each op's window then widened randomly around that point
    /// so that ops overlap. Also returns the committed events and the final state.
    ///
    /// Ops of one client may overlap each other; the checkers do not rely on clients being
    /// sequential, and it makes the histories more concurrent.
    pub fn history(
        seed: u64,
        keys: usize,
        ops: usize,
        clients: u64,
    ) -> (Vec<Op>, Vec<CommittedEvent>, FinalState) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut store: FinalState = BTreeMap::new();
        let mut revision = 1i64;
        let mut history = Vec::with_capacity(ops);
        let mut committed = Vec::new();
        // Windows reach up to `clients` steps either side of the op's point, so about
        // `2 * clients` ops overlap at any time.
        let widen_max = STEP_NS * clients;
        for index in 0..ops {
            let point = index as u64 * STEP_NS + widen_max;
            let key = format!("k{}", rng.random_range(0..keys)).into_bytes();
            let value = format!("v{index}").into_bytes();
            let call = match rng.random_range(0..10) {
                0..=3 => Call::Get { key: key.clone() },
                4..=6 => Call::Put {
                    key: key.clone(),
                    value: value.clone(),
                },
                7 => Call::Delete { key: key.clone() },
                _ => Call::Cas {
                    key: key.clone(),
                    expect: match (rng.random_range(0..3), store.get(&key)) {
                        (0, _) => Expect::Absent,
                        (1, Some(current)) if rng.random_bool(0.7) => {
                            Expect::ModRevision(current.mod_revision)
                        }
                        (1, _) => Expect::ModRevision(rng.random_range(0..revision + 1)),
                        (_, Some(current)) if rng.random_bool(0.7) => {
                            Expect::Value(current.value.clone())
                        }
                        _ => Expect::Value(b"v0".to_vec()),
                    },
                    value: value.clone(),
                },
            };
            // A write whose answer is lost applies or not at random; a failed one never does.
            let fate = rng.random_range(0..20);
            let (unknown, failed) = (call.is_write() && fate == 0, call.is_write() && fate == 1);
            let applies = !(failed || (unknown && rng.random_bool(0.5)));
            let answer = if applies {
                apply(&mut store, &mut revision, &mut committed, &call)
            } else {
                None
            };
            let result = match (unknown, failed, answer) {
                (true, _, _) => Outcome::Unknown,
                (_, true, _) => Outcome::Failed,
                (_, _, Some(answer)) => Outcome::Ok(answer),
                (_, _, None) => Outcome::Failed,
            };
            let invoke = point - rng.random_range(0..widen_max);
            let complete = point + rng.random_range(0..widen_max);
            history.push(Op {
                id: index as u64,
                client: rng.random_range(0..clients),
                call,
                invoke,
                complete: (!unknown).then_some(complete),
                result,
            });
        }
        (history, committed, store)
    }

    /// Applies `call` to the store with etcd's semantics and returns its answer.
    fn apply(
        store: &mut FinalState,
        revision: &mut i64,
        committed: &mut Vec<CommittedEvent>,
        call: &Call,
    ) -> Option<Answer> {
        let mut put = |store: &mut FinalState, key: &[u8], value: &[u8]| {
            *revision += 1;
            store.insert(
                key.to_vec(),
                Versioned {
                    value: value.to_vec(),
                    mod_revision: *revision,
                },
            );
            committed.push(CommittedEvent {
                revision: *revision,
                key: key.to_vec(),
                kind: EventKind::Put,
                value: value.to_vec(),
            });
            *revision
        };
        Some(match call {
            Call::Get { key } => Answer::Get {
                revision: *revision,
                kv: store.get(key).cloned(),
            },
            Call::Put { key, value } => Answer::Put {
                revision: put(store, key, value),
            },
            Call::Delete { key } => {
                if store.remove(key).is_some() {
                    *revision += 1;
                    committed.push(CommittedEvent {
                        revision: *revision,
                        key: key.clone(),
                        kind: EventKind::Delete,
                        value: Vec::new(),
                    });
                    Answer::Delete {
                        revision: *revision,
                        deleted: 1,
                    }
                } else {
                    Answer::Delete {
                        revision: *revision,
                        deleted: 0,
                    }
                }
            }
            Call::Cas { key, expect, value } => {
                let current = store.get(key);
                let holds = match expect {
                    Expect::Absent => current.is_none(),
                    Expect::Value(expected) => current.is_some_and(|kv| &kv.value == expected),
                    Expect::ModRevision(expected) => {
                        current.map_or(0, |kv| kv.mod_revision) == *expected
                    }
                };
                if holds {
                    Answer::Cas {
                        revision: put(store, key, value),
                        succeeded: true,
                    }
                } else {
                    Answer::Cas {
                        revision: *revision,
                        succeeded: false,
                    }
                }
            }
            Call::Range { .. } => return None,
        })
    }
}
