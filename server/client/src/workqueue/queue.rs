//! The core of the workqueue, with no locks, tasks or clocks of its own: a FIFO and two sets
//! (`docs/tricks.md` #17; client-go `util/workqueue/queue.go`).
//!
//! - `dirty`: the items that need processing. An add of an item already dirty does nothing,
//!   which is all the coalescing there is: ten updates to one object before a worker gets to it
//!   become one sync.
//! - `processing`: the items handed out by [`Queue::pop`] and not yet [`Queue::done`]. An item
//!   added while it is processing goes into `dirty` but not into the FIFO, so no second worker
//!   can take it; `done` moves it to the FIFO then, so the change that came in meanwhile is
//!   synced once more.
//! - `fifo`: the dirty items that are not processing, in the order they were added.
//!
//! Invariants (checked by `check_invariants` in tests): every item in `fifo` is in `dirty` and
//! not in `processing`, and appears in `fifo` once. So no item is ever handed to two workers at
//! once, and no item waits twice.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// What [`Queue::add`] did with an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    /// The item went to the back of the FIFO.
    Queued,
    /// The item is being processed; it is marked dirty and will be queued by `done`.
    HeldWhileProcessing,
    /// The item was already dirty: this add merged into the pending one.
    Coalesced,
    /// The queue is shutting down and takes no more items.
    Refused,
}

/// What [`Queue::done`] did with an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Finished {
    /// How long the item was processing; `None` if it was not processing at all.
    pub(crate) worked: Option<Duration>,
    /// Whether the item was added while it was processing and so went back into the FIFO.
    pub(crate) requeued: bool,
}

/// The FIFO and the two sets. Each set is a map to a time kept for the metrics: when the item
/// became dirty (queue latency) and when it was handed out (work duration).
#[derive(Debug)]
pub(crate) struct Queue<T> {
    fifo: VecDeque<T>,
    dirty: HashMap<T, Instant>,
    processing: HashMap<T, Instant>,
    shutting_down: bool,
}

impl<T: Hash + Eq + Clone> Queue<T> {
    pub(crate) fn new() -> Self {
        Queue {
            fifo: VecDeque::new(),
            dirty: HashMap::new(),
            processing: HashMap::new(),
            shutting_down: false,
        }
    }

    /// Marks `item` dirty and queues it unless it is already waiting or being processed.
    pub(crate) fn add(&mut self, item: T, now: Instant) -> Added {
        if self.shutting_down {
            return Added::Refused;
        }
        if self.dirty.contains_key(&item) {
            return Added::Coalesced;
        }
        let processing = self.processing.contains_key(&item);
        if !processing {
            self.fifo.push_back(item.clone());
        }
        self.dirty.insert(item, now);
        if processing {
            Added::HeldWhileProcessing
        } else {
            Added::Queued
        }
    }

    /// Takes the oldest waiting item, marks it processing and clean, and says how long it
    /// was dirty. Hands out nothing once shutting down.
    pub(crate) fn pop(&mut self, now: Instant) -> Option<(T, Duration)> {
        if self.shutting_down {
            return None;
        }
        let item = self.fifo.pop_front()?;
        let added = self.dirty.remove(&item);
        assert!(
            added.is_some(),
            "an item in the FIFO is always dirty (fifo {} dirty {})",
            self.fifo.len(),
            self.dirty.len()
        );
        let waited = added.map_or(Duration::ZERO, |added| now.saturating_duration_since(added));
        let earlier = self.processing.insert(item.clone(), now);
        assert!(earlier.is_none(), "an item in the FIFO is never processing");
        Some((item, waited))
    }

    /// Marks `item` processed; if it was added meanwhile, queues it again. An item that was
    /// not processing is left alone (client-go would queue a dirty one twice here).
    pub(crate) fn done(&mut self, item: &T, now: Instant) -> Finished {
        let Some(started) = self.processing.remove(item) else {
            return Finished {
                worked: None,
                requeued: false,
            };
        };
        let requeued = self.dirty.contains_key(item);
        if requeued {
            self.fifo.push_back(item.clone());
        }
        Finished {
            worked: Some(now.saturating_duration_since(started)),
            requeued,
        }
    }

    /// Items waiting in the FIFO.
    pub(crate) fn len(&self) -> usize {
        self.fifo.len()
    }

    /// Items handed out and not yet done.
    pub(crate) fn processing_len(&self) -> usize {
        self.processing.len()
    }

    pub(crate) fn shut_down(&mut self) {
        self.shutting_down = true;
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Seconds of work in progress summed over the processing items, and the longest one
    /// (client-go's `unfinished_work_seconds` and `longest_running_processor_seconds`).
    pub(crate) fn unfinished_work(&self, now: Instant) -> (f64, f64) {
        self.processing
            .values()
            .map(|started| now.saturating_duration_since(*started).as_secs_f64())
            .fold((0.0, 0.0), |(total, longest), secs| {
                (total + secs, f64::max(longest, secs))
            })
    }

    /// Checks the invariants in the module doc. Linear in the queue size: tests only.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut seen = std::collections::HashSet::new();
        for item in &self.fifo {
            assert!(self.dirty.contains_key(item), "queued item not dirty");
            assert!(
                !self.processing.contains_key(item),
                "queued item processing"
            );
            assert!(seen.insert(item), "item queued twice");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    fn drain(queue: &mut Queue<&'static str>, now: Instant) -> Vec<&'static str> {
        let mut out = Vec::new();
        while let Some((item, _)) = queue.pop(now) {
            out.push(item);
            queue.done(&item, now);
        }
        out
    }

    #[test]
    fn fifo_order() {
        let now = Instant::now();
        let mut queue = Queue::new();
        for item in ["c", "a", "b"] {
            assert_eq!(queue.add(item, now), Added::Queued);
        }
        queue.check_invariants();
        assert_eq!(drain(&mut queue, now), vec!["c", "a", "b"]);
    }

    #[test]
    fn pending_adds_coalesce() {
        let now = Instant::now();
        let mut queue = Queue::new();
        assert_eq!(queue.add("a", now), Added::Queued);
        assert_eq!(queue.add("b", now), Added::Queued);
        assert_eq!(queue.add("a", now), Added::Coalesced);
        assert_eq!(queue.add("a", now), Added::Coalesced);
        assert_eq!(queue.len(), 2);
        queue.check_invariants();
        // "a" keeps its first place.
        assert_eq!(drain(&mut queue, now), vec!["a", "b"]);
    }

    /// `docs/tricks.md` #17: a key added three times while it is being processed is processed
    /// twice in total, not four times.
    #[test]
    fn three_adds_while_processing_make_one_more_sync() {
        let now = Instant::now();
        let mut queue = Queue::new();
        queue.add("k", now);
        let (item, _) = queue.pop(now).unwrap();
        assert_eq!(item, "k");
        assert_eq!(queue.add("k", now), Added::HeldWhileProcessing);
        assert_eq!(queue.add("k", now), Added::Coalesced);
        assert_eq!(queue.add("k", now), Added::Coalesced);
        // Held back: no other worker can take "k" while the first holds it.
        assert_eq!(queue.len(), 0);
        assert_eq!(queue.pop(now), None);
        queue.check_invariants();
        let finished = queue.done(&"k", now);
        assert!(finished.requeued);
        assert_eq!(drain(&mut queue, now), vec!["k"]);
        assert_eq!(queue.len(), 0);
        assert_eq!(queue.processing_len(), 0);
    }

    #[test]
    fn done_requeues_only_a_dirty_item() {
        let now = Instant::now();
        let later = now + Duration::from_millis(30);
        let mut queue = Queue::new();
        queue.add("a", now);
        queue.add("b", now);
        let (a, _) = queue.pop(now).unwrap();
        let (b, _) = queue.pop(now).unwrap();
        queue.add("a", now);
        let finished = queue.done(&a, later);
        assert_eq!(finished.worked, Some(Duration::from_millis(30)));
        assert!(finished.requeued);
        let finished = queue.done(&b, later);
        assert!(!finished.requeued);
        assert_eq!(queue.len(), 1);
        // A second `done`, or one for an item never handed out, changes nothing.
        assert_eq!(
            queue.done(&b, later),
            Finished {
                worked: None,
                requeued: false
            }
        );
        assert_eq!(queue.done(&"a", later).worked, None);
        assert_eq!(queue.len(), 1);
        queue.check_invariants();
    }

    #[test]
    fn pop_reports_time_spent_dirty() {
        let now = Instant::now();
        let mut queue = Queue::new();
        queue.add("a", now);
        queue.add("a", now + Duration::from_millis(5));
        let (_, waited) = queue.pop(now + Duration::from_millis(20)).unwrap();
        // Measured from the first add, which the second merged into.
        assert_eq!(waited, Duration::from_millis(20));
    }

    #[test]
    fn shutting_down_refuses_and_hands_out_nothing() {
        let now = Instant::now();
        let mut queue = Queue::new();
        queue.add("a", now);
        queue.add("b", now);
        let (a, _) = queue.pop(now).unwrap();
        queue.shut_down();
        assert_eq!(queue.add("c", now), Added::Refused);
        assert_eq!(queue.pop(now), None);
        // In-flight work can still finish.
        assert_eq!(queue.processing_len(), 1);
        assert!(queue.done(&a, now).worked.is_some());
        assert_eq!(queue.processing_len(), 0);
    }

    #[test]
    fn unfinished_work_sums_and_maxes() {
        let now = Instant::now();
        let mut queue = Queue::new();
        queue.add("a", now);
        queue.add("b", now);
        queue.pop(now);
        queue.pop(now + Duration::from_secs(2));
        let (total, longest) = queue.unfinished_work(now + Duration::from_secs(5));
        assert_eq!(total, 8.0);
        assert_eq!(longest, 5.0);
    }
}
