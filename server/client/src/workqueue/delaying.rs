//! `add_after` on one heap and one timer (`docs/tricks.md` #17; client-go
//! `util/workqueue/delaying_queue.go`).
//!
//! Every delayed item goes into one min-heap ordered by the time it becomes ready, and one
//! background task sleeps until the earliest of them, moves every ready item into the queue,
//! and sleeps again. A thousand failing keys cost a thousand heap entries and one timer, not a
//! thousand sleeping tasks.
//!
//! An item already waiting keeps the earlier of its two ready times (client-go's
//! `knownEntries`): a rate-limited retry cannot push back a resync that was due sooner, and an
//! item waits in the heap once however often it is delayed.
//!
//! The heap has no decrease-key, so moving an item earlier pushes a second entry and leaves the
//! old one behind as stale; `known` says which entry is live, stale ones are skipped when they
//! reach the top, and the heap is compacted when they outnumber the live ones.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Stale heap entries tolerated beyond one per live item before the heap is compacted.
/// Compacting is linear in the heap size, so this keeps its cost amortised over as many
/// insertions; semi-arbitrary, large enough that a small heap is never rebuilt.
const STALE_ENTRIES_SLACK: usize = 1_024;

/// One heap entry: an item and when it becomes ready. `sequence` orders items ready at the
/// same instant by insertion and tells a live entry from a stale one.
#[derive(Debug)]
struct Entry<T> {
    ready_at: Instant,
    sequence: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.ready_at, self.sequence).cmp(&(other.ready_at, other.sequence))
    }
}

/// The items waiting for their time, as a min-heap on ready time.
#[derive(Debug)]
pub(crate) struct WaitingHeap<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    /// The live entry of each waiting item: its ready time and sequence.
    known: HashMap<T, (Instant, u64)>,
    next_sequence: u64,
}

impl<T: Hash + Eq + Clone> WaitingHeap<T> {
    pub(crate) fn new() -> Self {
        WaitingHeap {
            heap: BinaryHeap::new(),
            known: HashMap::new(),
            next_sequence: 0,
        }
    }

    /// Schedules `item` for `ready_at`, or moves it earlier if it already waits for later.
    /// Returns whether the earliest ready time of the heap moved earlier, that is whether the
    /// timer must be woken.
    pub(crate) fn insert(&mut self, item: T, ready_at: Instant) -> bool {
        let known_earlier = self
            .known
            .get(&item)
            .is_some_and(|(known_at, _)| *known_at <= ready_at);
        if known_earlier {
            return false;
        }
        let earliest = self.next_ready_at();
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.known.insert(item.clone(), (ready_at, sequence));
        self.heap.push(Reverse(Entry {
            ready_at,
            sequence,
            item,
        }));
        if self.heap.len() > 2 * self.known.len() + STALE_ENTRIES_SLACK {
            self.compact();
        }
        earliest.is_none_or(|earliest| ready_at < earliest)
    }

    /// Removes and returns the items ready at `now`, earliest first.
    pub(crate) fn pop_ready(&mut self, now: Instant) -> Vec<T> {
        let mut ready = Vec::new();
        while let Some(Reverse(top)) = self.heap.peek() {
            if top.ready_at > now {
                break;
            }
            let Some(Reverse(entry)) = self.heap.pop() else {
                break;
            };
            if self.is_live(&entry) {
                self.known.remove(&entry.item);
                ready.push(entry.item);
            }
        }
        ready
    }

    /// When the earliest waiting item becomes ready. Drops stale entries off the top.
    pub(crate) fn next_ready_at(&mut self) -> Option<Instant> {
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.is_live(top) {
                return Some(top.ready_at);
            }
            self.heap.pop();
        }
        None
    }

    /// Items waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.known.len()
    }

    /// Forgets every waiting item.
    pub(crate) fn clear(&mut self) {
        self.heap.clear();
        self.known.clear();
    }

    fn is_live(&self, entry: &Entry<T>) -> bool {
        self.known
            .get(&entry.item)
            .is_some_and(|(_, sequence)| *sequence == entry.sequence)
    }

    fn compact(&mut self) {
        let known = &self.known;
        self.heap.retain(|Reverse(entry)| {
            known
                .get(&entry.item)
                .is_some_and(|(_, sequence)| *sequence == entry.sequence)
        });
    }

    #[cfg(test)]
    fn entries(&self) -> usize {
        self.heap.len()
    }
}

/// What the waiting loop needs from the queue that owns it.
pub(crate) trait DelayTarget: Send + Sync + 'static {
    /// Moves the items ready at `now` into the queue; returns when the next one is due.
    fn fire_ready(&self, now: Instant) -> Option<Instant>;
}

/// The one timer: sleeps until the earliest ready time, fires, and repeats, until `stop` is
/// cancelled (shutdown, or the last handle of the queue dropped). `wake` is notified when an
/// item is scheduled before the current earliest. The loop holds the queue only weakly, so it
/// never keeps a dropped queue alive.
pub(crate) async fn waiting_loop<Q: DelayTarget>(
    target: Weak<Q>,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    loop {
        // Registered before the heap is read, so a wake between the read and the sleep is kept.
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let next = match target.upgrade() {
            Some(target) => target.fire_ready(Instant::now()),
            None => return,
        };
        let until_next = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = &mut woken => {}
            () = until_next => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn pops_in_ready_order() {
        let base = Instant::now();
        let mut heap = WaitingHeap::new();
        assert!(heap.insert("c", at(base, 30)));
        assert!(heap.insert("a", at(base, 10)));
        assert!(!heap.insert("b", at(base, 20)));
        assert_eq!(heap.next_ready_at(), Some(at(base, 10)));
        assert_eq!(heap.pop_ready(at(base, 5)), Vec::<&str>::new());
        assert_eq!(heap.pop_ready(at(base, 20)), vec!["a", "b"]);
        assert_eq!(heap.pop_ready(at(base, 100)), vec!["c"]);
        assert_eq!(heap.len(), 0);
        assert_eq!(heap.next_ready_at(), None);
    }

    #[test]
    fn same_time_keeps_insertion_order() {
        let base = Instant::now();
        let mut heap = WaitingHeap::new();
        for item in ["x", "y", "z"] {
            heap.insert(item, at(base, 10));
        }
        assert_eq!(heap.pop_ready(at(base, 10)), vec!["x", "y", "z"]);
    }

    #[test]
    fn a_waiting_item_keeps_the_earlier_time() {
        let base = Instant::now();
        let mut heap = WaitingHeap::new();
        heap.insert("a", at(base, 50));
        // Later: ignored.
        assert!(!heap.insert("a", at(base, 80)));
        assert_eq!(heap.entries(), 1);
        // Earlier: moves, and the timer must be woken.
        assert!(heap.insert("a", at(base, 10)));
        assert_eq!(heap.len(), 1);
        assert_eq!(heap.pop_ready(at(base, 10)), vec!["a"]);
        // The stale entry for 50 ms does not fire a second time.
        assert_eq!(heap.pop_ready(at(base, 100)), Vec::<&str>::new());
        assert_eq!(heap.entries(), 0);
    }

    #[test]
    fn stale_entries_are_compacted() {
        let base = Instant::now();
        let mut heap = WaitingHeap::new();
        let rounds = 3 * STALE_ENTRIES_SLACK as u64;
        for step in 0..rounds {
            heap.insert("a", at(base, 1_000_000 - step));
        }
        assert_eq!(heap.len(), 1);
        assert!(
            heap.entries() <= 2 + STALE_ENTRIES_SLACK,
            "{}",
            heap.entries()
        );
        assert_eq!(heap.pop_ready(at(base, 1_000_000)), vec!["a"]);
    }
}
