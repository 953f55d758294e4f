//! The event recorder: how controllers emit core/v1 Events (client-go's `tools/record`), the
//! lines `kubectl describe` prints under "Events:" (ScalingReplicaSet, SuccessfulCreate,
//! FailedCreate, ...).
//!
//! It carries client-go's event machinery, next to the client library of `docs/tricks.md`
//! #15-21:
//! - [`EventRecorder::event`] never blocks and never fails: it builds the Event (named
//!   `<involvedObject name>.<hex Unix nanoseconds>`, in the involved object's namespace or
//!   `default`) and `try_send`s it into a bounded queue of [`INCOMING_QUEUE_EVENTS_MAX`]. When
//!   the queue is full the event is dropped and counted ([`RecorderStats::queue_full_dropped`]):
//!   events are best-effort diagnostics, and a controller must never stall its reconcile loop
//!   on them — a slow or unreachable apiserver must cost events, not replicas (client-go's
//!   broadcaster queue is `DropIfChannelFull` for the same reason).
//! - One [`EventWriter`] task owns the [`EventCorrelator`] and is the only writer, so the
//!   correlator needs no lock.
//! - The [`EventCorrelator`] (client-go's `events_cache.go`) does, in this order:
//!   1. aggregation: events that differ only in message, seen [`AGGREGATE_EVENTS_MAX`]
//!      distinct times within [`AGGREGATE_INTERVAL`], become one
//!      `"(combined from similar events): <message>"` event;
//!   2. deduplication: an event equal in (source, involvedObject, type, reason, message) to one
//!      already written PATCHes that event's `count`, `lastTimestamp` and `message` instead of
//!      creating a new object (an LRU of [`LRU_CACHE_ENTRIES_MAX`] entries remembers names);
//!   3. spam filtering: a token bucket per (source, involvedObject) of [`SPAM_BURST`] events
//!      refilled one per [`SPAM_REFILL_INTERVAL`].
//! - Writes: a PATCH that answers 404 (the event expired on the server) becomes a CREATE;
//!   transport errors, 429 and 5xx are retried [`WRITE_TRIES_MAX`] times [`WRITE_RETRY_SLEEP`]
//!   apart (the first sleep randomized so recorders do not retry in lockstep after an
//!   apiserver restart); any other API error drops the event.
//!
//! Invariants: `event()` does no I/O and takes no lock held across an await; every queue and
//! cache here is bounded by a named constant; the writer ends when every recorder clone is
//! dropped (after draining the queue) or on [`EventRecorder::shutdown`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use rand::Rng;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::api::{Api, Client, Patch, PatchParams, PostParams};
use crate::error::Error;

/// The event type of routine progress (`v1.EventTypeNormal`).
pub const EVENT_TYPE_NORMAL: &str = "Normal";
/// The event type of something a user should look at (`v1.EventTypeWarning`).
pub const EVENT_TYPE_WARNING: &str = "Warning";

/// Bound on events waiting for the writer (client-go's `maxQueuedEvents = 1000`). Larger
/// holds more of a burst through an apiserver outage at ~1 KiB each; smaller drops sooner.
/// Past it `event()` drops: a controller never waits for an event to be written.
pub const INCOMING_QUEUE_EVENTS_MAX: usize = 1000;

/// Entries in each of the correlator's three LRU caches (client-go's `maxLruCacheEntries`).
/// Bounds the recorder's memory to a few MiB however many objects it reports on; an object
/// evicted from the cache only loses deduplication (its next event is created afresh).
pub const LRU_CACHE_ENTRIES_MAX: usize = 4096;

/// Distinct messages of otherwise-equal events (same source, object, type, reason) seen
/// within [`AGGREGATE_INTERVAL`] after which they are combined into one event (client-go's
/// `defaultAggregateMaxEvents`): ten variants is past what a human reads one by one.
pub const AGGREGATE_EVENTS_MAX: usize = 10;

/// The window of [`AGGREGATE_EVENTS_MAX`]: a similar event seen less than this after the
/// previous one extends the group (client-go's `defaultAggregateIntervalInSeconds = 600`).
pub const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);

/// Events a source may emit about one object in a burst (client-go's `defaultSpamBurst`):
/// enough for a whole rollout's story, not enough for a crash-looping object to flood etcd.
pub const SPAM_BURST: u32 = 25;

/// One more event about an object is allowed per this interval once the burst is spent
/// (client-go's `defaultSpamQPS = 1/300`): the long tail of an always-unhealthy object costs
/// one write every five minutes.
pub const SPAM_REFILL_INTERVAL: Duration = Duration::from_secs(300);

/// Attempts to write one event before it is abandoned (client-go's `maxTriesPerEvent`).
pub const WRITE_TRIES_MAX: u32 = 12;

/// Pause between write attempts (client-go's `defaultSleepDuration`); with
/// [`WRITE_TRIES_MAX`] an event survives about two minutes of apiserver outage.
pub const WRITE_RETRY_SLEEP: Duration = Duration::from_secs(10);

/// The prefix of an aggregated event's message (client-go's
/// `EventAggregatorByReasonMessageFunc`).
pub const AGGREGATE_MESSAGE_PREFIX: &str = "(combined from similar events): ";

/// Where events about cluster-scoped objects (Nodes, Namespaces) live
/// (`metav1.NamespaceDefault`, as client-go's `makeEvent`).
pub const EVENT_NAMESPACE_CLUSTER_SCOPED: &str = "default";

/// Separates the fields of a cache key. client-go joins them with "", which lets
/// `("ab","c")` and `("a","bc")` collide; NUL appears in no Kubernetes name or reason.
const KEY_SEPARATOR: &str = "\u{0}";

/// Wall time for the correlator and event timestamps; injectable so tests can move it.
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// An `ObjectReference` to `obj` (client-go's `reference.GetReference`): apiVersion and kind
/// from the Rust type, namespace, name, uid and resourceVersion from its metadata.
pub fn object_reference<K>(obj: &K) -> ObjectReference
where
    K: k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta>,
{
    object_reference_from_meta(K::API_VERSION, K::KIND, obj.metadata())
}

/// An `ObjectReference` from an apiVersion, a kind and metadata, for objects whose type is
/// known only at run time (e.g. a [`crate::PartialObjectMetadata`]'s own `api_version` and
/// `kind`).
pub fn object_reference_from_meta(
    api_version: &str,
    kind: &str,
    meta: &ObjectMeta,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.to_string()),
        kind: Some(kind.to_string()),
        namespace: meta.namespace.clone().filter(|ns| !ns.is_empty()),
        name: meta.name.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    }
}

/// The name client-go gives an event: `<involvedObject name>.<Unix nanoseconds in hex>`.
pub fn event_name(involved_object_name: &str, at: SystemTime) -> String {
    let nanos = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{involved_object_name}.{nanos:x}")
}

/// A `meta/v1` Time (second precision on the wire) of `at`.
fn to_time(at: SystemTime) -> Time {
    Time(Timestamp::try_from(at).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The Event client-go's `makeEvent` builds: count 1, first = last timestamp = `at`, in the
/// involved object's namespace (or `default` for a cluster-scoped object).
pub fn make_event(
    source: &EventSource,
    object: &ObjectReference,
    type_: &str,
    reason: &str,
    message: &str,
    at: SystemTime,
) -> Event {
    let namespace = match object.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ => EVENT_NAMESPACE_CLUSTER_SCOPED.to_string(),
    };
    let time = to_time(at);
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(object.name.as_deref().unwrap_or_default(), at)),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        involved_object: object.clone(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        first_timestamp: Some(time.clone()),
        last_timestamp: Some(time),
        count: Some(1),
        type_: Some(type_.to_string()),
        source: Some(source.clone()),
        reporting_component: source.component.clone(),
        reporting_instance: Some(source.host.clone().unwrap_or_default()),
        ..Event::default()
    }
}

// ---------------------------------------------------------------------------------------
// The correlator: pure, clock-driven, owned by the writer task.
// ---------------------------------------------------------------------------------------

/// A least-recently-used map of at most `entries_max` entries. `O(log n)` per operation:
/// a map from key to (value, stamp) and an ordered map from stamp to key.
#[derive(Debug)]
struct Lru<V> {
    entries: HashMap<String, (V, u64)>,
    by_stamp: BTreeMap<u64, String>,
    next_stamp: u64,
    entries_max: usize,
}

impl<V> Lru<V> {
    fn new(entries_max: usize) -> Lru<V> {
        assert!(entries_max > 0, "an LRU of 0 entries cannot hold anything");
        Lru {
            entries: HashMap::new(),
            by_stamp: BTreeMap::new(),
            next_stamp: 0,
            entries_max,
        }
    }

    /// The value of `key`, marked most recently used.
    fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let stamp = self.next_stamp;
        let (value, old) = self.entries.get_mut(key)?;
        self.by_stamp.remove(old);
        *old = stamp;
        self.by_stamp.insert(stamp, key.to_string());
        self.next_stamp += 1;
        Some(value)
    }

    /// Inserts or replaces `key`, evicting the least recently used entry past the bound.
    fn put(&mut self, key: String, value: V) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some((_, old)) = self.entries.insert(key.clone(), (value, stamp)) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(stamp, key);
        while self.entries.len() > self.entries_max {
            let Some((_, oldest)) = self.by_stamp.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        debug_assert_eq!(self.entries.len(), self.by_stamp.len());
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The correlator's tunables; [`Default`] is client-go's `NewEventCorrelator`.
#[derive(Clone, Debug)]
pub struct CorrelatorOptions {
    /// See [`LRU_CACHE_ENTRIES_MAX`].
    pub lru_cache_entries_max: usize,
    /// See [`AGGREGATE_EVENTS_MAX`].
    pub aggregate_events_max: usize,
    /// See [`AGGREGATE_INTERVAL`].
    pub aggregate_interval: Duration,
    /// See [`SPAM_BURST`].
    pub spam_burst: u32,
    /// See [`SPAM_REFILL_INTERVAL`].
    pub spam_refill_interval: Duration,
}

impl Default for CorrelatorOptions {
    fn default() -> CorrelatorOptions {
        CorrelatorOptions {
            lru_cache_entries_max: LRU_CACHE_ENTRIES_MAX,
            aggregate_events_max: AGGREGATE_EVENTS_MAX,
            aggregate_interval: AGGREGATE_INTERVAL,
            spam_burst: SPAM_BURST,
            spam_refill_interval: SPAM_REFILL_INTERVAL,
        }
    }
}

/// Similar events seen in the current aggregation window.
#[derive(Debug)]
struct AggregateRecord {
    /// The distinct messages seen; never more than `aggregate_events_max - 1` between calls.
    /// Ordered (client-go uses a Go set and `PopAny`) so which message leaves is
    /// deterministic.
    messages: BTreeSet<String>,
    last_seen: SystemTime,
}

/// What the correlator remembers of an event it has written (client-go's `eventLog`).
#[derive(Clone, Debug)]
struct EventLog {
    count: i32,
    first_timestamp: Option<Time>,
    name: String,
    resource_version: Option<String>,
}

/// A token bucket refilled continuously (golang.org/x/time/rate, which client-go's
/// `NewTokenBucketPassiveRateLimiterWithClock` wraps); starts full.
#[derive(Debug)]
struct SpamBucket {
    tokens: f64,
    last: SystemTime,
}

impl SpamBucket {
    fn try_accept(&mut self, now: SystemTime, burst: u32, refill_interval: Duration) -> bool {
        // A clock that went backwards refills nothing (and does not move `last` back).
        let elapsed = now.duration_since(self.last).unwrap_or_default();
        if now > self.last {
            self.last = now;
        }
        let refill = if refill_interval.is_zero() {
            f64::from(burst)
        } else {
            elapsed.as_secs_f64() / refill_interval.as_secs_f64()
        };
        self.tokens = (self.tokens + refill).min(f64::from(burst));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// An event the correlator lets through, and how to write it.
#[derive(Clone, Debug)]
pub struct Correlated {
    /// The event to create (or whose `count`/`lastTimestamp`/`message` to patch).
    pub event: Event,
    /// `Some`: PATCH the existing event `event.metadata.name` with this strategic merge
    /// patch (`count`, `lastTimestamp`, `message`); `None`: CREATE `event`.
    pub patch: Option<Value>,
    /// The key to hand back to [`EventCorrelator::update_state`] with the server's answer.
    pub key: String,
}

/// client-go's `EventCorrelator`: aggregation, deduplication and spam filtering of events
/// before they are written. Pure logic over a [`Clock`]; the [`EventWriter`] owns it.
pub struct EventCorrelator {
    options: CorrelatorOptions,
    clock: Arc<dyn Clock>,
    /// Aggregation groups by (source, object, type, reason, reporting controller/instance).
    aggregates: Lru<AggregateRecord>,
    /// Written events by their full key (or the aggregation key for combined events).
    logs: Lru<EventLog>,
    /// Spam token buckets by (source, object).
    spam: Lru<SpamBucket>,
}

impl std::fmt::Debug for EventCorrelator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventCorrelator")
            .field("options", &self.options)
            .field("aggregates", &self.aggregates.len())
            .field("logs", &self.logs.len())
            .field("spam", &self.spam.len())
            .finish()
    }
}

fn source_parts(event: &Event) -> [&str; 2] {
    let source = event.source.as_ref();
    [
        source
            .and_then(|s| s.component.as_deref())
            .unwrap_or_default(),
        source.and_then(|s| s.host.as_deref()).unwrap_or_default(),
    ]
}

/// client-go's `getEventKey`: source, involved object (with fieldPath), type, reason, message.
fn event_key(event: &Event) -> String {
    let o = &event.involved_object;
    let [component, host] = source_parts(event);
    [
        component,
        host,
        o.kind.as_deref().unwrap_or_default(),
        o.namespace.as_deref().unwrap_or_default(),
        o.name.as_deref().unwrap_or_default(),
        o.field_path.as_deref().unwrap_or_default(),
        o.uid.as_deref().unwrap_or_default(),
        o.api_version.as_deref().unwrap_or_default(),
        event.type_.as_deref().unwrap_or_default(),
        event.reason.as_deref().unwrap_or_default(),
        event.message.as_deref().unwrap_or_default(),
    ]
    .join(KEY_SEPARATOR)
}

/// client-go's `getSpamKey`: source and involved object (not type or reason: the budget is
/// per object).
fn spam_key(event: &Event) -> String {
    let o = &event.involved_object;
    let [component, host] = source_parts(event);
    [
        component,
        host,
        o.kind.as_deref().unwrap_or_default(),
        o.namespace.as_deref().unwrap_or_default(),
        o.name.as_deref().unwrap_or_default(),
        o.uid.as_deref().unwrap_or_default(),
        o.api_version.as_deref().unwrap_or_default(),
    ]
    .join(KEY_SEPARATOR)
}

/// client-go's `EventAggregatorByReasonFunc`: the aggregation key (everything but the
/// message) and the local key (the message).
fn aggregate_key(event: &Event) -> (String, String) {
    let o = &event.involved_object;
    let [component, host] = source_parts(event);
    let key = [
        component,
        host,
        o.kind.as_deref().unwrap_or_default(),
        o.namespace.as_deref().unwrap_or_default(),
        o.name.as_deref().unwrap_or_default(),
        o.uid.as_deref().unwrap_or_default(),
        o.api_version.as_deref().unwrap_or_default(),
        event.type_.as_deref().unwrap_or_default(),
        event.reason.as_deref().unwrap_or_default(),
        event.reporting_component.as_deref().unwrap_or_default(),
        event.reporting_instance.as_deref().unwrap_or_default(),
    ]
    .join(KEY_SEPARATOR);
    (key, event.message.clone().unwrap_or_default())
}

impl EventCorrelator {
    /// A correlator with `options`, reading time from `clock`.
    ///
    /// # Panics
    /// If `options.lru_cache_entries_max` is 0.
    pub fn new(options: CorrelatorOptions, clock: Arc<dyn Clock>) -> EventCorrelator {
        let entries_max = options.lru_cache_entries_max;
        EventCorrelator {
            options,
            clock,
            aggregates: Lru::new(entries_max),
            logs: Lru::new(entries_max),
            spam: Lru::new(entries_max),
        }
    }

    /// Aggregates, counts and filters `event` (client-go's `EventCorrelate`): `None` when the
    /// spam filter drops it, otherwise the event to write and whether to create or patch.
    ///
    /// As in client-go the spam filter runs last, so a dropped duplicate still counts:
    /// the next one that passes carries the true number of occurrences.
    pub fn correlate(&mut self, event: Event) -> Option<Correlated> {
        let now = self.clock.now();
        let (event, key) = self.aggregate(event, now);
        let (event, patch) = self.observe(event, &key);
        if self.spam_filtered(&event, now) {
            return None;
        }
        Some(Correlated { event, patch, key })
    }

    /// Records the server's copy of a written event (its name and resourceVersion) under the
    /// key [`Correlated::key`] returned. client-go recomputes the key from the server's
    /// event, which for a combined event differs from the aggregation key it was observed
    /// under; keying by the returned key keeps the two in step.
    pub fn update_state(&mut self, key: &str, written: &Event) {
        self.logs.put(
            key.to_string(),
            EventLog {
                count: written.count.unwrap_or(1),
                first_timestamp: written.first_timestamp.clone(),
                name: written.metadata.name.clone().unwrap_or_default(),
                resource_version: written.metadata.resource_version.clone(),
            },
        );
    }

    /// client-go's `EventAggregator.EventAggregate`: the event unchanged and its full key, or
    /// a combined event and the aggregation key once the group holds
    /// `aggregate_events_max` distinct messages.
    fn aggregate(&mut self, event: Event, now: SystemTime) -> (Event, String) {
        let full_key = event_key(&event);
        let (group_key, message) = aggregate_key(&event);
        let interval = self.options.aggregate_interval;
        // A clock that went backwards counts as no time passing.
        let window_open = self
            .aggregates
            .get_mut(&group_key)
            .is_some_and(|r| now.duration_since(r.last_seen).unwrap_or_default() <= interval);
        if !window_open {
            self.aggregates.put(
                group_key.clone(),
                AggregateRecord {
                    messages: BTreeSet::new(),
                    last_seen: now,
                },
            );
        }
        let Some(record) = self.aggregates.get_mut(&group_key) else {
            // Just inserted into a cache of at least one entry.
            return (event, full_key);
        };
        record.messages.insert(message);
        record.last_seen = now;
        if record.messages.len() < self.options.aggregate_events_max {
            return (event, full_key);
        }
        // Do not let the group grow past the threshold.
        record.messages.pop_first();

        let time = to_time(now);
        let message = format!(
            "{AGGREGATE_MESSAGE_PREFIX}{}",
            event.message.as_deref().unwrap_or_default()
        );
        let combined = Event {
            metadata: ObjectMeta {
                name: Some(event_name(
                    event.involved_object.name.as_deref().unwrap_or_default(),
                    now,
                )),
                namespace: event.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            count: Some(1),
            first_timestamp: Some(time.clone()),
            last_timestamp: Some(time),
            message: Some(message),
            involved_object: event.involved_object,
            type_: event.type_,
            reason: event.reason,
            source: event.source,
            // client-go leaves these empty on the combined event; the apiserver then reports
            // no controller. Carry them so `kubectl events` shows who combined it.
            reporting_component: event.reporting_component,
            reporting_instance: event.reporting_instance,
            ..Event::default()
        };
        (combined, group_key)
    }

    /// client-go's `eventLogger.eventObserve`: a repeat of a written event takes its name,
    /// resourceVersion and firstTimestamp, counts one more, and is written as a patch.
    fn observe(&mut self, mut event: Event, key: &str) -> (Event, Option<Value>) {
        let mut patch = None;
        if let Some(last) = self.logs.get_mut(key).filter(|l| l.count > 0) {
            event.metadata.name = Some(last.name.clone());
            event.metadata.resource_version = last.resource_version.clone();
            event.first_timestamp = last.first_timestamp.clone();
            event.count = Some(last.count.saturating_add(1));
            // What client-go's two-way strategic merge patch against a copy with count 0,
            // lastTimestamp at the epoch and no message comes to.
            patch = Some(json!({
                "count": event.count,
                "lastTimestamp": event.last_timestamp,
                "message": event.message,
            }));
        }
        self.logs.put(
            key.to_string(),
            EventLog {
                count: event.count.unwrap_or(1),
                first_timestamp: event.first_timestamp.clone(),
                name: event.metadata.name.clone().unwrap_or_default(),
                resource_version: event.metadata.resource_version.clone(),
            },
        );
        (event, patch)
    }

    /// client-go's `EventSourceObjectSpamFilter.Filter`: `true` when the object's bucket is
    /// empty.
    fn spam_filtered(&mut self, event: &Event, now: SystemTime) -> bool {
        let key = spam_key(event);
        let (burst, refill) = (self.options.spam_burst, self.options.spam_refill_interval);
        if let Some(bucket) = self.spam.get_mut(&key) {
            return !bucket.try_accept(now, burst, refill);
        }
        let mut bucket = SpamBucket {
            tokens: f64::from(burst),
            last: now,
        };
        let accepted = bucket.try_accept(now, burst, refill);
        self.spam.put(key, bucket);
        !accepted
    }
}

// ---------------------------------------------------------------------------------------
// The recorder and its writer task.
// ---------------------------------------------------------------------------------------

/// Counters of what the recorder did not write (all monotonic).
#[derive(Debug, Default)]
pub struct RecorderStats {
    queue_full_dropped: AtomicU64,
    spam_filtered: AtomicU64,
    write_failed: AtomicU64,
    invalid_type_dropped: AtomicU64,
}

impl RecorderStats {
    /// Events dropped by `event()` because the queue was full.
    pub fn queue_full_dropped(&self) -> u64 {
        self.queue_full_dropped.load(Ordering::Relaxed)
    }
    /// Events dropped by the spam filter.
    pub fn spam_filtered(&self) -> u64 {
        self.spam_filtered.load(Ordering::Relaxed)
    }
    /// Events abandoned after a rejected write or [`WRITE_TRIES_MAX`] failed ones.
    pub fn write_failed(&self) -> u64 {
        self.write_failed.load(Ordering::Relaxed)
    }
    /// Events dropped because their type was neither `Normal` nor `Warning`.
    pub fn invalid_type_dropped(&self) -> u64 {
        self.invalid_type_dropped.load(Ordering::Relaxed)
    }
}

/// Tunables of a recorder; [`RecorderOptions::new`] gives client-go's defaults.
#[derive(Clone)]
pub struct RecorderOptions {
    /// The reporting component (`source.component`, `reportingComponent`), e.g.
    /// `deployment-controller`.
    pub component: String,
    /// The reporting host (`source.host`, `reportingInstance`): the node name for a kubelet,
    /// `None` for controllers (as kube-controller-manager's recorders).
    pub host: Option<String>,
    /// See [`INCOMING_QUEUE_EVENTS_MAX`].
    pub queue_events_max: usize,
    /// The correlator's tunables.
    pub correlator: CorrelatorOptions,
    /// See [`WRITE_TRIES_MAX`].
    pub write_tries_max: u32,
    /// See [`WRITE_RETRY_SLEEP`].
    pub write_retry_sleep: Duration,
    /// The clock for event timestamps and the correlator.
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for RecorderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecorderOptions")
            .field("component", &self.component)
            .field("host", &self.host)
            .field("queue_events_max", &self.queue_events_max)
            .field("correlator", &self.correlator)
            .field("write_tries_max", &self.write_tries_max)
            .field("write_retry_sleep", &self.write_retry_sleep)
            .finish_non_exhaustive()
    }
}

impl RecorderOptions {
    /// client-go's defaults for `component`.
    pub fn new(component: &str) -> RecorderOptions {
        RecorderOptions {
            component: component.to_string(),
            host: None,
            queue_events_max: INCOMING_QUEUE_EVENTS_MAX,
            correlator: CorrelatorOptions::default(),
            write_tries_max: WRITE_TRIES_MAX,
            write_retry_sleep: WRITE_RETRY_SLEEP,
            clock: Arc::new(SystemClock),
        }
    }
}

/// What the writer task receives.
enum Message {
    Event(Box<Event>),
    /// Answered once everything queued before it has been written or given up.
    Flush(oneshot::Sender<()>),
}

/// Emits Events for one component. Cheap to clone; clones share the queue and the writer.
#[derive(Clone)]
pub struct EventRecorder {
    inner: Arc<RecorderInner>,
}

struct RecorderInner {
    /// Bounded so a stalled writer costs dropped events, never memory or a blocked
    /// controller; `event()` only ever `try_send`s on it.
    queue: mpsc::Sender<Message>,
    source: EventSource,
    clock: Arc<dyn Clock>,
    stats: Arc<RecorderStats>,
    /// Ends the writer at once, abandoning queued events and retries.
    stop: CancellationToken,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("source", &self.inner.source)
            .field("stats", &self.inner.stats)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder for `component` (e.g. `deployment-controller`) with client-go's defaults,
    /// its writer spawned on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(client: Client, component: &str) -> EventRecorder {
        let (recorder, writer) =
            EventRecorder::with_options(client, RecorderOptions::new(component));
        tokio::spawn(writer.run());
        recorder
    }

    /// A recorder and its writer, not yet running: spawn [`EventWriter::run`].
    ///
    /// # Panics
    /// If `options.queue_events_max` or `options.correlator.lru_cache_entries_max` is 0.
    pub fn with_options(client: Client, options: RecorderOptions) -> (EventRecorder, EventWriter) {
        assert!(
            options.queue_events_max > 0,
            "the event queue needs room for one event"
        );
        let (queue, receiver) = mpsc::channel(options.queue_events_max);
        let stats = Arc::new(RecorderStats::default());
        let stop = CancellationToken::new();
        let source = EventSource {
            component: Some(options.component.clone()),
            host: options.host.clone(),
        };
        let writer = EventWriter {
            client,
            receiver,
            correlator: EventCorrelator::new(options.correlator.clone(), options.clock.clone()),
            stats: stats.clone(),
            stop: stop.clone(),
            write_tries_max: options.write_tries_max.max(1),
            write_retry_sleep: options.write_retry_sleep,
        };
        let recorder = EventRecorder {
            inner: Arc::new(RecorderInner {
                queue,
                source,
                clock: options.clock,
                stats,
                stop,
            }),
        };
        (recorder, writer)
    }

    /// Records an event about `object` (see [`object_reference`]): `type_` is
    /// [`EVENT_TYPE_NORMAL`] or [`EVENT_TYPE_WARNING`], `reason` a short UpperCamelCase
    /// machine-readable word (`SuccessfulCreate`), `message` the human sentence.
    ///
    /// Never blocks and never fails: the event is queued for the writer, or dropped and
    /// counted when the queue is full or the type is invalid.
    pub fn event(&self, object: &ObjectReference, type_: &str, reason: &str, message: &str) {
        if type_ != EVENT_TYPE_NORMAL && type_ != EVENT_TYPE_WARNING {
            self.inner
                .stats
                .invalid_type_dropped
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(type_, reason, "unsupported event type, event dropped");
            return;
        }
        let event = make_event(
            &self.inner.source,
            object,
            type_,
            reason,
            message,
            self.inner.clock.now(),
        );
        match self.inner.queue.try_send(Message::Event(Box::new(event))) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let dropped = self
                    .inner
                    .stats
                    .queue_full_dropped
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                // Log the 1st, 2nd, 4th, 8th... drop: a flood of drops must not become a
                // flood of log lines.
                if dropped.is_power_of_two() {
                    tracing::warn!(dropped, reason, "event queue full, events dropped");
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::debug!(reason, "event recorder shut down, event dropped");
            }
        }
    }

    /// Waits until every event queued before this call has been written, filtered or given
    /// up (at most [`WRITE_TRIES_MAX`] × [`WRITE_RETRY_SLEEP`] per event while the apiserver
    /// is unreachable). Returns at once if the writer is not running any more. For tests
    /// and graceful shutdown; controllers never need it.
    pub async fn flush(&self) {
        let (done, answered) = oneshot::channel();
        let sent = tokio::select! {
            sent = self.inner.queue.send(Message::Flush(done)) => sent.is_ok(),
            () = self.inner.stop.cancelled() => false,
        };
        if sent {
            tokio::select! {
                _ = answered => {}
                () = self.inner.stop.cancelled() => {}
            }
        }
    }

    /// Stops the writer now (client-go's `Broadcaster.Shutdown`): queued events and retries
    /// are abandoned. Dropping every clone instead lets the writer drain the queue first.
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
    }

    /// What was dropped, and why.
    pub fn stats(&self) -> &RecorderStats {
        &self.inner.stats
    }

    /// The `source` this recorder stamps on its events.
    pub fn source(&self) -> &EventSource {
        &self.inner.source
    }
}

/// The one task that writes a recorder's events (client-go's `recordToSink` loop).
pub struct EventWriter {
    client: Client,
    receiver: mpsc::Receiver<Message>,
    /// Owned by this task alone: no lock.
    correlator: EventCorrelator,
    stats: Arc<RecorderStats>,
    stop: CancellationToken,
    write_tries_max: u32,
    write_retry_sleep: Duration,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("correlator", &self.correlator)
            .finish_non_exhaustive()
    }
}

/// How one write attempt ended.
enum Attempt {
    Done,
    Retry(Error),
}

impl EventWriter {
    /// Writes queued events until every recorder clone is dropped (and the queue is drained)
    /// or [`EventRecorder::shutdown`] is called.
    pub async fn run(mut self) {
        loop {
            let message = tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                message = self.receiver.recv() => message,
            };
            match message {
                None => return,
                Some(Message::Flush(done)) => {
                    let _ = done.send(());
                }
                Some(Message::Event(event)) => self.record(*event).await,
            }
        }
    }

    /// Correlates and writes one event, retrying what is worth retrying.
    async fn record(&mut self, event: Event) {
        let Some(correlated) = self.correlator.correlate(event) else {
            self.stats.spam_filtered.fetch_add(1, Ordering::Relaxed);
            return;
        };
        tracing::debug!(
            namespace = correlated.event.metadata.namespace.as_deref(),
            object = correlated.event.involved_object.name.as_deref(),
            type_ = correlated.event.type_.as_deref(),
            reason = correlated.event.reason.as_deref(),
            message = correlated.event.message.as_deref(),
            count = correlated.event.count,
            "event"
        );
        for attempt in 1..=self.write_tries_max {
            let error = match self.write(&correlated).await {
                Attempt::Done => return,
                Attempt::Retry(e) => e,
            };
            if attempt == self.write_tries_max {
                self.stats.write_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %error, "failed to write event (retry limit exceeded)");
                return;
            }
            // The first pause is randomized so that every recorder of every component does
            // not retry in lockstep after an apiserver restart.
            let sleep = if attempt == 1 {
                self.write_retry_sleep.mul_f64(rand::rng().random::<f64>())
            } else {
                self.write_retry_sleep
            };
            tracing::warn!(error = %error, attempt, "failed to write event, will retry");
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = self.stop.cancelled() => return,
            }
        }
    }

    /// One attempt: PATCH a repeat (CREATE instead if it has expired), or CREATE.
    async fn write(&mut self, correlated: &Correlated) -> Attempt {
        let namespace = correlated
            .event
            .metadata
            .namespace
            .as_deref()
            .unwrap_or(EVENT_NAMESPACE_CLUSTER_SCOPED);
        let api: Api<Event> = self.client.api(Some(namespace));
        let mut result = None;
        if let Some(patch) = &correlated.patch {
            let name = correlated
                .event
                .metadata
                .name
                .as_deref()
                .unwrap_or_default();
            let patch = Patch::Strategic(patch.clone());
            match api.patch(name, &PatchParams::default(), &patch).await {
                // The event expired on the server (or was deleted): create it again below.
                Err(e) if e.is_not_found() => {}
                other => result = Some(other),
            }
        }
        let result = match result {
            Some(result) => result,
            None => {
                let mut event = correlated.event.clone();
                event.metadata.resource_version = None;
                api.create(&PostParams::default(), &event).await
            }
        };
        match result {
            Ok(written) => {
                self.correlator.update_state(&correlated.key, &written);
                Attempt::Done
            }
            // client-go's `recordToSink` retries only what could not be delivered: the rest
            // client (ours too, `api::RETRY_AFTER_RETRIES_MAX`) has already retried 429 and
            // 5xx with Retry-After, and any answer the server gave is final.
            Err(e @ Error::Transport(_)) => Attempt::Retry(e),
            Err(e) => {
                self.stats.write_failed.fetch_add(1, Ordering::Relaxed);
                if e.is_already_exists() {
                    tracing::debug!(error = %e, "server rejected event (will not retry)");
                } else {
                    tracing::warn!(error = %e, "server rejected event (will not retry)");
                }
                Attempt::Done
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Node;
    use parking_lot::Mutex;

    /// A clock tests move by hand.
    struct FakeClock(Mutex<SystemTime>);

    impl FakeClock {
        fn new() -> Arc<FakeClock> {
            Arc::new(FakeClock(Mutex::new(
                UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            )))
        }
        fn advance(&self, by: Duration) {
            *self.0.lock() += by;
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> SystemTime {
            *self.0.lock()
        }
    }

    fn source() -> EventSource {
        EventSource {
            component: Some("deployment-controller".into()),
            host: None,
        }
    }

    fn deployment_ref(name: &str) -> ObjectReference {
        let mut d = Deployment::default();
        d.metadata.name = Some(name.into());
        d.metadata.namespace = Some("prod".into());
        d.metadata.uid = Some(format!("uid-{name}"));
        d.metadata.resource_version = Some("42".into());
        object_reference(&d)
    }

    fn ev(clock: &FakeClock, object: &ObjectReference, reason: &str, message: &str) -> Event {
        make_event(
            &source(),
            object,
            EVENT_TYPE_NORMAL,
            reason,
            message,
            clock.now(),
        )
    }

    fn correlator(clock: &Arc<FakeClock>) -> EventCorrelator {
        EventCorrelator::new(CorrelatorOptions::default(), clock.clone())
    }

    /// Plays the server: every written event gets a resourceVersion.
    fn written(c: &Correlated) -> Event {
        let mut e = c.event.clone();
        e.metadata.resource_version = Some("7".into());
        e
    }

    #[test]
    fn object_reference_carries_type_and_metadata() {
        let r = deployment_ref("web");
        assert_eq!(r.api_version.as_deref(), Some("apps/v1"));
        assert_eq!(r.kind.as_deref(), Some("Deployment"));
        assert_eq!(r.namespace.as_deref(), Some("prod"));
        assert_eq!(r.name.as_deref(), Some("web"));
        assert_eq!(r.uid.as_deref(), Some("uid-web"));
        assert_eq!(r.resource_version.as_deref(), Some("42"));
    }

    #[test]
    fn event_fields_name_and_namespace() {
        let at = UNIX_EPOCH + Duration::from_nanos(0x1234_5678_9abc);
        let e = make_event(
            &source(),
            &deployment_ref("web"),
            EVENT_TYPE_WARNING,
            "R",
            "m",
            at,
        );
        assert_eq!(e.metadata.name.as_deref(), Some("web.123456789abc"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("prod"));
        assert_eq!(e.count, Some(1));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.first_timestamp, e.last_timestamp);
        assert_eq!(
            e.reporting_component.as_deref(),
            Some("deployment-controller")
        );

        // A cluster-scoped object's events live in `default`.
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        let e = make_event(&source(), &object_reference(&node), "Normal", "R", "m", at);
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.involved_object.namespace, None);
        assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
    }

    #[test]
    fn repeats_patch_the_first_event_with_a_growing_count() {
        let clock = FakeClock::new();
        let mut c = correlator(&clock);
        let web = deployment_ref("web");

        let first = c
            .correlate(ev(&clock, &web, "ScalingReplicaSet", "up to 3"))
            .unwrap();
        assert!(first.patch.is_none(), "the first occurrence is created");
        let name = first.event.metadata.name.clone().unwrap();
        c.update_state(&first.key, &written(&first));

        for count in 2..=3 {
            clock.advance(Duration::from_secs(1));
            let again = c
                .correlate(ev(&clock, &web, "ScalingReplicaSet", "up to 3"))
                .unwrap();
            assert_eq!(again.event.metadata.name.as_deref(), Some(name.as_str()));
            assert_eq!(again.event.count, Some(count));
            assert_eq!(again.event.first_timestamp, first.event.first_timestamp);
            assert_eq!(again.event.metadata.resource_version.as_deref(), Some("7"));
            let patch = again.patch.clone().unwrap();
            assert_eq!(patch["count"], json!(count));
            assert_eq!(patch["message"], json!("up to 3"));
            assert_eq!(
                patch["lastTimestamp"],
                serde_json::to_value(to_time(clock.now())).unwrap()
            );
            c.update_state(&again.key, &written(&again));
        }

        // A different message, type or object is a different event.
        let other = c
            .correlate(ev(&clock, &web, "ScalingReplicaSet", "down to 1"))
            .unwrap();
        assert!(other.patch.is_none());
        let other = c.correlate(ev(
            &clock,
            &deployment_ref("api"),
            "ScalingReplicaSet",
            "up to 3",
        ));
        assert!(other.unwrap().patch.is_none());
    }

    #[test]
    fn ten_distinct_messages_are_combined() {
        let clock = FakeClock::new();
        let mut c = correlator(&clock);
        let web = deployment_ref("web");
        for i in 1..AGGREGATE_EVENTS_MAX {
            clock.advance(Duration::from_secs(1));
            let r = c
                .correlate(ev(&clock, &web, "FailedCreate", &format!("quota {i}")))
                .unwrap();
            assert!(r.patch.is_none());
            assert_eq!(
                r.event.message.as_deref(),
                Some(format!("quota {i}").as_str())
            );
            c.update_state(&r.key, &written(&r));
        }
        // The 10th distinct message starts the combined event...
        clock.advance(Duration::from_secs(1));
        let combined = c
            .correlate(ev(&clock, &web, "FailedCreate", "quota 10"))
            .unwrap();
        assert!(combined.patch.is_none());
        assert_eq!(
            combined.event.message.as_deref(),
            Some("(combined from similar events): quota 10")
        );
        assert_eq!(combined.event.count, Some(1));
        assert_eq!(combined.event.reason.as_deref(), Some("FailedCreate"));
        c.update_state(&combined.key, &written(&combined));
        // ...and later ones, new or old messages alike, bump it.
        for (count, message) in [(2, "quota 11"), (3, "quota 1")] {
            clock.advance(Duration::from_secs(1));
            let r = c
                .correlate(ev(&clock, &web, "FailedCreate", message))
                .unwrap();
            assert_eq!(r.event.metadata.name, combined.event.metadata.name);
            assert_eq!(r.event.count, Some(count));
            assert_eq!(
                r.patch.as_ref().unwrap()["message"],
                json!(format!("{AGGREGATE_MESSAGE_PREFIX}{message}"))
            );
            c.update_state(&r.key, &written(&r));
        }
    }

    #[test]
    fn aggregation_window_resets_after_the_interval() {
        let clock = FakeClock::new();
        let mut c = correlator(&clock);
        let web = deployment_ref("web");
        for i in 1..AGGREGATE_EVENTS_MAX {
            let r = c
                .correlate(ev(&clock, &web, "FailedCreate", &format!("m{i}")))
                .unwrap();
            c.update_state(&r.key, &written(&r));
        }
        // Quiet for longer than the window: the group starts over.
        clock.advance(AGGREGATE_INTERVAL + Duration::from_secs(1));
        let r = c
            .correlate(ev(&clock, &web, "FailedCreate", "fresh"))
            .unwrap();
        assert_eq!(r.event.message.as_deref(), Some("fresh"));
        // Exactly at the window's edge the group is still open.
        let mut c = correlator(&clock);
        for i in 1..AGGREGATE_EVENTS_MAX {
            c.correlate(ev(&clock, &web, "FailedCreate", &format!("m{i}")))
                .unwrap();
        }
        clock.advance(AGGREGATE_INTERVAL);
        let r = c
            .correlate(ev(&clock, &web, "FailedCreate", "tenth"))
            .unwrap();
        assert!(
            r.event
                .message
                .unwrap()
                .starts_with(AGGREGATE_MESSAGE_PREFIX)
        );
    }

    #[test]
    fn spam_filter_allows_a_burst_then_one_per_refill_interval() {
        let clock = FakeClock::new();
        let mut c = correlator(&clock);
        let web = deployment_ref("web");
        // Distinct reasons: no aggregation, no deduplication, only the per-object budget.
        let passed = (0..30)
            .filter(|i| {
                c.correlate(ev(&clock, &web, &format!("Reason{i}"), "m"))
                    .is_some()
            })
            .count();
        assert_eq!(passed, SPAM_BURST as usize);
        // Another object has its own budget.
        assert!(
            c.correlate(ev(&clock, &deployment_ref("api"), "R", "m"))
                .is_some()
        );
        // Less than one refill interval later: still empty.
        clock.advance(SPAM_REFILL_INTERVAL - Duration::from_secs(1));
        assert!(c.correlate(ev(&clock, &web, "Late", "m")).is_none());
        // One interval after the burst: exactly one more.
        clock.advance(Duration::from_secs(1));
        assert!(c.correlate(ev(&clock, &web, "Later", "m")).is_some());
        assert!(c.correlate(ev(&clock, &web, "Latest", "m")).is_none());
    }

    #[test]
    fn filtered_repeats_still_count() {
        let clock = FakeClock::new();
        let options = CorrelatorOptions {
            spam_burst: 1,
            ..CorrelatorOptions::default()
        };
        let mut c = EventCorrelator::new(options, clock.clone());
        let web = deployment_ref("web");
        let first = c.correlate(ev(&clock, &web, "R", "m")).unwrap();
        c.update_state(&first.key, &written(&first));
        assert!(c.correlate(ev(&clock, &web, "R", "m")).is_none());
        clock.advance(SPAM_REFILL_INTERVAL);
        let third = c.correlate(ev(&clock, &web, "R", "m")).unwrap();
        assert_eq!(
            third.event.count,
            Some(3),
            "the filtered occurrence is counted"
        );
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut lru = Lru::new(2);
        lru.put("a".into(), 1);
        lru.put("b".into(), 2);
        assert_eq!(lru.get_mut("a").copied(), Some(1)); // `b` is now the oldest
        lru.put("c".into(), 3);
        assert_eq!(lru.len(), 2);
        assert!(lru.get_mut("b").is_none());
        assert_eq!(lru.get_mut("a").copied(), Some(1));
        assert_eq!(lru.get_mut("c").copied(), Some(3));
        lru.put("a".into(), 10);
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.get_mut("a").copied(), Some(10));
    }

    #[test]
    fn evicted_events_are_created_again() {
        let clock = FakeClock::new();
        let options = CorrelatorOptions {
            lru_cache_entries_max: 1,
            ..CorrelatorOptions::default()
        };
        let mut c = EventCorrelator::new(options, clock.clone());
        let web = deployment_ref("web");
        let r = c.correlate(ev(&clock, &web, "A", "m")).unwrap();
        c.update_state(&r.key, &written(&r));
        let r = c.correlate(ev(&clock, &web, "B", "m")).unwrap();
        c.update_state(&r.key, &written(&r));
        let again = c.correlate(ev(&clock, &web, "A", "m")).unwrap();
        assert!(again.patch.is_none(), "A's log was evicted by B");
    }

    #[test]
    fn keys_do_not_collide_on_concatenation() {
        let clock = FakeClock::new();
        let web = deployment_ref("web");
        let a = ev(&clock, &web, "ab", "c");
        let b = ev(&clock, &web, "a", "bc");
        assert_ne!(event_key(&a), event_key(&b));
    }

    #[test]
    fn clock_going_backwards_neither_refills_nor_resets() {
        let clock = FakeClock::new();
        let mut bucket = SpamBucket {
            tokens: 0.0,
            last: clock.now(),
        };
        let earlier = clock.now() - Duration::from_secs(3600);
        assert!(!bucket.try_accept(earlier, 25, SPAM_REFILL_INTERVAL));
        assert_eq!(bucket.last, clock.now());
    }
}
