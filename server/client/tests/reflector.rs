//! The reflector against a scripted ListerWatcher: WatchList with the resource version withheld
//! until the initial-events-end bookmark, the LIST + WATCH fallback, relists on 410 Gone, and
//! client-go's backoff between failures: `docs/tricks.md` #15 (WatchList instead of LIST +
//! WATCH) and #16 (the reflector withholding unearned resource versions, and its backoff).
//!
//! The fake answers each LIST and WATCH with whatever the test sends down a channel, and
//! records every call's parameters and (virtual) time. Time is paused: backoff sleeps pass
//! instantly but are measured exactly.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc as stream_mpsc;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status};
use skerry_client::api::WatchStream;
use skerry_client::backoff::{BACKOFF_INITIAL, BACKOFF_MAX};
use skerry_client::reflector::{
    INITIAL_EVENTS_END_ANNOTATION, LIST_PAGE_SIZE, ListerWatcher, MIN_WATCH_TIMEOUT, Reflector,
    ReflectorStore,
};
use skerry_client::{Error, ListParams, ObjectList, WatchEvent, WatchParams};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// The fake ListerWatcher.

#[derive(Clone, Debug)]
enum Call {
    List(ListParams),
    Watch(WatchParams, Instant),
}

type ListAnswer = Result<ObjectList<Pod>, Error>;
type WatchAnswer = Result<WatchStream<Pod>, Error>;

struct FakeLw {
    calls: Arc<Mutex<Vec<Call>>>,
    lists: tokio::sync::Mutex<mpsc::UnboundedReceiver<ListAnswer>>,
    watches: tokio::sync::Mutex<mpsc::UnboundedReceiver<WatchAnswer>>,
}

impl ListerWatcher<Pod> for FakeLw {
    async fn list(&self, params: &ListParams) -> ListAnswer {
        self.calls.lock().unwrap().push(Call::List(params.clone()));
        match self.lists.lock().await.recv().await {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }
    async fn watch(&self, params: &WatchParams) -> WatchAnswer {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Watch(params.clone(), Instant::now()));
        match self.watches.lock().await.recv().await {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The recording store.

#[derive(Clone, Debug, PartialEq)]
enum Op {
    /// Names, in order, and the RV.
    Replace(Vec<String>, String),
    /// Name and the object's RV, for add/update/delete.
    Add(String, String),
    Update(String, String),
    Delete(String, String),
    Resync,
}

#[derive(Default)]
struct RecordingStore {
    ops: Mutex<Vec<Op>>,
}

fn name_rv(pod: &Pod) -> (String, String) {
    (
        pod.metadata.name.clone().unwrap(),
        pod.metadata.resource_version.clone().unwrap(),
    )
}

impl ReflectorStore<Pod> for RecordingStore {
    fn replace(&self, items: Vec<Pod>, resource_version: &str) {
        let names = items.iter().map(|p| name_rv(p).0).collect();
        self.ops
            .lock()
            .unwrap()
            .push(Op::Replace(names, resource_version.to_string()));
    }
    fn add(&self, obj: Pod) {
        let (n, rv) = name_rv(&obj);
        self.ops.lock().unwrap().push(Op::Add(n, rv));
    }
    fn update(&self, obj: Pod) {
        let (n, rv) = name_rv(&obj);
        self.ops.lock().unwrap().push(Op::Update(n, rv));
    }
    fn delete(&self, obj: Pod) {
        let (n, rv) = name_rv(&obj);
        self.ops.lock().unwrap().push(Op::Delete(n, rv));
    }
    fn resync(&self) {
        self.ops.lock().unwrap().push(Op::Resync);
    }
}

// ---------------------------------------------------------------------------------------------
// Builders.

fn pod(name: &str, rv: u64) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.to_string());
    p.metadata.namespace = Some("default".to_string());
    p.metadata.resource_version = Some(rv.to_string());
    p
}

fn status(code: i32, reason: &str) -> Box<Status> {
    Box::new(Status {
        code: Some(code),
        reason: Some(reason.to_string()),
        message: Some(format!("test {reason}")),
        ..Status::default()
    })
}

fn api_error(code: i32, reason: &str) -> Error {
    Error::Api(status(code, reason))
}

fn bookmark(rv: u64) -> WatchEvent<Pod> {
    WatchEvent::Bookmark {
        resource_version: rv.to_string(),
        annotations: BTreeMap::new(),
    }
}

fn initial_events_end(rv: u64) -> WatchEvent<Pod> {
    WatchEvent::Bookmark {
        resource_version: rv.to_string(),
        annotations: BTreeMap::from([(
            INITIAL_EVENTS_END_ANNOTATION.to_string(),
            "true".to_string(),
        )]),
    }
}

fn page(items: Vec<Pod>, rv: u64, continue_token: Option<&str>) -> ObjectList<Pod> {
    ObjectList {
        metadata: ListMeta {
            resource_version: Some(rv.to_string()),
            continue_: continue_token.map(str::to_string),
            ..ListMeta::default()
        },
        items,
    }
}

/// One watch stream the test feeds event by event.
struct FakeStream {
    tx: stream_mpsc::UnboundedSender<Result<WatchEvent<Pod>, Error>>,
    /// Events the reflector has taken from the stream.
    consumed: Arc<AtomicUsize>,
    sent: usize,
}

impl FakeStream {
    fn new() -> (FakeStream, WatchStream<Pod>) {
        let (tx, rx) = stream_mpsc::unbounded();
        let consumed = Arc::new(AtomicUsize::new(0));
        let counter = consumed.clone();
        let stream = rx
            .inspect(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .boxed();
        (
            FakeStream {
                tx,
                consumed,
                sent: 0,
            },
            stream,
        )
    }

    /// Sends `event` and waits until the reflector has taken and handled it. The runtime is
    /// single-threaded, so once the counter moves the reflector has run on to its next await,
    /// i.e. it has finished with the event.
    async fn send(&mut self, event: WatchEvent<Pod>) {
        self.send_result(Ok(event)).await;
    }

    async fn send_result(&mut self, event: Result<WatchEvent<Pod>, Error>) {
        self.tx.unbounded_send(event).unwrap();
        self.sent += 1;
        let consumed = self.consumed.clone();
        let sent = self.sent;
        until("the reflector takes the event", || {
            consumed.load(Ordering::SeqCst) >= sent
        })
        .await;
    }

    fn close(&self) {
        self.tx.close_channel();
    }
}

/// Polls `cond` in virtual time (10 ms steps, 15 virtual minutes at most).
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..90_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

// ---------------------------------------------------------------------------------------------
// The harness.

struct Harness {
    reflector: Arc<Reflector<Pod, FakeLw>>,
    store: Arc<RecordingStore>,
    calls: Arc<Mutex<Vec<Call>>>,
    lists: mpsc::UnboundedSender<ListAnswer>,
    watches: mpsc::UnboundedSender<WatchAnswer>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    fn start(resync: Option<Duration>) -> Harness {
        let (lists, list_rx) = mpsc::unbounded_channel();
        let (watches, watch_rx) = mpsc::unbounded_channel();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let lw = FakeLw {
            calls: calls.clone(),
            lists: tokio::sync::Mutex::new(list_rx),
            watches: tokio::sync::Mutex::new(watch_rx),
        };
        let store = Arc::new(RecordingStore::default());
        let reflector = Arc::new(Reflector::new(lw, store.clone(), resync));
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let reflector = reflector.clone();
            let stop = stop.clone();
            async move { reflector.run(stop).await }
        });
        Harness {
            reflector,
            store,
            calls,
            lists,
            watches,
            stop,
            task,
        }
    }

    fn rv(&self) -> Option<String> {
        self.reflector.last_sync_resource_version()
    }

    fn ops(&self) -> Vec<Op> {
        self.store.ops.lock().unwrap().clone()
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Waits for call number `n` (1-based) and returns it.
    async fn call(&self, n: usize) -> Call {
        let calls = self.calls.clone();
        until(&format!("call {n}"), || calls.lock().unwrap().len() >= n).await;
        self.calls()[n - 1].clone()
    }

    /// Waits for call `n`, which must be a WATCH, and returns its parameters and time.
    async fn watch_call(&self, n: usize) -> (WatchParams, Instant) {
        match self.call(n).await {
            Call::Watch(p, at) => {
                assert_watch_timeout(&p);
                (p, at)
            }
            other => panic!("call {n}: expected a WATCH, got {other:?}"),
        }
    }

    /// Waits for call `n`, which must be a LIST.
    async fn list_call(&self, n: usize) -> ListParams {
        match self.call(n).await {
            Call::List(p) => p,
            other => panic!("call {n}: expected a LIST, got {other:?}"),
        }
    }

    /// Answers the pending WATCH with a fresh stream.
    fn answer_watch(&self) -> FakeStream {
        let (fake, stream) = FakeStream::new();
        self.watches.send(Ok(stream)).unwrap();
        fake
    }

    async fn wait_ops(&self, n: usize) {
        let store = self.store.clone();
        until(&format!("{n} store operations"), || {
            store.ops.lock().unwrap().len() >= n
        })
        .await;
    }

    async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(1), self.task)
            .await
            .expect("the reflector stops promptly")
            .unwrap();
    }
}

fn assert_watch_timeout(p: &WatchParams) {
    let t = u64::from(p.timeout_seconds.expect("every watch has a timeout"));
    let min = MIN_WATCH_TIMEOUT.as_secs();
    assert!(
        t >= min && t < 2 * min,
        "timeoutSeconds {t} outside [{min}, {})",
        2 * min
    );
}

fn assert_watch_list(p: &WatchParams, resource_version: &str) {
    assert_eq!(p.send_initial_events, Some(true), "{p:?}");
    assert!(p.allow_bookmarks, "{p:?}");
    assert_eq!(
        p.resource_version_match.as_deref(),
        Some("NotOlderThan"),
        "{p:?}"
    );
    assert_eq!(
        p.resource_version.as_deref(),
        Some(resource_version),
        "{p:?}"
    );
}

fn assert_plain_watch(p: &WatchParams, resource_version: &str) {
    assert_eq!(p.send_initial_events, None, "{p:?}");
    assert!(p.allow_bookmarks, "{p:?}");
    assert_eq!(p.resource_version_match, None, "{p:?}");
    assert_eq!(
        p.resource_version.as_deref(),
        Some(resource_version),
        "{p:?}"
    );
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

/// Gets a harness through a WatchList whose initial state is `items`, ending at `rv`.
async fn synced_via_watch_list(h: &Harness, call: usize, items: &[Pod], rv: u64) -> FakeStream {
    let ops_before = h.ops().len();
    let (p, _) = h.watch_call(call).await;
    assert_eq!(p.send_initial_events, Some(true));
    let mut s = h.answer_watch();
    for item in items {
        s.send(WatchEvent::Added(item.clone())).await;
    }
    s.send(initial_events_end(rv)).await;
    assert_eq!(h.ops().len(), ops_before + 1);
    assert_eq!(h.rv(), Some(rv.to_string()));
    s
}

// ---------------------------------------------------------------------------------------------
// WatchList: one stream, and no unearned RV.

#[tokio::test(start_paused = true)]
async fn watch_list_withholds_the_rv_until_the_initial_events_end_bookmark() {
    let h = Harness::start(None);

    // The first request is a WatchList from "" (a consistent snapshot), not a LIST.
    let (p, _) = h.watch_call(1).await;
    assert_watch_list(&p, "");
    let mut s = h.answer_watch();

    // Synthetic ADDED events arrive out of RV order; none of their RVs is published and
    // nothing reaches the store item by item.
    for (name, rv) in [("a", 7), ("b", 3), ("c", 9)] {
        s.send(WatchEvent::Added(pod(name, rv))).await;
        assert_eq!(
            h.rv(),
            None,
            "RV published after synthetic ADDED {name}@{rv}"
        );
        assert!(
            h.ops().is_empty(),
            "store touched before the snapshot: {:?}",
            h.ops()
        );
    }
    // A progress bookmark in the middle of the initial state is not the end either.
    s.send(bookmark(8)).await;
    assert_eq!(
        h.rv(),
        None,
        "RV published from a bookmark without initial-events-end"
    );
    assert!(h.ops().is_empty());

    // The initial-events-end bookmark: the whole state at once, at the bookmark's RV.
    s.send(initial_events_end(12)).await;
    assert_eq!(
        h.ops(),
        vec![Op::Replace(names(&["a", "b", "c"]), "12".into())]
    );
    assert_eq!(h.rv().as_deref(), Some("12"));

    // The same stream carries on as a watch; events are applied in order and each RV is
    // published as it is applied.
    let steps = [
        (
            WatchEvent::Modified(pod("a", 13)),
            Op::Update("a".into(), "13".into()),
            "13",
        ),
        (
            WatchEvent::Added(pod("d", 14)),
            Op::Add("d".into(), "14".into()),
            "14",
        ),
        (
            WatchEvent::Deleted(pod("b", 15)),
            Op::Delete("b".into(), "15".into()),
            "15",
        ),
    ];
    let mut expected = h.ops();
    for (event, op, rv) in steps {
        s.send(event).await;
        expected.push(op);
        assert_eq!(h.ops(), expected);
        assert_eq!(h.rv().as_deref(), Some(rv));
    }
    s.send(bookmark(20)).await;
    assert_eq!(h.ops(), expected, "a bookmark does not touch the store");
    assert_eq!(h.rv().as_deref(), Some("20"));

    // One stream, no LIST at all.
    assert_eq!(h.calls().len(), 1, "{:?}", h.calls());
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn watch_list_applies_deletes_inside_the_initial_state_and_keeps_arrival_order() {
    let h = Harness::start(None);
    h.watch_call(1).await;
    let mut s = h.answer_watch();
    s.send(WatchEvent::Added(pod("z", 5))).await;
    s.send(WatchEvent::Added(pod("a", 2))).await;
    s.send(WatchEvent::Added(pod("m", 4))).await;
    s.send(WatchEvent::Deleted(pod("a", 2))).await;
    s.send(WatchEvent::Modified(pod("z", 6))).await;
    assert_eq!(h.rv(), None);
    s.send(initial_events_end(10)).await;
    assert_eq!(h.ops(), vec![Op::Replace(names(&["z", "m"]), "10".into())]);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn watch_list_stream_ending_early_publishes_nothing() {
    let h = Harness::start(None);
    h.watch_call(1).await;
    let mut s = h.answer_watch();
    s.send(WatchEvent::Added(pod("a", 7))).await;
    s.close();
    // Not a refusal: this round falls back to a LIST (client-go: progress beats deadlock),
    // but nothing from the broken stream was published.
    let p = h.list_call(2).await;
    assert_eq!(h.rv(), None);
    assert!(h.ops().is_empty());
    assert_eq!(p.resource_version.as_deref(), Some("0"));
    h.lists.send(Ok(page(vec![pod("a", 7)], 11, None))).unwrap();
    h.wait_ops(1).await;
    assert_eq!(h.ops(), vec![Op::Replace(names(&["a"]), "11".into())]);
    assert!(
        !h.reflector.watch_list_refused(),
        "a broken stream is not a refusal"
    );
    // Then a plain watch from the list's RV; the next relist tries WatchList again.
    let (p, _) = h.watch_call(3).await;
    assert_plain_watch(&p, "11");
    let mut s = h.answer_watch();
    s.send(WatchEvent::Error(status(500, "InternalError")))
        .await;
    let (p, _) = h.watch_call(4).await;
    assert_watch_list(&p, "11");
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The fallback: paginated LIST + WATCH when the server refuses WatchList.

#[tokio::test(start_paused = true)]
async fn refused_watch_list_falls_back_to_paginated_list_and_watch() {
    let h = Harness::start(None);
    let (p, _) = h.watch_call(1).await;
    assert_watch_list(&p, "");
    h.watches.send(Err(api_error(422, "Invalid"))).unwrap();

    // LIST from the cache ("0"), 500 at a time, following the continue token.
    let p = h.list_call(2).await;
    assert_eq!(p.limit, Some(LIST_PAGE_SIZE));
    assert_eq!(LIST_PAGE_SIZE, 500);
    assert_eq!(p.resource_version.as_deref(), Some("0"));
    assert_eq!(p.continue_token, None);
    h.lists
        .send(Ok(page(vec![pod("a", 3), pod("b", 8)], 20, Some("c1"))))
        .unwrap();
    let p = h.list_call(3).await;
    assert_eq!(p.limit, Some(LIST_PAGE_SIZE));
    assert_eq!(p.continue_token.as_deref(), Some("c1"));
    assert_eq!(
        p.resource_version, None,
        "continue carries the snapshot, not an RV"
    );
    assert_eq!(h.rv(), None, "RV published before the last page");
    assert!(h.ops().is_empty(), "store touched before the last page");
    h.lists.send(Ok(page(vec![pod("c", 5)], 20, None))).unwrap();
    h.wait_ops(1).await;
    assert_eq!(
        h.ops(),
        vec![Op::Replace(names(&["a", "b", "c"]), "20".into())]
    );
    assert_eq!(h.rv().as_deref(), Some("20"));
    assert!(h.reflector.watch_list_refused());

    // WATCH from the list's RV, with bookmarks; events advance the RV in order.
    let (p, _) = h.watch_call(4).await;
    assert_plain_watch(&p, "20");
    let mut s = h.answer_watch();
    let mut expected = h.ops();
    for (event, op, rv) in [
        (
            WatchEvent::Modified(pod("a", 21)),
            Some(Op::Update("a".into(), "21".into())),
            "21",
        ),
        (
            WatchEvent::Deleted(pod("b", 22)),
            Some(Op::Delete("b".into(), "22".into())),
            "22",
        ),
        (
            WatchEvent::Added(pod("d", 23)),
            Some(Op::Add("d".into(), "23".into())),
            "23",
        ),
        (bookmark(25), None, "25"),
    ] {
        s.send(event).await;
        expected.extend(op);
        assert_eq!(h.ops(), expected);
        assert_eq!(h.rv().as_deref(), Some(rv));
    }

    // A 410 in the stream: relist — by LIST again (the refusal is remembered), consistent
    // (no RV), never from the expired "25".
    s.send(WatchEvent::Error(status(410, "Expired"))).await;
    let p = h.list_call(5).await;
    assert_eq!(
        p.resource_version, None,
        "relist after 410 must be consistent: {p:?}"
    );
    assert_eq!(p.limit, Some(LIST_PAGE_SIZE));
    assert_eq!(
        h.rv().as_deref(),
        Some("25"),
        "the store still holds the state at 25"
    );
    h.lists
        .send(Ok(page(vec![pod("a", 21)], 40, None)))
        .unwrap();
    h.wait_ops(expected.len() + 1).await;
    assert_eq!(
        h.ops().last(),
        Some(&Op::Replace(names(&["a"]), "40".into()))
    );
    assert_eq!(h.rv().as_deref(), Some("40"));
    let (p, _) = h.watch_call(6).await;
    assert_plain_watch(&p, "40");
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn every_refusal_code_falls_back_whether_answered_or_in_stream() {
    for (i, code) in [400, 405, 422, 501].into_iter().enumerate() {
        let h = Harness::start(None);
        h.watch_call(1).await;
        if i % 2 == 0 {
            h.watches.send(Err(api_error(code, "Refused"))).unwrap();
        } else {
            // Accepted, then refused inside the stream before the initial-events-end bookmark.
            let mut s = h.answer_watch();
            s.send(WatchEvent::Added(pod("a", 3))).await;
            s.send(WatchEvent::Error(status(code, "Refused"))).await;
        }
        let p = h.list_call(2).await;
        assert_eq!(p.limit, Some(LIST_PAGE_SIZE), "code {code}");
        assert!(h.reflector.watch_list_refused(), "code {code}");
        assert_eq!(h.rv(), None, "code {code}: nothing earned yet");
        h.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn expired_continue_token_falls_back_to_one_full_list() {
    let h = Harness::start(None);
    h.watch_call(1).await;
    h.watches
        .send(Err(api_error(501, "NotImplemented")))
        .unwrap();
    h.list_call(2).await;
    h.lists
        .send(Ok(page(vec![pod("a", 3)], 20, Some("c1"))))
        .unwrap();
    h.list_call(3).await;
    h.lists.send(Err(api_error(410, "Expired"))).unwrap();
    let p = h.list_call(4).await;
    assert_eq!(p.limit, None, "the full list is unpaginated");
    assert_eq!(p.continue_token, None);
    assert_eq!(p.resource_version.as_deref(), Some("0"));
    h.lists
        .send(Ok(page(vec![pod("a", 3), pod("b", 4)], 30, None)))
        .unwrap();
    h.wait_ops(1).await;
    assert_eq!(h.ops(), vec![Op::Replace(names(&["a", "b"]), "30".into())]);
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 410 Gone: relist from a consistent snapshot, never resume from the expired RV.

#[tokio::test(start_paused = true)]
async fn in_stream_410_relists_with_a_fresh_watch_list() {
    let h = Harness::start(None);
    let mut s = synced_via_watch_list(&h, 1, &[pod("a", 5)], 10).await;
    s.send(WatchEvent::Modified(pod("a", 11))).await;
    assert_eq!(h.rv().as_deref(), Some("11"));

    s.send(WatchEvent::Error(status(410, "Expired"))).await;
    let (p, _) = h.watch_call(2).await;
    assert_watch_list(&p, "");
    assert_eq!(
        h.rv().as_deref(),
        Some("11"),
        "unchanged until the new snapshot"
    );
    let mut s = h.answer_watch();
    s.send(WatchEvent::Added(pod("a", 30))).await;
    s.send(WatchEvent::Added(pod("b", 29))).await;
    assert_eq!(
        h.rv().as_deref(),
        Some("11"),
        "relist's ADDED events are not earned either"
    );
    s.send(initial_events_end(40)).await;
    assert_eq!(
        h.ops().last(),
        Some(&Op::Replace(names(&["a", "b"]), "40".into()))
    );
    assert_eq!(h.rv().as_deref(), Some("40"));
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn watch_answered_with_410_relists_consistently() {
    let h = Harness::start(None);
    let s = synced_via_watch_list(&h, 1, &[pod("a", 5)], 10).await;
    // The server ends the watch normally (its timeout) after a while: re-watch from 10.
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.close();
    let (p, _) = h.watch_call(2).await;
    assert_plain_watch(&p, "10");
    // ... but 10 has been compacted meanwhile.
    h.watches.send(Err(api_error(410, "Gone"))).unwrap();
    let (p, _) = h.watch_call(3).await;
    assert_watch_list(&p, "");
    let mut s = h.answer_watch();
    s.send(initial_events_end(50)).await;
    assert_eq!(h.ops().last(), Some(&Op::Replace(vec![], "50".into())));
    assert_eq!(h.rv().as_deref(), Some("50"));
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn watch_list_from_an_expired_rv_retries_at_once_from_a_consistent_snapshot() {
    let h = Harness::start(None);
    let mut s = synced_via_watch_list(&h, 1, &[], 10).await;
    // An ordinary failure: relist (after a backoff step) as a WatchList not older than 10.
    s.send(WatchEvent::Error(status(500, "InternalError")))
        .await;
    let (p, _) = h.watch_call(2).await;
    assert_watch_list(&p, "10");
    h.watches.send(Err(api_error(410, "Expired"))).unwrap();
    let (p, at) = h.watch_call(3).await;
    assert_watch_list(&p, "");
    let (_, previous_at) = h.watch_call(2).await;
    assert!(
        at - previous_at < BACKOFF_INITIAL / 8,
        "the consistent retry needs no backoff: {:?}",
        at - previous_at
    );
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Backoff between failures, and its reset.

#[tokio::test(start_paused = true)]
async fn failures_back_off_from_800ms_doubling_to_the_cap_with_jitter() {
    let h = Harness::start(None);
    let attempts = 10;
    // When each WATCH was made, and when its failure was handed over: the harness notices a
    // call only on its next 10 ms poll, so the delay starts at the failure, not at the call.
    let mut called = Vec::new();
    let mut failed = Vec::new();
    for n in 1..=attempts {
        let (p, at) = h.watch_call(n).await;
        assert_watch_list(&p, "");
        called.push(at);
        failed.push(Instant::now());
        h.watches
            .send(Err(Error::Transport("connection refused".into())))
            .unwrap();
    }
    let mut base = BACKOFF_INITIAL;
    for i in 0..attempts - 1 {
        let gap = called[i + 1] - failed[i];
        // Timers have millisecond resolution.
        assert!(
            gap >= base && gap <= base * 2 + Duration::from_millis(2),
            "gap {i}: {gap:?} not in [{base:?}, 2 * {base:?})"
        );
        base = (base * 2).min(BACKOFF_MAX);
    }
    assert_eq!(base, BACKOFF_MAX, "the sequence reached the cap");
    // Transport failures are not refusals: no LIST was attempted.
    assert!(h.calls().iter().all(|c| matches!(c, Call::Watch(..))));
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn backoff_resets_after_two_quiet_minutes() {
    let h = Harness::start(None);
    // Five failures push the backoff to 12.8 s.
    for n in 1..=5 {
        h.watch_call(n).await;
        h.watches
            .send(Err(Error::Transport("connection refused".into())))
            .unwrap();
    }
    // A healthy stream for three minutes, then a failure: the delay is back to [0.8, 1.6) s.
    let mut s = synced_via_watch_list(&h, 6, &[], 10).await;
    tokio::time::sleep(Duration::from_secs(180)).await;
    let failed_at = Instant::now();
    s.send(WatchEvent::Error(status(500, "InternalError")))
        .await;
    let (_, retried_at) = h.watch_call(7).await;
    let gap = retried_at - failed_at;
    assert!(
        gap >= BACKOFF_INITIAL && gap <= BACKOFF_INITIAL * 2 + Duration::from_millis(2),
        "after two quiet minutes the delay starts over, got {gap:?}"
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_watch_closed_at_once_backs_off_and_relists() {
    let h = Harness::start(None);
    let s = synced_via_watch_list(&h, 1, &[], 10).await;
    s.close();
    // Closed within a second with no event after the snapshot: a very short watch.
    let (p, _) = h.watch_call(2).await;
    assert_watch_list(&p, "10");
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Resync and stop.

#[tokio::test(start_paused = true)]
async fn resync_calls_the_store_every_period() {
    let h = Harness::start(Some(Duration::from_secs(10)));
    let _s = synced_via_watch_list(&h, 1, &[pod("a", 1)], 5).await;
    tokio::time::sleep(Duration::from_secs(35)).await;
    let resyncs = h.ops().iter().filter(|op| **op == Op::Resync).count();
    assert_eq!(resyncs, 3, "{:?}", h.ops());
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn stop_ends_run_in_any_state() {
    // While waiting for the server to answer.
    let h = Harness::start(None);
    h.watch_call(1).await;
    h.shutdown().await;
    // In the middle of a WatchList's initial state.
    let h = Harness::start(None);
    h.watch_call(1).await;
    let mut s = h.answer_watch();
    s.send(WatchEvent::Added(pod("a", 1))).await;
    h.shutdown().await;
    // While backing off.
    let h = Harness::start(None);
    h.watch_call(1).await;
    h.watches
        .send(Err(Error::Transport("refused".into())))
        .unwrap();
    tokio::task::yield_now().await;
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Against the real apiserver: WatchList is accepted and the RV is withheld until the bookmark.

mod real_apiserver {
    use std::sync::OnceLock;

    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use skerry_apiserver::testing::TestServer;
    use skerry_client::config::{Config, Credentials};
    use skerry_client::{Api, Client, PostParams};

    use super::*;

    /// How long the test waits for the reflector to see something (the loopback delivers in
    /// milliseconds; generous for a loaded two-core machine).
    const WAIT: Duration = Duration::from_secs(20);

    /// What the reflector had published when the tap handed it each event.
    #[derive(Clone, Debug)]
    struct Seen {
        event: String,
        resource_version: String,
        published_before: Option<String>,
    }

    type Probe = Box<dyn Fn() -> Option<String> + Send + Sync>;

    /// The real `Api`, with every watch event recorded together with the reflector's published
    /// RV at the moment the event is handed over (i.e. before the reflector handles it).
    struct TapLw {
        api: Api<ConfigMap>,
        lists: Arc<AtomicUsize>,
        watch_params: Arc<Mutex<Vec<WatchParams>>>,
        seen: Arc<Mutex<Vec<Seen>>>,
        probe: Arc<OnceLock<Probe>>,
    }

    impl ListerWatcher<ConfigMap> for TapLw {
        async fn list(&self, params: &ListParams) -> Result<ObjectList<ConfigMap>, Error> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            self.api.list(params).await
        }
        async fn watch(&self, params: &WatchParams) -> Result<WatchStream<ConfigMap>, Error> {
            self.watch_params.lock().unwrap().push(params.clone());
            let stream = self.api.watch(params).await?;
            let seen = self.seen.clone();
            let probe = self.probe.clone();
            Ok(stream
                .inspect(move |item| {
                    let (event, resource_version) = match item {
                        Ok(WatchEvent::Added(o)) => ("ADDED", o.metadata.resource_version.clone()),
                        Ok(WatchEvent::Modified(o)) => {
                            ("MODIFIED", o.metadata.resource_version.clone())
                        }
                        Ok(WatchEvent::Deleted(o)) => {
                            ("DELETED", o.metadata.resource_version.clone())
                        }
                        Ok(WatchEvent::Bookmark {
                            resource_version,
                            annotations,
                        }) => (
                            if annotations.contains_key(INITIAL_EVENTS_END_ANNOTATION) {
                                "END"
                            } else {
                                "BOOKMARK"
                            },
                            Some(resource_version.clone()),
                        ),
                        Ok(WatchEvent::Error(_)) => ("ERROR", None),
                        Err(_) => ("FAILED", None),
                    };
                    seen.lock().unwrap().push(Seen {
                        event: event.to_string(),
                        resource_version: resource_version.unwrap_or_default(),
                        published_before: probe.get().and_then(|p| p()),
                    });
                })
                .boxed())
        }
    }

    /// A store that records `replace` calls and the names of added objects.
    #[derive(Default)]
    struct Recorded {
        replaced: Mutex<Vec<(Vec<String>, String)>>,
        added: Mutex<Vec<String>>,
    }

    impl ReflectorStore<ConfigMap> for Recorded {
        fn replace(&self, items: Vec<ConfigMap>, resource_version: &str) {
            let mut names: Vec<String> = items
                .iter()
                .map(|c| c.metadata.name.clone().unwrap())
                .collect();
            names.sort();
            self.replaced
                .lock()
                .unwrap()
                .push((names, resource_version.to_string()));
        }
        fn add(&self, obj: ConfigMap) {
            self.added.lock().unwrap().push(obj.metadata.name.unwrap());
        }
        fn update(&self, _: ConfigMap) {}
        fn delete(&self, _: ConfigMap) {}
        fn resync(&self) {}
    }

    fn config_map(name: &str, value: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.to_string());
        cm.data = Some(BTreeMap::from([("k".to_string(), value.to_string())]));
        cm
    }

    async fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + WAIT;
        while !cond() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting until {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_list_is_accepted_and_the_rv_is_withheld_until_the_bookmark() {
        let server = TestServer::start().await.unwrap();
        let mut config = Config::new(&server.url());
        config.ca_pem = Some(server.ca_pem().to_string());
        config.credentials = Credentials::ClientCert {
            cert_pem: server.admin_cert_pem().to_string(),
            key_pem: server.admin_key_pem().to_string(),
        };
        config.qps = 0.0;
        let client = Client::new(config).unwrap();

        let ns = "reflector-real";
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some(ns.to_string());
        client
            .api::<Namespace>(None)
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
        let api = client.api::<ConfigMap>(Some(ns));
        // Create a, b, c, then change a: in the initial state, a (first by key) carries the
        // newest RV, so the synthetic ADDED events are not in RV order.
        for name in ["a", "b", "c"] {
            api.create(&PostParams::default(), &config_map(name, "1"))
                .await
                .unwrap();
        }
        let mut a = api.get("a").await.unwrap();
        a.data = Some(BTreeMap::from([("k".to_string(), "2".to_string())]));
        let a = api.replace("a", &PostParams::default(), &a).await.unwrap();
        let newest_rv = a.metadata.resource_version.clone().unwrap();

        let lists = Arc::new(AtomicUsize::new(0));
        let watch_params = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let probe = Arc::new(OnceLock::new());
        let lw = TapLw {
            api: api.clone(),
            lists: lists.clone(),
            watch_params: watch_params.clone(),
            seen: seen.clone(),
            probe: probe.clone(),
        };
        let store = Arc::new(Recorded::default());
        let reflector = Arc::new(Reflector::new(lw, store.clone(), None));
        let weak = Arc::downgrade(&reflector);
        assert!(
            probe
                .set(
                    Box::new(move || weak.upgrade().and_then(|r| r.last_sync_resource_version()))
                        as Probe
                )
                .is_ok()
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let reflector = reflector.clone();
            let stop = stop.clone();
            async move { reflector.run(stop).await }
        });

        eventually("the initial state is replaced", || {
            !store.replaced.lock().unwrap().is_empty()
        })
        .await;
        let (names, bookmark_rv) = store.replaced.lock().unwrap()[0].clone();
        assert_eq!(names, vec!["a", "b", "c"]);
        assert_eq!(
            reflector.last_sync_resource_version(),
            Some(bookmark_rv.clone())
        );

        // WatchList was accepted: one WATCH with sendInitialEvents, no LIST.
        assert_eq!(
            lists.load(Ordering::SeqCst),
            0,
            "the server refused WatchList?"
        );
        assert!(!reflector.watch_list_refused());
        let first = watch_params.lock().unwrap()[0].clone();
        assert_watch_list(&first, "");

        // Every initial event — the ADDEDs and the end bookmark itself — was handed over while
        // nothing was published; the bookmark's RV is at least the newest object's.
        let initial: Vec<Seen> = {
            let seen = seen.lock().unwrap();
            let end = seen
                .iter()
                .position(|s| s.event == "END")
                .expect("an initial-events-end bookmark");
            seen[..=end].to_vec()
        };
        let added: Vec<&Seen> = initial.iter().filter(|s| s.event == "ADDED").collect();
        assert_eq!(added.len(), 3, "{initial:?}");
        for s in &initial {
            assert_eq!(
                s.published_before, None,
                "RV published during initial events: {initial:?}"
            );
        }
        let parse = |rv: &str| rv.parse::<u64>().unwrap();
        let max_added = added
            .iter()
            .map(|s| parse(&s.resource_version))
            .max()
            .unwrap();
        assert_eq!(max_added, parse(&newest_rv));
        assert!(
            parse(&bookmark_rv) >= max_added,
            "bookmark {bookmark_rv} < object {max_added}"
        );

        // The stream goes on as a watch: a new object arrives as ADDED after the bookmark's
        // RV was published, and its RV is published in turn.
        let d = api
            .create(&PostParams::default(), &config_map("d", "1"))
            .await
            .unwrap();
        let d_rv = d.metadata.resource_version.unwrap();
        eventually("d is added", || {
            store.added.lock().unwrap().contains(&"d".to_string())
        })
        .await;
        eventually("d's RV is published", || {
            reflector.last_sync_resource_version().as_deref() == Some(d_rv.as_str())
        })
        .await;
        let handed_d = seen
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.event == "ADDED" && s.resource_version == d_rv)
            .cloned()
            .unwrap();
        let before_d = parse(handed_d.published_before.as_deref().unwrap());
        assert!(
            before_d >= parse(&bookmark_rv) && before_d < parse(&d_rv),
            "{handed_d:?}"
        );
        assert_eq!(
            watch_params.lock().unwrap().len(),
            1,
            "one stream, no re-watch"
        );

        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
