//! Watch guarantees, checked against the committed history: each watcher sees exactly the
//! committed events of its range, in revision order, with no gap and no duplicate, across
//! resumes; progress notifications and compaction errors tell the truth.
//!
//! A watch log is cut into segments at each `Resumed` item. Within a segment starting at
//! revision S, the watcher must receive every committed event of its range with a revision
//! from S up to the highest it received, each once and in revision order (events of one
//! revision in any order). Across a resume from F, no committed event of the range may lie
//! between what the previous segment covered and F, except revisions a `Compacted` item said
//! were gone. A progress notification at R claims every event at or below R was delivered.
//! A `Compacted { compact_revision: C }` must name exactly the revision of a compaction the
//! harness asked for before the error arrived and that may have happened (acknowledged, or its
//! answer lost): etcd reports its current compact revision, which only a compaction request
//! sets. The watch (or its resume) must have started below C, since a watch from C or above
//! needs nothing compacted. After it the stream is cancelled, so only a `Resumed` may follow,
//! and a resume from C may skip the revisions below C, but nothing at or above it. That the
//! watcher had already received everything below C is not held against it: etcd 3.4 compares
//! C with the watcher's `minRev`, which a synced watcher does not advance as it receives
//! events, so after a snapshot restore it may be compacted though it is caught up.
//!
//! Events below the committed history's `from_revision` cannot be checked against it and are
//! checked only for order and duplicates. The resume revision is the client's choice, so a
//! resume is judged by whether it lost events, not by its distance from the last one.

use std::collections::{HashMap, HashSet};
use std::fmt;

use super::history::{
    self, CommittedEvent, CommittedHistory, Compaction, EventKind, WatchItem, WatchLog, show,
};

/// Events listed in one violation; the rest are only counted. Enough to see the pattern
/// without flooding a report when a watcher lost thousands. Semi-arbitrary.
const EVENTS_LISTED_MAX: usize = 10;

/// An event named by its revision and key, unique in etcd (a txn cannot touch a key twice).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventAt {
    pub revision: i64,
    pub key: Vec<u8>,
}

impl fmt::Display for EventAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", show(&self.key), self.revision)
    }
}

/// Up to `EVENTS_LISTED_MAX` events, and how many there were in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Events {
    pub listed: Vec<EventAt>,
    pub count: usize,
}

impl Events {
    fn collect<'a>(events: impl Iterator<Item = &'a CommittedEvent>) -> Events {
        let mut listed = Vec::new();
        let mut count = 0;
        for event in events {
            if listed.len() < EVENTS_LISTED_MAX {
                listed.push(EventAt {
                    revision: event.revision,
                    key: event.key.clone(),
                });
            }
            count += 1;
        }
        Events { listed, count }
    }
}

impl fmt::Display for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, event) in self.listed.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(f, "{separator}{event}")?;
        }
        if self.count > self.listed.len() {
            write!(f, " and {} more", self.count - self.listed.len())?;
        }
        Ok(())
    }
}

/// One broken watch guarantee. `item` is the index in the watch log's `items`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchViolation {
    /// The same event arrived twice (within a segment, or again after a resume past it).
    Duplicate {
        watcher: u64,
        item: usize,
        event: EventAt,
    },
    /// The event arrived after one of a higher revision.
    Reordered {
        watcher: u64,
        item: usize,
        event: EventAt,
        after_revision: i64,
    },
    /// Committed events of the range never arrived: skipped within a segment, or lost across
    /// the resume from `resumed_from`.
    Gap {
        watcher: u64,
        missing: Events,
        resumed_from: Option<i64>,
    },
    /// The event is not in the committed history (`committed` is `None`), or differs from it.
    NotCommitted {
        watcher: u64,
        item: usize,
        event: EventAt,
        committed: Option<CommittedEvent>,
    },
    OutOfRange {
        watcher: u64,
        item: usize,
        event: EventAt,
    },
    /// The event is below the revision the watch (or its resume) started from.
    BeforeStart {
        watcher: u64,
        item: usize,
        event: EventAt,
        start_revision: i64,
    },
    /// A progress notification at `revision` arrived before these events at or below it.
    ProgressSkipsEvent {
        watcher: u64,
        item: usize,
        revision: i64,
        undelivered: Events,
    },
    /// A progress notification below an event already delivered.
    ProgressBehind {
        watcher: u64,
        item: usize,
        revision: i64,
        last_event_revision: i64,
    },
    WrongCompacted {
        watcher: u64,
        item: usize,
        compact_revision: i64,
        /// The revision the watch (or its latest resume) started from.
        start_revision: i64,
        reason: &'static str,
    },
    /// Something other than `Resumed` followed a `Compacted`.
    AfterCompacted { watcher: u64, item: usize },
    /// The committed history itself is out of order or holds an event twice.
    Committed { reason: String },
}

impl fmt::Display for WatchViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchViolation::Duplicate {
                watcher,
                item,
                event,
            } => write!(f, "watcher {watcher} item {item}: duplicate event {event}"),
            WatchViolation::Reordered {
                watcher,
                item,
                event,
                after_revision,
            } => write!(
                f,
                "watcher {watcher} item {item}: event {event} after revision {after_revision}"
            ),
            WatchViolation::Gap {
                watcher,
                missing,
                resumed_from: None,
            } => write!(f, "watcher {watcher}: gap, never received {missing}"),
            WatchViolation::Gap {
                watcher,
                missing,
                resumed_from: Some(from),
            } => write!(f, "watcher {watcher}: resuming from {from} lost {missing}"),
            WatchViolation::NotCommitted {
                watcher,
                item,
                event,
                committed: None,
            } => write!(
                f,
                "watcher {watcher} item {item}: event {event} is not in the committed history"
            ),
            WatchViolation::NotCommitted {
                watcher,
                item,
                event,
                committed: Some(_),
            } => write!(
                f,
                "watcher {watcher} item {item}: event {event} differs from the committed one"
            ),
            WatchViolation::OutOfRange {
                watcher,
                item,
                event,
            } => write!(
                f,
                "watcher {watcher} item {item}: event {event} outside its range"
            ),
            WatchViolation::BeforeStart {
                watcher,
                item,
                event,
                start_revision,
            } => write!(
                f,
                "watcher {watcher} item {item}: event {event} below its start revision \
                 {start_revision}"
            ),
            WatchViolation::ProgressSkipsEvent {
                watcher,
                item,
                revision,
                undelivered,
            } => write!(
                f,
                "watcher {watcher} item {item}: progress at {revision} before {undelivered}"
            ),
            WatchViolation::ProgressBehind {
                watcher,
                item,
                revision,
                last_event_revision,
            } => write!(
                f,
                "watcher {watcher} item {item}: progress at {revision} after an event at \
                 {last_event_revision}"
            ),
            WatchViolation::WrongCompacted {
                watcher,
                item,
                compact_revision,
                start_revision,
                reason,
            } => write!(
                f,
                "watcher {watcher} item {item}: compacted at {compact_revision}, watching \
                 from {start_revision}: {reason}"
            ),
            WatchViolation::AfterCompacted { watcher, item } => write!(
                f,
                "watcher {watcher} item {item}: delivered after its watch was compacted"
            ),
            WatchViolation::Committed { reason } => {
                write!(f, "committed history: {reason}")
            }
        }
    }
}

/// Checks every watch log against `committed`; see the module doc.
pub fn check_watches(logs: &[WatchLog], committed: &CommittedHistory) -> Vec<WatchViolation> {
    let mut violations = Vec::new();
    let events = sorted_committed(committed, &mut violations);
    let by_id: HashMap<(i64, &[u8]), &CommittedEvent> = events
        .iter()
        .map(|event| ((event.revision, event.key.as_slice()), *event))
        .collect();
    for log in logs {
        let expected: Vec<&CommittedEvent> = events
            .iter()
            .copied()
            .filter(|event| history::range_contains(&log.range.0, &log.range.1, &event.key))
            .collect();
        let mut checker = LogChecker {
            log,
            expected: &expected,
            by_id: &by_id,
            compactions: &committed.compactions,
            floor: committed.from_revision,
            delivered_before: HashSet::new(),
            out: &mut violations,
        };
        checker.check();
    }
    violations
}

/// The committed events in (revision, key) order without duplicates, reporting any
/// disorder or duplicate the harness handed in.
fn sorted_committed<'a>(
    committed: &'a CommittedHistory,
    out: &mut Vec<WatchViolation>,
) -> Vec<&'a CommittedEvent> {
    if let Some(pair) = committed
        .events
        .windows(2)
        .find(|pair| pair[1].revision < pair[0].revision)
    {
        out.push(WatchViolation::Committed {
            reason: format!(
                "revision {} after revision {}",
                pair[1].revision, pair[0].revision
            ),
        });
    }
    if let Some(event) = committed
        .events
        .iter()
        .find(|event| event.revision < committed.from_revision)
    {
        out.push(WatchViolation::Committed {
            reason: format!(
                "event at {} below from_revision {}",
                event.revision, committed.from_revision
            ),
        });
    }
    let mut events: Vec<&CommittedEvent> = committed.events.iter().collect();
    events.sort_by(|a, b| (a.revision, &a.key).cmp(&(b.revision, &b.key)));
    let before = events.len();
    events.dedup_by(|a, b| a.revision == b.revision && a.key == b.key);
    if events.len() != before {
        out.push(WatchViolation::Committed {
            reason: format!("{} events repeat a (revision, key)", before - events.len()),
        });
    }
    events
}

/// How a segment ended, for judging the resume after it.
struct SegmentEnd {
    /// The lowest revision the watcher still needed.
    next_revision: i64,
    /// The compact revision that cancelled it, if one did.
    compacted: Option<i64>,
}

struct LogChecker<'a, 'o> {
    log: &'a WatchLog,
    /// Committed events in the log's range, in (revision, key) order.
    expected: &'a [&'a CommittedEvent],
    by_id: &'a HashMap<(i64, &'a [u8]), &'a CommittedEvent>,
    /// Every compaction the harness asked for.
    compactions: &'a [Compaction],
    /// Committed events are known from this revision on.
    floor: i64,
    /// Events delivered by earlier segments.
    delivered_before: HashSet<(i64, &'a [u8])>,
    out: &'o mut Vec<WatchViolation>,
}

impl<'a> LogChecker<'a, '_> {
    fn check(&mut self) {
        let items = &self.log.items;
        let mut start = self.log.start_revision;
        let mut first = 0;
        let mut previous: Option<SegmentEnd> = None;
        for (index, item) in items.iter().enumerate() {
            if let WatchItem::Resumed { from_revision } = item {
                previous = Some(self.segment(start, first..index, previous));
                start = *from_revision;
                first = index + 1;
            }
        }
        self.segment(start, first..items.len(), previous);
    }

    /// The committed events of the range with revisions in `[low, high]` and known.
    fn expected_between(&self, low: i64, high: i64) -> &'a [&'a CommittedEvent] {
        let low = low.max(self.floor);
        let from = self.expected.partition_point(|event| event.revision < low);
        let to = self
            .expected
            .partition_point(|event| event.revision <= high);
        &self.expected[from..to.max(from)]
    }

    /// Checks the items at `indices`, a segment watched from `start` (0 = from now), after
    /// `previous` ended; returns how this one ended.
    fn segment(
        &mut self,
        start: i64,
        indices: std::ops::Range<usize>,
        previous: Option<SegmentEnd>,
    ) -> SegmentEnd {
        let watcher = self.log.watcher;
        let items = &self.log.items[indices.clone()];
        let Some(start) = (start > 0)
            .then_some(start)
            .or_else(|| inferred_start(items))
        else {
            // Watched "from now" and nothing arrived: nothing to check, nothing covered.
            return SegmentEnd {
                next_revision: i64::MAX,
                compacted: None,
            };
        };
        if let Some(previous) = previous
            && previous.next_revision < start
        {
            let lost_from = previous
                .compacted
                .map_or(previous.next_revision, |compact| {
                    compact.max(previous.next_revision)
                });
            let lost = self.expected_between(lost_from, start.saturating_sub(1));
            if !lost.is_empty() {
                self.out.push(WatchViolation::Gap {
                    watcher,
                    missing: Events::collect(lost.iter().copied()),
                    resumed_from: Some(start),
                });
            }
        }

        let (range_start, range_end) = (&self.log.range.0, &self.log.range.1);
        let mut delivered: HashSet<(i64, &'a [u8])> = HashSet::new();
        // Revisions from the log may be anything, so arithmetic on them saturates.
        let mut last_event = start.saturating_sub(1);
        let mut covered = start.saturating_sub(1);
        let mut compacted: Option<i64> = None;
        for (offset, item) in items.iter().enumerate() {
            let index = indices.start + offset;
            if compacted.is_some() {
                self.out.push(WatchViolation::AfterCompacted {
                    watcher,
                    item: index,
                });
                continue;
            }
            match item {
                WatchItem::Event {
                    revision,
                    key,
                    kind,
                    value,
                } => {
                    let revision = *revision;
                    let event = EventAt {
                        revision,
                        key: key.clone(),
                    };
                    let id = (revision, key.as_slice());
                    if !history::range_contains(range_start, range_end, key) {
                        self.out.push(WatchViolation::OutOfRange {
                            watcher,
                            item: index,
                            event,
                        });
                        continue;
                    }
                    if revision < start {
                        self.out.push(if self.delivered_before.contains(&id) {
                            WatchViolation::Duplicate {
                                watcher,
                                item: index,
                                event,
                            }
                        } else {
                            WatchViolation::BeforeStart {
                                watcher,
                                item: index,
                                event,
                                start_revision: start,
                            }
                        });
                        continue;
                    }
                    if !delivered.insert(id) {
                        self.out.push(WatchViolation::Duplicate {
                            watcher,
                            item: index,
                            event,
                        });
                        continue;
                    }
                    if revision >= self.floor {
                        let matches = self.by_id.get(&id).map(|committed| {
                            committed.kind == *kind
                                && (*kind == EventKind::Delete || committed.value == *value)
                        });
                        if matches != Some(true) {
                            self.out.push(WatchViolation::NotCommitted {
                                watcher,
                                item: index,
                                event: event.clone(),
                                committed: self.by_id.get(&id).map(|event| (*event).clone()),
                            });
                        }
                    }
                    if revision < last_event {
                        self.out.push(WatchViolation::Reordered {
                            watcher,
                            item: index,
                            event,
                            after_revision: last_event,
                        });
                    }
                    last_event = last_event.max(revision);
                }
                WatchItem::Progress { revision } => {
                    let revision = *revision;
                    if revision < last_event {
                        self.out.push(WatchViolation::ProgressBehind {
                            watcher,
                            item: index,
                            revision,
                            last_event_revision: last_event,
                        });
                    }
                    // Events at or below an earlier notification were checked by it, so each
                    // undelivered event is blamed on the first notification that skipped it.
                    let undelivered: Vec<&CommittedEvent> = self
                        .expected_between(covered.saturating_add(1), revision)
                        .iter()
                        .copied()
                        .filter(|event| !delivered.contains(&(event.revision, &event.key)))
                        .collect();
                    if !undelivered.is_empty() {
                        self.out.push(WatchViolation::ProgressSkipsEvent {
                            watcher,
                            item: index,
                            revision,
                            undelivered: Events::collect(undelivered.into_iter()),
                        });
                    }
                    covered = covered.max(revision);
                }
                WatchItem::Compacted {
                    compact_revision,
                    received,
                } => {
                    let named = |compaction: &&Compaction| {
                        compaction.revision == *compact_revision && compaction.may_have_applied()
                    };
                    let reason = if !self.compactions.iter().any(|c| named(&c)) {
                        Some("not a revision the harness compacted")
                    } else if !self
                        .compactions
                        .iter()
                        .filter(named)
                        .any(|compaction| compaction.invoke <= *received)
                    {
                        Some("it arrived before that compaction was asked for")
                    } else if start >= *compact_revision {
                        Some("the watch started at or above it")
                    } else {
                        None
                    };
                    if let Some(reason) = reason {
                        self.out.push(WatchViolation::WrongCompacted {
                            watcher,
                            item: index,
                            compact_revision: *compact_revision,
                            start_revision: start,
                            reason,
                        });
                    }
                    compacted = Some(*compact_revision);
                }
                WatchItem::Resumed { .. } => {
                    // Segments are cut at resumes, so none is inside one.
                }
            }
        }

        let missing: Vec<&CommittedEvent> = self
            .expected_between(start, last_event)
            .iter()
            .copied()
            .filter(|event| !delivered.contains(&(event.revision, &event.key)))
            .collect();
        if !missing.is_empty() {
            self.out.push(WatchViolation::Gap {
                watcher,
                missing: Events::collect(missing.into_iter()),
                resumed_from: None,
            });
        }
        self.delivered_before.extend(delivered);
        SegmentEnd {
            next_revision: next_needed(start, last_event, covered),
            compacted,
        }
    }
}

/// The lowest revision a watcher still needs: past its start, the last event it received and
/// the last progress notification.
fn next_needed(start: i64, last_event: i64, covered: i64) -> i64 {
    start
        .max(last_event.saturating_add(1))
        .max(covered.saturating_add(1))
}

/// Where a "from now" segment starts: at its first event, or just above its first progress
/// notification.
fn inferred_start(items: &[WatchItem]) -> Option<i64> {
    items.iter().find_map(|item| match item {
        WatchItem::Event { revision, .. } => Some(*revision),
        WatchItem::Progress { revision } => Some(revision.saturating_add(1)),
        WatchItem::Compacted { .. } | WatchItem::Resumed { .. } => None,
    })
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::check::history::CompactOutcome;

    fn committed_put(revision: i64, key: &str, value: &str) -> CommittedEvent {
        CommittedEvent {
            revision,
            key: key.into(),
            kind: EventKind::Put,
            value: value.into(),
        }
    }

    fn event_of(committed: &CommittedEvent) -> WatchItem {
        WatchItem::Event {
            revision: committed.revision,
            key: committed.key.clone(),
            kind: committed.kind,
            value: committed.value.clone(),
        }
    }

    /// Revisions 2..=9: "a" and "b" alternate, with a delete of "a" at 6 and a write of "z"
    /// (outside the watched range) at 8; compacted at 4, asked for at 100, acknowledged at 110.
    fn committed() -> CommittedHistory {
        let mut events = vec![
            committed_put(2, "a", "1"),
            committed_put(3, "b", "1"),
            committed_put(4, "a", "2"),
            committed_put(5, "b", "2"),
            CommittedEvent {
                revision: 6,
                key: "a".into(),
                kind: EventKind::Delete,
                value: Vec::new(),
            },
            committed_put(7, "b", "3"),
            committed_put(8, "z", "1"),
            committed_put(9, "a", "3"),
        ];
        events.sort();
        CommittedHistory {
            from_revision: 1,
            events,
            compactions: vec![Compaction {
                id: 1,
                revision: 4,
                invoke: 100,
                complete: Some(110),
                outcome: CompactOutcome::Ok,
            }],
            past_reads: Vec::new(),
        }
    }

    /// The watch items of committed events of [a, c) with revisions in `revisions`.
    fn events(
        history: &CommittedHistory,
        revisions: std::ops::RangeInclusive<i64>,
    ) -> Vec<WatchItem> {
        history
            .events
            .iter()
            .filter(|event| revisions.contains(&event.revision) && event.key != b"z")
            .map(event_of)
            .collect()
    }

    fn log(start_revision: i64, items: Vec<WatchItem>) -> WatchLog {
        WatchLog {
            watcher: 1,
            range: ("a".into(), "c".into()),
            start_revision,
            items,
        }
    }

    fn check(items: Vec<WatchItem>) -> Vec<WatchViolation> {
        check_watches(&[log(1, items)], &committed())
    }

    fn at(revision: i64, key: &str) -> EventAt {
        EventAt {
            revision,
            key: key.into(),
        }
    }

    #[test]
    fn accepts_a_complete_stream_with_progress_and_resumes() {
        let history = committed();
        let mut items = events(&history, 1..=4);
        items.push(WatchItem::Progress { revision: 4 });
        items.push(WatchItem::Resumed { from_revision: 5 });
        items.extend(events(&history, 5..=6));
        // Resuming from an earlier revision redelivers, which is no duplicate.
        items.push(WatchItem::Resumed { from_revision: 6 });
        items.extend(events(&history, 6..=9));
        items.push(WatchItem::Progress { revision: 9 });
        assert_eq!(check(items), vec![]);
        // A watcher from "now" that starts mid-history.
        let from_now = log(0, events(&history, 5..=9));
        assert_eq!(check_watches(&[from_now], &history), vec![]);
    }

    #[test]
    fn rejects_a_duplicated_event() {
        let history = committed();
        let mut items = events(&history, 1..=3);
        items.push(events(&history, 3..=3)[0].clone());
        assert_eq!(
            check(items),
            vec![WatchViolation::Duplicate {
                watcher: 1,
                item: 2,
                event: at(3, "b"),
            }]
        );
        // Delivered again after a resume past it.
        let mut items = events(&history, 1..=3);
        items.push(WatchItem::Resumed { from_revision: 4 });
        items.extend(events(&history, 3..=4));
        assert!(matches!(
            check(items).as_slice(),
            [WatchViolation::Duplicate { item: 3, .. }]
        ));
    }

    #[test]
    fn rejects_a_gap() {
        let history = committed();
        let mut items = events(&history, 1..=2);
        items.extend(events(&history, 4..=5));
        assert_eq!(
            check(items),
            vec![WatchViolation::Gap {
                watcher: 1,
                missing: Events {
                    listed: vec![at(3, "b")],
                    count: 1,
                },
                resumed_from: None,
            }]
        );
    }

    #[test]
    fn rejects_a_reordered_event() {
        let history = committed();
        let mut items = events(&history, 1..=4);
        items.swap(1, 2);
        assert_eq!(
            check(items),
            vec![WatchViolation::Reordered {
                watcher: 1,
                item: 2,
                event: at(3, "b"),
                after_revision: 4,
            }]
        );
    }

    #[test]
    fn rejects_a_progress_notification_that_skips_an_undelivered_event() {
        let history = committed();
        let mut items = events(&history, 1..=2);
        items.push(WatchItem::Progress { revision: 3 });
        items.extend(events(&history, 3..=3));
        assert_eq!(
            check(items),
            vec![WatchViolation::ProgressSkipsEvent {
                watcher: 1,
                item: 1,
                revision: 3,
                undelivered: Events {
                    listed: vec![at(3, "b")],
                    count: 1,
                },
            }]
        );
        // A progress notification below what was already delivered.
        let mut items = events(&history, 1..=3);
        items.push(WatchItem::Progress { revision: 2 });
        assert!(matches!(
            check(items).as_slice(),
            [WatchViolation::ProgressBehind { revision: 2, .. }]
        ));
    }

    /// A compacted error at `compact_revision` that arrived at `received`.
    fn compacted(compact_revision: i64, received: u64) -> WatchItem {
        WatchItem::Compacted {
            compact_revision,
            received,
        }
    }

    /// After the compaction at 4 was asked for (at 100).
    const LATER: u64 = 200;

    #[test]
    fn rejects_a_wrong_compacted_error() {
        let history = committed();
        // A revision nobody compacted.
        assert!(matches!(
            check(vec![compacted(3, LATER)]).as_slice(),
            [WatchViolation::WrongCompacted {
                reason: "not a revision the harness compacted",
                ..
            }]
        ));
        // The right revision, but before anyone asked for it.
        assert!(matches!(
            check(vec![compacted(4, 50)]).as_slice(),
            [WatchViolation::WrongCompacted {
                reason: "it arrived before that compaction was asked for",
                ..
            }]
        ));
        // A compaction that failed compacted nothing.
        let mut failed = committed();
        failed.compactions[0].outcome = CompactOutcome::Failed;
        assert!(matches!(
            check_watches(&[log(1, vec![compacted(4, LATER)])], &failed).as_slice(),
            [WatchViolation::WrongCompacted {
                reason: "not a revision the harness compacted",
                ..
            }]
        ));
        // A watch from 5 needs nothing compacted at 4.
        let mut items = events(&history, 5..=6);
        items.push(compacted(4, LATER));
        assert!(matches!(
            check_watches(&[log(5, items)], &history).as_slice(),
            [WatchViolation::WrongCompacted {
                start_revision: 5,
                ..
            }]
        ));
        // Nor does a resume from 4: a read at the compact revision itself still succeeds.
        let mut items = events(&history, 1..=3);
        items.push(WatchItem::Resumed { from_revision: 4 });
        items.push(compacted(4, LATER));
        assert!(matches!(
            check(items).as_slice(),
            [WatchViolation::WrongCompacted {
                start_revision: 4,
                ..
            }]
        ));
        // Nothing may follow it before a resume.
        let mut items = vec![compacted(4, LATER)];
        items.extend(events(&history, 4..=4));
        assert!(matches!(
            check(items).as_slice(),
            [WatchViolation::AfterCompacted { item: 1, .. }]
        ));
        // The resume after it may skip what is below 4, but not 4 itself.
        let mut items = vec![compacted(4, LATER)];
        items.push(WatchItem::Resumed { from_revision: 5 });
        items.extend(events(&history, 5..=9));
        assert_eq!(
            check(items),
            vec![WatchViolation::Gap {
                watcher: 1,
                missing: Events {
                    listed: vec![at(4, "a")],
                    count: 1,
                },
                resumed_from: Some(5),
            }]
        );
    }

    #[test]
    fn accepts_a_right_compacted_error() {
        let history = committed();
        // Started at 1, compacted at 4, resumed at 4: events below 4 may be lost.
        let mut items = vec![compacted(4, LATER)];
        items.push(WatchItem::Resumed { from_revision: 4 });
        items.extend(events(&history, 4..=9));
        assert_eq!(check(items.clone()), vec![]);
        // Also while the compaction is in flight, and when its answer was lost.
        let mut in_flight = committed();
        in_flight.compactions[0].complete = None;
        in_flight.compactions[0].outcome = CompactOutcome::Unknown;
        let mut early = items.clone();
        early[0] = compacted(4, 100);
        assert_eq!(check_watches(&[log(1, early)], &in_flight), vec![]);
        // A watcher cut off after receiving everything below the compaction is tolerated
        // (etcd 3.4 may do that after a snapshot restore, see the module doc).
        let mut items = events(&history, 1..=4);
        items.push(compacted(4, LATER));
        assert_eq!(check(items), vec![]);
        // With two compactions, etcd names the latest: a watcher from 3 cut off at 6 resumes
        // at 6 and may lose 3..=5.
        let mut two = committed();
        two.compactions.push(Compaction {
            id: 2,
            revision: 6,
            invoke: 150,
            complete: Some(160),
            outcome: CompactOutcome::Ok,
        });
        let mut items = vec![compacted(6, LATER), WatchItem::Resumed { from_revision: 6 }];
        items.extend(events(&two, 6..=9));
        assert_eq!(check_watches(&[log(3, items)], &two), vec![]);
    }

    #[test]
    fn rejects_an_event_lost_across_a_resume() {
        let history = committed();
        let mut items = events(&history, 1..=3);
        items.push(WatchItem::Resumed { from_revision: 5 });
        items.extend(events(&history, 5..=9));
        assert_eq!(
            check(items),
            vec![WatchViolation::Gap {
                watcher: 1,
                missing: Events {
                    listed: vec![at(4, "a")],
                    count: 1,
                },
                resumed_from: Some(5),
            }]
        );
        // Skipping revisions with no event in the range loses nothing: 8 is "z".
        let mut items = events(&history, 1..=7);
        items.push(WatchItem::Resumed { from_revision: 9 });
        items.extend(events(&history, 9..=9));
        assert_eq!(check(items), vec![]);
    }

    #[test]
    fn rejects_events_that_were_not_committed_or_not_watched() {
        let history = committed();
        let mut items = events(&history, 1..=2);
        items.push(WatchItem::Event {
            revision: 3,
            key: "b".into(),
            kind: EventKind::Put,
            value: "other".into(),
        });
        items.push(WatchItem::Event {
            revision: 10,
            key: "a".into(),
            kind: EventKind::Put,
            value: "4".into(),
        });
        items.push(event_of(&committed_put(8, "z", "1")));
        let violations = check(items);
        assert!(matches!(
            violations.as_slice(),
            [
                WatchViolation::NotCommitted {
                    committed: Some(_),
                    ..
                },
                WatchViolation::NotCommitted {
                    committed: None,
                    ..
                },
                WatchViolation::OutOfRange { .. },
                WatchViolation::Gap { .. },
            ]
        ));
        // An event below the watch's start.
        let items = events(&history, 2..=3);
        let violations = check_watches(&[log(3, items)], &history);
        assert!(matches!(
            violations.as_slice(),
            [WatchViolation::BeforeStart { item: 0, .. }]
        ));
    }

    #[test]
    fn events_below_the_committed_floor_are_not_checked_against_it() {
        let mut history = committed();
        history.events.retain(|event| event.revision >= 5);
        history.from_revision = 5;
        let mut items = vec![WatchItem::Event {
            revision: 2,
            key: "a".into(),
            kind: EventKind::Put,
            value: "unknowable".into(),
        }];
        items.extend(events(&committed(), 5..=9));
        assert_eq!(check_watches(&[log(1, items)], &history), vec![]);
    }

    #[test]
    fn rejects_a_malformed_committed_history() {
        let mut history = committed();
        history.events.push(committed_put(9, "a", "3"));
        let violations = check_watches(&[], &history);
        assert!(matches!(
            violations.as_slice(),
            [WatchViolation::Committed { .. }, ..]
        ));
    }

    /// Random histories compacted every 40 revisions (compaction k asked for at time k),
    /// watched from random revisions by watchers that a compaction now and then cuts off and
    /// that resume from the compact revision: all accepted. The same streams resumed one
    /// revision too high, where that skips an event of the range, are rejected.
    #[test]
    fn accepts_random_streams_cut_off_by_compaction() {
        const EVERY: i64 = 40;
        for seed in 0..30 {
            let (_, events, _) = crate::check::linearizable::sim::history(seed, 3, 300, 6);
            let last = events.last().map_or(1, |event| event.revision);
            let compactions: Vec<Compaction> = (1..=last / EVERY)
                .map(|k| Compaction {
                    id: k as u64,
                    revision: k * EVERY,
                    invoke: k as u64 * 1_000,
                    complete: Some(k as u64 * 1_000 + 10),
                    outcome: CompactOutcome::Ok,
                })
                .collect();
            let committed = CommittedHistory {
                from_revision: 1,
                events,
                compactions,
                past_reads: Vec::new(),
            };
            let mut rng = StdRng::seed_from_u64(seed);
            for skip in [false, true] {
                let start_revision = rng.random_range(1..last.max(2));
                let mut items = Vec::new();
                let mut skipped_an_event = false;
                let mut next = start_revision;
                let mut events = committed.events.iter().peekable();
                while let Some(event) = events.next() {
                    if event.revision < next {
                        continue;
                    }
                    items.push(event_of(event));
                    next = event.revision + 1;
                    // The latest compaction above what the watcher still needs cuts it off.
                    let Some(cut) = committed
                        .compactions
                        .iter()
                        .rev()
                        .find(|compaction| compaction.revision > next)
                    else {
                        continue;
                    };
                    if !rng.random_bool(0.05) {
                        continue;
                    }
                    items.push(WatchItem::Compacted {
                        compact_revision: cut.revision,
                        received: cut.invoke + 5,
                    });
                    let lands_on_event = events.peek().is_some()
                        && committed
                            .events
                            .iter()
                            .any(|event| event.revision == cut.revision);
                    let from = if skip && lands_on_event {
                        skipped_an_event = true;
                        cut.revision + 1
                    } else {
                        cut.revision
                    };
                    items.push(WatchItem::Resumed {
                        from_revision: from,
                    });
                    next = from;
                }
                let log = WatchLog {
                    watcher: 1,
                    range: (Vec::new(), vec![0]),
                    start_revision,
                    items,
                };
                let violations = check_watches(&[log], &committed);
                if skipped_an_event {
                    assert!(
                        violations
                            .iter()
                            .all(|v| matches!(v, WatchViolation::Gap { .. })),
                        "seed {seed}: {violations:?}"
                    );
                    assert!(!violations.is_empty(), "seed {seed}: a skip went unnoticed");
                } else {
                    assert_eq!(violations, vec![], "seed {seed}, skip {skip}");
                }
            }
        }
    }

    #[test]
    fn accepts_random_faithful_streams() {
        for seed in 0..50 {
            let (_, events, _) = crate::check::linearizable::sim::history(seed, 4, 300, 6);
            let last = events.last().map_or(1, |event| event.revision);
            let committed = CommittedHistory {
                from_revision: 1,
                events,
                ..CommittedHistory::default()
            };
            let mut rng = StdRng::seed_from_u64(seed);
            let logs: Vec<WatchLog> = (0..4)
                .map(|watcher| {
                    let range: (Vec<u8>, Vec<u8>) = match watcher {
                        0 => ("k0".into(), "".into()),
                        1 => ("k1".into(), "k3".into()),
                        _ => ("k".into(), "\0".into()),
                    };
                    let start_revision = rng.random_range(1..last + 1);
                    let mut items = Vec::new();
                    for event in &committed.events {
                        if event.revision < start_revision
                            || !history::range_contains(&range.0, &range.1, &event.key)
                        {
                            continue;
                        }
                        // Progress at the revision just below, as an idle server would send.
                        if rng.random_bool(0.1) {
                            items.push(WatchItem::Progress {
                                revision: event.revision - 1,
                            });
                        }
                        items.push(event_of(event));
                        if rng.random_bool(0.05) {
                            items.push(WatchItem::Resumed {
                                from_revision: event.revision + 1,
                            });
                        }
                    }
                    items.push(WatchItem::Progress { revision: last });
                    WatchLog {
                        watcher,
                        range,
                        start_revision,
                        items,
                    }
                })
                .collect();
            assert_eq!(check_watches(&logs, &committed), vec![], "seed {seed}");
        }
    }
}
