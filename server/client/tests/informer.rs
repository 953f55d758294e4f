//! The shared informer end to end: the DeltaFIFO, the indexer and the per-handler rings,
//! fed by hand ([`SharedInformer::manual`]), by the real reflector over a fake
//! [`ListerWatcher`], and by the real reflector over a real apiserver ([`TestServer`]).
//!
//! What they show (`docs/tricks.md` #18, the informer's unbounded ring per handler): a handler
//! blocked forever does not delay another handler by one event; a handler added late sees the
//! cache's contents; a deletion missed while the watch was down arrives as a tombstone after
//! the relist; a resync reaches handlers as `on_update(obj, obj)`.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status};
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::api::WatchStream;
use skerry_client::config::{Config, Credentials};
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::reflector::{ListerWatcher, ReflectorStore};
use skerry_client::{
    Api, Client, DeleteParams, Error, ListParams, ObjectList, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a test waits for one notification before failing: events cross a channel, a task
/// and a thread in microseconds, and a relist waits one reflector backoff step (800 ms, up to
/// twice that with jitter); generous for a loaded two-core CI machine.
const EVENT_WAIT: Duration = Duration::from_secs(20);

/// Events pushed through the informer while one handler is blocked: the brief's 10,000.
const EVENTS_WHILE_BLOCKED: usize = 10_000;

// ---------------------------------------------------------------------------------------------
// Helpers

fn pod(name: &str, rv: u64, app: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.namespace = Some("default".into());
    p.metadata.name = Some(name.into());
    p.metadata.resource_version = Some(rv.to_string());
    p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
    p
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn rv(p: &Pod) -> String {
    p.metadata.resource_version.clone().unwrap_or_default()
}

/// A notification as a handler saw it.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    Add {
        name: String,
        initial: bool,
    },
    Update {
        name: String,
        old_rv: String,
        new_rv: String,
        /// `old` and `new` are the same allocation: a resync.
        same: bool,
    },
    Delete {
        name: String,
        rv: String,
        tombstone: bool,
    },
}

/// A handler that reports every notification on a channel.
struct Recorder(mpsc::UnboundedSender<Seen>);

impl EventHandler<Pod> for Recorder {
    fn on_add(&self, obj: &Arc<Pod>, is_initial_list: bool) {
        let _ = self.0.send(Seen::Add {
            name: name(obj),
            initial: is_initial_list,
        });
    }
    fn on_update(&self, old: &Arc<Pod>, new: &Arc<Pod>) {
        let _ = self.0.send(Seen::Update {
            name: name(new),
            old_rv: rv(old),
            new_rv: rv(new),
            same: Arc::ptr_eq(old, new),
        });
    }
    fn on_delete(&self, obj: &Deleted<Pod>) {
        let _ = self.0.send(Seen::Delete {
            name: name(obj.object()),
            rv: rv(obj.object()),
            tombstone: matches!(obj, Deleted::Unknown(_)),
        });
    }
}

fn recorder() -> (Recorder, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Recorder(tx), rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(EVENT_WAIT, rx.recv())
        .await
        .expect("a notification in time")
        .expect("handler alive")
}

/// The next `n` notifications, sorted (for sets delivered in hash order).
async fn next_sorted(rx: &mut mpsc::UnboundedReceiver<Seen>, n: usize) -> Vec<Seen> {
    let mut seen = Vec::with_capacity(n);
    for _ in 0..n {
        seen.push(next(rx).await);
    }
    seen.sort_by_key(|s| format!("{s:?}"));
    seen
}

fn add(name: &str, initial: bool) -> Seen {
    Seen::Add {
        name: name.into(),
        initial,
    }
}

async fn synced(informer: &SharedInformer<Pod>, stop: &CancellationToken) {
    let synced = tokio::time::timeout(EVENT_WAIT, informer.wait_for_sync(stop))
        .await
        .expect("synced in time");
    assert!(synced);
}

// ---------------------------------------------------------------------------------------------
// A manual informer: the test is the reflector.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_does_not_delay_a_fast_one() {
    let (informer, fifo) = SharedInformer::<Pod>::manual();

    // The slow handler blocks on its first notification until the test lets it go.
    struct Slow {
        gate: Mutex<std::sync::mpsc::Receiver<()>>,
        seen: Arc<AtomicUsize>,
    }
    impl EventHandler<Pod> for Slow {
        fn on_add(&self, _: &Arc<Pod>, _: bool) {
            if self.seen.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = self.gate.lock().unwrap().recv();
            }
        }
        fn on_update(&self, _: &Arc<Pod>, _: &Arc<Pod>) {}
        fn on_delete(&self, _: &Deleted<Pod>) {}
    }
    /// Counts, and says when it has seen everything.
    struct Fast {
        seen: AtomicUsize,
        done: mpsc::UnboundedSender<()>,
    }
    impl EventHandler<Pod> for Fast {
        fn on_add(&self, _: &Arc<Pod>, _: bool) {
            if self.seen.fetch_add(1, Ordering::SeqCst) + 1 == EVENTS_WHILE_BLOCKED {
                let _ = self.done.send(());
            }
        }
        fn on_update(&self, _: &Arc<Pod>, _: &Arc<Pod>) {}
        fn on_delete(&self, _: &Deleted<Pod>) {}
    }

    let (release, gate) = std::sync::mpsc::channel();
    let slow_seen = Arc::new(AtomicUsize::new(0));
    informer.add_handler(Slow {
        gate: Mutex::new(gate),
        seen: slow_seen.clone(),
    });
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    informer.add_handler(Fast {
        seen: AtomicUsize::new(0),
        done: done_tx,
    });
    let stop = CancellationToken::new();
    informer.run(stop.clone());

    for i in 0..EVENTS_WHILE_BLOCKED {
        fifo.add(pod(&format!("p{i}"), i as u64 + 1, "web"));
    }
    tokio::time::timeout(EVENT_WAIT, done_rx.recv())
        .await
        .expect("the fast handler saw every event while the slow one was blocked")
        .unwrap();
    assert_eq!(
        slow_seen.load(Ordering::SeqCst),
        1,
        "the slow handler is still blocked on its first event"
    );
    assert_eq!(informer.store().len(), EVENTS_WHILE_BLOCKED);

    // Released, the slow handler catches up from its ring: nothing was dropped.
    release.send(()).unwrap();
    tokio::time::timeout(EVENT_WAIT, async {
        while slow_seen.load(Ordering::SeqCst) < EVENTS_WHILE_BLOCKED {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the slow handler caught up");
    assert_eq!(slow_seen.load(Ordering::SeqCst), EVENTS_WHILE_BLOCKED);
    stop.cancel();
}

#[tokio::test]
async fn a_late_handler_gets_the_existing_objects_then_the_changes() {
    let (informer, fifo) = SharedInformer::<Pod>::manual();
    let (early, mut early_rx) = recorder();
    informer.add_handler(early);
    let stop = CancellationToken::new();
    informer.run(stop.clone());
    assert!(!informer.has_synced());

    fifo.replace(vec![pod("a", 1, "web"), pod("b", 2, "web")], "2");
    synced(&informer, &stop).await;
    assert_eq!(informer.last_sync_resource_version().as_deref(), Some("2"));
    assert_eq!(
        next_sorted(&mut early_rx, 2).await,
        [add("a", true), add("b", true)]
    );

    let (late, mut late_rx) = recorder();
    informer.add_handler(late);
    assert_eq!(
        next_sorted(&mut late_rx, 2).await,
        [add("a", true), add("b", true)]
    );

    // Both see what follows, once.
    fifo.add(pod("c", 3, "web"));
    assert_eq!(next(&mut early_rx).await, add("c", false));
    assert_eq!(next(&mut late_rx).await, add("c", false));
    assert!(late_rx.try_recv().is_err(), "no duplicate");
    stop.cancel();
}

#[tokio::test]
async fn updates_deletes_and_the_indexer() {
    let (informer, fifo) = SharedInformer::<Pod>::manual();
    informer
        .add_index(
            "app",
            Arc::new(|p: &Pod| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app").cloned())
                    .into_iter()
                    .collect()
            }),
        )
        .unwrap();
    let (handler, mut rx) = recorder();
    informer.add_handler(handler);
    let stop = CancellationToken::new();
    informer.run(stop.clone());
    assert!(
        informer
            .add_index("late", Arc::new(|_: &Pod| vec![]))
            .is_err(),
        "indexes are added before run"
    );

    fifo.replace(vec![pod("a", 1, "web")], "1");
    synced(&informer, &stop).await;
    assert_eq!(next(&mut rx).await, add("a", true));

    fifo.update(pod("a", 2, "db"));
    assert_eq!(
        next(&mut rx).await,
        Seen::Update {
            name: "a".into(),
            old_rv: "1".into(),
            new_rv: "2".into(),
            same: false
        }
    );
    let store = informer.store();
    assert!(store.by_index("app", "web").is_empty());
    assert_eq!(store.by_index("app", "db").len(), 1);

    fifo.delete(pod("a", 3, "db"));
    assert_eq!(
        next(&mut rx).await,
        Seen::Delete {
            name: "a".into(),
            rv: "3".into(),
            tombstone: false
        }
    );
    assert!(store.is_empty());
    stop.cancel();
}

#[tokio::test]
async fn a_relist_delivers_missed_deletions_as_tombstones() {
    let (informer, fifo) = SharedInformer::<Pod>::manual();
    let (handler, mut rx) = recorder();
    informer.add_handler(handler);
    let stop = CancellationToken::new();
    informer.run(stop.clone());

    fifo.replace(vec![pod("a", 1, "web"), pod("b", 2, "web")], "2");
    synced(&informer, &stop).await;
    next_sorted(&mut rx, 2).await;

    // The watch went down; b was deleted meanwhile; the relist no longer has it.
    fifo.replace(vec![pod("a", 1, "web")], "5");
    let seen = next_sorted(&mut rx, 2).await;
    assert!(seen.contains(&Seen::Delete {
        name: "b".into(),
        rv: "2".into(),
        tombstone: true
    }));
    assert!(seen.contains(&Seen::Update {
        name: "a".into(),
        old_rv: "1".into(),
        new_rv: "1".into(),
        same: false
    }));
    assert!(informer.store().get("default/b").is_none());
    assert_eq!(informer.last_sync_resource_version().as_deref(), Some("5"));
    stop.cancel();
}

#[tokio::test]
async fn resync_reaches_handlers_as_update_of_the_same_object() {
    let (informer, fifo) = SharedInformer::<Pod>::manual();
    let (handler, mut rx) = recorder();
    informer.add_handler(handler);
    let stop = CancellationToken::new();
    informer.run(stop.clone());
    fifo.replace(vec![pod("a", 1, "web")], "1");
    synced(&informer, &stop).await;
    assert_eq!(next(&mut rx).await, add("a", true));

    fifo.resync();
    assert_eq!(
        next(&mut rx).await,
        Seen::Update {
            name: "a".into(),
            old_rv: "1".into(),
            new_rv: "1".into(),
            same: true
        }
    );
    stop.cancel();
}

#[tokio::test]
async fn wait_for_sync_returns_false_when_stopped_first() {
    let (informer, _fifo) = SharedInformer::<Pod>::manual();
    let stop = CancellationToken::new();
    informer.run(stop.clone());
    stop.cancel();
    assert!(!informer.wait_for_sync(&stop).await);
}

// ---------------------------------------------------------------------------------------------
// The real reflector over a fake lister-watcher.

type EventSender = futures::channel::mpsc::UnboundedSender<Result<WatchEvent<Pod>, Error>>;

/// An in-memory resource: LIST answers from `objects`, WATCH replays `history` after the asked
/// version and then streams live. WatchList is refused (405), so the reflector uses LIST +
/// WATCH, the path where a missed deletion is found by the relist.
#[derive(Clone, Default)]
struct FakeLw {
    inner: Arc<Mutex<FakeState>>,
}

#[derive(Default)]
struct FakeState {
    objects: BTreeMap<String, Pod>,
    history: Vec<(u64, WatchEvent<Pod>)>,
    resource_version: u64,
    watchers: Vec<EventSender>,
}

fn status(code: i32, reason: &str) -> Error {
    Error::Api(Box::new(Status {
        code: Some(code),
        reason: Some(reason.into()),
        ..Status::default()
    }))
}

impl FakeLw {
    /// Applies a change with the next resource version and tells the watchers.
    fn change(&self, mut obj: Pod, kind: fn(Pod) -> WatchEvent<Pod>, deleted: bool) {
        let mut state = self.inner.lock().unwrap();
        state.resource_version += 1;
        let rv = state.resource_version;
        obj.metadata.resource_version = Some(rv.to_string());
        if deleted {
            state.objects.remove(&name(&obj));
        } else {
            state.objects.insert(name(&obj), obj.clone());
        }
        let event = kind(obj);
        state.history.push((rv, event.clone()));
        state
            .watchers
            .retain(|w| w.unbounded_send(Ok(event.clone())).is_ok());
    }
    fn create(&self, obj: Pod) {
        self.change(obj, WatchEvent::Added, false);
    }
    fn update(&self, obj: Pod) {
        self.change(obj, WatchEvent::Modified, false);
    }
    fn delete(&self, obj: Pod) {
        self.change(obj, WatchEvent::Deleted, true);
    }
    /// Deletes `name` without any watch event: what a client misses while its watch is down.
    fn delete_unseen(&self, name: &str) {
        let mut state = self.inner.lock().unwrap();
        state.resource_version += 1;
        state.objects.remove(name);
        state.history.clear();
    }
    /// Ends every watch with an in-stream 410 Expired, as after a compaction.
    fn expire_watches(&self) {
        let mut state = self.inner.lock().unwrap();
        for w in state.watchers.drain(..) {
            let _ = w.unbounded_send(Ok(WatchEvent::Error(Box::new(Status {
                code: Some(410),
                reason: Some("Expired".into()),
                ..Status::default()
            }))));
        }
    }
}

impl ListerWatcher<Pod> for FakeLw {
    fn list(
        &self,
        _params: &ListParams,
    ) -> impl Future<Output = Result<ObjectList<Pod>, Error>> + Send {
        let state = self.inner.lock().unwrap();
        let list = ObjectList {
            metadata: ListMeta {
                resource_version: Some(state.resource_version.to_string()),
                ..ListMeta::default()
            },
            items: state.objects.values().cloned().collect(),
        };
        async move { Ok(list) }
    }

    fn watch(
        &self,
        params: &WatchParams,
    ) -> impl Future<Output = Result<WatchStream<Pod>, Error>> + Send {
        let result = if params.send_initial_events == Some(true) {
            Err(status(405, "MethodNotAllowed"))
        } else {
            let from: u64 = params
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let (tx, rx) = futures::channel::mpsc::unbounded();
            let mut state = self.inner.lock().unwrap();
            for (_, event) in state.history.iter().filter(|(rv, _)| *rv > from) {
                let _ = tx.unbounded_send(Ok(event.clone()));
            }
            state.watchers.push(tx);
            Ok(rx.boxed())
        };
        async move { result }
    }
}

#[tokio::test]
async fn through_the_reflector_watch_events_and_a_relist_tombstone() {
    let lw = FakeLw::default();
    lw.create(pod("a", 0, "web"));
    let informer = SharedInformer::new(lw.clone(), None);
    let (handler, mut rx) = recorder();
    informer.add_handler(handler);
    let stop = CancellationToken::new();
    informer.run(stop.clone());
    synced(&informer, &stop).await;
    assert_eq!(next(&mut rx).await, add("a", true));
    assert_eq!(informer.last_sync_resource_version().as_deref(), Some("1"));

    lw.create(pod("b", 0, "web"));
    assert_eq!(next(&mut rx).await, add("b", false));
    lw.update(pod("a", 0, "db"));
    assert_eq!(
        next(&mut rx).await,
        Seen::Update {
            name: "a".into(),
            old_rv: "1".into(),
            new_rv: "3".into(),
            same: false
        }
    );
    lw.delete(pod("b", 2, "web"));
    assert_eq!(
        next(&mut rx).await,
        Seen::Delete {
            name: "b".into(),
            rv: "4".into(),
            tombstone: false
        }
    );

    // a is deleted while nobody watches; the watch then expires and the reflector relists.
    lw.delete_unseen("a");
    lw.expire_watches();
    assert_eq!(
        next(&mut rx).await,
        Seen::Delete {
            name: "a".into(),
            rv: "3".into(),
            tombstone: true
        }
    );
    assert!(informer.store().is_empty());
    assert_eq!(informer.last_sync_resource_version().as_deref(), Some("5"));
    stop.cancel();
}

#[tokio::test]
async fn the_reflectors_resync_period_reaches_handlers() {
    let lw = FakeLw::default();
    lw.create(pod("a", 0, "web"));
    let informer = SharedInformer::new(lw, Some(Duration::from_millis(100)));
    let (handler, mut rx) = recorder();
    informer.add_handler(handler);
    let stop = CancellationToken::new();
    informer.run(stop.clone());
    synced(&informer, &stop).await;
    assert_eq!(next(&mut rx).await, add("a", true));
    for _ in 0..2 {
        assert_eq!(
            next(&mut rx).await,
            Seen::Update {
                name: "a".into(),
                old_rv: "1".into(),
                new_rv: "1".into(),
                same: true
            }
        );
    }
    stop.cancel();
}

// ---------------------------------------------------------------------------------------------
// The real apiserver.

fn api_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_pods_informer_sees_create_update_delete_on_a_real_apiserver() {
    let server = TestServer::start().await.unwrap();
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    let client = Client::new(config).unwrap();
    let api: Api<Pod> = client.api(Some("default"));
    api.create(&PostParams::default(), &api_pod("before"))
        .await
        .unwrap();

    let informer = SharedInformer::new(api.clone(), None);
    let (handler, mut rx) = recorder();
    informer.add_handler(handler);
    let stop = CancellationToken::new();
    informer.run(stop.clone());
    synced(&informer, &stop).await;
    assert_eq!(next(&mut rx).await, add("before", true));
    assert!(informer.last_sync_resource_version().is_some());
    assert!(informer.store().get("default/before").is_some());

    let created = api
        .create(&PostParams::default(), &api_pod("web"))
        .await
        .unwrap();
    assert_eq!(next(&mut rx).await, add("web", false));

    let patched = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        next(&mut rx).await,
        Seen::Update {
            name: "web".into(),
            old_rv: rv(&created),
            new_rv: rv(&patched),
            same: false
        }
    );
    let cached = informer.store().get("default/web").unwrap();
    assert_eq!(cached.metadata.labels.as_ref().unwrap()["app"], "db");

    api.delete("web", &DeleteParams::default()).await.unwrap();
    match next(&mut rx).await {
        Seen::Delete {
            name, tombstone, ..
        } => {
            assert_eq!(name, "web");
            assert!(!tombstone);
        }
        other => panic!("expected the deletion, got {other:?}"),
    }
    assert!(informer.store().get("default/web").is_none());
    stop.cancel();
}
