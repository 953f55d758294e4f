//! The watch cache's window: a ring of recent events whose capacity follows the load.
//!
//! A watcher that resumes from resourceVersion R is served from here if every event after R
//! is still held, and otherwise hears 410 Expired. Kubernetes sizes the window by time
//! rather than count: it starts at 100 events, doubles (up to 100 × 1024) while the oldest
//! held event is younger than [`EVENT_FRESH_DURATION`], and halves when even the newest
//! quarter reaches further back than that. So a quiet resource keeps a small ring, and a busy
//! one keeps about 75 seconds of history, enough for any client that re-watches after a
//! bookmark-length gap.
//!
//! Invariants: events are in revision order; `window_start` is the revision of the last
//! evicted event (or of the list the window started from), and every event with a revision
//! above it is held, so a watch from any revision at or above `window_start` misses nothing.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::object::{CachedObject, EventType};

/// The smallest window, in events (Kubernetes' `defaultLowerBoundCapacity = 100`). Smaller
/// would make a watcher that blinks during a burst relist; the cost of 100 `Arc`s is nil.
pub const WINDOW_EVENTS_MIN: usize = 100;

/// The largest window, in events (Kubernetes' `defaultUpperBoundCapacity = 100 * 1024`).
/// Bounds memory under a write storm: events hold the objects they carry, so 100 k events of
/// 2 KiB objects is ~200 MiB at worst, the most an appliance box should give one resource.
pub const WINDOW_EVENTS_MAX: usize = 100 * 1024;

/// How much history the window aims to keep (Kubernetes' `DefaultEventFreshDuration`, the
/// bookmark frequency plus 15 s): a client that got a bookmark and then lost its connection
/// can re-watch from the bookmark's revision without a 410.
pub const EVENT_FRESH_DURATION: Duration = Duration::from_secs(75);

const _: () = assert!(
    WINDOW_EVENTS_MIN >= 4,
    "the shrink rule looks at the newest quarter"
);
const _: () = assert!(WINDOW_EVENTS_MIN <= WINDOW_EVENTS_MAX);

/// One change of one object, as the cache dispatches it.
#[derive(Debug)]
pub struct Event {
    /// The store revision of the change.
    pub resource_version: i64,
    pub event_type: EventType,
    /// The object's key under the resource prefix (`namespace/name` or `name`).
    pub key: Arc<str>,
    /// The object after the change; for a delete, its last state carrying the delete's
    /// revision.
    pub object: CachedObject,
    /// The object before the change with its own revision; `None` for a create.
    pub prev: Option<CachedObject>,
    /// When the cache recorded it, from the cache's clock base.
    pub recorded: Duration,
    /// `prev` at this event's revision, made on first need: a watcher whose filter matched
    /// the old state but not the new one hears a DELETED carrying it. Memoized so that every
    /// such watcher shares one copy and one serialization.
    prev_at_event: OnceLock<CachedObject>,
}

impl Event {
    /// An event as the cache records it.
    pub fn new(
        resource_version: i64,
        event_type: EventType,
        key: Arc<str>,
        object: CachedObject,
        prev: Option<CachedObject>,
        recorded: Duration,
    ) -> Self {
        Self {
            resource_version,
            event_type,
            key,
            object,
            prev,
            recorded,
            prev_at_event: OnceLock::new(),
        }
    }

    /// The object a DELETED event carries for a watcher that no longer matches: the delete's
    /// own object, or the previous state re-stamped with this event's revision.
    pub fn deleted_object(&self) -> Option<CachedObject> {
        if self.event_type == EventType::Deleted {
            return Some(self.object.clone());
        }
        let prev = self.prev.as_ref()?;
        Some(
            self.prev_at_event
                .get_or_init(|| prev.with_resource_version(self.resource_version))
                .clone(),
        )
    }
}

/// The ring of recent events.
#[derive(Debug)]
pub struct History {
    events: VecDeque<Arc<Event>>,
    capacity: usize,
    capacity_min: usize,
    capacity_max: usize,
    fresh: Duration,
    window_start: i64,
}

/// Why events since a revision cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    /// The oldest revision a watch can start from now.
    pub window_start: i64,
}

impl History {
    /// An empty window starting at `resource_version`.
    ///
    /// # Panics
    /// If the bounds are inverted or below 4 (validated in the cache's config).
    pub fn new(capacity_min: usize, capacity_max: usize, fresh: Duration, rv: i64) -> Self {
        assert!(capacity_min >= 4, "capacity_min {capacity_min} < 4");
        assert!(
            capacity_min <= capacity_max,
            "capacity_min {capacity_min} > capacity_max {capacity_max}"
        );
        Self {
            events: VecDeque::new(),
            capacity: capacity_min,
            capacity_min,
            capacity_max,
            fresh,
            window_start: rv,
        }
    }

    /// Empties the window after a relist at `resource_version`.
    pub fn reset(&mut self, resource_version: i64) {
        self.events.clear();
        self.capacity = self.capacity_min;
        self.window_start = resource_version;
    }

    /// The oldest revision a watch can start from.
    pub fn window_start(&self) -> i64 {
        self.window_start
    }

    /// The current capacity, in events.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event is held.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Appends an event, first resizing the ring by the age of what it holds.
    ///
    /// # Panics
    /// If the event is older than the newest held one.
    pub fn push(&mut self, event: Arc<Event>) {
        if let Some(last) = self.events.back() {
            assert!(
                event.resource_version >= last.resource_version,
                "event at {} after {}",
                event.resource_version,
                last.resource_version
            );
        }
        self.capacity = self.resized(event.recorded);
        self.events.push_back(event);
        while self.events.len() > self.capacity {
            if let Some(evicted) = self.events.pop_front() {
                self.window_start = evicted.resource_version;
            }
        }
    }

    /// Kubernetes' rule: a full ring whose oldest event is still fresh doubles; a full ring
    /// whose newest quarter already reaches past the fresh duration halves.
    fn resized(&self, now: Duration) -> usize {
        if self.events.len() < self.capacity {
            return self.capacity;
        }
        let age = |e: &Arc<Event>| now.saturating_sub(e.recorded);
        if self.events.front().is_some_and(|e| age(e) < self.fresh) {
            return (self.capacity * 2).min(self.capacity_max);
        }
        let quarter = self.events.len() - self.capacity / 4;
        if self
            .events
            .get(quarter)
            .is_some_and(|e| age(e) > self.fresh)
        {
            return (self.capacity / 2).max(self.capacity_min);
        }
        self.capacity
    }

    /// Every held event after `resource_version`, or [`TooOld`] if some were evicted.
    pub fn since(
        &self,
        resource_version: i64,
    ) -> Result<impl DoubleEndedIterator<Item = &Arc<Event>>, TooOld> {
        if resource_version < self.window_start {
            return Err(TooOld {
                window_start: self.window_start,
            });
        }
        let first = self
            .events
            .partition_point(|e| e.resource_version <= resource_version);
        Ok(self.events.range(first..))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn event(rv: i64, at_secs: u64) -> Arc<Event> {
        let o = CachedObject::new(json!({"metadata": {"name": "a"}}), None);
        Arc::new(Event::new(
            rv,
            EventType::Modified,
            Arc::from("a"),
            o,
            None,
            Duration::from_secs(at_secs),
        ))
    }

    #[test]
    fn evicting_moves_the_window_and_old_watches_are_refused() {
        let mut h = History::new(4, 4, EVENT_FRESH_DURATION, 10);
        for rv in 11..=16 {
            h.push(event(rv, 1_000 + rv as u64 * 100)); // old events: no growth
        }
        assert_eq!(h.len(), 4);
        assert_eq!(h.window_start(), 12);
        assert_eq!(h.since(11).err(), Some(TooOld { window_start: 12 }));
        let revs: Vec<i64> = h
            .since(12)
            .expect("in window")
            .map(|e| e.resource_version)
            .collect();
        assert_eq!(revs, vec![13, 14, 15, 16]);
        assert_eq!(h.since(16).expect("current").count(), 0);
    }

    #[test]
    fn grows_under_fresh_load_and_shrinks_when_quiet() {
        let mut h = History::new(4, 16, EVENT_FRESH_DURATION, 0);
        for rv in 1..=16 {
            h.push(event(rv, 5)); // all within the fresh duration
        }
        assert_eq!(
            h.capacity(),
            16,
            "doubled 4 -> 8 -> 16 while events were fresh"
        );
        assert_eq!(h.len(), 16);
        assert_eq!(h.window_start(), 0, "nothing evicted while growing");
        h.push(event(17, 5));
        assert_eq!(h.capacity(), 16, "capped");
        // Much later, even the newest quarter is stale: halve.
        h.push(event(18, 1_000));
        assert_eq!(h.capacity(), 8);
        assert_eq!(h.len(), 8);
        assert_eq!(h.window_start(), 10);
    }

    #[test]
    fn delete_object_for_filtered_watchers_is_made_once() {
        let prev = CachedObject::new(
            json!({"metadata": {"name": "a", "resourceVersion": "3"}}),
            None,
        );
        let cur = CachedObject::new(
            json!({"metadata": {"name": "a", "resourceVersion": "7"}}),
            None,
        );
        let e = Event::new(
            7,
            EventType::Modified,
            Arc::from("a"),
            cur,
            Some(prev),
            Duration::ZERO,
        );
        let a = e.deleted_object().expect("has prev");
        let b = e.deleted_object().expect("has prev");
        assert!(a.ptr_eq(&b));
        assert_eq!(a.resource_version(), 7);
    }
}
