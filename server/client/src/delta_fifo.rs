//! The DeltaFIFO between the reflector and the informer (client-go's `DeltaFIFO`,
//! `docs/tricks.md` #18).
//!
//! The reflector writes what it sees ([`ReflectorStore`]); the informer [`DeltaFifo::pop`]s
//! one key at a time and gets *every* change to that object since the last pop, oldest first,
//! as [`Delta`]s. Keys leave in the order they first arrived; an object that changes while its
//! key is queued keeps its place and accumulates deltas instead of being queued twice.
//!
//! The trick carried here: **`pop` runs the handler while holding the queue lock**. The
//! reflector's `add`/`update`/`replace` take the same lock, so while the informer is
//! processing one item the reflector cannot push more: the backlog is bounded by how fast the
//! informer processes, not by how fast the watch delivers. (The informer's handler only updates
//! the indexer and appends to the handlers' rings, so the lock is held for microseconds; the
//! handlers themselves run elsewhere.)
//!
//! Invariants:
//! - a key is in `queue` exactly once iff it has a non-empty entry in `items`;
//! - two consecutive `Deleted` deltas never sit in one key's list (client-go's
//!   `dedupDeltas`/`isDeletionDup`: the one that is not a tombstone is kept);
//! - lock order is DeltaFIFO → indexer (`replace`/`resync` read the indexer, and the informer's
//!   pop handler writes it, both under this queue's lock). Nothing may take the indexer's lock
//!   and then this one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tracing::{error, warn};

use crate::cache::Indexer;
use crate::object::{Object, key_of};
use crate::reflector::ReflectorStore;

/// A handler holding the queue lock longer than this, with a backlog, is logged: it is
/// stalling the reflector. client-go's `Pop` traces with `LogIfLong(100 * time.Millisecond)`.
const POP_SLOW_HANDLER: Duration = Duration::from_millis(100);

/// Below this queue depth a slow handler is not worth a log line: the backlog it causes is
/// small. client-go's `Pop` only traces when `depth > 10`.
const POP_SLOW_DEPTH_MIN: usize = 10;

/// A deletion learned from a relist: the object vanished while the watch was down, so its
/// final state is unknown and this is the last state the cache had.
#[derive(Clone, Debug)]
pub struct DeletedFinalStateUnknown<K> {
    /// The object's key.
    pub key: String,
    /// The last state the cache had.
    pub obj: std::sync::Arc<K>,
}

/// What happened to an object (client-go's `DeltaType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeltaType {
    /// ADDED from the watch.
    Added,
    /// MODIFIED from the watch.
    Updated,
    /// DELETED from the watch, or (with a tombstone) missing from a relist.
    Deleted,
    /// Listed by a relist (client-go's `EmitDeltaTypeReplaced = true` behaviour).
    Replaced,
    /// Re-delivered by a periodic resync; the object did not change.
    Sync,
}

/// The object a delta carries: the object, or a tombstone for a deletion seen only as an
/// absence from a relist.
#[derive(Clone, Debug)]
pub enum DeltaObject<K> {
    /// The object's state.
    Object(Arc<K>),
    /// A deletion whose final state is unknown.
    Tombstone(DeletedFinalStateUnknown<K>),
}

impl<K: Object> DeltaObject<K> {
    /// The object (for a tombstone, the last state the cache had).
    pub fn object(&self) -> &Arc<K> {
        match self {
            DeltaObject::Object(o) => o,
            DeltaObject::Tombstone(t) => &t.obj,
        }
    }

    /// The key the delta is queued under.
    pub fn key(&self) -> String {
        match self {
            DeltaObject::Object(o) => key_of(o.as_ref()),
            DeltaObject::Tombstone(t) => t.key.clone(),
        }
    }

    /// Whether this is a tombstone.
    pub fn is_tombstone(&self) -> bool {
        matches!(self, DeltaObject::Tombstone(_))
    }
}

/// One change to one object.
#[derive(Clone, Debug)]
pub struct Delta<K> {
    /// What happened.
    pub delta_type: DeltaType,
    /// The object after it happened.
    pub object: DeltaObject<K>,
}

impl<K> Delta<K> {
    fn new(delta_type: DeltaType, object: DeltaObject<K>) -> Delta<K> {
        Delta { delta_type, object }
    }
}

/// Why a [`DeltaFifo::pop`] handler did not process its deltas.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// client-go's `ErrRequeue`: put the deltas back at the end of the queue (unless new
    /// deltas for the key arrived meanwhile, client-go's `AddIfNotPresent`), then report the
    /// cause to the popper.
    #[error("requeued")]
    Requeue(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Processing failed; the deltas are dropped.
    #[error("processing failed")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The state behind the queue lock.
struct State<K> {
    /// key → pending deltas, oldest first. Never holds an empty list.
    items: HashMap<String, Vec<Delta<K>>>,
    /// Keys in the order they were first queued, each once.
    queue: VecDeque<String>,
    /// Whether anything (a replace, add, update or delete) has arrived yet.
    populated: bool,
    /// Items of the first replace not yet popped (client-go's `initialPopulationCount`).
    initial_population_count: usize,
    /// Set by [`DeltaFifo::close`]: nothing more is accepted, poppers get `None` once empty.
    closed: bool,
    /// The resource version of the last replace.
    last_replace_resource_version: Option<String>,
}

impl<K> State<K> {
    fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }
}

/// client-go's `dedupDeltas`: if the last two deltas are both deletions, keep one — the older
/// one, unless it is a tombstone (the newer one then knows more).
fn dedup_deltas<K>(deltas: &mut Vec<Delta<K>>) {
    let n = deltas.len();
    if n < 2 {
        return;
    }
    if deltas[n - 1].delta_type != DeltaType::Deleted
        || deltas[n - 2].delta_type != DeltaType::Deleted
    {
        return;
    }
    let Some(newer) = deltas.pop() else {
        return;
    };
    if let DeltaObject::Tombstone(_) = deltas[n - 2].object {
        deltas[n - 2] = newer;
    }
}

/// The queue of deltas between a reflector and an informer. Share it through an `Arc`.
pub struct DeltaFifo<K> {
    /// A blocking mutex, not an async one: every critical section is synchronous (including
    /// the pop handler, on purpose — see the module doc), and the reflector's `add` must be
    /// able to wait on it from synchronous code.
    state: Mutex<State<K>>,
    /// The informer's indexer: what the consumer has already seen, so a relist can detect
    /// deletions of objects no longer queued and a resync knows what to re-deliver.
    known_objects: Option<Indexer<K>>,
    /// Wakes waiting poppers after anything is queued or the queue is closed.
    item_added: Notify,
    /// `has_synced`, published for async waiters (the informer's `wait_for_sync`).
    synced: watch::Sender<bool>,
}

/// What one locked attempt to pop found.
enum TryPop<T> {
    Popped(Result<T, ProcessError>),
    Empty,
    Closed,
}

impl<K: Object> DeltaFifo<K> {
    /// An empty queue; `known_objects` is the consumer's store (the informer's indexer), used
    /// by `replace` to find deletions and by `resync` to find what to re-deliver.
    pub fn new(known_objects: Option<Indexer<K>>) -> DeltaFifo<K> {
        DeltaFifo {
            state: Mutex::new(State {
                items: HashMap::new(),
                queue: VecDeque::new(),
                populated: false,
                initial_population_count: 0,
                closed: false,
                last_replace_resource_version: None,
            }),
            known_objects,
            item_added: Notify::new(),
            synced: watch::Sender::new(false),
        }
    }

    /// client-go's `queueActionLocked`: appends a delta to the key's list (queuing the key if
    /// it had none) and collapses consecutive deletions.
    fn queue_action(state: &mut State<K>, delta_type: DeltaType, object: DeltaObject<K>) {
        let key = object.key();
        let deltas = state.items.entry(key.clone()).or_default();
        let newly_queued = deltas.is_empty();
        deltas.push(Delta::new(delta_type, object));
        dedup_deltas(deltas);
        if newly_queued {
            state.queue.push_back(key);
        }
    }

    /// Wakes poppers and publishes `has_synced` after a change to `state`.
    fn changed(&self, state: &State<K>) {
        let synced = state.has_synced();
        self.synced.send_if_modified(|s| {
            let changed = *s != synced;
            *s = synced;
            changed
        });
        self.item_added.notify_waiters();
    }

    /// Queues one delta for `obj` (the watch's add/update).
    fn push(&self, delta_type: DeltaType, obj: K) {
        let mut state = self.state.lock();
        if state.closed {
            return;
        }
        state.populated = true;
        Self::queue_action(&mut state, delta_type, DeltaObject::Object(Arc::new(obj)));
        self.changed(&state);
    }

    /// client-go's `AddIfNotPresent`: queues `deltas` for `key` unless the key already has
    /// pending deltas (which are newer). Used to requeue what a handler could not process.
    pub fn add_if_not_present(&self, key: &str, deltas: Vec<Delta<K>>) {
        let mut state = self.state.lock();
        Self::add_if_not_present_locked(&mut state, key, deltas);
        self.changed(&state);
    }

    fn add_if_not_present_locked(state: &mut State<K>, key: &str, deltas: Vec<Delta<K>>) {
        if deltas.is_empty() || state.items.contains_key(key) {
            return;
        }
        state.populated = true;
        state.items.insert(key.to_string(), deltas);
        state.queue.push_back(key.to_string());
    }

    /// Waits for a key, removes it with all its deltas and runs `handler(key, deltas,
    /// is_in_initial_list)` **while holding the queue lock**, so that nothing can be added
    /// while the handler runs: the reflector waits, and the backlog cannot grow behind a
    /// handler (`docs/tricks.md` #18). The handler must therefore be quick and must not block —
    /// hand slow work to something else (the informer hands it to each handler's ring).
    ///
    /// `is_in_initial_list` is true while the items of the first replace are being popped.
    /// If the handler returns [`ProcessError::Requeue`], the deltas go back to the end of the
    /// queue. Returns `None` once the queue is closed and empty. Cancel-safe: dropping the
    /// future before it returns pops nothing.
    pub async fn pop<T, F>(&self, handler: F) -> Option<Result<T, ProcessError>>
    where
        F: FnOnce(&str, &[Delta<K>], bool) -> Result<T, ProcessError>,
    {
        let mut handler = Some(handler);
        loop {
            // Registered before looking at the queue, so an add between the look and the
            // await still wakes us.
            let notified = self.item_added.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.try_pop(&mut handler) {
                TryPop::Popped(result) => return Some(result),
                TryPop::Closed => return None,
                TryPop::Empty => notified.await,
            }
        }
    }

    /// One locked attempt at [`Self::pop`]; takes the handler only if it pops something.
    fn try_pop<T, F>(&self, handler: &mut Option<F>) -> TryPop<T>
    where
        F: FnOnce(&str, &[Delta<K>], bool) -> Result<T, ProcessError>,
    {
        let mut state = self.state.lock();
        loop {
            let Some(key) = state.queue.pop_front() else {
                return if state.closed {
                    TryPop::Closed
                } else {
                    TryPop::Empty
                };
            };
            let is_in_initial_list = !state.has_synced();
            state.initial_population_count = state.initial_population_count.saturating_sub(1);
            let Some(deltas) = state.items.remove(&key) else {
                // Breaks the queue/items invariant; skip the key rather than wedge the informer.
                error!(key = %key, "delta fifo: key queued without deltas; ignoring");
                continue;
            };
            let Some(handler) = handler.take() else {
                error!("delta fifo: pop handler already used");
                return TryPop::Empty;
            };
            let depth = state.queue.len();
            let started = Instant::now();
            let result = handler(&key, &deltas, is_in_initial_list);
            let took = started.elapsed();
            if took > POP_SLOW_HANDLER && depth > POP_SLOW_DEPTH_MIN {
                warn!(key = %key, depth, took_ms = took.as_millis() as u64, "delta fifo: slow pop handler");
            }
            if let Err(ProcessError::Requeue(_)) = &result {
                Self::add_if_not_present_locked(&mut state, &key, deltas);
            }
            self.changed(&state);
            return TryPop::Popped(result);
        }
    }

    /// Closes the queue: nothing more is accepted, and poppers get `None` once it is empty.
    pub fn close(&self) {
        let mut state = self.state.lock();
        state.closed = true;
        self.changed(&state);
    }

    /// Whether [`Self::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// True once the first replace's items (or the first add, if one came first) have all
    /// been popped and processed (client-go's `populated && initialPopulationCount == 0`).
    pub fn has_synced(&self) -> bool {
        self.state.lock().has_synced()
    }

    /// Waits until [`Self::has_synced`].
    pub async fn wait_for_sync(&self) {
        let mut synced = self.synced.subscribe();
        // The sender lives in `self`, which outlives this borrow: the wait cannot fail.
        let _ = synced.wait_for(|s| *s).await;
    }

    /// Number of queued keys.
    pub fn len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Whether no key is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queued keys, in queue order.
    pub fn list_keys(&self) -> Vec<String> {
        self.state.lock().queue.iter().cloned().collect()
    }

    /// The pending deltas of `key`, oldest first.
    pub fn deltas(&self, key: &str) -> Option<Vec<Delta<K>>> {
        self.state.lock().items.get(key).cloned()
    }

    /// The resource version of the last [`ReflectorStore::replace`].
    pub fn last_replace_resource_version(&self) -> Option<String> {
        self.state.lock().last_replace_resource_version.clone()
    }
}

impl<K: Object> ReflectorStore<K> for DeltaFifo<K> {
    /// client-go's `Replace` with `EmitDeltaTypeReplaced`: a `Replaced` delta for every listed
    /// object, then a `Deleted` tombstone for every key that is queued or known to the
    /// consumer but absent from the list (its deletion was missed while the watch was down).
    fn replace(&self, items: Vec<K>, resource_version: &str) {
        let mut state = self.state.lock();
        if state.closed {
            return;
        }
        let mut listed = HashSet::with_capacity(items.len());
        for obj in items {
            let object = DeltaObject::Object(Arc::new(obj));
            listed.insert(object.key());
            Self::queue_action(&mut state, DeltaType::Replaced, object);
        }

        // Deletions of queued objects: the tombstone carries the newest state we queued.
        let mut queued_deletions = 0;
        let missing_queued: Vec<(String, Arc<K>)> = state
            .items
            .iter()
            .filter(|(key, _)| !listed.contains(key.as_str()))
            .filter_map(|(key, deltas)| {
                let newest = deltas.last()?;
                Some((key.clone(), newest.object.object().clone()))
            })
            .collect();
        for (key, obj) in missing_queued {
            queued_deletions += 1;
            let tombstone = DeletedFinalStateUnknown { key, obj };
            Self::queue_action(
                &mut state,
                DeltaType::Deleted,
                DeltaObject::Tombstone(tombstone),
            );
        }

        // Deletions of objects the consumer has but nobody queued: the tombstone carries the
        // consumer's last state.
        if let Some(known) = &self.known_objects {
            for key in known.keys() {
                if listed.contains(&key) || state.items.contains_key(&key) {
                    continue;
                }
                let Some(obj) = known.get(&key) else {
                    continue;
                };
                queued_deletions += 1;
                let tombstone = DeletedFinalStateUnknown { key, obj };
                Self::queue_action(
                    &mut state,
                    DeltaType::Deleted,
                    DeltaObject::Tombstone(tombstone),
                );
            }
        }

        if !state.populated {
            state.populated = true;
            state.initial_population_count = listed.len() + queued_deletions;
        }
        state.last_replace_resource_version = Some(resource_version.to_string());
        self.changed(&state);
    }

    fn add(&self, obj: K) {
        self.push(DeltaType::Added, obj);
    }

    fn update(&self, obj: K) {
        self.push(DeltaType::Updated, obj);
    }

    /// client-go's `Delete`: skipped if neither the consumer nor the queue has the object
    /// (it is already gone); otherwise a `Deleted` delta with the object's final state.
    fn delete(&self, obj: K) {
        let object = DeltaObject::Object(Arc::new(obj));
        let key = object.key();
        let mut state = self.state.lock();
        if state.closed {
            return;
        }
        state.populated = true;
        let known = match &self.known_objects {
            Some(known) => known.get(&key).is_some(),
            None => false,
        };
        if !known && !state.items.contains_key(&key) {
            return;
        }
        Self::queue_action(&mut state, DeltaType::Deleted, object);
        self.changed(&state);
    }

    /// client-go's `Resync`: a `Sync` delta for every object the consumer has, except those
    /// with pending deltas — those deltas are newer than the consumer's state, and a Sync
    /// queued behind them would deliver the old state last.
    fn resync(&self) {
        let Some(known) = &self.known_objects else {
            return;
        };
        let mut state = self.state.lock();
        if state.closed {
            return;
        }
        for key in known.keys() {
            if state.items.contains_key(&key) {
                continue;
            }
            if let Some(obj) = known.get(&key) {
                Self::queue_action(&mut state, DeltaType::Sync, DeltaObject::Object(obj));
            }
        }
        self.changed(&state);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    fn pod(name: &str, rv: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("ns".into());
        p.metadata.name = Some(name.into());
        p.metadata.resource_version = Some(rv.into());
        p
    }

    fn types(deltas: &[Delta<Pod>]) -> Vec<DeltaType> {
        deltas.iter().map(|d| d.delta_type).collect()
    }

    fn rv(d: &Delta<Pod>) -> String {
        d.object
            .object()
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default()
    }

    /// Pops one item and returns its key and deltas.
    async fn pop_one(fifo: &DeltaFifo<Pod>) -> (String, Vec<Delta<Pod>>, bool) {
        fifo.pop(|key, deltas, initial| Ok((key.to_string(), deltas.to_vec(), initial)))
            .await
            .expect("queue open")
            .expect("handler succeeded")
    }

    #[tokio::test]
    async fn deltas_accumulate_per_key_in_first_arrival_order() {
        let fifo = DeltaFifo::new(None);
        fifo.add(pod("a", "1"));
        fifo.add(pod("b", "2"));
        fifo.update(pod("a", "3"));
        assert_eq!(fifo.list_keys(), ["ns/a", "ns/b"], "a is queued once");
        let (key, deltas, _) = pop_one(&fifo).await;
        assert_eq!(key, "ns/a");
        assert_eq!(types(&deltas), [DeltaType::Added, DeltaType::Updated]);
        assert_eq!(rv(&deltas[1]), "3");
        let (key, _, _) = pop_one(&fifo).await;
        assert_eq!(key, "ns/b");
        assert!(fifo.is_empty());
    }

    #[test]
    fn consecutive_deletes_collapse_keeping_the_non_tombstone() {
        let known = Indexer::new();
        known.upsert("ns/a", Arc::new(pod("a", "1")));
        let fifo = DeltaFifo::new(Some(known));
        // The watch's deletion (with the final state) ...
        fifo.delete(pod("a", "2"));
        // ... then a relist that no longer lists the object adds a tombstone: collapsed, and
        // the delta that knows the final state wins even though it is older.
        fifo.replace(vec![], "10");
        let deltas = fifo.deltas("ns/a").unwrap();
        assert_eq!(types(&deltas), [DeltaType::Deleted]);
        assert!(!deltas[0].object.is_tombstone());
        assert_eq!(rv(&deltas[0]), "2");
        // Two watch deletions: the older one is kept.
        fifo.delete(pod("a", "3"));
        let deltas = fifo.deltas("ns/a").unwrap();
        assert_eq!(deltas.len(), 1);
        assert_eq!(rv(&deltas[0]), "2");
        assert_eq!(fifo.len(), 1);
    }

    #[test]
    fn a_tombstone_followed_by_a_real_delete_keeps_the_real_one() {
        let mut deltas = vec![
            Delta::new(
                DeltaType::Deleted,
                DeltaObject::Tombstone(DeletedFinalStateUnknown {
                    key: "ns/a".into(),
                    obj: Arc::new(pod("a", "1")),
                }),
            ),
            Delta::new(
                DeltaType::Deleted,
                DeltaObject::Object(Arc::new(pod("a", "2"))),
            ),
        ];
        dedup_deltas(&mut deltas);
        assert_eq!(deltas.len(), 1);
        assert!(!deltas[0].object.is_tombstone());
    }

    #[test]
    fn delete_of_an_unknown_object_is_dropped() {
        let fifo = DeltaFifo::new(Some(Indexer::new()));
        fifo.delete(pod("ghost", "1"));
        assert!(fifo.is_empty());
    }

    #[tokio::test]
    async fn replace_queues_replaced_and_tombstones_for_missing_keys() {
        let known = Indexer::new();
        known.upsert("ns/kept", Arc::new(pod("kept", "1")));
        known.upsert("ns/gone", Arc::new(pod("gone", "1")));
        let fifo = DeltaFifo::new(Some(known));
        // Queued but never seen by the consumer, and absent from the list.
        fifo.add(pod("queued-gone", "2"));
        fifo.replace(vec![pod("kept", "5"), pod("new", "5")], "5");
        assert_eq!(fifo.last_replace_resource_version().as_deref(), Some("5"));

        let kept = fifo.deltas("ns/kept").unwrap();
        assert_eq!(types(&kept), [DeltaType::Replaced]);
        assert_eq!(
            types(&fifo.deltas("ns/new").unwrap()),
            [DeltaType::Replaced]
        );

        let gone = fifo.deltas("ns/gone").unwrap();
        assert_eq!(types(&gone), [DeltaType::Deleted]);
        match &gone[0].object {
            DeltaObject::Tombstone(t) => {
                assert_eq!(t.key, "ns/gone");
                assert_eq!(t.obj.metadata.resource_version.as_deref(), Some("1"));
            }
            other => panic!("expected a tombstone, got {other:?}"),
        }

        let queued = fifo.deltas("ns/queued-gone").unwrap();
        assert_eq!(types(&queued), [DeltaType::Added, DeltaType::Deleted]);
        assert!(queued[1].object.is_tombstone());
        assert_eq!(
            rv(&queued[1]),
            "2",
            "tombstone carries the newest queued state"
        );
    }

    #[test]
    fn resync_queues_sync_only_for_keys_without_pending_deltas() {
        let known = Indexer::new();
        known.upsert("ns/idle", Arc::new(pod("idle", "1")));
        known.upsert("ns/busy", Arc::new(pod("busy", "1")));
        let fifo = DeltaFifo::new(Some(known));
        fifo.update(pod("busy", "2"));
        fifo.resync();
        assert_eq!(types(&fifo.deltas("ns/idle").unwrap()), [DeltaType::Sync]);
        let busy = fifo.deltas("ns/busy").unwrap();
        assert_eq!(
            types(&busy),
            [DeltaType::Updated],
            "no Sync behind a pending delta"
        );
        assert_eq!(rv(&busy[0]), "2");
    }

    #[test]
    fn resync_without_known_objects_does_nothing() {
        let fifo = DeltaFifo::<Pod>::new(None);
        fifo.resync();
        assert!(fifo.is_empty());
    }

    #[tokio::test]
    async fn has_synced_after_the_initial_population_is_popped() {
        let known = Indexer::new();
        known.upsert("ns/old", Arc::new(pod("old", "1")));
        let fifo = DeltaFifo::new(Some(known));
        assert!(!fifo.has_synced(), "nothing has arrived");
        fifo.replace(vec![pod("a", "2"), pod("b", "2")], "2");
        // Three items: a, b and the tombstone for old.
        assert!(!fifo.has_synced());
        fifo.add(pod("c", "3"));
        let (_, _, initial) = pop_one(&fifo).await;
        assert!(initial);
        let (_, _, initial) = pop_one(&fifo).await;
        assert!(initial);
        assert!(!fifo.has_synced());
        let (key, deltas, initial) = pop_one(&fifo).await;
        assert_eq!(key, "ns/old");
        assert_eq!(types(&deltas), [DeltaType::Deleted]);
        assert!(initial);
        assert!(fifo.has_synced());
        fifo.wait_for_sync().await;
        let (key, _, initial) = pop_one(&fifo).await;
        assert_eq!(key, "ns/c");
        assert!(!initial, "items after the first list are not initial");
    }

    #[tokio::test]
    async fn an_empty_first_list_is_synced_at_once() {
        let fifo = DeltaFifo::<Pod>::new(Some(Indexer::new()));
        fifo.replace(vec![], "1");
        assert!(fifo.has_synced());
    }

    #[tokio::test]
    async fn requeue_puts_the_deltas_back_at_the_end() {
        let fifo = DeltaFifo::new(None);
        fifo.add(pod("a", "1"));
        fifo.add(pod("b", "1"));
        let result = fifo
            .pop(|key, _, _| -> Result<(), ProcessError> {
                assert_eq!(key, "ns/a");
                Err(ProcessError::Requeue("conflict".into()))
            })
            .await
            .unwrap();
        assert!(matches!(result, Err(ProcessError::Requeue(_))));
        assert_eq!(fifo.list_keys(), ["ns/b", "ns/a"]);
        assert_eq!(types(&fifo.deltas("ns/a").unwrap()), [DeltaType::Added]);

        // A failure that is not a requeue drops the deltas.
        let result = fifo
            .pop(|_, _, _| -> Result<(), ProcessError> { Err(ProcessError::Failed("bad".into())) })
            .await
            .unwrap();
        assert!(matches!(result, Err(ProcessError::Failed(_))));
        assert_eq!(fifo.list_keys(), ["ns/a"]);
    }

    #[test]
    fn add_if_not_present_keeps_newer_deltas() {
        let fifo = DeltaFifo::new(None);
        fifo.update(pod("a", "2"));
        let old = vec![Delta::new(
            DeltaType::Added,
            DeltaObject::Object(Arc::new(pod("a", "1"))),
        )];
        fifo.add_if_not_present("ns/a", old);
        let deltas = fifo.deltas("ns/a").unwrap();
        assert_eq!(types(&deltas), [DeltaType::Updated]);
    }

    /// `docs/tricks.md` #18: while the handler runs, an add from another thread waits for it.
    #[test]
    fn pop_runs_the_handler_under_the_queue_lock() {
        let fifo = Arc::new(DeltaFifo::new(None));
        fifo.add(pod("a", "1"));
        let (in_handler_tx, in_handler_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();

        let popper = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(fifo.pop(|_, _, _| {
                    in_handler_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok(())
                }))
            })
        };
        in_handler_rx.recv().unwrap();

        let added = Arc::new(AtomicBool::new(false));
        let adder = {
            let (fifo, added) = (fifo.clone(), added.clone());
            std::thread::spawn(move || {
                fifo.add(pod("b", "1"));
                added.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !added.load(Ordering::SeqCst),
            "add went through while the handler ran"
        );

        release_tx.send(()).unwrap();
        adder.join().unwrap();
        assert!(added.load(Ordering::SeqCst));
        assert!(matches!(popper.join().unwrap(), Some(Ok(()))));
        assert_eq!(fifo.list_keys(), ["ns/b"]);
    }

    #[tokio::test]
    async fn pop_waits_for_an_item_and_close_wakes_with_none() {
        let fifo = Arc::new(DeltaFifo::new(None));
        let waiter = {
            let fifo = fifo.clone();
            tokio::spawn(async move { fifo.pop(|key, _, _| Ok(key.to_string())).await })
        };
        tokio::task::yield_now().await;
        fifo.add(pod("a", "1"));
        let popped = waiter.await.unwrap();
        assert_eq!(popped.unwrap().unwrap(), "ns/a");

        let waiter = {
            let fifo = fifo.clone();
            tokio::spawn(async move { fifo.pop(|_, _, _| Ok(())).await })
        };
        tokio::task::yield_now().await;
        fifo.close();
        assert!(waiter.await.unwrap().is_none());
        fifo.add(pod("b", "1"));
        assert!(fifo.is_empty(), "a closed queue accepts nothing");
    }
}
