//! The Watch service over real gRPC: several watchers multiplexed on one stream, cancel, a
//! duplicate watch id, and a progress request, as an etcd v3 client drives them.

use std::time::Duration;

use bytes::Bytes;
use skerry_store::grpc::{EtcdApi, MemberInfo, router};
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::watch_client::WatchClient;
use skerry_store::pb::etcdserverpb::{
    PutRequest, WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse, watch_request::RequestUnion,
};
use skerry_store::{Store, StoreConfig};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};

const WAIT: Duration = Duration::from_secs(10);

fn create(key: &str, watch_id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            watch_id,
            ..Default::default()
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_share_a_stream_and_cancel_independently() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(StoreConfig::new(dir.path())).expect("open");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let api = EtcdApi::new(store.clone(), MemberInfo::default());
    let server = tokio::spawn(router(api).serve_with_incoming(TcpListenerStream::new(listener)));

    let mut kv = KvClient::connect(endpoint.clone()).await.expect("connect");
    let mut watch = WatchClient::connect(endpoint).await.expect("connect");
    let (tx, rx) = mpsc::channel(16);
    let mut responses = watch
        .watch(ReceiverStream::new(rx))
        .await
        .expect("watch")
        .into_inner();
    let mut next = async || -> WatchResponse {
        tokio::time::timeout(WAIT, responses.next())
            .await
            .expect("a response in time")
            .expect("stream open")
            .expect("no error")
    };

    tx.send(create("a", 0)).await.expect("send");
    let a = next().await;
    assert!(a.created);
    tx.send(create("b", 0)).await.expect("send");
    let b = next().await;
    assert!(b.created);
    assert_ne!(a.watch_id, b.watch_id, "two watchers, two ids");
    tx.send(create("c", b.watch_id)).await.expect("send");
    let duplicate = next().await;
    assert!(duplicate.created && duplicate.canceled, "{duplicate:?}");
    assert_eq!(duplicate.cancel_reason, "etcdserver: duplicate watch ID");

    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: a.watch_id,
        })),
    })
    .await
    .expect("send");
    let canceled = next().await;
    assert!(
        canceled.canceled && canceled.watch_id == a.watch_id,
        "{canceled:?}"
    );

    for key in ["a", "b"] {
        kv.put(PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        })
        .await
        .expect("put");
    }
    let event = next().await;
    assert_eq!(
        event.watch_id, b.watch_id,
        "only the live watcher hears: {event:?}"
    );
    assert_eq!(event.events.len(), 1);
    assert_eq!(
        event.events[0].kv.as_ref().map(|kv| kv.key.clone()),
        Some(Bytes::from_static(b"b"))
    );

    tx.send(WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
    })
    .await
    .expect("send");
    let progress = next().await;
    assert_eq!(progress.watch_id, -1);
    assert!(progress.events.is_empty());
    assert_eq!(progress.header.map(|h| h.revision), Some(store.revision()));

    server.abort();
    store.close();
}
