//! The watch cache against a real store opened in a tempdir.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use skerry_store::StoreConfig;

use super::*;
use crate::storage::{create, delete, update};

/// Every wait in these tests is bounded so that a bug fails instead of hanging.
const WAIT: Duration = Duration::from_secs(10);

fn pods() -> &'static ResourceInfo {
    skerry_api::catalogue::lookup("", "v1", "pods").expect("pods are served")
}

fn configmaps() -> &'static ResourceInfo {
    skerry_api::catalogue::lookup("", "v1", "configmaps").expect("configmaps are served")
}

fn pod(ns: &str, name: &str, app: &str) -> Value {
    json!({"kind": "Pod", "apiVersion": "v1",
           "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(StoreConfig::new(dir.path())).expect("open store");
    (dir, store)
}

async fn started(store: &Store, config: WatchCacheConfig) -> Arc<WatchCache> {
    let cache = WatchCache::start_with(pods(), store.clone(), config).expect("valid config");
    cache.wait_fresh(0).await.expect("cache becomes ready");
    cache
}

async fn put_pod(store: &Store, ns: &str, name: &str, app: &str) -> i64 {
    let v = create(store, pods(), Some(ns), name, pod(ns, name, app))
        .await
        .expect("create");
    rv_of(&v)
}

fn rv_of(v: &Value) -> i64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("resourceVersion set")
}

async fn next(stream: &mut WatchStream) -> Value {
    let frame = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("a frame in time")
        .expect("stream open");
    assert!(frame.ends_with(b"\n"), "one frame per line");
    serde_json::from_slice(&frame).expect("frame is JSON")
}

async fn ended(stream: &mut WatchStream) -> bool {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("stream resolves in time")
        .is_none()
}

fn live_from(rv: i64) -> WatchOptions {
    WatchOptions {
        resource_version: Some(rv),
        send_initial_events: Some(false),
        ..Default::default()
    }
}

/// Reference: `docs/tricks.md` #5 (cachingObject). Without the memo every watcher would encode
/// every event itself: 1,000 serializations instead of 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_watchers_ten_events_ten_serializations() {
    let (_dir, store) = open();
    let cache = started(&store, WatchCacheConfig::default()).await;
    let rv = cache.resource_version();
    let mut streams = Vec::new();
    for _ in 0..100 {
        streams.push(cache.watch(live_from(rv)).await.expect("watch"));
    }
    assert_eq!(cache.watchers(), 100);
    for i in 0..10 {
        put_pod(&store, "ns", &format!("p{i}"), "web").await;
    }
    let mut first_frames: Vec<Bytes> = Vec::new();
    for (n, stream) in streams.iter_mut().enumerate() {
        for i in 0..10 {
            let frame = tokio::time::timeout(WAIT, stream.next())
                .await
                .expect("in time")
                .expect("open");
            if n == 0 {
                first_frames.push(frame);
            } else {
                assert_eq!(
                    frame.as_ptr(),
                    first_frames[i].as_ptr(),
                    "every watcher gets the same frame buffer"
                );
            }
        }
    }
    let event: Value = serde_json::from_slice(&first_frames[3]).expect("json");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "p3");
    assert_eq!(cache.metrics().serializations(), 10);
    assert_eq!(cache.metrics().watchers_registered(), 100);
    drop(streams);
    assert_eq!(
        cache.watchers(),
        0,
        "dropping a stream unregisters its watcher"
    );
}

/// Reference: `docs/tricks.md` #7, Kubernetes' `blockTimeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_ahead_waits_three_seconds_then_504() {
    let (_dir, store) = open();
    put_pod(&store, "ns", "a", "web").await;
    let cache = started(&store, WatchCacheConfig::default()).await;
    let ahead = store.revision() + 1;
    let waits = cache.metrics().waits_started();
    let began = std::time::Instant::now();
    let e = cache
        .list(
            &ListOptions {
                resource_version: Some(ahead),
                resource_version_match: Some(ResourceVersionMatch::NotOlderThan),
                ..Default::default()
            },
            None,
        )
        .await
        .expect_err("never reached");
    assert!(began.elapsed() >= RESOURCE_VERSION_TOO_HIGH_WAIT);
    let status = e.to_status();
    assert_eq!(status["code"], 504);
    assert_eq!(status["reason"], "Timeout");
    assert_eq!(
        status["message"],
        format!(
            "Timeout: Too large resource version: {ahead}, current: {}",
            ahead - 1
        )
    );
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
    assert_eq!(cache.metrics().waits_started(), waits + 1);

    // A write that lands within the wait answers it.
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.watch(live_from(ahead)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = put_pod(&store, "ns", "b", "web").await;
    assert_eq!(written, ahead);
    let mut stream = waiter
        .await
        .expect("join")
        .expect("caught up within the wait");
    put_pod(&store, "ns", "c", "web").await;
    assert_eq!(next(&mut stream).await["object"]["metadata"]["name"], "c");
}

/// The fresh path allocates no wait: no timer, no task, no progress request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_cache_answers_without_waiting() {
    let (_dir, store) = open();
    let rv = put_pod(&store, "ns", "a", "web").await;
    let cache = started(&store, WatchCacheConfig::default()).await;
    let before = cache.metrics().waits_started();
    for opts in [
        ListOptions {
            resource_version: Some(0),
            ..Default::default()
        },
        ListOptions {
            resource_version: Some(rv),
            resource_version_match: Some(ResourceVersionMatch::NotOlderThan),
            ..Default::default()
        },
        ListOptions::default(), // consistent: the cache is at the store's revision
    ] {
        let list = cache.list(&opts, None).await.expect("list");
        assert_eq!(list.items.len(), 1);
        assert_eq!(list.resource_version, rv);
    }
    let _stream = cache.watch(live_from(rv)).await.expect("watch");
    assert_eq!(cache.metrics().waits_started(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_read_learns_revisions_of_other_resources() {
    let (_dir, store) = open();
    put_pod(&store, "ns", "a", "web").await;
    let cache = started(&store, WatchCacheConfig::default()).await;
    let cm = json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "c", "namespace": "ns"}});
    create(&store, configmaps(), Some("ns"), "c", cm)
        .await
        .expect("create");
    let list = cache
        .list(&ListOptions::default(), None)
        .await
        .expect("list");
    assert_eq!(
        list.resource_version,
        store.revision(),
        "moved by a progress notification"
    );
    assert_eq!(list.items.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_older_than_the_window_gets_an_in_stream_410() {
    let (_dir, store) = open();
    let config = WatchCacheConfig {
        window_events_min: 4,
        window_events_max: 4,
        ..Default::default()
    };
    let cache = started(&store, config).await;
    let first = put_pod(&store, "ns", "p0", "web").await;
    let mut last = first;
    for i in 1..10 {
        last = put_pod(&store, "ns", &format!("p{i}"), "web").await;
    }
    cache.wait_fresh(last).await.expect("caught up");
    let mut stream = cache.watch(live_from(first)).await.expect("a stream");
    let error = next(&mut stream).await;
    assert_eq!(error["type"], "ERROR");
    assert_eq!(error["object"]["code"], 410);
    assert_eq!(error["object"]["reason"], "Expired");
    assert_eq!(
        error["object"]["message"],
        format!("too old resource version: {first} ({})", last - 4)
    );
    assert!(ended(&mut stream).await);
    // Inside the window: the backlog, then live.
    let mut stream = cache.watch(live_from(last - 4)).await.expect("watch");
    for i in 6..10 {
        assert_eq!(
            next(&mut stream).await["object"]["metadata"]["name"],
            format!("p{i}")
        );
    }
}

/// Reference: the WatchList protocol (KEP-3157); `docs/tricks.md` #6, the three-state machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_list_sends_state_then_end_bookmark_then_live_without_gaps() {
    let (_dir, store) = open();
    for i in 0..5 {
        put_pod(&store, "ns", &format!("early{i}"), "web").await;
    }
    let cache = started(&store, WatchCacheConfig::default()).await;
    // Writes race the watch's registration.
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..20 {
                put_pod(&store, "ns", &format!("late{i:02}"), "web").await;
            }
        })
    };
    let mut stream = cache
        .watch(WatchOptions {
            resource_version: None,
            send_initial_events: Some(true),
            allow_bookmarks: true,
            ..Default::default()
        })
        .await
        .expect("watch list");
    writer.await.expect("writer");
    let mut seen = std::collections::BTreeMap::new();
    let mut bookmark_rv = None;
    while seen.len() < 25 {
        let event = next(&mut stream).await;
        let meta = &event["object"]["metadata"];
        let rv: i64 = meta["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("rv");
        if event["type"] == "BOOKMARK" {
            assert_eq!(meta["annotations"][INITIAL_EVENTS_END_ANNOTATION], "true");
            assert_eq!(event["object"]["kind"], "Pod");
            assert_eq!(event["object"]["apiVersion"], "v1");
            assert!(bookmark_rv.is_none(), "one end bookmark");
            assert!(
                seen.values().all(|r| *r <= rv),
                "the bookmark follows the whole state"
            );
            bookmark_rv = Some(rv);
            continue;
        }
        assert_eq!(event["type"], "ADDED");
        if let Some(b) = bookmark_rv {
            assert!(rv > b, "live events come after the bookmark's revision");
        }
        let name = meta["name"].as_str().expect("name").to_string();
        assert!(seen.insert(name.clone(), rv).is_none(), "{name} doubled");
    }
    assert!(bookmark_rv.is_some(), "the end bookmark came");
    assert_eq!(stream.phase(), Phase::Live);
    assert_eq!(seen.len(), 25, "no object missed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_is_cut_off_without_blocking_the_others() {
    let (_dir, store) = open();
    let config = WatchCacheConfig {
        watcher_queue_events_max: 4,
        ..Default::default()
    };
    let cache = started(&store, config).await;
    let rv = cache.resource_version();
    let mut slow = cache.watch(live_from(rv)).await.expect("watch");
    let mut fast = cache.watch(live_from(rv)).await.expect("watch");
    // The fast watcher reads each event before the next put (on a loaded machine a reader
    // task may otherwise not run at all during ten quick puts, and be cut off too); the slow
    // one never reads, so its queue of 4 overflows on the fifth event.
    let (read_tx, mut read_rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut names = Vec::new();
        for _ in 0..10 {
            names.push(next(&mut fast).await["object"]["metadata"]["name"].clone());
            let _ = read_tx.send(());
        }
        names
    });
    for i in 0..10 {
        put_pod(&store, "ns", &format!("p{i}"), "web").await;
        tokio::time::timeout(WAIT, read_rx.recv())
            .await
            .expect("the fast watcher reads the event in time");
    }
    assert_eq!(
        reader.await.expect("reader").len(),
        10,
        "the fast watcher got everything"
    );
    assert_eq!(cache.metrics().watchers_terminated(), 1);
    for i in 0..4 {
        assert_eq!(
            next(&mut slow).await["object"]["metadata"]["name"],
            format!("p{i}")
        );
    }
    assert!(
        ended(&mut slow).await,
        "the slow watcher's stream ends; its client re-watches"
    );
}

/// Reference: `docs/tricks.md` #6, bookmarks bucketed per second. The ticker is driven by hand
/// so the test needs no clock: one pop serves every due watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_go_out_in_bulk_per_second() {
    let (_dir, store) = open();
    let rv = put_pod(&store, "ns", "a", "web").await;
    let cache = started(&store, WatchCacheConfig::default()).await;
    let with = |timeout: Option<Duration>| WatchOptions {
        allow_bookmarks: true,
        timeout,
        ..live_from(rv)
    };
    let mut bookmarked = Vec::new();
    for _ in 0..3 {
        bookmarked.push(cache.watch(with(None)).await.expect("watch"));
    }
    let mut plain = cache.watch(live_from(rv)).await.expect("watch");
    let mut short = cache
        .watch(with(Some(Duration::from_secs(5))))
        .await
        .expect("watch");
    let now = cache.shared.now();
    assert!(
        cache.shared.state.lock().bookmarks.len() <= 2,
        "buckets by second, not timers"
    );

    // 2 s before the short watch's deadline: only it is due.
    cache.shared.tick(now + Duration::from_secs(3));
    let b = next(&mut short).await;
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(
        b["object"],
        json!({"kind": "Pod", "apiVersion": "v1",
                                   "metadata": {"resourceVersion": rv.to_string()}})
    );
    // Its deadline ends it.
    cache.shared.tick(now + Duration::from_secs(6));
    assert!(ended(&mut short).await);

    let serializations = cache.metrics().serializations();
    cache
        .shared
        .tick(now + BOOKMARK_FREQUENCY + Duration::from_secs(1));
    for stream in &mut bookmarked {
        assert_eq!(next(stream).await["type"], "BOOKMARK");
    }
    assert_eq!(cache.metrics().bookmarks_sent(), 4);
    assert_eq!(
        cache.metrics().serializations(),
        serializations + 1,
        "one frame for all"
    );
    let nothing = tokio::time::timeout(Duration::from_millis(200), plain.next()).await;
    assert!(
        nothing.is_err(),
        "a watcher that did not ask gets no bookmark"
    );
    // They are filed again a minute on.
    cache
        .shared
        .tick(now + BOOKMARK_FREQUENCY * 2 + Duration::from_secs(2));
    assert_eq!(cache.metrics().bookmarks_sent(), 7);
}

use bookmarks::BOOKMARK_FREQUENCY;

/// Kubernetes' filtered-watch rule: leaving the filter is a DELETED, entering it an ADDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_watcher_sees_objects_enter_and_leave() {
    let (_dir, store) = open();
    let cache = started(&store, WatchCacheConfig::default()).await;
    let web: Filter = Arc::new(|o: &CachedObject| o.label("app") == Some("web"));
    let mut stream = cache
        .watch(WatchOptions {
            filter: Some(web),
            namespace: Some("ns".into()),
            ..live_from(cache.resource_version())
        })
        .await
        .expect("watch");
    put_pod(&store, "other", "x", "web").await; // another namespace: not seen
    let rv1 = put_pod(&store, "ns", "a", "web").await;
    let e = next(&mut stream).await;
    assert_eq!(
        (e["type"].as_str(), rv_of(&e["object"])),
        (Some("ADDED"), rv1)
    );
    let rv2 = rv_of(
        &update(&store, pods(), Some("ns"), "a", pod("ns", "a", "db"), rv1)
            .await
            .expect("update"),
    );
    let e = next(&mut stream).await;
    assert_eq!(e["type"], "DELETED");
    assert_eq!(
        e["object"]["metadata"]["labels"]["app"], "web",
        "the state it left"
    );
    assert_eq!(rv_of(&e["object"]), rv2, "at the change's revision");
    let rv3 = rv_of(
        &update(&store, pods(), Some("ns"), "a", pod("ns", "a", "web"), rv2)
            .await
            .expect("update"),
    );
    assert_eq!(next(&mut stream).await["type"], "ADDED");
    let rv4 = rv_of(
        &update(&store, pods(), Some("ns"), "a", pod("ns", "a", "web"), rv3)
            .await
            .expect("update"),
    );
    let e = next(&mut stream).await;
    assert_eq!(
        (e["type"].as_str(), rv_of(&e["object"])),
        (Some("MODIFIED"), rv4)
    );
    delete(&store, pods(), Some("ns"), "a", None)
        .await
        .expect("delete");
    let e = next(&mut stream).await;
    assert_eq!(e["type"], "DELETED");
    assert_eq!(
        rv_of(&e["object"]),
        store.revision(),
        "the delete's revision"
    );
    assert_eq!(
        e["object"]["metadata"]["labels"]["app"], "web",
        "the last state"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_from_the_cache() {
    let (_dir, store) = open();
    let mut p0 = 0;
    for i in 0..5 {
        let rv = put_pod(
            &store,
            "ns",
            &format!("p{i}"),
            if i % 2 == 0 { "web" } else { "db" },
        )
        .await;
        if i == 0 {
            p0 = rv;
        }
    }
    put_pod(&store, "other", "q", "web").await;
    let cache = started(&store, WatchCacheConfig::default()).await;
    // resourceVersion=0 ignores limit, as Kubernetes' cache does.
    let list = cache
        .list(
            &ListOptions {
                resource_version: Some(0),
                limit: Some(2),
                ..Default::default()
            },
            None,
        )
        .await
        .expect("list");
    assert_eq!(list.items.len(), 6);
    assert!(list.continue_token.is_none());
    let web: Filter = Arc::new(|o: &CachedObject| o.label("app") == Some("web"));
    let list = cache
        .list(
            &ListOptions {
                resource_version: Some(0),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            Some(web.clone()),
        )
        .await
        .expect("list");
    let names: Vec<&str> = list.items.iter().map(|o| o.name()).collect();
    assert_eq!(names, vec!["p0", "p2", "p4"]);

    // Exact inside the window: rebuilt from the events, equal to the store's answer.
    let at = store.revision();
    update(&store, pods(), Some("ns"), "p0", pod("ns", "p0", "db"), p0)
        .await
        .expect("update");
    delete(&store, pods(), Some("ns"), "p1", None)
        .await
        .expect("delete");
    put_pod(&store, "ns", "p9", "web").await;
    cache.wait_fresh(store.revision()).await.expect("fresh");
    let exact = ListOptions {
        resource_version: Some(at),
        resource_version_match: Some(ResourceVersionMatch::Exact),
        ..Default::default()
    };
    let from_cache = cache.list(&exact, None).await.expect("exact from cache");
    let from_store = storage::list(&store, pods(), &exact, None)
        .await
        .expect("exact from store");
    assert_eq!(from_cache.resource_version, at);
    assert_eq!(from_cache.items, from_store.items);
    assert_eq!(from_cache.items.len(), 6);
    let now = cache
        .list(
            &ListOptions {
                resource_version: Some(0),
                ..Default::default()
            },
            None,
        )
        .await
        .expect("now");
    let names: Vec<&str> = now.items.iter().map(|o| o.name()).collect();
    assert_eq!(names, vec!["p0", "p2", "p3", "p4", "p9", "q"]);
    // A limit with another revision goes to the store, which pages.
    let paged = cache
        .list(
            &ListOptions {
                limit: Some(4),
                ..Default::default()
            },
            None,
        )
        .await
        .expect("paged");
    assert_eq!(paged.items.len(), 4);
    assert!(paged.continue_token.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_lists_older_than_the_window_go_to_the_store() {
    let (_dir, store) = open();
    let config = WatchCacheConfig {
        window_events_min: 4,
        window_events_max: 4,
        ..Default::default()
    };
    let cache = started(&store, config).await;
    let first = put_pod(&store, "ns", "p0", "web").await;
    for i in 1..10 {
        put_pod(&store, "ns", &format!("p{i}"), "web").await;
    }
    cache.wait_fresh(store.revision()).await.expect("fresh");
    let list = cache
        .list(
            &ListOptions {
                resource_version: Some(first),
                resource_version_match: Some(ResourceVersionMatch::Exact),
                ..Default::default()
            },
            None,
        )
        .await
        .expect("from the store");
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.resource_version, first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_store_watch_relists_and_old_watchers_get_410() {
    let (_dir, store) = open();
    let config = WatchCacheConfig {
        window_events_min: 4,
        window_events_max: 4,
        ..Default::default()
    };
    let cache = started(&store, config).await;
    let before = put_pod(&store, "ns", "a", "web").await;
    let rv = put_pod(&store, "ns", "a2", "web").await;
    cache.wait_fresh(rv).await.expect("fresh");
    let mut resumable = cache.watch(live_from(before)).await.expect("in the window");
    assert_eq!(
        next(&mut resumable).await["object"]["metadata"]["name"],
        "a2"
    );
    drop(resumable);
    let mut watcher = cache.watch(live_from(rv)).await.expect("watch");
    assert_eq!(cache.metrics().relists(), 1);
    // The store watch is lost (as when the hub drops the stream).
    let stream_id = cache.shared.state.lock().feed_stream.expect("feeding");
    store.hub().close_stream(stream_id);
    assert!(
        ended(&mut watcher).await,
        "watchers end so clients re-watch"
    );
    // Writes while the cache relists are in its new list, not in any window.
    for i in 0..3 {
        put_pod(&store, "ns", &format!("b{i}"), "web").await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while cache.metrics().relists() < 2 || cache.resource_version() < store.revision() {
        assert!(tokio::time::Instant::now() < deadline, "relisted in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let list = cache
        .list(
            &ListOptions {
                resource_version: Some(0),
                ..Default::default()
            },
            None,
        )
        .await
        .expect("list");
    assert_eq!(list.items.len(), 5);
    // A client resuming from before the relist: the old window held its events, the new
    // one starts at the relist.
    let window_start = cache.shared.state.lock().history.window_start();
    assert!(before < window_start, "the new window starts at the relist");
    let mut stream = cache.watch(live_from(before)).await.expect("stream");
    let e = next(&mut stream).await;
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["code"], 410);
    // And the new feed works.
    let mut fresh = cache
        .watch(live_from(cache.resource_version()))
        .await
        .expect("watch");
    put_pod(&store, "ns", "c", "web").await;
    assert_eq!(next(&mut fresh).await["object"]["metadata"]["name"], "c");
}

#[test]
fn which_lists_the_cache_serves() {
    let o = |rv: Option<i64>, m: Option<ResourceVersionMatch>, limit: Option<i64>| ListOptions {
        resource_version: rv,
        resource_version_match: m,
        limit,
        ..Default::default()
    };
    use ResourceVersionMatch::*;
    assert_eq!(
        plan(&o(Some(0), None, Some(500))),
        Plan::Latest(Freshen::Any)
    );
    assert_eq!(
        plan(&o(None, None, None)),
        Plan::Latest(Freshen::Consistent)
    );
    assert_eq!(plan(&o(None, None, Some(500))), Plan::Store);
    assert_eq!(
        plan(&o(Some(7), None, None)),
        Plan::Latest(Freshen::AtLeast(7))
    );
    assert_eq!(plan(&o(Some(7), None, Some(5))), Plan::Store);
    assert_eq!(
        plan(&o(Some(7), Some(NotOlderThan), None)),
        Plan::Latest(Freshen::AtLeast(7))
    );
    assert_eq!(plan(&o(Some(7), Some(Exact), None)), Plan::Exact(7));
    assert_eq!(plan(&o(Some(7), Some(Exact), Some(5))), Plan::Store);
    let mut cont = o(None, None, Some(5));
    cont.continue_token = Some("x".into());
    assert_eq!(plan(&cont), Plan::Store);
    assert!(
        WatchCacheConfig {
            window_events_min: 2,
            ..Default::default()
        }
        .validate()
        .is_err()
    );
    assert!(WatchCacheConfig::default().validate().is_ok());
}

/// The next frame of a protobuf stream: the event type and its object decoded by the normal
/// protobuf serializer (magic and `runtime.Unknown` envelope checked on the way).
async fn next_protobuf(stream: &mut WatchStream) -> (String, Value) {
    let frame = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("a frame in time")
        .expect("stream open");
    let (event, used) = object::decode_protobuf_frame(&frame)
        .expect("a well-formed frame")
        .expect("a whole frame");
    assert_eq!(used, frame.len(), "one WatchEvent per frame");
    assert!(
        event.raw.starts_with(&skerry_api::protobuf::MAGIC),
        "the object keeps the normal serializer's magic"
    );
    let (type_meta, object) = skerry_api::protobuf::decode(&event.raw).expect("object decodes");
    assert!(!type_meta.kind.is_empty(), "the envelope names the kind");
    (event.event_type, object)
}

fn protobuf_from(rv: i64) -> WatchOptions {
    WatchOptions {
        encoding: Encoding::Protobuf,
        ..live_from(rv)
    }
}

/// What a JSON watch frame's object becomes after a protobuf round trip: the form a
/// protobuf client decodes (Go's zero values filled in).
fn via_protobuf(object: &Value) -> Value {
    let kind = object["kind"].as_str().expect("kind");
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let bytes = skerry_api::protobuf::encode(api_version, kind, object).expect("encode");
    skerry_api::protobuf::decode(&bytes).expect("decode").1
}

/// A JSON and a protobuf watcher of one cache see the same events, in the same order, and
/// each event is serialized once per encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_and_json_watchers_see_the_same_events() {
    let (_dir, store) = open();
    let cache = started(&store, WatchCacheConfig::default()).await;
    let rv = cache.resource_version();
    let mut json_stream = cache.watch(live_from(rv)).await.expect("json watch");
    let mut proto_stream = cache
        .watch(protobuf_from(rv))
        .await
        .expect("protobuf watch");
    let a = put_pod(&store, "ns", "a", "web").await;
    put_pod(&store, "ns", "b", "web").await;
    update(&store, pods(), Some("ns"), "a", pod("ns", "a", "db"), a)
        .await
        .expect("update");
    delete(&store, pods(), Some("ns"), "b", None)
        .await
        .expect("delete");
    for expected in ["ADDED", "ADDED", "MODIFIED", "DELETED"] {
        let json_event = next(&mut json_stream).await;
        let (event_type, object) = next_protobuf(&mut proto_stream).await;
        assert_eq!(json_event["type"], expected);
        assert_eq!(event_type, expected);
        assert_eq!(object, via_protobuf(&json_event["object"]));
    }
    assert!(a > rv);
    assert_eq!(
        cache.metrics().serializations(),
        8,
        "four events, two encodings"
    );
}

/// Reference: `docs/tricks.md` #5 (cachingObject), per encoding: 50 protobuf watchers of 10 events
/// cost 10 protobuf serializations and share every frame buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_protobuf_watchers_ten_events_ten_serializations() {
    let (_dir, store) = open();
    let cache = started(&store, WatchCacheConfig::default()).await;
    let rv = cache.resource_version();
    let mut streams = Vec::new();
    for _ in 0..50 {
        streams.push(cache.watch(protobuf_from(rv)).await.expect("watch"));
    }
    for i in 0..10 {
        put_pod(&store, "ns", &format!("p{i}"), "web").await;
    }
    let mut first_frames: Vec<Bytes> = Vec::new();
    for (n, stream) in streams.iter_mut().enumerate() {
        for i in 0..10 {
            let frame = tokio::time::timeout(WAIT, stream.next())
                .await
                .expect("in time")
                .expect("open");
            if n == 0 {
                first_frames.push(frame);
            } else {
                assert_eq!(
                    frame.as_ptr(),
                    first_frames[i].as_ptr(),
                    "every protobuf watcher gets the same frame buffer"
                );
            }
        }
    }
    for (i, frame) in first_frames.iter().enumerate() {
        let (event, _) = object::decode_protobuf_frame(frame)
            .expect("well-formed")
            .expect("whole");
        assert_eq!(event.event_type, "ADDED");
        let (_, pod) = skerry_api::protobuf::decode(&event.raw).expect("decode");
        assert_eq!(pod["metadata"]["name"], format!("p{i}"));
    }
    assert_eq!(cache.metrics().serializations(), 10);
}

/// WatchList in protobuf: snapshot, the annotated end bookmark (an object of the watched
/// kind carrying only its metadata), ticker bookmarks, and a 410 ERROR carrying a Status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_bookmark_and_error_frames_decode() {
    let (_dir, store) = open();
    let config = WatchCacheConfig {
        window_events_min: 4,
        window_events_max: 4,
        ..Default::default()
    };
    let first = put_pod(&store, "ns", "p0", "web").await;
    let cache = started(&store, config).await;
    let mut stream = cache
        .watch(WatchOptions {
            resource_version: None,
            send_initial_events: Some(true),
            allow_bookmarks: true,
            encoding: Encoding::Protobuf,
            ..Default::default()
        })
        .await
        .expect("watch list");
    let (event_type, pod) = next_protobuf(&mut stream).await;
    assert_eq!(event_type, "ADDED");
    assert_eq!(pod["metadata"]["name"], "p0");
    let (event_type, bookmark) = next_protobuf(&mut stream).await;
    assert_eq!(event_type, "BOOKMARK");
    assert_eq!(bookmark["kind"], "Pod");
    assert_eq!(bookmark["apiVersion"], "v1");
    assert_eq!(
        bookmark["metadata"]["resourceVersion"],
        first.to_string().as_str()
    );
    assert_eq!(
        bookmark["metadata"]["annotations"][INITIAL_EVENTS_END_ANNOTATION],
        "true"
    );
    assert_eq!(stream.phase(), Phase::Live);

    // A ticker bookmark goes out once per encoding to the watchers of each.
    let mut json_stream = cache
        .watch(WatchOptions {
            allow_bookmarks: true,
            ..live_from(first)
        })
        .await
        .expect("json watch");
    let before = cache.metrics().serializations();
    cache
        .shared
        .tick(cache.shared.now() + BOOKMARK_FREQUENCY + Duration::from_secs(1));
    let (event_type, bookmark) = next_protobuf(&mut stream).await;
    assert_eq!(event_type, "BOOKMARK");
    assert_eq!(
        bookmark["metadata"]["resourceVersion"],
        first.to_string().as_str()
    );
    assert!(
        bookmark["metadata"]["annotations"].is_null(),
        "only the end bookmark is annotated"
    );
    assert_eq!(next(&mut json_stream).await["type"], "BOOKMARK");
    assert_eq!(cache.metrics().serializations(), before + 2);

    let mut last = first;
    for i in 1..10 {
        last = put_pod(&store, "ns", &format!("p{i}"), "web").await;
    }
    cache.wait_fresh(last).await.expect("caught up");
    let mut expired = cache.watch(protobuf_from(first)).await.expect("a stream");
    let (event_type, status) = next_protobuf(&mut expired).await;
    assert_eq!(event_type, "ERROR");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 410);
    assert_eq!(status["reason"], "Expired");
    assert!(ended(&mut expired).await);
}

/// The frame decoder refuses hostile input instead of panicking, and asks for more bytes
/// when a frame is incomplete.
#[test]
fn protobuf_frames_split_and_refuse_garbage() {
    let frame = object::watch_frame(Encoding::Protobuf, "ADDED", b"k8s\0xyz");
    for cut in 0..frame.len() {
        assert_eq!(
            object::decode_protobuf_frame(&frame[..cut]),
            Ok(None),
            "{cut} bytes"
        );
    }
    let mut two = frame.to_vec();
    two.extend_from_slice(&frame);
    let (event, used) = object::decode_protobuf_frame(&two)
        .expect("ok")
        .expect("whole");
    assert_eq!(used, frame.len());
    assert_eq!(event.event_type, "ADDED");
    assert_eq!(&event.raw[..], b"k8s\0xyz");
    // A length past the end of the message, and an endless varint.
    assert!(object::decode_protobuf_frame(&[0, 0, 0, 2, 0x0a, 0x05]).is_err());
    assert!(object::decode_protobuf_frame(&[0, 0, 0, 3, 0x0a, 0xff, 0xff]).is_err());
}
