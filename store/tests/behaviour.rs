//! Behaviour tests of the store's mechanisms that a model comparison does not reach: group
//! commit, the write-ahead log and its replay, slow watchers, progress notifications, lease
//! expiry, batched compaction, restart, and refusing data dirs that are not ours.

use std::time::Duration;

use bytes::Bytes;
use skerry_store::pb::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, WatchCreateRequest, WatchResponse,
};
use skerry_store::pb::mvccpb::event::EventType;
use skerry_store::watch::{STREAM_PROGRESS_WATCH_ID, WATCH_STREAM_QUEUE_MAX, WatchOut};
use skerry_store::{Store, StoreConfig, StoreError};
use tokio::sync::mpsc;

/// Every wait in these tests is bounded so that a bug fails instead of hanging.
const WAIT: Duration = Duration::from_secs(10);

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn open(dir: &std::path::Path) -> Store {
    Store::open(StoreConfig::new(dir)).expect("open store")
}

async fn put(store: &Store, key: &str, value: &str) -> i64 {
    store
        .put(PutRequest {
            key: b(key),
            value: b(value),
            ..Default::default()
        })
        .await
        .expect("put")
        .header
        .expect("header")
        .revision
}

async fn recv(rx: &mut mpsc::Receiver<WatchOut>) -> WatchResponse {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("watch response in time")
        .expect("stream open")
        .response
}

async fn watch(store: &Store, key: &str, end: &str, start: i64) -> (u64, mpsc::Receiver<WatchOut>) {
    let (stream, tx, mut rx) = store.hub().open_stream();
    let permit = tx.reserve().await.expect("reserve");
    let req = WatchCreateRequest {
        key: b(key),
        range_end: b(end),
        start_revision: start,
        ..Default::default()
    };
    store
        .hub()
        .create(stream, &req, permit)
        .expect("create watch");
    assert!(recv(&mut rx).await.created);
    (stream, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_durable_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let before = store.durable_commits();
    let writers: Vec<_> = (0..256)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { put(&store, &format!("k{i}"), "v").await })
        })
        .collect();
    let mut revisions = Vec::new();
    for w in writers {
        revisions.push(w.await.expect("join"));
    }
    revisions.sort_unstable();
    revisions.dedup();
    assert_eq!(revisions.len(), 256, "each put took its own revision");
    let commits = store.durable_commits() - before;
    assert!(
        commits < 256,
        "256 concurrent puts took {commits} fsynced commits: no grouping"
    );
    store.close();
}

/// Copies a data dir as a crash would leave it: what the running process has written to its
/// files so far (the page cache), nothing it holds only in memory.
fn crash_image(from: &std::path::Path, to: &std::path::Path) {
    for entry in walk(from) {
        let rel = entry.strip_prefix(from).expect("inside");
        let target = to.join(rel);
        if entry.is_dir() {
            std::fs::create_dir_all(&target).expect("mkdir");
        } else {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).expect("mkdir");
            }
            std::fs::copy(&entry, &target).expect("copy");
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        out.push(path.clone());
        if path.is_dir() {
            out.extend(walk(&path));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_after_the_last_checkpoint_come_back_from_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    // Fewer writes than a checkpoint takes, so redb holds them only non-durably.
    let writers: Vec<_> = (0..64)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut last = 0;
                for i in 0..20 {
                    last = put(&store, &format!("k{w}-{i}"), &format!("v{i}")).await;
                }
                last
            })
        })
        .collect();
    let mut top = 0;
    for w in writers {
        top = top.max(w.await.expect("join"));
    }
    assert_eq!(
        store.checkpoints(),
        0,
        "the test needs writes only the log holds"
    );
    let image = tempfile::tempdir().expect("tempdir");
    crash_image(dir.path(), image.path());
    store.close();

    let recovered = open(image.path());
    assert_eq!(recovered.replayed_at_open(), 64 * 20);
    assert_eq!(recovered.revision(), top);
    let all = recovered
        .range(&RangeRequest {
            key: b("k"),
            range_end: b("l"),
            ..Default::default()
        })
        .expect("range");
    assert_eq!(all.count, 64 * 20);
    for kv in &all.kvs {
        let key = String::from_utf8_lossy(&kv.key);
        let i = key.rsplit('-').next().expect("suffix");
        assert_eq!(kv.value, b(&format!("v{i}")), "{key}");
    }
    // The replay was made durable: a second crash image needs no replay.
    let again = tempfile::tempdir().expect("tempdir");
    crash_image(image.path(), again.path());
    recovered.close();
    let reopened = open(again.path());
    assert_eq!(reopened.replayed_at_open(), 0);
    assert_eq!(reopened.revision(), top);
    // And writing continues after the replayed commands.
    assert_eq!(put(&reopened, "after", "x").await, top + 1);
    reopened.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_bound_the_log_and_a_clean_stop_leaves_nothing_to_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(StoreConfig {
        wal_segment_bytes: skerry_store::wal::WAL_SEGMENT_BYTES_MIN,
        ..StoreConfig::new(dir.path())
    })
    .expect("open");
    let total = skerry_store::store::CHECKPOINT_COMMANDS as usize + 2_000;
    let writers: Vec<_> = (0..32)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (w..total).step_by(32) {
                    put(&store, &format!("k{i:06}"), "value").await;
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("join");
    }
    assert!(
        store.checkpoints() >= 1,
        "a checkpoint every {} commands",
        skerry_store::store::CHECKPOINT_COMMANDS
    );
    // Segments of 64 KiB hold a few hundred puts: the log rotated many times, and the
    // segments the checkpoint covered are gone.
    let segments = std::fs::read_dir(dir.path().join("wal"))
        .expect("wal dir")
        .count();
    let max_after_checkpoint = 2_000 * 150 / (64 << 10) + 3;
    assert!(segments <= max_after_checkpoint, "{segments} segments left");
    let revision = store.revision();
    store.close();
    let reopened = open(dir.path());
    assert_eq!(reopened.replayed_at_open(), 0);
    assert_eq!(reopened.revision(), revision);
    reopened.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_falls_back_to_history_and_misses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let (_stream, mut slow) = watch(&store, "k", "l", 0).await;
    // Far more separate revisions than the stream queue holds, while nobody reads it.
    let writes = WATCH_STREAM_QUEUE_MAX * 3;
    for i in 0..writes {
        put(&store, "k", &i.to_string()).await;
    }
    let (watchers, unsynced, _) = store.hub().counts();
    assert_eq!(
        (watchers, unsynced),
        (1, 1),
        "the full queue moved the watcher to replay"
    );
    let mut seen = Vec::new();
    while seen.len() < writes {
        let resp = recv(&mut slow).await;
        for e in resp.events {
            let kv = e.kv.expect("kv");
            seen.push((
                kv.mod_revision,
                String::from_utf8(kv.value.to_vec()).expect("utf8"),
            ));
        }
    }
    let expected: Vec<(i64, String)> = (0..writes).map(|i| (i as i64 + 2, i.to_string())).collect();
    assert_eq!(seen, expected, "every event once, in order");
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_replay_history_then_continue_live_with_prev_kv() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    put(&store, "a/1", "x").await;
    put(&store, "a/1", "y").await;
    store
        .delete_range(DeleteRangeRequest {
            key: b("a/1"),
            ..Default::default()
        })
        .await
        .expect("delete");
    let (stream, tx, mut rx) = store.hub().open_stream();
    let permit = tx.reserve().await.expect("reserve");
    let req = WatchCreateRequest {
        key: b("a/"),
        range_end: b("a0"),
        start_revision: 1,
        prev_kv: true,
        ..Default::default()
    };
    store.hub().create(stream, &req, permit).expect("create");
    assert!(recv(&mut rx).await.created);
    let mut events = Vec::new();
    while events.len() < 3 {
        events.extend(recv(&mut rx).await.events);
    }
    put(&store, "a/2", "z").await;
    while events.len() < 4 {
        events.extend(recv(&mut rx).await.events);
    }
    let kinds: Vec<i32> = events.iter().map(|e| e.r#type).collect();
    let put_kind = EventType::Put as i32;
    let delete_kind = EventType::Delete as i32;
    assert_eq!(kinds, vec![put_kind, put_kind, delete_kind, put_kind]);
    assert_eq!(
        events[1].prev_kv.as_ref().map(|kv| kv.value.clone()),
        Some(b("x"))
    );
    assert_eq!(
        events[2].kv.as_ref().map(|kv| kv.mod_revision),
        Some(4),
        "a delete carries its revision"
    );
    assert_eq!(
        events[2].prev_kv.as_ref().map(|kv| kv.value.clone()),
        Some(b("y"))
    );
    assert!(events[3].prev_kv.is_none());
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_requests_never_claim_undelivered_revisions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    for i in 0..50 {
        put(&store, "p", &i.to_string()).await;
    }
    // A watcher replaying history is unsynced: the progress answer must wait for it.
    let (stream, mut rx) = watch(&store, "p", "", 1).await;
    store.hub().request_progress(stream);
    let mut last_event_rev = 0;
    loop {
        let resp = recv(&mut rx).await;
        if resp.watch_id == STREAM_PROGRESS_WATCH_ID && resp.events.is_empty() {
            let claimed = resp.header.expect("header").revision;
            assert_eq!(claimed, 51);
            assert_eq!(
                last_event_rev, 51,
                "progress at {claimed} came before events up to it"
            );
            break;
        }
        for e in resp.events {
            last_event_rev = e.kv.expect("kv").mod_revision;
        }
    }
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_progress_notifications_reach_watchers_that_ask() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = StoreConfig::new(dir.path());
    config.progress_notify_interval = Duration::from_millis(200);
    let store = Store::open(config).expect("open");
    put(&store, "q", "1").await;
    let (stream, tx, mut rx) = store.hub().open_stream();
    let permit = tx.reserve().await.expect("reserve");
    let req = WatchCreateRequest {
        key: b("q"),
        progress_notify: true,
        ..Default::default()
    };
    let id = store.hub().create(stream, &req, permit).expect("create");
    assert!(recv(&mut rx).await.created);
    let resp = recv(&mut rx).await;
    assert_eq!(resp.watch_id, id);
    assert!(resp.events.is_empty());
    assert_eq!(resp.header.expect("header").revision, 2);
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_deletes_its_keys_in_one_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let (id, ttl) = store.lease_grant(1, 0).await.expect("grant");
    assert_eq!(
        ttl,
        skerry_store::lease::LEASE_TTL_MIN_SECONDS,
        "short TTLs are raised to the minimum"
    );
    for key in ["l/1", "l/2", "l/3"] {
        store
            .put(PutRequest {
                key: b(key),
                value: b("v"),
                lease: id,
                ..Default::default()
            })
            .await
            .expect("put");
    }
    let (_s, mut rx) = watch(&store, "l/", "l0", 0).await;
    let resp = recv(&mut rx).await;
    assert_eq!(resp.events.len(), 3, "three deletes together");
    let revs: Vec<i64> = resp
        .events
        .iter()
        .map(|e| e.kv.as_ref().expect("kv").mod_revision)
        .collect();
    assert!(
        revs.iter().all(|r| *r == 5),
        "one revision for the whole expiry: {revs:?}"
    );
    assert!(store.lease_time_to_live(id, false).is_none());
    assert_eq!(
        store
            .put(PutRequest {
                key: b("x"),
                lease: id,
                ..Default::default()
            })
            .await
            .err(),
        Some(StoreError::LeaseNotFound)
    );
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_a_restart_with_their_full_ttl_and_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let (id, _) = store.lease_grant(30, 0).await.expect("grant");
    store
        .put(PutRequest {
            key: b("held"),
            value: b("v"),
            lease: id,
            ..Default::default()
        })
        .await
        .expect("put");
    store.close();
    let store = open(dir.path());
    let (remaining, granted, keys) = store
        .lease_time_to_live(id, true)
        .expect("lease after restart");
    assert_eq!(granted, 30);
    assert!(remaining >= 29, "remaining {remaining}");
    assert_eq!(keys, vec![b("held")]);
    assert_eq!(store.lease_revoke(id).await.expect("revoke"), 3);
    let resp = store
        .range(&RangeRequest {
            key: b("held"),
            ..Default::default()
        })
        .expect("range");
    assert!(resp.kvs.is_empty());
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn physical_compaction_runs_in_batches_and_keeps_what_is_readable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let keys = skerry_store::store::COMPACTION_BATCH_KEYS * 3 + 17;
    for round in 0..2 {
        let writers: Vec<_> = (0..keys)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(
                    async move { put(&store, &format!("c/{i:05}"), &format!("{round}")).await },
                )
            })
            .collect();
        for w in writers {
            w.await.expect("join");
        }
    }
    let at = store.revision();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..200 {
                put(&store, "during", &i.to_string()).await;
            }
        })
    };
    store.compact(at, true).await.expect("compact");
    writer.await.expect("writes went on during compaction");
    let resp = store
        .range(&RangeRequest {
            key: b("c/"),
            range_end: b("c0"),
            revision: at,
            count_only: true,
            ..Default::default()
        })
        .expect("read at the compacted revision");
    assert_eq!(resp.count, keys as i64);
    assert!(
        matches!(store.history(1, at), Err(StoreError::Compacted { compact_revision }) if compact_revision == at)
    );
    assert!(matches!(
        store.range(&RangeRequest {
            key: b("c/00001"),
            revision: at - 1,
            ..Default::default()
        }),
        Err(StoreError::Compacted { .. })
    ));
    assert_eq!(
        store.compact(at, false).await.err(),
        Some(StoreError::Compacted {
            compact_revision: at
        })
    );
    assert_eq!(
        store.compact(store.revision() + 1, false).await.err(),
        Some(StoreError::FutureRevision)
    );
    // After a restart the compaction floor and the data are as they were.
    let revision = store.revision();
    store.close();
    let store = open(dir.path());
    assert_eq!(store.compact_revision(), at);
    assert_eq!(store.revision(), revision);
    let resp = store
        .range(&RangeRequest {
            key: b("c/00000"),
            ..Default::default()
        })
        .expect("range");
    assert_eq!(resp.kvs[0].value, b("1"));
    assert_eq!(resp.kvs[0].version, 2);
    store.close();
}

#[test]
fn data_dirs_that_are_not_ours_are_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("member")).expect("mkdir");
    let err = Store::open(StoreConfig::new(dir.path()))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not a skerry store"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join(skerry_store::store::DB_FILE_NAME),
        b"SQLite format 3\0 and more",
    )
    .expect("write");
    let err = Store::open(StoreConfig::new(dir.path()))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not a skerry store file"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let err = Store::open(StoreConfig::new(dir.path()))
        .err()
        .expect("refused while open");
    assert!(err.to_string().contains("in use"), "{err}");
    store.close();
    open(dir.path()).close();
}

/// etcd 3.4 panics on this txn (its duplicate-key check lets a `"\0"` delete and an
/// `ignore_value` put of the same key through, and the put then fails mid-apply); skerry must
/// refuse it before writing and keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_txn_that_crashes_etcd_is_refused_and_the_store_keeps_serving() {
    use skerry_store::pb::etcdserverpb::{RequestOp, TxnRequest, request_op::Request};
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    put(&store, "c", "v").await;
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp {
                request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                    key: Bytes::from_static(b"\0"),
                    range_end: Bytes::from_static(b"\0"),
                    ..Default::default()
                })),
            },
            RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: b("c"),
                    ignore_value: true,
                    ..Default::default()
                })),
            },
        ],
        failure: vec![],
    };
    assert_eq!(store.txn(txn).await.err(), Some(StoreError::KeyNotFound));
    assert_eq!(
        put(&store, "c", "w").await,
        3,
        "nothing was written; writes go on"
    );
    store.close();
}

/// The store side of the Kubernetes compactor (`docs/tricks.md` #13, the compactor elected
/// by a CAS on a magic key): every apiserver runs
/// `Txn(If(Version(compact_rev_key) == expected)).Then(Put(compact_rev_key, rev)).Else(Get)`;
/// the version of one key is the only clock, and exactly one contender wins each round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compactor_cas_on_a_magic_key_elects_one_winner_per_round() {
    use skerry_store::pb::etcdserverpb::{
        Compare, RequestOp, TxnRequest, compare, request_op::Request, response_op,
    };
    const COMPACT_REV_KEY: &str = "compact_rev_key";
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    for i in 0..10 {
        put(&store, &format!("/registry/pods/p{i}"), "v").await;
    }
    let cas = |expected_version: i64, rev: i64| TxnRequest {
        compare: vec![Compare {
            result: compare::CompareResult::Equal as i32,
            target: compare::CompareTarget::Version as i32,
            key: b(COMPACT_REV_KEY),
            target_union: Some(compare::TargetUnion::Version(expected_version)),
            ..Default::default()
        }],
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: b(COMPACT_REV_KEY),
                value: Bytes::from(rev.to_string()),
                ..Default::default()
            })),
        }],
        failure: vec![RequestOp {
            request: Some(Request::RequestRange(RangeRequest {
                key: b(COMPACT_REV_KEY),
                ..Default::default()
            })),
        }],
    };
    // Three apiservers try the same round concurrently, each expecting version 0.
    let seen = store.revision();
    let contenders: Vec<_> = (0..3)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.txn(cas(0, seen)).await })
        })
        .collect();
    let mut winners = 0;
    for c in contenders {
        let resp = c.await.expect("join").expect("txn");
        if resp.succeeded {
            winners += 1;
        } else {
            // The losers adopt the version they read, for the next round.
            let Some(response_op::Response::ResponseRange(r)) = &resp.responses[0].response else {
                panic!("a failed CAS returns the key: {resp:?}");
            };
            assert_eq!(r.kvs[0].version, 1);
        }
    }
    assert_eq!(
        winners, 1,
        "one compaction per interval across all apiservers"
    );
    // The winner compacts to the revision it saw; reads there still work.
    store.compact(seen, true).await.expect("compact");
    let resp = store
        .range(&RangeRequest {
            key: b("/registry/pods/"),
            range_end: b("/registry/pods0"),
            revision: seen,
            count_only: true,
            ..Default::default()
        })
        .expect("read at the compacted revision");
    assert_eq!(resp.count, 10);
    store.close();
}

/// The store side of paged LIST: `count` is the full count of what remains in the range (the
/// apiserver's `remainingItemCount`), and pinning the first page's revision gives a consistent
/// list while writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_with_a_pinned_revision_is_consistent_under_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    for i in 0..50 {
        put(&store, &format!("/registry/pods/p{i:02}"), "v").await;
    }
    let mut key = b("/registry/pods/");
    let end = b("/registry/pods0");
    let mut pinned = 0;
    let mut listed = Vec::new();
    loop {
        let resp = store
            .range(&RangeRequest {
                key: key.clone(),
                range_end: end.clone(),
                limit: 7,
                revision: pinned,
                ..Default::default()
            })
            .expect("page");
        if pinned == 0 {
            pinned = resp.header.expect("header").revision;
        }
        assert_eq!(
            resp.count as usize,
            50 - listed.len(),
            "count covers the rest of the range"
        );
        // Writes between pages are not seen: the revision is pinned.
        put(&store, &format!("/registry/pods/new{}", listed.len()), "v").await;
        listed.extend(resp.kvs.iter().map(|kv| kv.key.clone()));
        if !resp.more {
            break;
        }
        let mut next = resp.kvs.last().expect("a full page").key.to_vec();
        next.push(0);
        key = Bytes::from(next);
    }
    let expected: Vec<Bytes> = (0..50)
        .map(|i| b(&format!("/registry/pods/p{i:02}")))
        .collect();
    assert_eq!(listed, expected);
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_quota_the_store_raises_nospace_which_survives_a_restart_until_cleared() {
    use skerry_store::pb::etcdserverpb::{
        AlarmMember, AlarmRequest, AlarmType, TxnRequest, alarm_request::AlarmAction,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // A quota below what a new store's file already takes: everything that costs is refused.
    let store = Store::open(StoreConfig {
        quota: Some(4096),
        ..StoreConfig::new(dir.path())
    })
    .expect("open");
    let member = store.member_id();
    let nospace = vec![AlarmMember {
        member_id: member,
        alarm: AlarmType::Nospace as i32,
    }];
    assert!(store.alarms().is_empty());
    let refused = store
        .put(PutRequest {
            key: b("k"),
            value: b("v"),
            ..Default::default()
        })
        .await;
    assert_eq!(refused.err(), Some(StoreError::NoSpace));
    // Refused before anything was proposed, with this member's alarm raised on the way.
    assert_eq!(store.revision(), 1);
    assert_eq!(store.alarms(), nospace);
    assert_eq!(
        store.lease_grant(60, 0).await.err(),
        Some(StoreError::NoSpace)
    );
    // What costs nothing passes: a txn without puts, a delete, reads.
    store
        .txn(TxnRequest::default())
        .await
        .expect("an empty txn costs nothing");
    store
        .delete_range(DeleteRangeRequest {
            key: b("k"),
            ..Default::default()
        })
        .await
        .expect("deletes go on");
    store
        .range(&RangeRequest {
            key: b("k"),
            ..Default::default()
        })
        .expect("reads go on");
    store.close();

    // Reopened without a quota: the alarm is in the store, and still stops writes.
    let store = Store::open(StoreConfig {
        quota: None,
        ..StoreConfig::new(dir.path())
    })
    .expect("reopen");
    assert_eq!(store.alarms(), nospace);
    let refused = store
        .put(PutRequest {
            key: b("k"),
            value: b("v"),
            ..Default::default()
        })
        .await;
    assert_eq!(refused.err(), Some(StoreError::NoSpace));
    let listed = store
        .alarm(AlarmRequest {
            action: AlarmAction::Get as i32,
            member_id: 0,
            alarm: AlarmType::None as i32,
        })
        .await
        .expect("alarm list");
    assert_eq!(listed.alarms, nospace);
    let cleared = store
        .alarm(AlarmRequest {
            action: AlarmAction::Deactivate as i32,
            member_id: member,
            alarm: AlarmType::Nospace as i32,
        })
        .await
        .expect("disarm");
    assert_eq!(cleared.alarms, nospace);
    assert!(store.alarms().is_empty());
    put(&store, "k", "v").await;
    store.close();
    let store = open(dir.path());
    assert!(store.alarms().is_empty(), "the clearing is durable too");
    store.close();
}

/// A replicated log that records what the store proposes and never applies it.
#[derive(Default)]
struct RecordingLog {
    submitted: std::sync::Mutex<Vec<skerry_store::pb::command::Command>>,
}

impl skerry_store::replication::Replicator for RecordingLog {
    fn submit(
        &self,
        command: skerry_store::pb::command::Command,
        _reply: skerry_store::replication::Reply,
    ) {
        self.submitted.lock().expect("lock").push(command);
    }
    fn read_index(&self, reply: tokio::sync::oneshot::Sender<Result<u64, StoreError>>) {
        let _ = reply.send(Err(StoreError::NoLeader));
    }
    fn status(&self) -> skerry_store::replication::ReplicaStatus {
        skerry_store::replication::ReplicaStatus::default()
    }
    fn renew_lease(&self, _id: i64) {}
}

#[test]
fn a_member_past_its_quota_raises_its_own_alarm_for_entries_others_proposed() {
    use skerry_store::pb::command::{Command, command};
    use skerry_store::pb::etcdserverpb::{AlarmType, alarm_request::AlarmAction};
    use skerry_store::replication::Committed;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(StoreConfig {
        replicated: true,
        identity: Some((0xc1, 7)),
        quota: Some(4096),
        ..StoreConfig::new(dir.path())
    })
    .expect("open");
    let log = std::sync::Arc::new(RecordingLog::default());
    store.set_replicator(log.clone());
    // Another member's put, committed: it applies here, past this member's quota.
    let (reply, mut rx) = tokio::sync::oneshot::channel();
    store
        .apply_committed(vec![
            Committed {
                index: 1,
                command: Some(Command {
                    command: Some(command::Command::Put(PutRequest {
                        key: b("k"),
                        value: b("v"),
                        ..Default::default()
                    })),
                }),
                reply: None,
            },
            // A no-op entry with a reply, to know when the batch before it is done.
            Committed {
                index: 2,
                command: None,
                reply: Some(reply),
            },
        ])
        .expect("hand over");
    let deadline = std::time::Instant::now() + WAIT;
    while rx.try_recv().is_err() {
        assert!(std::time::Instant::now() < deadline, "not applied in time");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(store.revision(), 2, "the put applied all the same");
    let submitted = log.submitted.lock().expect("lock").clone();
    let raised: Vec<_> = submitted
        .iter()
        .filter_map(|c| match &c.command {
            Some(command::Command::Alarm(a)) => Some((a.action, a.member_id, a.alarm)),
            _ => None,
        })
        .collect();
    assert_eq!(
        raised,
        [(AlarmAction::Activate as i32, 7, AlarmType::Nospace as i32)]
    );
    store.close();
}
