//! The watch cache: one per resource, fed by one store watch, serving LIST and WATCH from
//! memory so that one store event can reach any number of watchers.
//!
//! # How it works
//! A background task LISTs the resource's prefix at revision R, then watches the store from
//! R+1 with `prev_kv`. Each store event updates the current objects (keyed by
//! `namespace/name`), is appended to a window of recent events ([`history`]), and is offered
//! to every watcher's bounded queue. A watch error (the store compacted past the cache's
//! watch) or loss (the store stream closed) ends every watcher and relists; clients re-watch
//! and those older than the new window hear 410 Expired.
//!
//! Tricks carried here (`docs/tricks.md`, the apiserver part):
//! - #5, serialize once per watch event ([`object`]): frames are built once
//!   per event and per encoding actually watched (JSON, protobuf), and shared as `Bytes`;
//!   [`CacheMetrics::serializations`] counts encodings. Each watcher records its
//!   [`Encoding`], and every frame it is sent (events, backlog, snapshot, bookmarks, ERROR)
//!   is of that encoding.
//! - #6, bookmarks bucketed per second ([`bookmarks`], [`stream`]): one ticker per cache pops
//!   watchers due for a bookmark (or their deadline) by whole second; WatchList's three
//!   states live in the stream.
//! - #7, the 3 s wait before "too old resource version" ([`WatchCache::wait_fresh`]): a request
//!   for a revision the cache has not reached waits up to [`RESOURCE_VERSION_TOO_HIGH_WAIT`],
//!   and the common fresh case returns at once with no task and no timer.
//! - Slow watchers are cut off ([`WatchCacheConfig::watcher_queue_events_max`]): a full
//!   queue ends that watcher and never blocks the dispatcher.
//!
//! # Invariants
//! - One lock ([`Shared::state`]) covers the objects, the window, the watchers and their
//!   queues' senders. An event is applied, appended and dispatched under it, and a watcher
//!   is registered (its snapshot or backlog taken, its queue created) under it, so every
//!   watcher sees each event after its start exactly once, in revision order.
//! - `resource_version` only grows between relists; every held event is at or below it.
//! - `metadata.resourceVersion` of every object is its store `mod_revision`
//!   ([`crate::storage::decode`]); a DELETED event's object carries the delete's revision.

#![allow(
    clippy::result_large_err,
    reason = "ApiError is the crate's one wire error; boxing it is a crate-wide choice"
)]

pub mod bookmarks;
pub mod history;
pub mod object;
pub mod stream;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::json;
use skerry_api::{ApiError, ResourceInfo};
use skerry_store::Store;
use skerry_store::pb::etcdserverpb::{RangeRequest, WatchCreateRequest, WatchResponse};
use skerry_store::pb::mvccpb::{Event as StoreEvent, event::EventType as StoreEventType};
use skerry_store::watch::WatchOut;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::storage::{self, decode, prefix_end, too_large_resource_version};
pub use crate::storage::{CachedList, Filter, ListOptions, ResourceVersionMatch};
use bookmarks::{Buckets, bucket_of, next_bookmark};
use history::{Event, History, TooOld};
pub use object::{CachedObject, Encoding, EventType};
use object::{encode_value, set_resource_version, watch_frame};
use stream::{Initial, Registration};
pub use stream::{Phase, WatchStream};

/// How long a LIST or WATCH at a revision the cache has not reached waits for it
/// (Kubernetes' `blockTimeout = 3 * time.Second`). The cache normally trails the store by
/// milliseconds; three seconds covers a store hiccup or a long apply, and past it the client
/// hears 504 "Too large resource version" and retries, rather than hang on a revision that
/// may never come (a client that read from another, newer member).
pub const RESOURCE_VERSION_TOO_HIGH_WAIT: Duration = Duration::from_secs(3);

/// While a request waits for the cache, how often the cache asks the store for a progress
/// notification (Kubernetes' progress requester ticks every 100 ms). The cache learns of
/// revisions written to other resources only this way; shorter costs store wake-ups, longer
/// adds latency to consistent reads.
pub const PROGRESS_REQUEST_INTERVAL: Duration = Duration::from_millis(100);

/// The bookmark ticker's period: buckets are whole seconds, so one pop a second is enough.
pub const BOOKMARK_TICK: Duration = Duration::from_secs(1);

/// Pause before relisting after the store refused a LIST or watch (it is stopping, or has
/// no leader). Short, since clients are waiting; semi-arbitrary.
pub const RELIST_BACKOFF: Duration = Duration::from_secs(1);

/// Events queued per watcher before it is cut off. Kubernetes sizes a watcher's channel
/// between 10 and 1000 events (`suggestedWatchChannelSize`; 100 for an unindexed watch) and
/// also lets the dispatcher block up to 100 ms before cutting. A queue entry here is a
/// reference to a frame shared by all watchers, so a deep queue costs pointers, not copies;
/// we take Kubernetes' upper bound and never block instead. Larger lets a watcher lag longer
/// before it must re-watch; smaller cuts clients during ordinary bursts.
pub const WATCHER_QUEUE_EVENTS_MAX: usize = 1_000;

/// The annotation on the bookmark that ends a WatchList's initial events.
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// The tunables of one watch cache, each documented at its default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchCacheConfig {
    /// [`history::WINDOW_EVENTS_MIN`].
    pub window_events_min: usize,
    /// [`history::WINDOW_EVENTS_MAX`].
    pub window_events_max: usize,
    /// [`history::EVENT_FRESH_DURATION`].
    pub event_fresh_duration: Duration,
    /// [`WATCHER_QUEUE_EVENTS_MAX`].
    pub watcher_queue_events_max: usize,
}

impl Default for WatchCacheConfig {
    fn default() -> Self {
        Self {
            window_events_min: history::WINDOW_EVENTS_MIN,
            window_events_max: history::WINDOW_EVENTS_MAX,
            event_fresh_duration: history::EVENT_FRESH_DURATION,
            watcher_queue_events_max: WATCHER_QUEUE_EVENTS_MAX,
        }
    }
}

/// A configuration the cache cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid watch cache config: {0}")]
pub struct ConfigError(pub String);

impl WatchCacheConfig {
    /// Checks the bounds the window and queues need.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.window_events_min < 4 {
            return Err(ConfigError(format!(
                "window_events_min {} < 4",
                self.window_events_min
            )));
        }
        if self.window_events_max < self.window_events_min {
            return Err(ConfigError(format!(
                "window_events_max {} < window_events_min {}",
                self.window_events_max, self.window_events_min
            )));
        }
        if self.watcher_queue_events_max == 0 {
            return Err(ConfigError("watcher_queue_events_max is 0".into()));
        }
        if self.event_fresh_duration.is_zero() {
            return Err(ConfigError("event_fresh_duration is 0".into()));
        }
        Ok(())
    }
}

/// Counters of one cache. Read with the accessor methods.
#[derive(Debug, Default)]
pub struct CacheMetrics {
    /// Shared with every object the cache makes, which bumps it once per encoding.
    serializations: Arc<AtomicU64>,
    watchers_registered: AtomicU64,
    watchers_terminated: AtomicU64,
    waits_started: AtomicU64,
    relists: AtomicU64,
    bookmarks_sent: AtomicU64,
}

impl CacheMetrics {
    /// Objects (and bookmarks) encoded, in any encoding.
    pub fn serializations(&self) -> u64 {
        self.serializations.load(Ordering::Relaxed)
    }

    /// Watchers registered since the cache started.
    pub fn watchers_registered(&self) -> u64 {
        self.watchers_registered.load(Ordering::Relaxed)
    }

    /// Watchers cut off because their queue was full.
    pub fn watchers_terminated(&self) -> u64 {
        self.watchers_terminated.load(Ordering::Relaxed)
    }

    /// Requests that had to wait for the cache to reach their revision.
    pub fn waits_started(&self) -> u64 {
        self.waits_started.load(Ordering::Relaxed)
    }

    /// LISTs of the store that (re)initialized the cache.
    pub fn relists(&self) -> u64 {
        self.relists.load(Ordering::Relaxed)
    }

    /// Bookmarks queued to watchers by the ticker.
    pub fn bookmarks_sent(&self) -> u64 {
        self.bookmarks_sent.load(Ordering::Relaxed)
    }
}

/// The options of a WATCH, parsed from the query string by the caller.
#[derive(Clone, Default)]
pub struct WatchOptions {
    /// `resourceVersion`; `None` when absent or empty.
    pub resource_version: Option<i64>,
    /// `sendInitialEvents`; `None` when absent (then RV unset or "0" sends the current state
    /// as ADDED events first, Kubernetes' legacy behaviour).
    pub send_initial_events: Option<bool>,
    /// `allowWatchBookmarks`.
    pub allow_bookmarks: bool,
    /// `timeoutSeconds`: the stream ends after this long.
    pub timeout: Option<Duration>,
    /// Label and field selectors.
    pub filter: Option<Filter>,
    /// The namespace of a namespaced request.
    pub namespace: Option<String>,
    /// The encoding of every frame of the stream (negotiated from `Accept`).
    pub encoding: Encoding,
}

/// What the cache can tell waiters without taking its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Freshness {
    ready: bool,
    resource_version: i64,
}

/// The watch cache of one resource. Dropping the last handle stops its task and ends its
/// watchers.
pub struct WatchCache {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WatchCache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) struct Shared {
    resource: &'static ResourceInfo,
    store: Store,
    config: WatchCacheConfig,
    /// A blocking mutex: every section is in-memory and short (apply, dispatch, register,
    /// pop buckets) and never awaits; one lock makes apply-and-dispatch atomic with
    /// registering a watcher.
    state: Mutex<State>,
    /// A watch channel of (ready, resourceVersion): waiters check it without the lock and
    /// sleep on it without a task of their own.
    fresh: watch::Sender<Freshness>,
    metrics: CacheMetrics,
    /// The zero of the bookmark clock.
    clock_base: Instant,
}

struct State {
    ready: bool,
    resource_version: i64,
    /// Current objects by key under the resource prefix (`namespace/name` or `name`), in
    /// store key order.
    objects: BTreeMap<Arc<str>, CachedObject>,
    history: History,
    watchers: HashMap<u64, Watcher>,
    next_watcher_id: u64,
    bookmarks: Buckets,
    deadlines: Buckets,
    /// The hub stream feeding the cache, for progress requests.
    feed_stream: Option<u64>,
}

struct Watcher {
    /// Bounded: a full queue means the client is not reading, and the watcher is cut off.
    tx: mpsc::Sender<Bytes>,
    namespace: Option<String>,
    filter: Option<Filter>,
    allow_bookmarks: bool,
    /// The encoding of every frame this watcher is sent.
    encoding: Encoding,
    /// From the clock base.
    deadline: Option<Duration>,
    /// The bucket the watcher's next bookmark is filed under; entries under other seconds
    /// are stale.
    bookmark_bucket: Option<u64>,
    deadline_bucket: Option<u64>,
}

impl Watcher {
    fn matches(&self, object: &CachedObject) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| object.namespace() == Some(ns))
            && self.filter.as_ref().is_none_or(|f| f(object))
    }

    /// The frame this watcher gets for `event`, by Kubernetes' rule: the new state matching
    /// is ADDED or MODIFIED (did the old one match?), only the old one matching is DELETED
    /// carrying the old state at the event's revision, neither is nothing.
    fn frame_for(&self, event: &Event) -> Option<Bytes> {
        let current = event.event_type != EventType::Deleted && self.matches(&event.object);
        let previous = event.prev.as_ref().is_some_and(|p| self.matches(p));
        match (current, previous) {
            (true, true) => Some(event.object.frame(EventType::Modified, self.encoding)),
            (true, false) => Some(event.object.frame(EventType::Added, self.encoding)),
            (false, true) => event
                .deleted_object()
                .map(|o| o.frame(EventType::Deleted, self.encoding)),
            (false, false) => None,
        }
    }
}

/// The cache's watch on the store; dropping it closes the hub stream.
struct Feed {
    store: Store,
    stream_id: u64,
    rx: mpsc::Receiver<WatchOut>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.store.hub().close_stream(self.stream_id);
    }
}

/// How the cache answers a LIST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Delegate to the store ([`storage::list`]).
    Store,
    /// The current state, once the cache has reached `at_least`.
    Latest(Freshen),
    /// The state at exactly this revision.
    Exact(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Freshen {
    /// Any state (`resourceVersion=0`).
    Any,
    /// At least this revision.
    AtLeast(i64),
    /// At least the store's current revision (a consistent read).
    Consistent,
}

/// Which LISTs the cache serves, Kubernetes 1.32's `shouldDelegateList` with consistent
/// reads from the cache, plus exact revisions still inside the window:
/// - `continue` goes to the store (the token pins a revision the window may not hold);
/// - `resourceVersion=0` is served from the cache and ignores `limit`, as Kubernetes does;
/// - any other `limit` goes to the store, which pages;
/// - `Exact` is served from the cache (or the store, when older than the window).
fn plan(opts: &ListOptions) -> Plan {
    if opts.continue_token.is_some() {
        return Plan::Store;
    }
    let limited = opts.page_limit().is_some();
    match (opts.resource_version_match, opts.resource_version) {
        (Some(ResourceVersionMatch::Exact), Some(rv)) if rv > 0 && !limited => Plan::Exact(rv),
        (Some(ResourceVersionMatch::Exact), _) => Plan::Store,
        (_, Some(0)) => Plan::Latest(Freshen::Any),
        (_, Some(rv)) if !limited => Plan::Latest(Freshen::AtLeast(rv)),
        (_, None) if !limited => Plan::Latest(Freshen::Consistent),
        _ => Plan::Store,
    }
}

impl WatchCache {
    /// Starts the cache of `resource` with the default configuration.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(resource: &'static ResourceInfo, store: Store) -> Arc<WatchCache> {
        Self::start_with(resource, store, WatchCacheConfig::default())
            .expect("the default watch cache config is valid")
    }

    /// Starts the cache of `resource`: its task lists and watches the store until the last
    /// handle is dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start_with(
        resource: &'static ResourceInfo,
        store: Store,
        config: WatchCacheConfig,
    ) -> Result<Arc<WatchCache>, ConfigError> {
        config.validate()?;
        let history = History::new(
            config.window_events_min,
            config.window_events_max,
            config.event_fresh_duration,
            0,
        );
        let (fresh, _) = watch::channel(Freshness {
            ready: false,
            resource_version: 0,
        });
        let shared = Arc::new(Shared {
            resource,
            store,
            config,
            state: Mutex::new(State {
                ready: false,
                resource_version: 0,
                objects: BTreeMap::new(),
                history,
                watchers: HashMap::new(),
                next_watcher_id: 0,
                bookmarks: Buckets::default(),
                deadlines: Buckets::default(),
                feed_stream: None,
            }),
            fresh,
            metrics: CacheMetrics::default(),
            clock_base: Instant::now(),
        });
        let task = tokio::spawn(run(shared.clone()));
        Ok(Arc::new(WatchCache { shared, task }))
    }

    /// The resource this cache holds.
    pub fn resource(&self) -> &'static ResourceInfo {
        self.shared.resource
    }

    /// The cache's counters.
    pub fn metrics(&self) -> &CacheMetrics {
        &self.shared.metrics
    }

    /// The revision the cache has caught up to.
    pub fn resource_version(&self) -> i64 {
        self.shared.fresh.borrow().resource_version
    }

    /// Watchers currently registered.
    pub fn watchers(&self) -> usize {
        self.shared.state.lock().watchers.len()
    }

    /// Whether the cache has listed the store and is following it (false while it relists).
    pub fn is_ready(&self) -> bool {
        self.shared.fresh.borrow().ready
    }

    /// Objects currently held.
    pub fn len(&self) -> usize {
        self.shared.state.lock().objects.len()
    }

    /// Whether the cache holds no objects.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One object as the cache holds it now (a GET at `resourceVersion=0`); `None` if absent
    /// or the cache is not ready.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<CachedObject> {
        let key = match namespace {
            Some(ns) if self.shared.resource.namespaced => format!("{ns}/{name}"),
            _ => name.to_string(),
        };
        let state = self.shared.state.lock();
        if !state.ready {
            return None;
        }
        state.objects.get(key.as_str()).cloned()
    }

    /// Every object held now, in key order (reference-count bumps, no copies).
    pub fn items(&self) -> Vec<CachedObject> {
        self.shared.state.lock().objects.values().cloned().collect()
    }

    /// Waits until the cache is ready and has reached `resource_version`, for at most
    /// [`RESOURCE_VERSION_TOO_HIGH_WAIT`]; then 504 "Too large resource version" (or 429
    /// while the cache is still (re)listing). A fresh cache answers at once without
    /// creating a timer or a task.
    pub async fn wait_fresh(&self, resource_version: i64) -> Result<(), ApiError> {
        self.shared.wait_fresh(resource_version).await
    }

    /// A LIST. Served from memory where [`plan`] allows, else delegated to
    /// [`storage::list`]. Items come in store key order.
    pub async fn list(
        &self,
        opts: &ListOptions,
        filter: Option<Filter>,
    ) -> Result<CachedList, ApiError> {
        let shared = &self.shared;
        let exact = match plan(opts) {
            Plan::Store => {
                return storage::list(&shared.store, shared.resource, opts, filter.as_ref()).await;
            }
            Plan::Latest(freshen) => {
                let target = match freshen {
                    Freshen::Any => 0,
                    Freshen::AtLeast(rv) => rv,
                    Freshen::Consistent => shared.store_revision().await?,
                };
                shared.wait_fresh(target).await?;
                let state = shared.state.lock();
                if !state.ready {
                    return Err(not_ready());
                }
                let items = shared
                    .objects_in(&state.objects, opts.namespace.as_deref())
                    .map(|(_, o)| o)
                    .filter(|o| filter.as_ref().is_none_or(|f| f(o)))
                    .cloned()
                    .collect();
                return Ok(CachedList {
                    items,
                    resource_version: state.resource_version,
                    ..Default::default()
                });
            }
            Plan::Exact(rv) => rv,
        };
        shared.wait_fresh(exact).await?;
        {
            let state = shared.state.lock();
            if state.ready
                && let Some(items) = shared.state_at(&state, exact, opts.namespace.as_deref())
            {
                let items = items
                    .filter(|o| filter.as_ref().is_none_or(|f| f(o)))
                    .collect();
                return Ok(CachedList {
                    items,
                    resource_version: exact,
                    ..Default::default()
                });
            }
        }
        // Older than the window: the store may still hold that revision.
        storage::list(&shared.store, shared.resource, opts, filter.as_ref()).await
    }

    /// A WATCH. Errors that Kubernetes answers before the stream starts (bad options, 504 too
    /// large, 429 not ready) are `Err`; a revision older than the window is a stream of one
    /// ERROR event (410 Expired), as Kubernetes sends it.
    pub async fn watch(&self, opts: WatchOptions) -> Result<WatchStream, ApiError> {
        let shared = &self.shared;
        if opts.send_initial_events == Some(true) && !opts.allow_bookmarks {
            return Err(ApiError::bad_request(
                "allowWatchBookmarks must be set to true when sendInitialEvents is set",
            ));
        }
        let initial_events = opts
            .send_initial_events
            .unwrap_or(matches!(opts.resource_version, None | Some(0)));
        let target = match (opts.send_initial_events, opts.resource_version) {
            (Some(true), None) => shared.store_revision().await?,
            (_, Some(rv)) if rv > 0 => rv,
            _ => 0,
        };
        shared.wait_fresh(target).await?;
        shared.register(opts, initial_events)
    }
}

fn not_ready() -> ApiError {
    ApiError::too_many_requests("storage is (re)initializing", 1)
}

impl Shared {
    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.clock_base)
    }

    fn publish(&self, state: &State) {
        let fresh = Freshness {
            ready: state.ready,
            resource_version: state.resource_version,
        };
        self.fresh.send_if_modified(|f| {
            let changed = *f != fresh;
            *f = fresh;
            changed
        });
    }

    /// The store's current revision, after a linearizable barrier: what a consistent read
    /// must reflect.
    async fn store_revision(&self) -> Result<i64, ApiError> {
        self.store
            .linearizable_barrier()
            .await
            .map_err(storage::store_error)?;
        Ok(self.store.revision())
    }

    async fn wait_fresh(&self, resource_version: i64) -> Result<(), ApiError> {
        let fresh = |f: &Freshness| f.ready && f.resource_version >= resource_version;
        // The common case: the cache is already there. No timer, no task, no progress
        // request: one atomic load and a read lock of the channel.
        if fresh(&self.fresh.borrow()) {
            return Ok(());
        }
        self.metrics.waits_started.fetch_add(1, Ordering::Relaxed);
        let mut rx = self.fresh.subscribe();
        let deadline = Instant::now() + RESOURCE_VERSION_TOO_HIGH_WAIT;
        loop {
            // The revision may have been written to another resource: ask the store to say
            // how far it is, which moves the cache's revision without an event.
            self.request_progress();
            let step = (Instant::now() + PROGRESS_REQUEST_INTERVAL).min(deadline);
            match tokio::time::timeout_at(step, rx.wait_for(fresh)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(_)) => return Err(ApiError::service_unavailable("the watch cache stopped")),
                Err(_) if Instant::now() >= deadline => break,
                Err(_) => {}
            }
        }
        let last = *rx.borrow();
        if !last.ready {
            return Err(not_ready());
        }
        Err(too_large_resource_version(
            resource_version,
            last.resource_version,
        ))
    }

    fn request_progress(&self) {
        let stream = self.state.lock().feed_stream;
        if let Some(stream) = stream {
            self.store.hub().request_progress(stream);
        }
    }

    /// The keys and objects of `namespace` (all, for cluster-scoped resources or `None`), in
    /// key order.
    fn objects_in<'a>(
        &self,
        objects: &'a BTreeMap<Arc<str>, CachedObject>,
        namespace: Option<&str>,
    ) -> Box<dyn Iterator<Item = (&'a Arc<str>, &'a CachedObject)> + 'a> {
        match self.key_prefix(namespace) {
            Some(start) => {
                let end = String::from_utf8(prefix_end(&start))
                    .expect("a namespace/ prefix stays UTF-8 when its '/' is incremented");
                Box::new(objects.range::<str, _>((
                    Bound::Included(start.as_str()),
                    Bound::Excluded(end.as_str()),
                )))
            }
            None => Box::new(objects.iter()),
        }
    }

    /// `namespace/`, the key prefix of a namespaced request; `None` when every key is in
    /// scope.
    fn key_prefix(&self, namespace: Option<&str>) -> Option<String> {
        match namespace {
            Some(ns) if self.resource.namespaced => Some(format!("{ns}/")),
            _ => None,
        }
    }

    /// The objects of `namespace` as they were at `resource_version`, rebuilt from the
    /// current ones by undoing the window's later events; `None` if the window no longer
    /// reaches back that far.
    fn state_at(
        &self,
        state: &State,
        resource_version: i64,
        namespace: Option<&str>,
    ) -> Option<impl Iterator<Item = CachedObject>> {
        let later = state.history.since(resource_version).ok()?;
        let mut at: BTreeMap<Arc<str>, CachedObject> = self
            .objects_in(&state.objects, namespace)
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        let prefix = self.key_prefix(namespace);
        // Newest first, so the last write to each key is the state before the oldest
        // later event: the state at `resource_version`.
        for event in later.rev() {
            if prefix.as_deref().is_some_and(|p| !event.key.starts_with(p)) {
                continue;
            }
            match &event.prev {
                Some(prev) => at.insert(event.key.clone(), prev.clone()),
                None => at.remove(&event.key),
            };
        }
        Some(at.into_values())
    }

    /// Registers a watcher and builds its stream, all under the lock (see the invariants).
    fn register(
        self: &Arc<Self>,
        opts: WatchOptions,
        initial_events: bool,
    ) -> Result<WatchStream, ApiError> {
        let now = self.now();
        let (tx, rx) = mpsc::channel(self.config.watcher_queue_events_max);
        let mut watcher = Watcher {
            tx,
            namespace: opts.namespace.clone().filter(|_| self.resource.namespaced),
            filter: opts.filter.clone(),
            allow_bookmarks: opts.allow_bookmarks,
            encoding: opts.encoding,
            deadline: opts.timeout.map(|t| now + t),
            bookmark_bucket: None,
            deadline_bucket: None,
        };
        let mut state = self.state.lock();
        if !state.ready {
            return Err(not_ready());
        }
        let start = state.resource_version;
        let mut initial = VecDeque::new();
        if initial_events {
            initial.extend(
                self.objects_in(&state.objects, watcher.namespace.as_deref())
                    .map(|(_, o)| o)
                    .filter(|o| watcher.filter.as_ref().is_none_or(|f| f(o)))
                    .cloned()
                    .map(Initial::Added),
            );
        } else {
            let from = opts.resource_version.filter(|rv| *rv > 0).unwrap_or(start);
            match state.history.since(from) {
                Ok(events) => initial.extend(
                    events
                        .filter_map(|e| watcher.frame_for(e))
                        .map(Initial::Frame),
                ),
                Err(TooOld { window_start }) => {
                    let e = ApiError::expired(format!(
                        "too old resource version: {from} ({window_start})"
                    ));
                    return Ok(WatchStream::single(error_frame(&e, opts.encoding)));
                }
            }
        }
        let end_bookmark = (opts.send_initial_events == Some(true))
            .then(|| self.bookmark_frame(start, true, opts.encoding));
        let id = state.next_watcher_id;
        state.next_watcher_id += 1;
        if watcher.allow_bookmarks
            && let Some(due) = next_bookmark(now, watcher.deadline)
        {
            let bucket = bucket_of(due);
            watcher.bookmark_bucket = Some(bucket);
            state.bookmarks.add(bucket, id);
        }
        if let Some(deadline) = watcher.deadline {
            // Round up: a watch ends at or after its deadline, never before.
            let bucket = bucket_of(deadline) + u64::from(deadline.subsec_nanos() > 0);
            watcher.deadline_bucket = Some(bucket);
            state.deadlines.add(bucket, id);
        }
        state.watchers.insert(id, watcher);
        drop(state);
        self.metrics
            .watchers_registered
            .fetch_add(1, Ordering::Relaxed);
        Ok(WatchStream::new(
            opts.encoding,
            initial,
            end_bookmark,
            rx,
            Registration {
                shared: Arc::downgrade(self),
                watcher_id: id,
            },
        ))
    }

    pub(crate) fn unregister(&self, watcher_id: u64) {
        self.state.lock().watchers.remove(&watcher_id);
    }

    /// A BOOKMARK frame at `resource_version`: the kind, apiVersion and resourceVersion
    /// only (plus the end-of-initial-events annotation for WatchList), in `encoding`.
    fn bookmark_frame(
        &self,
        resource_version: i64,
        initial_events_end: bool,
        encoding: Encoding,
    ) -> Bytes {
        let mut metadata = json!({"resourceVersion": resource_version.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({INITIAL_EVENTS_END_ANNOTATION: "true"});
        }
        let object = json!({
            "kind": self.resource.kind,
            "apiVersion": self.resource.api_version(),
            "metadata": metadata,
        });
        self.metrics.serializations.fetch_add(1, Ordering::Relaxed);
        match encode_value(encoding, &object) {
            Ok(bytes) => watch_frame(encoding, "BOOKMARK", &bytes),
            // A kind outside the protobuf schema; `watch.rs` refuses such watches up front.
            Err(e) => error_frame(
                &ApiError::internal(format!("encoding a bookmark: {e}")),
                encoding,
            ),
        }
    }

    /// One ticker pop at `now`: ends watchers past their deadline, then sends a bookmark to
    /// every watcher due one this second, built once per encoding for all of them.
    fn tick(&self, now: Duration) {
        let second = bucket_of(now);
        let mut state = self.state.lock();
        for (bucket, id) in state.deadlines.pop_due(second) {
            if state
                .watchers
                .get(&id)
                .is_some_and(|w| w.deadline_bucket == Some(bucket))
            {
                // Dropping the sender ends the stream once the client drained it.
                state.watchers.remove(&id);
            }
        }
        let due = state.bookmarks.pop_due(second);
        if due.is_empty() {
            return;
        }
        let resource_version = state.resource_version;
        let frames: [OnceLock<Bytes>; Encoding::COUNT] = Default::default();
        let mut refile = Vec::new();
        let mut sent = 0;
        for (bucket, id) in due {
            let Some(w) = state.watchers.get_mut(&id) else {
                continue;
            };
            if w.bookmark_bucket != Some(bucket) || !w.allow_bookmarks {
                continue;
            }
            // Every event up to `resource_version` is already in the queue ahead of this
            // bookmark, so it claims nothing the watcher has not been sent. A full queue
            // skips it: events are flowing, which says as much.
            let encoding = w.encoding;
            let frame = frames[encoding.index()]
                .get_or_init(|| self.bookmark_frame(resource_version, false, encoding));
            if w.tx.try_send(frame.clone()).is_ok() {
                sent += 1;
            }
            w.bookmark_bucket = next_bookmark(now, w.deadline)
                .map(bucket_of)
                .filter(|b| *b > second);
            if let Some(b) = w.bookmark_bucket {
                refile.push((b, id));
            }
        }
        for (bucket, id) in refile {
            state.bookmarks.add(bucket, id);
        }
        self.metrics
            .bookmarks_sent
            .fetch_add(sent, Ordering::Relaxed);
    }

    /// The key under the resource prefix of a store key.
    fn key_of(&self, store_key: &[u8]) -> Option<Arc<str>> {
        let prefix = self.resource.prefix(None);
        let suffix = store_key.strip_prefix(prefix.as_bytes())?;
        std::str::from_utf8(suffix).ok().map(Arc::from)
    }

    /// LISTs the resource and opens the store watch after it.
    async fn relist(&self) -> Result<Feed, skerry_store::StoreError> {
        let hub = self.store.hub();
        let (stream_id, tx, rx) = hub.open_stream();
        let feed = Feed {
            store: self.store.clone(),
            stream_id,
            rx,
        };
        let prefix = self.resource.prefix(None);
        let range_end = Bytes::from(prefix_end(&prefix));
        let request = RangeRequest {
            key: Bytes::from(prefix.clone()),
            range_end: range_end.clone(),
            ..Default::default()
        };
        let store = self.store.clone();
        // The one potentially long read of the cache's life: keep it off the async workers.
        let resp = tokio::task::spawn_blocking(move || store.range(&request))
            .await
            .map_err(|e| skerry_store::StoreError::Storage(format!("list task failed: {e}")))??;
        let revision = resp.header.as_ref().map_or(0, |h| h.revision);
        let mut objects = BTreeMap::new();
        for kv in &resp.kvs {
            let Some(key) = self.key_of(&kv.key) else {
                continue;
            };
            match decode(kv) {
                Ok(value) => {
                    let object =
                        CachedObject::new(value, Some(self.metrics.serializations.clone()));
                    objects.insert(key, object);
                }
                Err(e) => {
                    error!(resource = self.resource.resource, error = %e, "skipping corrupt object")
                }
            }
        }
        let permit = tx
            .reserve()
            .await
            .map_err(|_| skerry_store::StoreError::Stopped)?;
        let create = WatchCreateRequest {
            key: Bytes::from(prefix),
            range_end,
            start_revision: revision + 1,
            prev_kv: true,
            ..Default::default()
        };
        hub.create(stream_id, &create, permit)
            .map_err(|e| skerry_store::StoreError::Storage(format!("store watch: {e:?}")))?;
        // Only the hub may hold a sender: when it closes the stream, the feed must see it.
        drop(tx);
        let count = objects.len();
        {
            let mut state = self.state.lock();
            state.objects = objects;
            state.resource_version = revision;
            state.history.reset(revision);
            state.ready = true;
            state.feed_stream = Some(stream_id);
            self.publish(&state);
        }
        self.metrics.relists.fetch_add(1, Ordering::Relaxed);
        info!(
            resource = self.resource.resource,
            revision,
            objects = count,
            "watch cache listed"
        );
        Ok(feed)
    }

    /// Marks the cache not ready and ends every watcher: their clients re-watch, and those
    /// older than the next window hear 410.
    fn invalidate(&self) {
        let mut state = self.state.lock();
        state.ready = false;
        state.feed_stream = None;
        state.watchers.clear();
        state.bookmarks.clear();
        state.deadlines.clear();
        self.publish(&state);
    }

    /// Applies one store watch response; false when the watch must be replaced by a relist.
    fn apply(&self, response: WatchResponse) -> bool {
        if response.canceled {
            warn!(
                resource = self.resource.resource,
                compact_revision = response.compact_revision,
                reason = %response.cancel_reason,
                "store watch canceled; relisting"
            );
            return false;
        }
        if response.created {
            return true;
        }
        let mut state = self.state.lock();
        if response.events.is_empty() {
            // A progress notification: every event up to this revision has been delivered.
            let revision = response.header.as_ref().map_or(0, |h| h.revision);
            if revision > state.resource_version {
                state.resource_version = revision;
                self.publish(&state);
            }
            return true;
        }
        let now = self.now();
        for event in response.events {
            self.apply_event(&mut state, event, now);
        }
        self.publish(&state);
        true
    }

    fn apply_event(&self, state: &mut State, event: StoreEvent, now: Duration) {
        let Some(kv) = &event.kv else { return };
        let Some(key) = self.key_of(&kv.key) else {
            return;
        };
        let revision = kv.mod_revision;
        let counter = Some(self.metrics.serializations.clone());
        let (event_type, object, prev) = if event.r#type == StoreEventType::Delete as i32 {
            let prev = state.objects.remove(&key);
            let last = match (&event.prev_kv, &prev) {
                (Some(prev_kv), _) => match decode(prev_kv) {
                    Ok(mut value) => {
                        set_resource_version(&mut value, revision);
                        CachedObject::new(value, counter.clone())
                    }
                    Err(e) => {
                        error!(resource = self.resource.resource, error = %e, "corrupt deleted object");
                        return;
                    }
                },
                (None, Some(prev)) => prev.with_resource_version(revision),
                (None, None) => return,
            };
            let prev = prev.or_else(|| {
                let prev_kv = event.prev_kv.as_ref()?;
                decode(prev_kv)
                    .ok()
                    .map(|v| CachedObject::new(v, counter.clone()))
            });
            (EventType::Deleted, last, prev)
        } else {
            let value = match decode(kv) {
                Ok(value) => value,
                Err(e) => {
                    error!(resource = self.resource.resource, error = %e, "skipping corrupt object");
                    return;
                }
            };
            let object = CachedObject::new(value, counter);
            let prev = state.objects.insert(key.clone(), object.clone());
            let event_type = if prev.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            };
            (event_type, object, prev)
        };
        assert!(
            revision >= state.resource_version,
            "event at {revision} behind the cache at {}",
            state.resource_version
        );
        state.resource_version = revision;
        let event = Arc::new(Event::new(revision, event_type, key, object, prev, now));
        state.history.push(event.clone());
        self.dispatch(state, &event);
    }

    /// Offers `event` to every watcher; a full queue cuts that watcher off.
    fn dispatch(&self, state: &mut State, event: &Event) {
        let mut ended = Vec::new();
        for (id, watcher) in &state.watchers {
            let Some(frame) = watcher.frame_for(event) else {
                continue;
            };
            match watcher.tx.try_send(frame) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.metrics
                        .watchers_terminated
                        .fetch_add(1, Ordering::Relaxed);
                    debug!(
                        resource = self.resource.resource,
                        watcher = id,
                        revision = event.resource_version,
                        "cutting off a slow watcher"
                    );
                    ended.push(*id);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => ended.push(*id),
            }
        }
        for id in ended {
            state.watchers.remove(&id);
        }
    }
}

/// An in-stream ERROR frame carrying the Status of `e`, in `encoding`.
fn error_frame(e: &ApiError, encoding: Encoding) -> Bytes {
    object::error_frame(encoding, &e.to_status())
}

/// The cache's task: list, watch, apply, tick; relist on watch error or loss.
async fn run(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(BOOKMARK_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut feed = match shared.relist().await {
            Ok(feed) => feed,
            Err(e) => {
                warn!(resource = shared.resource.resource, error = %e, "watch cache list failed; retrying");
                tokio::time::sleep(RELIST_BACKOFF).await;
                continue;
            }
        };
        loop {
            tokio::select! {
                out = feed.rx.recv() => match out {
                    Some(out) => {
                        if !shared.apply(out.response) {
                            break;
                        }
                    }
                    None => {
                        warn!(resource = shared.resource.resource, "store watch closed; relisting");
                        break;
                    }
                },
                _ = ticker.tick() => shared.tick(shared.now()),
            }
        }
        shared.invalidate();
        drop(feed);
    }
}

#[cfg(test)]
mod tests;
