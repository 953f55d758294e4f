//! The shared informer (client-go's `sharedIndexInformer`): one reflector and one DeltaFIFO
//! feeding one indexer and many handlers, each with its own unbounded ring (`docs/tricks.md`
//! #18, the informer's unbounded ring per handler and Pop under the queue lock).
//!
//! The path of an object:
//! 1. the [`Reflector`] lists and watches, and writes into the [`DeltaFifo`];
//! 2. one processing task pops the DeltaFIFO; under its lock it updates the [`Indexer`] and
//!    appends one notification per delta to every handler's channel (never blocking);
//! 3. per handler, a buffering task moves notifications from that channel into a growing
//!    `VecDeque` (the ring) and hands them one at a time to a dedicated thread that calls the
//!    handler.
//!
//! A slow handler therefore delays only its own ring. Its backlog grows without bound: that is
//! the trade-off client-go makes on purpose — memory for correctness. Dropping notifications
//! would silently desynchronise the handler from the cache, and blocking would stall the
//! DeltaFIFO and with it every other handler and the reflector; an informer whose handler can
//! never keep up eventually runs out of memory instead, loudly.
//!
//! Lock order: DeltaFIFO → processor (listeners) → indexer. The processor lock is client-go's
//! `blockDeltas`: a handler added late takes it to read the indexer and queue its synthetic
//! adds, so it sees each object exactly once — in the snapshot or as a later notification.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::cache::{IndexFunc, Indexer};
use crate::delta_fifo::{DeletedFinalStateUnknown, Delta, DeltaFifo, DeltaObject, DeltaType};
use crate::object::Object;
use crate::reflector::{ListerWatcher, Reflector, ReflectorStore};

/// Initial capacity of a handler's ring; it grows past this as needed (it is *not* a bound).
/// client-go's `initialBufferSize = 1024`: enough for a burst of a thousand objects without
/// reallocating, a few KiB of pointers per handler when idle.
const RING_INITIAL_CAPACITY: usize = 1024;

/// A ring whose backlog reaches this many notifications is logged, and again at every
/// doubling: not a bound (nothing is dropped), only a sign that a handler is falling behind on
/// the way to the out-of-memory the design accepts. Sixteen times the initial capacity:
/// past any ordinary burst (a relist of a few thousand objects), and at most ~log2(memory)
/// lines per handler.
const RING_BACKLOG_WARN: usize = 16 * RING_INITIAL_CAPACITY;

/// Notifications in flight between a ring and its handler thread: one, like client-go's
/// unbuffered `nextCh`, so the backlog stays in the ring where it can be seen.
const HANDOFF_CAPACITY: usize = 1;

/// Numbers the handler threads, for their names.
static HANDLER_THREAD_ID: AtomicUsize = AtomicUsize::new(0);

/// What a handler is told of a deletion: the object's last state, or a tombstone when the
/// deletion was learned from a relist (the last state may be stale).
#[derive(Clone, Debug)]
pub enum Deleted<K> {
    /// The object as it was deleted.
    Object(Arc<K>),
    /// The deletion was missed; this is the last state the cache had.
    Unknown(DeletedFinalStateUnknown<K>),
}

impl<K> Deleted<K> {
    /// The object (last known state either way).
    pub fn object(&self) -> &Arc<K> {
        match self {
            Deleted::Object(o) => o,
            Deleted::Unknown(t) => &t.obj,
        }
    }
}

/// Handlers of an informer's notifications. Each handler runs on its own thread, fed by its
/// own ring; a slow handler delays only itself.
pub trait EventHandler<K>: Send + Sync + 'static {
    /// A new object (or, with `is_initial_list`, one from the first list).
    fn on_add(&self, obj: &Arc<K>, is_initial_list: bool);
    /// A changed object (also called on resync with `old` and `new` the same object).
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>);
    /// A deleted object.
    fn on_delete(&self, obj: &Deleted<K>);
}

/// One notification for one handler.
enum Notification<K> {
    Add { obj: Arc<K>, is_initial_list: bool },
    Update { old: Arc<K>, new: Arc<K> },
    Delete(Deleted<K>),
}

impl<K> Clone for Notification<K> {
    fn clone(&self) -> Self {
        match self {
            Notification::Add {
                obj,
                is_initial_list,
            } => Notification::Add {
                obj: obj.clone(),
                is_initial_list: *is_initial_list,
            },
            Notification::Update { old, new } => Notification::Update {
                old: old.clone(),
                new: new.clone(),
            },
            Notification::Delete(d) => Notification::Delete(d.clone_shallow()),
        }
    }
}

impl<K> Deleted<K> {
    /// A clone sharing the object (no `K: Clone` needed).
    fn clone_shallow(&self) -> Deleted<K> {
        match self {
            Deleted::Object(o) => Deleted::Object(o.clone()),
            Deleted::Unknown(t) => Deleted::Unknown(DeletedFinalStateUnknown {
                key: t.key.clone(),
                obj: t.obj.clone(),
            }),
        }
    }
}

/// What feeds the DeltaFIFO, with the lister-watcher's type erased: the reflector, or nothing
/// for a [`SharedInformer::manual`] informer.
trait Source: Send + Sync + 'static {
    /// Runs until `stop`.
    fn run(self: Arc<Self>, stop: CancellationToken) -> BoxFuture<'static, ()>;
    /// The last resource version published.
    fn last_sync_resource_version(&self) -> Option<String>;
}

impl<K: Object, L: ListerWatcher<K>> Source for Reflector<K, L> {
    fn run(self: Arc<Self>, stop: CancellationToken) -> BoxFuture<'static, ()> {
        Box::pin(async move { Reflector::run(&self, stop).await })
    }
    fn last_sync_resource_version(&self) -> Option<String> {
        Reflector::last_sync_resource_version(self)
    }
}

/// The source of a manual informer: the caller writes into the DeltaFIFO itself.
struct ManualSource<K> {
    fifo: Arc<DeltaFifo<K>>,
}

impl<K: Object> Source for ManualSource<K> {
    fn run(self: Arc<Self>, _stop: CancellationToken) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
    fn last_sync_resource_version(&self) -> Option<String> {
        self.fifo.last_replace_resource_version()
    }
}

/// A handler not yet running (added before [`SharedInformer::run`]).
struct PendingListener<K> {
    handler: Box<dyn EventHandler<K>>,
    notifications: mpsc::UnboundedReceiver<Notification<K>>,
}

/// Where the informer runs, once it does.
struct Running {
    runtime: Handle,
    stop: CancellationToken,
}

/// client-go's `sharedProcessor`: the handlers' channels.
struct Processor<K> {
    /// One sender per handler. Unbounded on purpose (see the module doc): the distributor
    /// runs under the DeltaFIFO's lock and must never wait for a handler.
    listeners: Vec<mpsc::UnboundedSender<Notification<K>>>,
    /// Handlers added before `run`, started by it.
    pending: Vec<PendingListener<K>>,
    /// Set by `run`.
    running: Option<Running>,
}

impl<K: Object> Processor<K> {
    /// Sends `n` to every handler. A handler whose ring is gone (the informer stopped) is
    /// skipped.
    fn distribute(&self, n: Notification<K>) {
        for listener in &self.listeners {
            let _ = listener.send(n.clone());
        }
    }
}

struct Inner<K> {
    indexer: Indexer<K>,
    fifo: Arc<DeltaFifo<K>>,
    source: Arc<dyn Source>,
    /// A blocking mutex: held by the DeltaFIFO's pop handler (synchronous, under the queue
    /// lock) and by `add_handler`; neither awaits while holding it.
    processor: Mutex<Processor<K>>,
}

impl<K: Object> Inner<K> {
    /// client-go's `HandleDeltas`/`processDeltas`: applies one key's deltas to the indexer and
    /// tells every handler. Runs under the DeltaFIFO's lock.
    fn handle_deltas(&self, key: &str, deltas: &[Delta<K>], is_in_initial_list: bool) {
        let processor = self.processor.lock();
        for delta in deltas {
            let notification = match delta.delta_type {
                DeltaType::Added | DeltaType::Updated | DeltaType::Replaced | DeltaType::Sync => {
                    let obj = delta.object.object().clone();
                    match self.indexer.upsert(key, obj.clone()) {
                        // For a Sync delta `obj` came from the indexer: old and new are the
                        // same object, which is how handlers recognise a resync.
                        Some(old) => Notification::Update { old, new: obj },
                        None => Notification::Add {
                            obj,
                            is_initial_list: is_in_initial_list,
                        },
                    }
                }
                DeltaType::Deleted => {
                    self.indexer.remove(key);
                    Notification::Delete(match &delta.object {
                        DeltaObject::Object(o) => Deleted::Object(o.clone()),
                        DeltaObject::Tombstone(t) => Deleted::Unknown(t.clone()),
                    })
                }
            };
            processor.distribute(notification);
        }
    }

    /// Pops the DeltaFIFO until `stop` (client-go's `controller.processLoop`).
    async fn process_loop(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let popped = tokio::select! {
                _ = stop.cancelled() => break,
                popped = self.fifo.pop(|key, deltas, initial| {
                    self.handle_deltas(key, deltas, initial);
                    Ok(())
                }) => popped,
            };
            match popped {
                None => break,
                Some(Ok(())) => {}
                Some(Err(e)) => warn!(error = %e, "informer: processing deltas failed"),
            }
        }
        self.fifo.close();
        debug!("informer: processing stopped");
    }
}

/// Starts one handler: its buffering task on `running`'s runtime and its thread.
fn start_listener<K: Object>(
    running: &Running,
    handler: Box<dyn EventHandler<K>>,
    notifications: mpsc::UnboundedReceiver<Notification<K>>,
) {
    let (handoff_tx, handoff_rx) = mpsc::channel(HANDOFF_CAPACITY);
    running
        .runtime
        .spawn(ring(notifications, handoff_tx, running.stop.clone()));

    // A thread, not a task: handlers are synchronous and may block (on a lock, on I/O, on a
    // test's barrier); on a runtime worker that would stall unrelated tasks. It ends when the
    // ring drops its end of the handoff.
    // The thread enters the informer's runtime, so a handler can use what needs one (a
    // workqueue's `add_after` timer, `tokio::spawn`) without blocking on it.
    let id = HANDLER_THREAD_ID.fetch_add(1, Ordering::Relaxed);
    let runtime = running.runtime.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("informer-handler-{id}"))
        .spawn(move || {
            let _entered = runtime.enter();
            run_handler(handler.as_ref(), handoff_rx)
        });
    if let Err(e) = spawned {
        error!(error = %e, "informer: cannot start a handler thread; the handler gets no events");
    }
}

/// client-go's `processorListener.pop`: the ring between the distributor and one handler.
///
/// The `VecDeque` grows without bound, on purpose (see the module doc): a slow handler costs
/// memory, never a lost event, and never blocks the DeltaFIFO or the other handlers.
async fn ring<K>(
    mut notifications: mpsc::UnboundedReceiver<Notification<K>>,
    handoff: mpsc::Sender<Notification<K>>,
    stop: CancellationToken,
) {
    let mut pending: VecDeque<Notification<K>> = VecDeque::with_capacity(RING_INITIAL_CAPACITY);
    let mut backlog_warn = RING_BACKLOG_WARN;
    loop {
        if pending.len() >= backlog_warn {
            warn!(
                backlog = pending.len(),
                "informer: a handler is falling behind; its ring keeps growing"
            );
            backlog_warn = backlog_warn.saturating_mul(2);
        }
        if pending.is_empty() {
            backlog_warn = RING_BACKLOG_WARN;
            tokio::select! {
                _ = stop.cancelled() => return,
                n = notifications.recv() => match n {
                    Some(n) => pending.push_back(n),
                    None => return,
                },
            }
        } else {
            tokio::select! {
                _ = stop.cancelled() => return,
                permit = handoff.reserve() => match (permit, pending.pop_front()) {
                    (Ok(permit), Some(n)) => permit.send(n),
                    // The handler thread is gone.
                    (Err(_), _) => return,
                    (Ok(_), None) => {}
                },
                n = notifications.recv() => match n {
                    Some(n) => pending.push_back(n),
                    None => return,
                },
            }
        }
    }
}

/// client-go's `processorListener.run`: calls the handler for each notification, in order.
fn run_handler<K: Object>(
    handler: &dyn EventHandler<K>,
    mut handoff: mpsc::Receiver<Notification<K>>,
) {
    while let Some(n) = handoff.blocking_recv() {
        let called = catch_unwind(AssertUnwindSafe(|| match &n {
            Notification::Add {
                obj,
                is_initial_list,
            } => handler.on_add(obj, *is_initial_list),
            Notification::Update { old, new } => handler.on_update(old, new),
            Notification::Delete(d) => handler.on_delete(d),
        }));
        if called.is_err() {
            // A handler bug; the next notifications still go through.
            error!("informer: event handler panicked");
        }
    }
}

/// A shared informer for `K`. Clones share it.
pub struct SharedInformer<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for SharedInformer<K> {
    fn clone(&self) -> Self {
        SharedInformer {
            inner: self.inner.clone(),
        }
    }
}

impl<K: Object> SharedInformer<K> {
    /// An informer over `lw`, resyncing every `resync` if set (handlers then get
    /// `on_update(obj, obj)` for every cached object each period).
    pub fn new<L: ListerWatcher<K>>(lw: L, resync: Option<Duration>) -> SharedInformer<K> {
        let indexer = Indexer::new();
        let fifo = Arc::new(DeltaFifo::new(Some(indexer.clone())));
        let store: Arc<dyn ReflectorStore<K>> = fifo.clone();
        let reflector = Arc::new(Reflector::new(lw, store, resync));
        SharedInformer::with_source(indexer, fifo, reflector)
    }

    /// An informer with no reflector: the caller feeds the returned DeltaFIFO through its
    /// [`ReflectorStore`] methods (`replace`, `add`, `update`, `delete`, `resync`), and what it
    /// writes flows to the indexer and the handlers exactly as a reflector's writes would.
    /// For tests of controllers and of the informer itself. `last_sync_resource_version` is
    /// the version of the last `replace`.
    pub fn manual() -> (SharedInformer<K>, Arc<DeltaFifo<K>>) {
        let indexer = Indexer::new();
        let fifo = Arc::new(DeltaFifo::new(Some(indexer.clone())));
        let source = Arc::new(ManualSource { fifo: fifo.clone() });
        (
            SharedInformer::with_source(indexer, fifo.clone(), source),
            fifo,
        )
    }

    fn with_source(
        indexer: Indexer<K>,
        fifo: Arc<DeltaFifo<K>>,
        source: Arc<dyn Source>,
    ) -> SharedInformer<K> {
        SharedInformer {
            inner: Arc::new(Inner {
                indexer,
                fifo,
                source,
                processor: Mutex::new(Processor {
                    listeners: Vec::new(),
                    pending: Vec::new(),
                    running: None,
                }),
            }),
        }
    }

    /// Adds an index before the informer runs.
    pub fn add_index(&self, name: &str, f: IndexFunc<K>) -> Result<(), String> {
        if self.inner.processor.lock().running.is_some() {
            return Err(format!(
                "cannot add index {name:?}: informer has already started"
            ));
        }
        self.inner.indexer.add_index(name, f)
    }

    /// Adds a handler; one added after the informer started first receives an `on_add` for
    /// every object in the cache (with `is_initial_list` set).
    pub fn add_handler<H: EventHandler<K>>(&self, handler: H) {
        let (tx, rx) = mpsc::unbounded_channel();
        // Held while reading the indexer and registering, so no delta is applied in between
        // (client-go's `blockDeltas`).
        let mut processor = self.inner.processor.lock();
        let handler: Box<dyn EventHandler<K>> = Box::new(handler);
        match &processor.running {
            None => processor.pending.push(PendingListener {
                handler,
                notifications: rx,
            }),
            Some(running) => {
                for obj in self.inner.indexer.list() {
                    let _ = tx.send(Notification::Add {
                        obj,
                        is_initial_list: true,
                    });
                }
                start_listener(running, handler, rx);
            }
        }
        processor.listeners.push(tx);
    }

    /// The indexer (the lister's view).
    pub fn store(&self) -> Indexer<K> {
        self.inner.indexer.clone()
    }

    /// Starts the reflector and the processing on the current tokio runtime until `stop`.
    /// A second call does nothing.
    ///
    /// # Panics
    /// If called outside a tokio runtime.
    pub fn run(&self, stop: CancellationToken) {
        let running = Running {
            runtime: Handle::current(),
            stop: stop.clone(),
        };
        {
            let mut processor = self.inner.processor.lock();
            if processor.running.is_some() {
                warn!("informer: run called twice; ignoring");
                return;
            }
            for listener in std::mem::take(&mut processor.pending) {
                start_listener(&running, listener.handler, listener.notifications);
            }
            processor.running = Some(running);
        }
        tokio::spawn(self.inner.source.clone().run(stop.clone()));
        tokio::spawn(self.inner.clone().process_loop(stop));
    }

    /// Whether the first list has been delivered to the store.
    pub fn has_synced(&self) -> bool {
        self.inner.fifo.has_synced()
    }

    /// Waits until [`Self::has_synced`] (or `stop`); returns whether it synced.
    pub async fn wait_for_sync(&self, stop: &CancellationToken) -> bool {
        tokio::select! {
            _ = self.inner.fifo.wait_for_sync() => true,
            _ = stop.cancelled() => self.has_synced(),
        }
    }

    /// The last resource version the reflector published (never an unearned one).
    pub fn last_sync_resource_version(&self) -> Option<String> {
        self.inner.source.last_sync_resource_version()
    }
}
