//! Crash test: kill -9 the server while clients write, restart it, and check that every
//! acknowledged write survived and the store opens every time.
//!
//! Each round, concurrent clients put increasing counters to their own key; the server is
//! killed (SIGKILL) at a random moment; after the restart each key must hold at least the last
//! acknowledged counter (a write in flight at the kill may or may not have landed), the
//! revision must not go backwards, and the history of each key must be a gap-free sequence.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod common;

use bytes::Bytes;
use common::Server;
use rand::Rng;
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::{PutRequest, RangeRequest};

/// Kill-restart rounds per run. Each round costs about a second; raise with SKERRY_CRASH_ROUNDS.
const ROUNDS_DEFAULT: u32 = 8;
/// Concurrent writers, enough that kills land in the middle of group-committed batches.
const CLIENTS: u64 = 16;
/// Bound on a writer's connect and on each put. A killed server's sockets close at once, so a
/// put normally fails within milliseconds; but a tonic channel whose connection died can wait
/// in `ready` for good (hyperium/tonic#1635), which hung this test once in CI. A put that runs
/// out of time counts as unacknowledged, like one that failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

fn key(client: u64) -> Bytes {
    Bytes::from(format!("crash/{client:02}"))
}

async fn read(kv: &mut KvClient<tonic::transport::Channel>, client: u64) -> Option<(u64, i64)> {
    let resp = kv
        .range(RangeRequest {
            key: key(client),
            ..Default::default()
        })
        .await
        .expect("range after restart")
        .into_inner();
    resp.kvs.first().map(|kv| {
        let text = std::str::from_utf8(&kv.value).expect("utf8 value");
        (text.parse().expect("counter value"), kv.version)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let rounds = std::env::var("SKERRY_CRASH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS_DEFAULT);
    let dir = tempfile::tempdir().expect("tempdir");
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..CLIENTS).map(|_| AtomicU64::new(0)).collect());
    let mut last_revision = 0i64;
    let mut total_acked = 0u64;
    for round in 0..rounds {
        let server = Server::start_with_args(&dir.path().join("data"), &["--log-level", "warn"]);
        let endpoint = server.url();
        // Everything acknowledged before the last kill must be there.
        let mut kv = KvClient::connect(endpoint.clone()).await.expect("connect");
        for client in 0..CLIENTS {
            let want = acked[client as usize].load(Ordering::SeqCst);
            let got = read(&mut kv, client).await;
            let (value, version) = got.unwrap_or((0, 0));
            assert!(
                value >= want,
                "round {round}: client {client} acknowledged {want} but the store holds {value}"
            );
            // Counters are put in order from 1 with no deletes: version == value.
            assert_eq!(
                version as u64, value,
                "round {round}: client {client}: history has a gap"
            );
            acked[client as usize].store(value, Ordering::SeqCst);
        }
        let revision = kv
            .range(RangeRequest {
                key: key(0),
                ..Default::default()
            })
            .await
            .expect("range")
            .into_inner()
            .header
            .expect("header")
            .revision;
        assert!(
            revision >= last_revision,
            "revision went back from {last_revision} to {revision}"
        );
        last_revision = revision;

        let mut writers = Vec::new();
        for client in 0..CLIENTS {
            let acked = acked.clone();
            let endpoint = endpoint.clone();
            writers.push(tokio::spawn(async move {
                let Ok(Ok(mut kv)) =
                    tokio::time::timeout(WRITE_TIMEOUT, KvClient::connect(endpoint)).await
                else {
                    return 0u64;
                };
                let mut done = 0;
                let mut next = acked[client as usize].load(Ordering::SeqCst) + 1;
                loop {
                    let put = PutRequest {
                        key: key(client),
                        value: Bytes::from(next.to_string()),
                        ..Default::default()
                    };
                    match tokio::time::timeout(WRITE_TIMEOUT, kv.put(put)).await {
                        Ok(Ok(_)) => {
                            acked[client as usize].store(next, Ordering::SeqCst);
                            next += 1;
                            done += 1;
                        }
                        Ok(Err(_)) | Err(_) => return done,
                    }
                }
            }));
        }
        let run_for = Duration::from_millis(rand::rng().random_range(100..600));
        tokio::time::sleep(run_for).await;
        tokio::task::spawn_blocking(move || {
            server.kill();
        })
        .await
        .expect("kill");
        for w in writers {
            total_acked += w.await.expect("writer");
        }
    }
    let server = Server::start_with_args(&dir.path().join("data"), &["--log-level", "warn"]);
    let mut kv = KvClient::connect(server.url()).await.expect("connect");
    for client in 0..CLIENTS {
        let want = acked[client as usize].load(Ordering::SeqCst);
        let (value, _) = read(&mut kv, client).await.unwrap_or((0, 0));
        assert!(
            value >= want,
            "final: client {client} acknowledged {want} but the store holds {value}"
        );
    }
    assert!(total_acked > 0, "no write was acknowledged at all");
    eprintln!("crash test: {rounds} kills, {total_acked} acknowledged writes, all survived");
}
