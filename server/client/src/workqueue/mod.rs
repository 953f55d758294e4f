//! The workqueue every controller pulls keys from: two sets and a FIFO, `add_after` on one
//! heap, and rate limiters (`docs/tricks.md` #17, the workqueue's dirty set, processing set
//! and FIFO, one heap for AddAfter; client-go `util/workqueue`).
//!
//! - [`queue`](self) core: a `dirty` set, a `processing` set and a FIFO give coalescing (an
//!   item added ten times before a worker takes it is synced once), mutual exclusion (an item
//!   is never held by two workers) and re-queue on race (an item added while it is being
//!   processed is synced once more after [`WorkQueue::done`]) with no other bookkeeping.
//! - `delaying`: [`WorkQueue::add_after`] puts items on one min-heap driven by one timer task,
//!   not a timer per item.
//! - [`rate_limiter`]: how long [`WorkQueue::add_rate_limited`] waits; the default is
//!   client-go's per-item exponential 5 ms → 1000 s maxed with a 10 qps / 100 burst bucket.
//! - [`metrics`]: client-go's `workqueue_*` metrics, labelled by queue name.
//!
//! A worker's loop is `get`, sync, then `forget` or `add_rate_limited`, then `done` (see
//! `skerry_controllers::runtime::process`). Every item handed out by `get` must be given back
//! with `done`, or it is never handed out again.
//!
//! One difference from client-go, on purpose: after [`WorkQueue::shut_down`], `get` returns
//! `None` at once even if items are still queued (client-go hands out the rest first). A
//! controller shuts its queue down when it loses its leader lease, and must then stop acting
//! instead of working through a backlog on a lease it no longer holds.

mod delaying;
pub mod metrics;
mod queue;
pub mod rate_limiter;

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::delaying::{DelayTarget, WaitingHeap, waiting_loop};
use self::metrics::{QueueMetrics, UnfinishedWork};
use self::queue::{Added, Queue};
pub use self::rate_limiter::{
    BucketRateLimiter, ItemExponentialFailureRateLimiter, MaxOfRateLimiter, RateLimiter,
    default_controller_rate_limiter,
};

/// Longest delay `add_after` honours; longer ones are cut to this. Far beyond any backoff (the
/// default limiter caps at 1000 s) and far from the overflow of `Instant + Duration`, which a
/// caller-chosen `Duration::MAX` would otherwise hit.
pub const ADD_AFTER_DELAY_MAX: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A rate-limited, delaying work queue of keys (client-go's `RateLimitingInterface`). Clones
/// share the queue.
pub struct WorkQueue<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        WorkQueue {
            shared: self.shared.clone(),
        }
    }
}

impl<T> std::fmt::Debug for WorkQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// The state behind the queue lock.
struct Locked<T> {
    queue: Queue<T>,
    /// Whether a `shut_down_with_drain` is waiting for processing to empty; `shut_down`
    /// clears it and so releases the waiters (client-go's `drain`).
    draining: bool,
}

struct Shared<T> {
    name: String,
    /// The FIFO and the two sets. A `parking_lot::Mutex`, not an async one: every critical
    /// section is a few map operations and never awaits; waiting is done on the `Notify`s.
    state: Mutex<Locked<T>>,
    /// Wakes one `get` per item pushed onto the FIFO, and every `get` on shutdown. A `Notify`
    /// rather than a channel because the items live in the FIFO; this only says "look again".
    item_ready: Notify,
    /// Wakes `shut_down_with_drain` when the processing set empties.
    processing_empty: Notify,
    /// The delayed items. Its own lock, so the timer never contends with `get`/`done`; the
    /// two locks are never held together.
    waiting: Mutex<WaitingHeap<T>>,
    /// Wakes the timer task when an item is scheduled before the current earliest.
    timer_wake: Arc<Notify>,
    /// Whether the timer task was spawned; it is spawned by the first delayed add, so a
    /// queue that never delays spawns nothing and may be built outside a runtime.
    timer_started: AtomicBool,
    /// Stops the timer task: cancelled on shutdown and when the last handle is dropped.
    stop: CancellationToken,
    limiter: Box<dyn RateLimiter<T>>,
    metrics: QueueMetrics,
}

impl<T: Hash + Eq + Clone + Send + Sync + std::fmt::Debug + 'static> WorkQueue<T> {
    /// A queue named `name` (the metrics' `name` label) with client-go's default controller
    /// rate limiter (max of per-item exponential 5 ms → 1000 s and a 10 qps / 100 burst bucket).
    pub fn new(name: &str) -> WorkQueue<T> {
        WorkQueue::with_rate_limiter(name, default_controller_rate_limiter())
    }

    /// A queue named `name` whose `add_rate_limited` asks `limiter` for its delays.
    pub fn with_rate_limiter(name: &str, limiter: impl RateLimiter<T> + 'static) -> WorkQueue<T> {
        let shared = Arc::new(Shared {
            name: name.to_string(),
            state: Mutex::new(Locked {
                queue: Queue::new(),
                draining: false,
            }),
            item_ready: Notify::new(),
            processing_empty: Notify::new(),
            waiting: Mutex::new(WaitingHeap::new()),
            timer_wake: Arc::new(Notify::new()),
            timer_started: AtomicBool::new(false),
            stop: CancellationToken::new(),
            limiter: Box::new(limiter),
            metrics: QueueMetrics::new(name),
        });
        let watched: std::sync::Weak<dyn UnfinishedWork> = Arc::downgrade(&shared) as _;
        QueueMetrics::watch_unfinished_work(watched);
        WorkQueue { shared }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Adds `item` (coalesced with a pending copy; held back while it is being processed).
    /// Ignored once the queue is shutting down.
    pub fn add(&self, item: T) {
        self.shared.add(item);
    }

    /// Adds `item` after `delay` (at once if `delay` is zero). If `item` already waits for a
    /// later time it is moved to the earlier one; if it waits for an earlier one this does
    /// nothing. Delays beyond [`ADD_AFTER_DELAY_MAX`] are cut to it. Outside a tokio runtime
    /// there is no timer to wait on, and the item is added at once.
    pub fn add_after(&self, item: T, delay: Duration) {
        if self.is_shutting_down() {
            return;
        }
        // client-go counts every `AddAfter` as a retry, whatever the delay.
        self.shared.metrics.retries.inc();
        if delay.is_zero() {
            self.add(item);
            return;
        }
        if !self.ensure_timer() {
            tracing::warn!(queue = %self.shared.name, ?item, ?delay, "no tokio runtime for the delay timer; adding at once");
            self.add(item);
            return;
        }
        let ready_at = Instant::now() + delay.min(ADD_AFTER_DELAY_MAX);
        let earliest_moved = self.shared.waiting.lock().insert(item, ready_at);
        if earliest_moved {
            self.shared.timer_wake.notify_one();
        }
    }

    /// Adds `item` after the rate limiter's delay for it.
    pub fn add_rate_limited(&self, item: T) {
        let delay = self.shared.limiter.when(&item);
        self.add_after(item, delay);
    }

    /// Forgets `item`'s failures (its per-item backoff starts over).
    pub fn forget(&self, item: &T) {
        self.shared.limiter.forget(item);
    }

    /// How many times `item` has been re-queued by `add_rate_limited`.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.shared.limiter.num_requeues(item)
    }

    /// The next item, marked as being processed; `None` once shut down. Waits while the queue
    /// is empty. Cancel-safe: a `get` dropped while waiting takes nothing.
    pub async fn get(&self) -> Option<T> {
        let shared = &*self.shared;
        loop {
            // Registered before the FIFO is looked at, so an add between the look and the
            // wait still wakes this waiter.
            let ready = shared.item_ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            {
                let mut state = shared.state.lock();
                if state.queue.is_shutting_down() {
                    return None;
                }
                if let Some((item, waited)) = state.queue.pop(Instant::now()) {
                    shared.metrics.depth.dec();
                    shared.metrics.queue_duration.observe(waited.as_secs_f64());
                    return Some(item);
                }
            }
            ready.await;
        }
    }

    /// Marks `item` as processed (re-queues it if it was added meanwhile). Does nothing for an
    /// item that was not handed out by `get`.
    pub fn done(&self, item: &T) {
        let shared = &*self.shared;
        let (finished, processing_left) = {
            let mut state = shared.state.lock();
            let finished = state.queue.done(item, Instant::now());
            if let Some(worked) = finished.worked {
                shared.metrics.work_duration.observe(worked.as_secs_f64());
            }
            (finished, state.queue.processing_len())
        };
        if finished.requeued {
            shared.item_ready.notify_one();
        }
        if processing_left == 0 {
            shared.processing_empty.notify_waiters();
        }
    }

    /// Items waiting (not counting those waiting for a delay, or being processed).
    pub fn len(&self) -> usize {
        self.shared.state.lock().queue.len()
    }

    /// Whether no item waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items handed out by `get` and not yet `done`.
    pub fn num_processing(&self) -> usize {
        self.shared.state.lock().queue.processing_len()
    }

    /// Stops handing out items; `get` returns `None` at once, to waiters too. Delayed items
    /// are dropped and the timer task stops. Releases a `shut_down_with_drain` in progress.
    pub fn shut_down(&self) {
        self.shared.shut_down(false);
    }

    /// Stops accepting items and waits until every item being processed is done. A worker
    /// must not call this while it holds an item itself: it would wait for itself.
    pub async fn shut_down_with_drain(&self) {
        let shared = &*self.shared;
        shared.shut_down(true);
        loop {
            let emptied = shared.processing_empty.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            {
                let state = shared.state.lock();
                if !state.draining || state.queue.processing_len() == 0 {
                    return;
                }
            }
            emptied.await;
        }
    }

    /// Whether the queue is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.state.lock().queue.is_shutting_down()
    }

    /// Spawns the timer task unless it runs already. False when there is no runtime to
    /// spawn it on.
    fn ensure_timer(&self) -> bool {
        if self.shared.timer_started.load(Ordering::Acquire) {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if !self.shared.timer_started.swap(true, Ordering::AcqRel) {
            runtime.spawn(waiting_loop(
                Arc::downgrade(&self.shared),
                self.shared.timer_wake.clone(),
                self.shared.stop.clone(),
            ));
        }
        true
    }
}

impl<T: Hash + Eq + Clone> Shared<T> {
    fn add(&self, item: T) {
        let added = {
            let mut state = self.state.lock();
            let added = state.queue.add(item, Instant::now());
            // Recorded under the lock, so `get`'s decrement never overtakes the increment.
            if matches!(added, Added::Queued | Added::HeldWhileProcessing) {
                self.metrics.adds.inc();
                self.metrics.depth.inc();
            }
            added
        };
        if added == Added::Queued {
            self.item_ready.notify_one();
        }
    }

    fn shut_down(&self, drain: bool) {
        {
            let mut state = self.state.lock();
            state.queue.shut_down();
            state.draining = drain;
        }
        self.stop.cancel();
        self.waiting.lock().clear();
        self.item_ready.notify_waiters();
        if !drain {
            self.processing_empty.notify_waiters();
        }
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> DelayTarget for Shared<T> {
    fn fire_ready(&self, now: Instant) -> Option<Instant> {
        let (ready, next) = {
            let mut waiting = self.waiting.lock();
            (waiting.pop_ready(now), waiting.next_ready_at())
        };
        for item in ready {
            self.add(item);
        }
        next
    }
}

impl<T: Hash + Eq + Clone + Send + Sync> UnfinishedWork for Shared<T> {
    fn update_unfinished_work(&self) {
        let (total, longest) = self.state.lock().queue.unfinished_work(Instant::now());
        self.metrics.unfinished_work.set(total);
        self.metrics.longest_running_processor.set(longest);
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        self.stop.cancel();
        self.metrics.unfinished_work.set(0.0);
        self.metrics.longest_running_processor.set(0.0);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::AtomicU64;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn alive_tasks() -> usize {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }

    /// `docs/tricks.md` #17: a key added three times while it is being processed is processed
    /// twice in total, not four times.
    #[tokio::test]
    async fn three_adds_while_processing_sync_twice() {
        let queue = WorkQueue::<String>::new("test-seed-example");
        queue.add("default/web".to_string());
        let key = queue.get().await.unwrap();
        let mut syncs = 1;
        for _ in 0..3 {
            queue.add(key.clone());
        }
        // Not handed out while the first worker holds it.
        assert_eq!(queue.len(), 0);
        queue.done(&key);
        while !queue.is_empty() {
            let key = queue.get().await.unwrap();
            syncs += 1;
            queue.done(&key);
        }
        assert_eq!(syncs, 2);
        // Two adds counted: the first, and the first of the three; the other two merged.
        assert_eq!(queue.shared.metrics.adds.get(), 2);
        assert_eq!(queue.shared.metrics.depth.get(), 0);
    }

    #[tokio::test]
    async fn coalesces_and_keeps_fifo_order() {
        let queue = WorkQueue::<&str>::new("test-fifo");
        for item in ["b", "a", "b", "c", "a", "b"] {
            queue.add(item);
        }
        assert_eq!(queue.len(), 3);
        let mut order = Vec::new();
        while !queue.is_empty() {
            let item = queue.get().await.unwrap();
            order.push(item);
            queue.done(&item);
        }
        assert_eq!(order, vec!["b", "a", "c"]);
    }

    #[tokio::test]
    async fn done_requeues_a_dirty_key_and_wakes_a_waiter() {
        let queue = WorkQueue::<&str>::new("test-requeue");
        queue.add("a");
        let held = queue.get().await.unwrap();
        let waiter = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        tokio::task::yield_now().await;
        queue.add("a");
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a second worker got the held key");
        queue.done(&held);
        assert_eq!(waiter.await.unwrap(), Some("a"));
    }

    /// Many producers and workers over a few keys: no key is ever held by two workers, and
    /// every key's last change is synced (nothing is lost to coalescing).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_workers_never_hold_the_same_key() {
        const KEYS: usize = 16;
        const ADDS_PER_PRODUCER: usize = 2_000;
        let queue = WorkQueue::<usize>::new("test-exclusion");
        let held = Arc::new(Mutex::new(HashSet::new()));
        let versions: Arc<Vec<AtomicU64>> =
            Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let seen: Arc<Mutex<HashMap<usize, u64>>> = Arc::default();
        let mut workers = Vec::new();
        for _ in 0..4 {
            let (queue, held, versions, seen) =
                (queue.clone(), held.clone(), versions.clone(), seen.clone());
            workers.push(tokio::spawn(async move {
                let mut syncs = 0u64;
                while let Some(key) = queue.get().await {
                    assert!(held.lock().insert(key), "key {key} held by two workers");
                    let version = versions[key].load(Ordering::SeqCst);
                    {
                        let mut seen = seen.lock();
                        let entry = seen.entry(key).or_insert(0);
                        *entry = (*entry).max(version);
                    }
                    tokio::task::yield_now().await;
                    assert!(held.lock().remove(&key));
                    queue.done(&key);
                    syncs += 1;
                }
                syncs
            }));
        }
        let mut producers = Vec::new();
        for producer in 0..4 {
            let (queue, versions) = (queue.clone(), versions.clone());
            producers.push(tokio::spawn(async move {
                for i in 0..ADDS_PER_PRODUCER {
                    let key = (i * 7 + producer) % KEYS;
                    versions[key].fetch_add(1, Ordering::SeqCst);
                    queue.add(key);
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for producer in producers {
            producer.await.unwrap();
        }
        while !(queue.is_empty() && queue.num_processing() == 0) {
            tokio::time::sleep(ms(1)).await;
        }
        queue.shut_down();
        let mut syncs = 0;
        for worker in workers {
            syncs += worker.await.unwrap();
        }
        let seen = seen.lock();
        for (key, version) in versions.iter().enumerate() {
            assert_eq!(
                seen.get(&key).copied(),
                Some(version.load(Ordering::SeqCst)),
                "key {key}'s last change was never synced"
            );
        }
        assert!(syncs <= (4 * ADDS_PER_PRODUCER) as u64);
        assert!(syncs >= KEYS as u64);
    }

    #[tokio::test]
    async fn shut_down_returns_none_to_waiters() {
        let queue = WorkQueue::<&str>::new("test-shutdown");
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let queue = queue.clone();
                tokio::spawn(async move { queue.get().await })
            })
            .collect();
        tokio::task::yield_now().await;
        queue.shut_down();
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap(), None);
        }
        assert!(queue.is_shutting_down());
        // Items are refused, and nothing more is handed out.
        queue.add("late");
        assert_eq!(queue.len(), 0);
        assert_eq!(queue.get().await, None);
    }

    #[tokio::test]
    async fn shut_down_stops_handing_out_queued_items() {
        let queue = WorkQueue::<&str>::new("test-shutdown-queued");
        queue.add("a");
        queue.add("b");
        queue.shut_down();
        assert_eq!(queue.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_in_flight_work() {
        let queue = WorkQueue::<&str>::new("test-drain");
        queue.add("a");
        queue.add("b");
        let a = queue.get().await.unwrap();
        let drain = tokio::spawn({
            let queue = queue.clone();
            async move { queue.shut_down_with_drain().await }
        });
        tokio::time::sleep(ms(100)).await;
        assert!(!drain.is_finished(), "drain returned with work in flight");
        assert!(queue.is_shutting_down());
        queue.add("c");
        assert_eq!(queue.get().await, None);
        queue.done(&a);
        tokio::time::timeout(ms(10), drain).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn drain_with_nothing_in_flight_returns_at_once() {
        let queue = WorkQueue::<&str>::new("test-drain-idle");
        queue.add("a");
        queue.shut_down_with_drain().await;
        assert_eq!(queue.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_releases_a_drain() {
        let queue = WorkQueue::<&str>::new("test-drain-released");
        queue.add("a");
        let _held = queue.get().await.unwrap();
        let drain = tokio::spawn({
            let queue = queue.clone();
            async move { queue.shut_down_with_drain().await }
        });
        tokio::time::sleep(ms(10)).await;
        assert!(!drain.is_finished());
        queue.shut_down();
        tokio::time::timeout(ms(10), drain).await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_fires_in_ready_order() {
        let queue = WorkQueue::<&str>::new("test-add-after");
        let start = Instant::now();
        queue.add_after("late", ms(30));
        queue.add_after("early", ms(10));
        queue.add_after("middle", ms(20));
        queue.add_after("now", Duration::ZERO);
        assert_eq!(queue.len(), 1);
        let mut fired = Vec::new();
        for _ in 0..4 {
            let item = queue.get().await.unwrap();
            fired.push((item, Instant::now().duration_since(start)));
            queue.done(&item);
        }
        assert_eq!(
            fired,
            vec![
                ("now", ms(0)),
                ("early", ms(10)),
                ("middle", ms(20)),
                ("late", ms(30))
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_keeps_the_earlier_time() {
        let queue = WorkQueue::<&str>::new("test-add-after-dedup");
        queue.add_after("a", ms(50));
        queue.add_after("a", ms(10));
        queue.add_after("a", ms(100));
        assert_eq!(queue.shared.waiting.lock().len(), 1);
        tokio::time::sleep(ms(11)).await;
        assert_eq!(queue.len(), 1);
        let a = queue.get().await.unwrap();
        queue.done(&a);
        // Neither the 50 ms nor the 100 ms request fires a second time.
        tokio::time::sleep(ms(200)).await;
        assert_eq!(queue.len(), 0);
    }

    /// `docs/tricks.md` #17: a thousand delayed items cost one timer task, not a thousand.
    #[tokio::test(start_paused = true)]
    async fn add_after_uses_one_timer_task() {
        let queue = WorkQueue::<u32>::new("test-one-timer");
        let before = alive_tasks();
        for item in 0..1_000 {
            queue.add_after(item, ms(1 + u64::from(item)));
        }
        assert_eq!(alive_tasks(), before + 1);
        tokio::time::sleep(ms(1_001)).await;
        assert_eq!(queue.len(), 1_000);
        // The timer stops with the queue.
        queue.shut_down();
        tokio::task::yield_now().await;
        assert_eq!(alive_tasks(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn timer_stops_when_the_queue_is_dropped() {
        let before = alive_tasks();
        let queue = WorkQueue::<u32>::new("test-timer-drop");
        queue.add_after(1, Duration::from_secs(60));
        assert_eq!(alive_tasks(), before + 1);
        drop(queue);
        tokio::task::yield_now().await;
        assert_eq!(alive_tasks(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_items_are_dropped_on_shutdown() {
        let queue = WorkQueue::<&str>::new("test-delay-shutdown");
        queue.add_after("a", ms(10));
        queue.shut_down();
        tokio::time::sleep(ms(20)).await;
        assert_eq!(queue.shared.state.lock().queue.len(), 0);
        queue.add_after("b", ms(1));
        assert_eq!(queue.shared.waiting.lock().len(), 0);
    }

    #[test]
    fn add_after_outside_a_runtime_adds_at_once() {
        let queue = WorkQueue::<&str>::new("test-no-runtime");
        queue.add_after("a", ms(10));
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn huge_delays_do_not_overflow() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let queue = WorkQueue::<&str>::new("test-huge-delay");
            queue.add_after("a", Duration::MAX);
            assert_eq!(queue.shared.waiting.lock().len(), 1);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn add_rate_limited_backs_off_per_item() {
        let queue = WorkQueue::<&str>::with_rate_limiter(
            "test-rate-limited",
            ItemExponentialFailureRateLimiter::new(ms(5), Duration::from_secs(1000)),
        );
        let start = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..3 {
            let before = Instant::now();
            queue.add_rate_limited("a");
            let item = queue.get().await.unwrap();
            delays.push(Instant::now().duration_since(before));
            queue.done(&item);
        }
        assert_eq!(delays, vec![ms(5), ms(10), ms(20)]);
        assert_eq!(queue.num_requeues(&"a"), 3);
        queue.forget(&"a");
        assert_eq!(queue.num_requeues(&"a"), 0);
        queue.add_rate_limited("a");
        let item = queue.get().await.unwrap();
        queue.done(&item);
        assert_eq!(Instant::now().duration_since(start), ms(40));
        assert_eq!(queue.shared.metrics.retries.get(), 4);
    }

    /// The value of the sample `series` (name and labels) in the text exposition `text`.
    fn sample(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
            .parse()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_adds_depth_latency_and_work() {
        let queue = WorkQueue::<&str>::new("test-metrics");
        let series = |metric: &str| format!("{metric}{{name=\"test-metrics\"}}");
        queue.add("a");
        queue.add("a");
        queue.add("b");
        let text = metrics::encode_text();
        assert_eq!(sample(&text, &series("workqueue_adds_total")), 2.0);
        assert_eq!(sample(&text, &series("workqueue_depth")), 2.0);

        tokio::time::sleep(ms(250)).await;
        let a = queue.get().await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let text = metrics::encode_text();
        assert_eq!(sample(&text, &series("workqueue_depth")), 1.0);
        assert_eq!(
            sample(&text, &series("workqueue_queue_duration_seconds_count")),
            1.0
        );
        assert_eq!(
            sample(&text, &series("workqueue_queue_duration_seconds_sum")),
            0.25
        );
        // "a" has been processing for 2 s; nothing else is.
        assert_eq!(
            sample(&text, &series("workqueue_unfinished_work_seconds")),
            2.0
        );
        assert_eq!(
            sample(
                &text,
                &series("workqueue_longest_running_processor_seconds")
            ),
            2.0
        );

        queue.done(&a);
        queue.add_after("c", ms(1));
        let text = metrics::encode_text();
        assert_eq!(
            sample(&text, &series("workqueue_work_duration_seconds_count")),
            1.0
        );
        assert_eq!(
            sample(&text, &series("workqueue_work_duration_seconds_sum")),
            2.0
        );
        assert_eq!(sample(&text, &series("workqueue_retries_total")), 1.0);
        assert_eq!(
            sample(&text, &series("workqueue_unfinished_work_seconds")),
            0.0
        );
        // The latency histogram uses client-go's buckets: 10 ns to 10 s by tens.
        assert!(
            text.contains(
                "workqueue_queue_duration_seconds_bucket{le=\"1.0\",name=\"test-metrics\"} 1"
            ) || text.contains(
                "workqueue_queue_duration_seconds_bucket{name=\"test-metrics\",le=\"1.0\"} 1"
            ),
            "{text}"
        );
    }
}
