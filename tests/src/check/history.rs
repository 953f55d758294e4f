//! The history model: what a torture harness records about client operations and watches
//! against an etcd-v3-compatible store, in the shapes the checkers read.
//!
//! Semantics are etcd 3.4's. The store has one global revision; it starts at 1 and each write
//! transaction that changes something bumps it by one, so the first write gets revision 2. A
//! delete of a missing key and a `Cas` whose compare fails (its failure branch is empty) do not
//! bump it. Keys and values are byte strings.
//!
//! Invariant the checkers rely on, which the harness must keep: the history holds every write
//! to the keys it touches (no other client writes them), and those keys start absent.

use std::collections::BTreeMap;
use std::fmt;

/// One client operation: what was asked, when, and what came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Unique within a history; violations name ops by it.
    pub id: u64,
    /// The client (session) that issued it.
    pub client: u64,
    pub call: Call,
    /// When the client sent it, in nanoseconds on one clock shared by all clients (virtual in
    /// simulation, monotonic in real runs).
    pub invoke: u64,
    /// When the answer arrived. `None` when none did (timeout, lost connection): such an op
    /// may take effect at any time after `invoke`, or never.
    pub complete: Option<u64>,
    pub result: Outcome,
}

/// The request, in etcd terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Get {
        key: Vec<u8>,
    },
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// A txn: if `expect` holds, put `value` at `key`; otherwise do nothing.
    Cas {
        key: Vec<u8>,
        expect: Expect,
        value: Vec<u8>,
    },
    /// Reads every key in the etcd range `[start, end)`: an empty `end` means the single key
    /// `start`, and `end == "\0"` means every key at or above `start`.
    Range {
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

/// The compare of a `Cas`, with etcd's meaning on a missing key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Expect {
    /// `mod_revision == n`. On a missing key etcd compares against 0, so `ModRevision(0)`
    /// holds exactly when the key is absent.
    ModRevision(i64),
    /// `value == v`. Always false on a missing key, as in etcd.
    Value(Vec<u8>),
    /// The key does not exist (etcd: `create_revision == 0`).
    Absent,
}

/// How an op ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok(Answer),
    /// Definitely not applied: an error the server returns only when nothing happened.
    Failed,
    /// No answer, or an error after which the op may or may not have been applied.
    Unknown,
}

/// A key's value and the revision of the write that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Versioned {
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// One entry of a `Range` answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// What etcd returned. `revision` is always the response header's revision: for a write that
/// changed something it is the write's own revision, otherwise the store's revision when the
/// request was served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Get {
        revision: i64,
        kv: Option<Versioned>,
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
    Range {
        revision: i64,
        kvs: Vec<KeyValue>,
    },
}

impl Answer {
    /// The response header's revision.
    pub fn revision(&self) -> i64 {
        match self {
            Answer::Get { revision, .. }
            | Answer::Put { revision }
            | Answer::Delete { revision, .. }
            | Answer::Cas { revision, .. }
            | Answer::Range { revision, .. } => *revision,
        }
    }

    /// Whether this answer says the request bumped the global revision.
    pub fn bumped_revision(&self) -> bool {
        match self {
            Answer::Put { .. } => true,
            Answer::Delete { deleted, .. } => *deleted > 0,
            Answer::Cas { succeeded, .. } => *succeeded,
            Answer::Get { .. } | Answer::Range { .. } => false,
        }
    }
}

impl Call {
    /// The key of a single-key call; `None` for `Range`.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Call::Get { key } | Call::Put { key, .. } | Call::Delete { key } => Some(key),
            Call::Cas { key, .. } => Some(key),
            Call::Range { .. } => None,
        }
    }

    /// Whether the call can change the store.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Call::Put { .. } | Call::Delete { .. } | Call::Cas { .. }
        )
    }

    /// The value a put-like call would write.
    pub fn written_value(&self) -> Option<&[u8]> {
        match self {
            Call::Put { value, .. } | Call::Cas { value, .. } => Some(value),
            _ => None,
        }
    }
}

impl Op {
    /// The answer, when the op was acknowledged.
    pub fn answer(&self) -> Option<&Answer> {
        match &self.result {
            Outcome::Ok(answer) => Some(answer),
            Outcome::Failed | Outcome::Unknown => None,
        }
    }

    /// The revision of an acknowledged write that changed the store.
    pub fn write_revision(&self) -> Option<i64> {
        self.answer()
            .filter(|answer| answer.bumped_revision())
            .map(Answer::revision)
    }

    /// When the op's effect is known to be over: `complete` for acknowledged ops, never
    /// (`u64::MAX`) for unknown ones, since the server may still apply them.
    pub(crate) fn effective_complete(&self) -> u64 {
        match (&self.result, self.complete) {
            (Outcome::Ok(_), Some(complete)) => complete,
            _ => u64::MAX,
        }
    }
}

/// Whether `key` lies in the etcd range given by `start` and `end` (see [`Call::Range`]).
pub fn range_contains(start: &[u8], end: &[u8], key: &[u8]) -> bool {
    if end.is_empty() {
        key == start
    } else if end == [0] {
        key >= start
    } else {
        start <= key && key < end
    }
}

/// What a watch delivers for one key at one revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    Put,
    Delete,
}

/// One watch stream as a watcher saw it, resumes included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchLog {
    pub watcher: u64,
    /// The watched etcd range `(start, end)`, with [`Call::Range`]'s conventions.
    pub range: (Vec<u8>, Vec<u8>),
    /// The revision the watch was created from; 0 means "from now", whose first revision the
    /// checker then takes from the first item.
    pub start_revision: i64,
    pub items: Vec<WatchItem>,
}

/// One thing a watch stream delivered, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    /// `value` is the new value of a put, and is ignored for a delete.
    Event {
        revision: i64,
        key: Vec<u8>,
        kind: EventKind,
        value: Vec<u8>,
    },
    /// A progress notification: the header revision of an empty watch response.
    Progress { revision: i64 },
    /// The watch was cancelled because the revisions it still needed were compacted.
    /// `received` is when the cancel arrived, on the ops' clock: the compaction it reports
    /// must have been asked for before then.
    Compacted {
        compact_revision: i64,
        received: u64,
    },
    /// The watcher reconnected and watched again from `from_revision`.
    Resumed { from_revision: i64 },
}

/// One event of the committed history.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommittedEvent {
    pub revision: i64,
    pub key: Vec<u8>,
    pub kind: EventKind,
    /// The new value of a put; ignored for a delete.
    pub value: Vec<u8>,
}

/// The store's history (read by a watch from `from_revision`, during the run or at its end),
/// and what the harness did to that history: its compactions, and its reads at past revisions,
/// both judged against it by `check::compaction`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommittedHistory {
    /// `events` holds every event with a revision at or above this one; events below it (for
    /// instance under a compaction floor) are unknown and not checked.
    pub from_revision: i64,
    /// In revision order.
    pub events: Vec<CommittedEvent>,
    /// Every compaction the harness asked for, whatever came of it.
    pub compactions: Vec<Compaction>,
    /// Every read at a past revision the harness made.
    pub past_reads: Vec<PastRead>,
}

/// One etcd `Compact` request (physical = false, as Kubernetes' compactor sends it): compact
/// away every revision below `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// Unique among compactions; violations name them by it.
    pub id: u64,
    pub revision: i64,
    /// When it was sent and answered, on the ops' clock; `complete` is `None` when no answer
    /// came (the outcome is then `Unknown`).
    pub invoke: u64,
    pub complete: Option<u64>,
    pub outcome: CompactOutcome,
}

/// How a compaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactOutcome {
    /// Acknowledged: the store is compacted at `revision` from the commit on.
    Ok,
    /// Refused with etcd's "required revision has been compacted": the store was already
    /// compacted at or above `revision`.
    AlreadyCompacted,
    /// Refused with an error the server returns only when nothing happened (no leader,
    /// connection refused, a future revision).
    Failed,
    /// No answer, or an error after which it may or may not have been applied.
    Unknown,
}

impl Compaction {
    /// Whether the store may have compacted at `revision` because of this request.
    pub fn may_have_applied(&self) -> bool {
        matches!(self.outcome, CompactOutcome::Ok | CompactOutcome::Unknown)
    }

    /// The floor this request proves the store had reached by the time it completed: an
    /// acknowledged compaction, or a refusal because of an earlier one, shows the store was
    /// compacted at `revision` or above. `None` when it proves nothing.
    pub fn proven_floor(&self) -> Option<(u64, i64)> {
        match (self.outcome, self.complete) {
            (CompactOutcome::Ok | CompactOutcome::AlreadyCompacted, Some(complete)) => {
                Some((complete, self.revision))
            }
            _ => None,
        }
    }
}

/// A linearizable range read at a past revision (etcd `Range` with `revision` set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastRead {
    /// Unique among past reads.
    pub id: u64,
    /// The revision asked for.
    pub revision: i64,
    /// The etcd range read, with [`Call::Range`]'s conventions.
    pub range: (Vec<u8>, Vec<u8>),
    pub invoke: u64,
    /// A read changes nothing, so one without an answer is simply `Failed` and completes
    /// when the client gave up.
    pub complete: u64,
    pub outcome: PastReadOutcome,
}

/// What a read at a past revision returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PastReadOutcome {
    /// The keys of the range as they were at the revision asked for, and the response
    /// header's revision (the store's current one).
    Ok {
        header_revision: i64,
        kvs: Vec<KeyValue>,
    },
    /// etcd's "required revision has been compacted".
    Compacted,
    /// Any other error or a timeout: judged by nothing.
    Failed,
}

/// The store's contents read at the end with faults healed: key -> value and mod_revision.
/// It must hold every key of the history that exists (read it with a `Range` over them).
pub type FinalState = BTreeMap<Vec<u8>, Versioned>;

/// Why a history cannot be checked as given: a harness bug, not a store bug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryError {
    DuplicateId {
        id: u64,
    },
    /// An acknowledged op has no completion time.
    OkWithoutComplete {
        id: u64,
    },
    CompleteBeforeInvoke {
        id: u64,
    },
    /// The answer's kind is not the one the call returns.
    AnswerMismatch {
        id: u64,
    },
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryError::DuplicateId { id } => write!(f, "op id {id} is used twice"),
            HistoryError::OkWithoutComplete { id } => {
                write!(f, "op {id} is acknowledged but has no completion time")
            }
            HistoryError::CompleteBeforeInvoke { id } => {
                write!(f, "op {id} completes before it is invoked")
            }
            HistoryError::AnswerMismatch { id } => {
                write!(f, "op {id} has an answer of another kind than its call")
            }
        }
    }
}

/// Checks that a history is well formed: unique ids, acknowledged ops with a completion time
/// not before their invocation, and answers of the kind their call returns.
pub fn validate(history: &[Op]) -> Vec<HistoryError> {
    let mut errors = Vec::new();
    let mut ids = std::collections::HashSet::with_capacity(history.len());
    for op in history {
        if !ids.insert(op.id) {
            errors.push(HistoryError::DuplicateId { id: op.id });
        }
        if let Some(complete) = op.complete
            && complete < op.invoke
        {
            errors.push(HistoryError::CompleteBeforeInvoke { id: op.id });
        }
        if let Outcome::Ok(answer) = &op.result {
            if op.complete.is_none() {
                errors.push(HistoryError::OkWithoutComplete { id: op.id });
            }
            let matches = matches!(
                (&op.call, answer),
                (Call::Get { .. }, Answer::Get { .. })
                    | (Call::Put { .. }, Answer::Put { .. })
                    | (Call::Delete { .. }, Answer::Delete { .. })
                    | (Call::Cas { .. }, Answer::Cas { .. })
                    | (Call::Range { .. }, Answer::Range { .. })
            );
            if !matches {
                errors.push(HistoryError::AnswerMismatch { id: op.id });
            }
        }
    }
    errors
}

/// Bytes for humans: ASCII as is, the rest escaped.
pub(crate) fn show(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// Builders for hand-made histories, shared by the checkers' tests.
#[cfg(test)]
pub(crate) mod build {
    use super::*;

    pub fn op(id: u64, invoke: u64, complete: Option<u64>, call: Call, result: Outcome) -> Op {
        Op {
            id,
            client: id,
            call,
            invoke,
            complete,
            result,
        }
    }

    pub fn put(id: u64, span: (u64, u64), key: &str, value: &str, revision: i64) -> Op {
        op(
            id,
            span.0,
            Some(span.1),
            Call::Put {
                key: key.into(),
                value: value.into(),
            },
            Outcome::Ok(Answer::Put { revision }),
        )
    }

    pub fn put_unknown(id: u64, invoke: u64, key: &str, value: &str) -> Op {
        op(
            id,
            invoke,
            None,
            Call::Put {
                key: key.into(),
                value: value.into(),
            },
            Outcome::Unknown,
        )
    }

    pub fn put_failed(id: u64, span: (u64, u64), key: &str, value: &str) -> Op {
        op(
            id,
            span.0,
            Some(span.1),
            Call::Put {
                key: key.into(),
                value: value.into(),
            },
            Outcome::Failed,
        )
    }

    /// A get that saw `found` = (value, mod_revision), or nothing.
    pub fn get(
        id: u64,
        span: (u64, u64),
        key: &str,
        found: Option<(&str, i64)>,
        revision: i64,
    ) -> Op {
        op(
            id,
            span.0,
            Some(span.1),
            Call::Get { key: key.into() },
            Outcome::Ok(Answer::Get {
                revision,
                kv: found.map(|(value, mod_revision)| Versioned {
                    value: value.into(),
                    mod_revision,
                }),
            }),
        )
    }

    pub fn delete(id: u64, span: (u64, u64), key: &str, deleted: i64, revision: i64) -> Op {
        op(
            id,
            span.0,
            Some(span.1),
            Call::Delete { key: key.into() },
            Outcome::Ok(Answer::Delete { revision, deleted }),
        )
    }

    pub fn cas(
        id: u64,
        span: (u64, u64),
        key: &str,
        expect: Expect,
        value: &str,
        answer: Option<(bool, i64)>,
    ) -> Op {
        op(
            id,
            span.0,
            answer.map(|_| span.1),
            Call::Cas {
                key: key.into(),
                expect,
                value: value.into(),
            },
            match answer {
                Some((succeeded, revision)) => Outcome::Ok(Answer::Cas {
                    revision,
                    succeeded,
                }),
                None => Outcome::Unknown,
            },
        )
    }

    /// A range read of `[start, end)` that saw `kvs` = (key, value, mod_revision).
    pub fn range(
        id: u64,
        span: (u64, u64),
        (start, end): (&str, &str),
        kvs: &[(&str, &str, i64)],
        revision: i64,
    ) -> Op {
        op(
            id,
            span.0,
            Some(span.1),
            Call::Range {
                start: start.into(),
                end: end.into(),
            },
            Outcome::Ok(Answer::Range {
                revision,
                kvs: kvs
                    .iter()
                    .map(|(key, value, mod_revision)| KeyValue {
                        key: (*key).into(),
                        value: (*value).into(),
                        mod_revision: *mod_revision,
                    })
                    .collect(),
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    #[test]
    fn range_follows_etcd_conventions() {
        assert!(range_contains(b"a", b"", b"a"));
        assert!(!range_contains(b"a", b"", b"ab"));
        assert!(range_contains(b"a", b"\0", b"zzz"));
        assert!(!range_contains(b"b", b"\0", b"a"));
        assert!(range_contains(b"a", b"c", b"b"));
        assert!(!range_contains(b"a", b"c", b"c"));
    }

    #[test]
    fn validate_rejects_malformed_histories() {
        let mut late = put(2, (10, 5), "k", "v", 2);
        late.complete = Some(5);
        let mut mismatched = get(3, (0, 1), "k", None, 1);
        mismatched.result = Outcome::Ok(Answer::Put { revision: 2 });
        let mut no_complete = put(4, (0, 1), "k", "v", 3);
        no_complete.complete = None;
        let history = vec![
            put(1, (0, 1), "k", "v", 2),
            put(1, (0, 1), "k", "v", 2),
            late,
            mismatched,
            no_complete,
        ];
        assert_eq!(
            validate(&history),
            vec![
                HistoryError::DuplicateId { id: 1 },
                HistoryError::CompleteBeforeInvoke { id: 2 },
                HistoryError::AnswerMismatch { id: 3 },
                HistoryError::OkWithoutComplete { id: 4 },
            ]
        );
        assert!(validate(&[put(1, (0, 1), "k", "v", 2)]).is_empty());
    }
}
