//! The reflector: keeps a [`ReflectorStore`] in step with one resource on the apiserver, through
//! one WatchList stream or, when the server refuses that, paginated LIST + WATCH.
//!
//! Tricks carried here (`docs/tricks.md`):
//! - **#15, WatchList instead of LIST + WATCH**: the reflector first asks for a WatchList — a
//!   WATCH with `sendInitialEvents=true`, `allowWatchBookmarks=true` and
//!   `resourceVersionMatch=NotOlderThan`.
//!   The server sends the current state as synthetic ADDED events, then a BOOKMARK annotated
//!   `k8s.io/initial-events-end: "true"`, then carries on as an ordinary watch. Pagination is
//!   deliberately not involved: the point is that the server answers from its watch cache in
//!   memory instead of paging through its store, and one stream replaces a LIST and a WATCH.
//! - **#16, the reflector withholding unearned resource versions**: the synthetic
//!   ADDED events of the initial state are *not* in resource-version order (each carries its
//!   object's own last-modified RV), so none of them may become the reflector's RV: resuming a
//!   watch from one would skip every change between it and the real snapshot. They go into a
//!   temporary list and the RV is withheld until the initial-events-end bookmark, whose RV is the
//!   snapshot's; only then does the store get the whole state (`replace`) and the RV become
//!   visible through [`Reflector::last_sync_resource_version`]. Retries are paced by
//!   [`crate::backoff`], client-go's traffic arithmetic.
//!
//! The loop (client-go `Reflector.ListAndWatch`, run under `wait.BackoffUntil`):
//! 1. WatchList, unless this server has refused it before (400/405/422/501); a refusal is
//!    remembered and the reflector falls back to paginated LIST ([`LIST_PAGE_SIZE`]) +
//!    `replace`, then WATCH from the list's RV with bookmarks.
//! 2. Watch events are applied in order (ADDED → `add`, MODIFIED → `update`, DELETED →
//!    `delete`, BOOKMARK → RV only), and each one's RV is published: after the initial state the
//!    server sends events in RV order, so every one of them is earned.
//! 3. A watch that ends normally (its timeout) is re-established from the last RV. A 410 Gone
//!    (the RV was compacted) — as the WATCH's answer or as an in-stream ERROR — relists from a
//!    consistent snapshot (WatchList or LIST with no RV); the expired RV is never resumed from.
//!    (client-go first tries a LIST "not older than" the expired RV and only goes consistent if
//!    that 410s too; skerry goes consistent at once — one quorum read per 410, on a three-node
//!    appliance, buys one code path less.) Any other failure relists after one backoff step.
//!
//! Invariant: the published RV is always the RV of a complete state already handed to the
//! store (a LIST's, or an initial-events-end bookmark's) or of a watch event after it that the
//! store has already been given — never the RV of a synthetic initial ADDED event.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::Error;
use crate::api::{ListParams, ObjectList, WatchEvent, WatchParams, WatchStream};
use crate::backoff::Backoff;
use crate::object::{Object, key_of};

/// The bookmark annotation that ends a WatchList's initial events (the apiserver's
/// `metav1.InitialEventsAnnotationKey`).
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// `resourceVersionMatch` of a WatchList: the initial state may be any snapshot at least as new
/// as the RV asked for (for RV "": a consistent, current one), so the watch cache can serve it.
pub const RESOURCE_VERSION_MATCH_NOT_OLDER_THAN: &str = "NotOlderThan";

/// Page size of the fallback LIST (client-go `pager.defaultPageSize`). Bounds the size of one
/// response and of one range read in the store: larger makes fewer round trips but bigger
/// allocations on both sides for huge collections; smaller multiplies requests. Only the LIST
/// fallback pages; a WatchList is never paginated (that is its point).
pub const LIST_PAGE_SIZE: u32 = 500;

/// The shortest `timeoutSeconds` of a watch; each watch picks uniformly in
/// `[MIN_WATCH_TIMEOUT, 2 * MIN_WATCH_TIMEOUT)` (client-go `minWatchTimeout`). The randomness is
/// the point: watches started together (after an apiserver restart, all of them) would
/// otherwise all time out and reconnect together every five minutes. The timeout also bounds
/// how long a silently hung watch can go unnoticed.
pub const MIN_WATCH_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// A watch that ends sooner than this having delivered no event is treated as a failure (and
/// backs off) rather than re-established at once: client-go's "very short watch" check, which
/// stops a server that accepts and immediately closes watches from turning the reflector into
/// a busy loop.
pub const SHORT_WATCH: Duration = Duration::from_secs(1);

/// HTTP codes with which a server refuses a WatchList rather than failing it: 400 and 422 (the
/// parameters are rejected, e.g. by a server that predates `sendInitialEvents`), 405 (a proxy
/// or aggregated server with no watch support for this request), 501 (not implemented).
/// Anything else is a failure worth retrying as a WatchList.
const WATCH_LIST_REFUSAL_CODES: [u16; 4] = [400, 405, 422, 501];

/// Where a reflector gets its objects: a LIST and a WATCH of one resource.
pub trait ListerWatcher<K>: Send + Sync + 'static {
    /// One page of a LIST.
    fn list(
        &self,
        params: &ListParams,
    ) -> impl Future<Output = Result<ObjectList<K>, Error>> + Send;
    /// A WATCH.
    fn watch(
        &self,
        params: &WatchParams,
    ) -> impl Future<Output = Result<WatchStream<K>, Error>> + Send;
}

impl<K: Object + k8s_openapi::Resource> ListerWatcher<K> for crate::api::Api<K> {
    fn list(
        &self,
        params: &ListParams,
    ) -> impl Future<Output = Result<ObjectList<K>, Error>> + Send {
        crate::api::Api::list(self, params)
    }
    fn watch(
        &self,
        params: &WatchParams,
    ) -> impl Future<Output = Result<WatchStream<K>, Error>> + Send {
        crate::api::Api::watch(self, params)
    }
}

impl ListerWatcher<crate::object::PartialObjectMetadata> for crate::api::MetadataApi {
    fn list(
        &self,
        params: &ListParams,
    ) -> impl Future<Output = Result<ObjectList<crate::object::PartialObjectMetadata>, Error>> + Send
    {
        crate::api::MetadataApi::list(self, params)
    }
    fn watch(
        &self,
        params: &WatchParams,
    ) -> impl Future<Output = Result<WatchStream<crate::object::PartialObjectMetadata>, Error>> + Send
    {
        crate::api::MetadataApi::watch(self, params)
    }
}

/// What a reflector writes into (the DeltaFIFO implements it).
pub trait ReflectorStore<K>: Send + Sync + 'static {
    /// The full state at `resource_version`, replacing everything (after a LIST, or at a
    /// WatchList's initial-events-end bookmark). Objects that vanished become tombstones.
    fn replace(&self, items: Vec<K>, resource_version: &str);
    /// ADDED from the watch.
    fn add(&self, obj: K);
    /// MODIFIED from the watch.
    fn update(&self, obj: K);
    /// DELETED from the watch.
    fn delete(&self, obj: K);
    /// Periodic resync: re-deliver everything known as Sync deltas.
    fn resync(&self);
}

/// Feeds a [`ReflectorStore`] from a [`ListerWatcher`]: WatchList first, LIST + WATCH when the
/// server refuses it, relist on 410 Gone, backoff between failures, optional periodic resync.
/// Share it behind an `Arc` to run it on a task and read its RV elsewhere.
pub struct Reflector<K, L> {
    lw: L,
    store: Arc<dyn ReflectorStore<K>>,
    /// Period of `store.resync()`; `None` (or zero) for none.
    resync: Option<Duration>,
    /// The reflector's bookkeeping. A `parking_lot::Mutex` because every critical section is a
    /// few field reads or writes, never held across an `.await` or a store call; readers of
    /// [`Self::last_sync_resource_version`] on other tasks take it briefly too.
    state: Mutex<State>,
}

/// What the reflector remembers between list/watch attempts.
#[derive(Debug)]
struct State {
    /// The last published (earned) resource version; `None` before the first sync.
    last_sync_resource_version: Option<String>,
    /// The last RV was rejected as expired (410): the next relist must be consistent (RV "").
    last_sync_resource_version_unavailable: bool,
    /// The server refused WatchList once; use LIST + WATCH from now on.
    watch_list_refused: bool,
    /// A `resourceVersion="0"` LIST came back paginated: the server honours paging even for
    /// cache reads (no watch cache), so keep paging later lists too (client-go
    /// `paginatedResult`).
    paginated_result: bool,
    /// Pacing of retries (client-go's reflector backoff manager).
    backoff: Backoff,
}

impl State {
    /// The RV a WatchList starts from (client-go `rewatchResourceVersion`): the last synced
    /// one, or "" (a consistent snapshot) the first time and after a 410.
    fn rewatch_resource_version(&self) -> String {
        if self.last_sync_resource_version_unavailable {
            return String::new();
        }
        self.last_sync_resource_version.clone().unwrap_or_default()
    }

    /// The RV a fallback LIST asks for (client-go `relistResourceVersion`): "" (consistent)
    /// after a 410, "0" (whatever the cache has, cheapest) the first time, else the last synced
    /// one (not older than what we had, so the cache can answer without going back in time).
    fn relist_resource_version(&self) -> String {
        if self.last_sync_resource_version_unavailable {
            return String::new();
        }
        self.last_sync_resource_version
            .clone()
            .unwrap_or_else(|| "0".to_string())
    }
}

/// Why one list/watch round ended (internal; the reflector logs it and retries).
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// A request failed, or the server sent an in-stream ERROR.
    #[error(transparent)]
    Client(#[from] Error),
    /// A WatchList stream ended before its initial-events-end bookmark.
    #[error("watch-list stream ended before the initial-events-end bookmark")]
    WatchListIncomplete,
    /// A watch closed almost at once with nothing in it.
    #[error("very short watch: closed within {SHORT_WATCH:?} without an event")]
    ShortWatch,
    /// A LIST or an initial-events-end bookmark without a resourceVersion: nothing to resume
    /// a watch from.
    #[error("{0} without a resourceVersion")]
    MissingResourceVersion(&'static str),
}

impl Failure {
    fn client(&self) -> Option<&Error> {
        match self {
            Failure::Client(e) => Some(e),
            _ => None,
        }
    }
    /// 410 Gone / Expired: the RV asked for has been compacted.
    fn is_gone(&self) -> bool {
        self.client().is_some_and(Error::is_gone)
    }
    /// The server does not do WatchList (as opposed to failing one).
    fn is_watch_list_refusal(&self) -> bool {
        self.client()
            .and_then(Error::code)
            .is_some_and(|code| WATCH_LIST_REFUSAL_CODES.contains(&code))
    }
    /// Unreachable or overloaded (transport, 429, 5xx): retrying the same request later is
    /// right, a different request (a LIST instead of a WatchList) would fail the same way.
    fn is_retryable(&self) -> bool {
        self.client().is_some_and(Error::is_retryable)
    }
}

/// How a watch stream ended without a failure.
enum WatchEnd {
    /// `stop` was cancelled.
    Stopped,
    /// The server closed the stream (its timeout) or the connection dropped, after `events`
    /// events.
    Closed { events: usize },
}

/// The items of a LIST, all pages joined.
struct Listed<K> {
    items: Vec<K>,
    resource_version: String,
    paginated: bool,
}

/// The WatchList's initial state as it streams in, keyed like the store
/// (`namespace/name`) and kept in arrival order. Held back from the store until the
/// initial-events-end bookmark.
struct InitialState<K> {
    order: Vec<String>,
    objects: HashMap<String, K>,
}

impl<K: Object> InitialState<K> {
    fn new() -> Self {
        InitialState {
            order: Vec::new(),
            objects: HashMap::new(),
        }
    }
    fn upsert(&mut self, obj: K) {
        let key = key_of(&obj);
        if self.objects.insert(key.clone(), obj).is_none() {
            self.order.push(key);
        }
    }
    fn remove(&mut self, obj: &K) {
        self.objects.remove(&key_of(obj));
    }
    fn into_items(mut self) -> Vec<K> {
        // A key removed and added again appears twice in `order`; `remove` yields it once.
        self.order
            .iter()
            .filter_map(|key| self.objects.remove(key))
            .collect()
    }
}

/// `fut`, unless `stop` is cancelled first (`None`).
async fn or_stop<F: Future>(stop: &CancellationToken, fut: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        _ = stop.cancelled() => None,
        out = fut => Some(out),
    }
}

/// A watch's `timeoutSeconds`, uniform in `[MIN_WATCH_TIMEOUT, 2 * MIN_WATCH_TIMEOUT)`.
fn watch_timeout_seconds() -> u32 {
    let timeout = MIN_WATCH_TIMEOUT.mul_f64(1.0 + rand::random::<f64>());
    u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX)
}

/// The object's resourceVersion, if it has a non-empty one.
fn resource_version_of<K: Object>(obj: &K) -> Option<String> {
    obj.metadata()
        .resource_version
        .clone()
        .filter(|rv| !rv.is_empty())
}

impl<K: Object, L: ListerWatcher<K>> Reflector<K, L> {
    /// A reflector from `lw` into `store`, resyncing every `resync` if set.
    pub fn new(
        lw: L,
        store: Arc<dyn ReflectorStore<K>>,
        resync: Option<Duration>,
    ) -> Reflector<K, L> {
        Reflector {
            lw,
            store,
            resync: resync.filter(|period| !period.is_zero()),
            state: Mutex::new(State {
                last_sync_resource_version: None,
                last_sync_resource_version_unavailable: false,
                watch_list_refused: false,
                paginated_result: false,
                backoff: Backoff::reflector(),
            }),
        }
    }

    /// The last resource version published to the store (never an unearned one).
    pub fn last_sync_resource_version(&self) -> Option<String> {
        self.state.lock().last_sync_resource_version.clone()
    }

    /// Whether the server refused WatchList and the reflector uses LIST + WATCH.
    pub fn watch_list_refused(&self) -> bool {
        self.state.lock().watch_list_refused
    }

    /// Runs until `stop`: list/watch, relist on 410, back off on errors.
    pub async fn run(&self, stop: CancellationToken) {
        debug!(kind = std::any::type_name::<K>(), "reflector starting");
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.run_list_and_watch(&stop) => {}
            _ = self.run_resync() => {}
        }
        debug!(kind = std::any::type_name::<K>(), "reflector stopped");
    }

    /// Calls `store.resync()` every period, forever (or never, without a period).
    async fn run_resync(&self) {
        let Some(period) = self.resync else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(period).await;
            self.store.resync();
        }
    }

    /// client-go `wait.BackoffUntil(ListAndWatch, backoffManager, sliding)`: every round that
    /// ends — a failure, or a watch that needs a relist — waits one backoff step first.
    async fn run_list_and_watch(&self, stop: &CancellationToken) {
        while !stop.is_cancelled() {
            match self.list_and_watch(stop).await {
                Ok(()) => {}
                Err(failure) if failure.is_gone() => {
                    info!(
                        kind = std::any::type_name::<K>(),
                        "resource version expired, relisting: {failure}"
                    );
                }
                Err(failure) => {
                    warn!(
                        kind = std::any::type_name::<K>(),
                        "list/watch failed: {failure}"
                    );
                }
            }
            let delay = self.state.lock().backoff.next_delay(Instant::now());
            if or_stop(stop, tokio::time::sleep(delay)).await.is_none() {
                return;
            }
        }
    }

    /// One round: the initial state (WatchList, or LIST), then watch until something needs a
    /// relist. `Ok(())` only when `stop` was cancelled.
    async fn list_and_watch(&self, stop: &CancellationToken) -> Result<(), Failure> {
        let mut stream = None;
        let mut fall_back_to_list = self.state.lock().watch_list_refused;
        if !fall_back_to_list {
            match self.watch_list(stop).await {
                Ok(None) => return Ok(()),
                Ok(Some(s)) => stream = Some(s),
                Err(failure) if failure.is_watch_list_refusal() => {
                    warn!(
                        kind = std::any::type_name::<K>(),
                        "the server refused WatchList, using LIST + WATCH from now on: {failure}"
                    );
                    self.state.lock().watch_list_refused = true;
                    fall_back_to_list = true;
                }
                // Server down or overloaded, or our RV expired: a LIST would fare no better.
                Err(failure) if failure.is_retryable() || failure.is_gone() => {
                    return Err(failure);
                }
                Err(failure) => {
                    // client-go: "making progress is better than deadlocking" — this round
                    // lists instead; the next round tries WatchList again.
                    warn!(
                        kind = std::any::type_name::<K>(),
                        "WatchList failed, falling back to LIST for this round: {failure}"
                    );
                    fall_back_to_list = true;
                }
            }
        }
        if fall_back_to_list && !self.list(stop).await? {
            return Ok(());
        }
        self.watch(stream, stop).await
    }

    /// The WatchList: a watch with the initial state streamed first. Returns the stream, ready
    /// to go on as an ordinary watch, once the initial state is in the store and its RV
    /// published; `Ok(None)` when stopped.
    async fn watch_list(
        &self,
        stop: &CancellationToken,
    ) -> Result<Option<WatchStream<K>>, Failure> {
        let mut retried_after_gone = false;
        loop {
            let resource_version = self.state.lock().rewatch_resource_version();
            let params = WatchParams {
                resource_version: Some(resource_version.clone()),
                resource_version_match: Some(RESOURCE_VERSION_MATCH_NOT_OLDER_THAN.to_string()),
                allow_bookmarks: true,
                send_initial_events: Some(true),
                timeout_seconds: Some(watch_timeout_seconds()),
                ..WatchParams::default()
            };
            let failure = match or_stop(stop, self.lw.watch(&params)).await {
                None => return Ok(None),
                Some(Err(e)) => Failure::from(e),
                Some(Ok(mut stream)) => match self.initial_events(&mut stream, stop).await {
                    Ok(true) => return Ok(Some(stream)),
                    Ok(false) => return Ok(None),
                    Err(failure) => failure,
                },
            };
            if !failure.is_gone() {
                return Err(failure);
            }
            // The version we asked to start from has been compacted: never resume from it;
            // ask for a consistent snapshot instead, at once (client-go marks the RV
            // unavailable and `continue`s). Only once per round, so a server that answers
            // 410 even to that backs us off instead of spinning.
            self.state.lock().last_sync_resource_version_unavailable = true;
            if resource_version.is_empty() || retried_after_gone {
                return Err(failure);
            }
            info!(
                kind = std::any::type_name::<K>(),
                "WatchList from {resource_version} expired, asking for a consistent snapshot"
            );
            retried_after_gone = true;
        }
    }

    /// Consumes a WatchList's initial events into a temporary list and, at the
    /// initial-events-end bookmark, replaces the store's content with it and publishes the
    /// bookmark's RV. `Ok(false)` when stopped first.
    async fn initial_events(
        &self,
        stream: &mut WatchStream<K>,
        stop: &CancellationToken,
    ) -> Result<bool, Failure> {
        let mut initial = InitialState::new();
        loop {
            let Some(next) = or_stop(stop, stream.next()).await else {
                return Ok(false);
            };
            let event = match next {
                None => return Err(Failure::WatchListIncomplete),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(event)) => event,
            };
            match event {
                // The synthetic ADDED events of the initial state are not in RV order (each
                // carries its object's own last-modified RV), so no RV seen here is earned:
                // resuming from one would skip every change between it and the snapshot. Hold
                // the objects back and publish nothing until the bookmark says the snapshot is
                // complete. (MODIFIED/DELETED do not normally occur before the bookmark; they are
                // applied to the temporary list like client-go's temporary store does.)
                WatchEvent::Added(obj) | WatchEvent::Modified(obj) => initial.upsert(obj),
                WatchEvent::Deleted(obj) => initial.remove(&obj),
                WatchEvent::Bookmark {
                    resource_version,
                    annotations,
                } => {
                    let end = annotations
                        .get(INITIAL_EVENTS_END_ANNOTATION)
                        .is_some_and(|v| v == "true");
                    if !end {
                        // A progress bookmark in the middle of the initial state: the snapshot
                        // is still incomplete, so its RV is not earned either.
                        continue;
                    }
                    if resource_version.is_empty() {
                        return Err(Failure::MissingResourceVersion(
                            "initial-events-end bookmark",
                        ));
                    }
                    let items = initial.into_items();
                    debug!(
                        kind = std::any::type_name::<K>(),
                        count = items.len(),
                        resource_version,
                        "WatchList initial state complete"
                    );
                    // The store first, the RV second: whoever reads the RV finds the store
                    // already at (at least) that version.
                    self.store.replace(items, &resource_version);
                    self.publish_snapshot(resource_version);
                    return Ok(true);
                }
                WatchEvent::Error(status) => return Err(Error::Api(status).into()),
            }
        }
    }

    /// The fallback: a paginated LIST, `replace`d into the store, its RV published.
    /// `Ok(false)` when stopped first.
    async fn list(&self, stop: &CancellationToken) -> Result<bool, Failure> {
        let (resource_version, page_size) = {
            let state = self.state.lock();
            let resource_version = state.relist_resource_version();
            // client-go: page "" (consistent, from the store) and "0" (the watch cache ignores
            // the limit then anyway); for a specific RV turn paging off so the watch cache can
            // answer instead of the store — unless this server paged a "0" list before, i.e.
            // it has no watch cache and pages everything.
            let specific = !resource_version.is_empty() && resource_version != "0";
            let page_size = (!specific || state.paginated_result).then_some(LIST_PAGE_SIZE);
            (resource_version, page_size)
        };
        let mut result = self.list_pages(&resource_version, page_size, stop).await;
        if let Err(e) = &result
            && e.is_gone()
            && !resource_version.is_empty()
        {
            // The RV we listed at has been compacted: retry at once, consistently.
            self.state.lock().last_sync_resource_version_unavailable = true;
            result = self.list_pages("", Some(LIST_PAGE_SIZE), stop).await;
        }
        let Some(listed) = result? else {
            return Ok(false);
        };
        if listed.resource_version.is_empty() {
            return Err(Failure::MissingResourceVersion("LIST"));
        }
        if resource_version == "0" && listed.paginated {
            self.state.lock().paginated_result = true;
        }
        debug!(
            kind = std::any::type_name::<K>(),
            count = listed.items.len(),
            resource_version = listed.resource_version,
            "listed"
        );
        self.store.replace(listed.items, &listed.resource_version);
        self.publish_snapshot(listed.resource_version);
        Ok(true)
    }

    /// All pages of one LIST at `resource_version` ("" for a consistent read). `Ok(None)` when
    /// stopped first.
    async fn list_pages(
        &self,
        resource_version: &str,
        limit: Option<u32>,
        stop: &CancellationToken,
    ) -> Result<Option<Listed<K>>, Error> {
        let first = ListParams {
            resource_version: (!resource_version.is_empty()).then(|| resource_version.to_string()),
            limit,
            ..ListParams::default()
        };
        let mut params = first.clone();
        let mut items = Vec::new();
        let mut paginated = false;
        loop {
            let Some(page) = or_stop(stop, self.lw.list(&params)).await else {
                return Ok(None);
            };
            let page: ObjectList<K> = match page {
                Ok(page) => page,
                Err(e) if e.is_gone() && params.continue_token.is_some() => {
                    // The snapshot behind the continue token was compacted mid-list: fall back
                    // to one unpaginated list at the original version (client-go pager's
                    // FullListIfExpired).
                    let full = ListParams {
                        limit: None,
                        ..first.clone()
                    };
                    let Some(page) = or_stop(stop, self.lw.list(&full)).await else {
                        return Ok(None);
                    };
                    let page = page?;
                    return Ok(Some(Listed {
                        items: page.items,
                        resource_version: page.metadata.resource_version.unwrap_or_default(),
                        paginated,
                    }));
                }
                Err(e) => return Err(e),
            };
            items.extend(page.items);
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => {
                    if params.continue_token.as_deref() == Some(token.as_str()) {
                        // A server handing back the token it was given would page forever.
                        return Err(Error::Decode(format!(
                            "LIST returned the same continue token twice: {token:?}"
                        )));
                    }
                    paginated = true;
                    params.continue_token = Some(token);
                    // The token carries the snapshot; the server refuses a resourceVersion
                    // next to it.
                    params.resource_version = None;
                    params.resource_version_match = None;
                }
                _ => {
                    return Ok(Some(Listed {
                        items,
                        resource_version: page.metadata.resource_version.unwrap_or_default(),
                        paginated,
                    }));
                }
            }
        }
    }

    /// Watches from the last synced RV, applying events, re-establishing the watch when the
    /// server closes it, until something needs a relist (`Err`) or `stop` (`Ok`). `stream` is
    /// a WatchList stream already past its initial state, if there is one.
    async fn watch(
        &self,
        mut stream: Option<WatchStream<K>>,
        stop: &CancellationToken,
    ) -> Result<(), Failure> {
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            let started = Instant::now();
            let mut current = match stream.take() {
                Some(s) => s,
                None => {
                    let params = WatchParams {
                        resource_version: Some(
                            self.last_sync_resource_version().unwrap_or_default(),
                        ),
                        allow_bookmarks: true,
                        timeout_seconds: Some(watch_timeout_seconds()),
                        ..WatchParams::default()
                    };
                    match or_stop(stop, self.lw.watch(&params)).await {
                        None => return Ok(()),
                        Some(Ok(s)) => s,
                        Some(Err(e)) => {
                            let failure = Failure::from(e);
                            if failure.is_gone() {
                                self.state.lock().last_sync_resource_version_unavailable = true;
                                return Err(failure);
                            }
                            if !failure.is_retryable() {
                                return Err(failure);
                            }
                            // Unreachable or overloaded: wait, then retry the watch from the
                            // same RV, without the cost of a relist (client-go
                            // `isWatchErrorRetriable`).
                            debug!(
                                kind = std::any::type_name::<K>(),
                                "watch failed, backing off: {failure}"
                            );
                            let delay = self.state.lock().backoff.next_delay(Instant::now());
                            if or_stop(stop, tokio::time::sleep(delay)).await.is_none() {
                                return Ok(());
                            }
                            continue;
                        }
                    }
                }
            };
            match self.handle_watch(&mut current, stop).await {
                Ok(WatchEnd::Stopped) => return Ok(()),
                Ok(WatchEnd::Closed { events }) => {
                    if events == 0 && started.elapsed() < SHORT_WATCH {
                        return Err(Failure::ShortWatch);
                    }
                    // The server's timeout: carry on from the last RV.
                }
                Err(failure) => {
                    if failure.is_gone() {
                        self.state.lock().last_sync_resource_version_unavailable = true;
                    }
                    return Err(failure);
                }
            }
        }
    }

    /// Applies one watch stream's events to the store, publishing each event's RV.
    async fn handle_watch(
        &self,
        stream: &mut WatchStream<K>,
        stop: &CancellationToken,
    ) -> Result<WatchEnd, Failure> {
        let mut events = 0;
        loop {
            let Some(next) = or_stop(stop, stream.next()).await else {
                return Ok(WatchEnd::Stopped);
            };
            let event = match next {
                None => return Ok(WatchEnd::Closed { events }),
                // A dropped connection ends the watch like a timeout does: re-establish it
                // from the last RV (client-go's StreamWatcher closes quietly on EOF).
                Some(Err(Error::Transport(e))) => {
                    debug!(
                        kind = std::any::type_name::<K>(),
                        "watch connection ended: {e}"
                    );
                    return Ok(WatchEnd::Closed { events });
                }
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(event)) => event,
            };
            events += 1;
            // After the initial state, the server sends events in RV order, so each one's RV
            // is earned as soon as the store has the event.
            match event {
                WatchEvent::Added(obj) => {
                    let rv = resource_version_of(&obj);
                    self.store.add(obj);
                    self.publish(rv);
                }
                WatchEvent::Modified(obj) => {
                    let rv = resource_version_of(&obj);
                    self.store.update(obj);
                    self.publish(rv);
                }
                WatchEvent::Deleted(obj) => {
                    let rv = resource_version_of(&obj);
                    self.store.delete(obj);
                    self.publish(rv);
                }
                WatchEvent::Bookmark {
                    resource_version, ..
                } => self.publish(Some(resource_version).filter(|rv| !rv.is_empty())),
                WatchEvent::Error(status) => return Err(Error::Api(status).into()),
            }
        }
    }

    /// Publishes the RV of a complete state just handed to the store; a later relist may
    /// resume from it again.
    fn publish_snapshot(&self, resource_version: String) {
        let mut state = self.state.lock();
        state.last_sync_resource_version = Some(resource_version);
        state.last_sync_resource_version_unavailable = false;
    }

    /// Publishes the RV of a watch event the store already has.
    fn publish(&self, resource_version: Option<String>) {
        if let Some(rv) = resource_version {
            self.state.lock().last_sync_resource_version = Some(rv);
        }
    }
}
