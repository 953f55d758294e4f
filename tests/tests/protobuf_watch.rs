//! Protobuf watch streams over real HTTP/2 + TLS to an in-process apiserver, as client-go
//! with `application/vnd.kubernetes.protobuf` reads them: the response is
//! `application/vnd.kubernetes.protobuf;stream=watch`, a sequence of 4-byte big-endian
//! length prefixes each followed by a raw `metav1.WatchEvent`, whose `object.raw` is the
//! object as the normal protobuf serializer writes it (`k8s\0` magic and envelope).
//! The same watch in JSON must carry the same events.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use serde_json::Value;
use skerry_apiserver::watch_cache::object::decode_protobuf_frame;
use skerry_tests::apibench::fixture::{Harness, NAMESPACE, resource_version_of};
use skerry_tests::apibench::pki::SERVER_NAME;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Every exchange is bounded so that a bug fails instead of hanging: the watches below end
/// by `timeoutSeconds` well inside it.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// A watch's `timeoutSeconds`: long enough for the backlog to be written, short enough to
/// keep the test quick (the body is read to its end).
const WATCH_SECONDS: u64 = 2;

const PROTOBUF_ACCEPT: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// One HTTP/2 connection to the harness as the admin.
async fn connect(harness: &Harness) -> http2::SendRequest<Full<Bytes>> {
    let tls = harness.pki.admin_client_config().expect("client tls");
    let tcp = TcpStream::connect(harness.addr).await.expect("connect");
    let name = ServerName::try_from(SERVER_NAME).expect("server name");
    let stream = TlsConnector::from(Arc::clone(&tls))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    sender
}

/// A GET with `accept`, read to its end: status, content type and body.
async fn get(
    sender: &http2::SendRequest<Full<Bytes>>,
    harness: &Harness,
    path: &str,
    accept: &str,
) -> (StatusCode, String, Bytes) {
    let request = http::Request::builder()
        .method(Method::GET)
        .uri(format!("https://{}{path}", harness.addr))
        .header(header::ACCEPT, accept)
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let mut sender = sender.clone();
    let exchange = async move {
        sender.ready().await.expect("connection open");
        let response = sender.send_request(request).await.expect("response");
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, content_type, body)
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .expect("the watch ended in time")
}

/// The events of a protobuf watch body: type and decoded object, every byte accounted for.
fn protobuf_events(mut body: &[u8]) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    while !body.is_empty() {
        let (event, used) = decode_protobuf_frame(body)
            .expect("a well-formed frame")
            .expect("no truncated frame at the end of the body");
        body = &body[used..];
        assert!(
            event.raw.starts_with(&skerry_api::protobuf::MAGIC),
            "the object keeps the k8s magic"
        );
        let (_, object) = skerry_api::protobuf::decode(&event.raw).expect("object decodes");
        events.push((event.event_type, object));
    }
    events
}

/// The events of a JSON watch body, with each object put through a protobuf round trip so
/// that it compares with what a protobuf client decodes (Go's zero values filled in).
fn json_events(body: &[u8]) -> Vec<(String, Value)> {
    body.split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| {
            let event: Value = serde_json::from_slice(line).expect("a JSON frame");
            let object = &event["object"];
            let kind = object["kind"].as_str().expect("kind");
            let api_version = object["apiVersion"].as_str().expect("apiVersion");
            let bytes = skerry_api::protobuf::encode(api_version, kind, object).expect("encodes");
            let (_, object) = skerry_api::protobuf::decode(&bytes).expect("decodes");
            (event["type"].as_str().expect("type").to_string(), object)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_watch_streams_match_json_over_http() {
    let harness = Harness::start().await.expect("apiserver");
    let sender = connect(&harness).await;
    let start = harness.pods_cache().resource_version();
    let mut last = start;
    for i in 0..3 {
        let pod = harness
            .create_pod(NAMESPACE, &format!("proto-{i}"), i)
            .await
            .expect("create");
        last = resource_version_of(&pod).expect("rv");
    }
    harness
        .pods_cache()
        .wait_fresh(last)
        .await
        .expect("cache caught up");
    let serializations_before = harness.pods_cache().metrics().serializations();

    // A resumed watch: the backlog after `start`, then the stream ends at its timeout.
    let path = format!(
        "/api/v1/namespaces/{NAMESPACE}/pods?watch=true&resourceVersion={start}\
         &timeoutSeconds={WATCH_SECONDS}"
    );
    let (status, content_type, body) = get(&sender, &harness, &path, PROTOBUF_ACCEPT).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    assert_eq!(
        content_type,
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let proto = protobuf_events(&body);
    let names: Vec<&str> = proto
        .iter()
        .map(|(_, o)| o["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["proto-0", "proto-1", "proto-2"]);
    assert!(proto.iter().all(|(t, _)| t == "ADDED"));

    // client-go's plain protobuf Accept negotiates the same stream.
    let (status, content_type, plain) = get(
        &sender,
        &harness,
        &path,
        "application/vnd.kubernetes.protobuf, application/json",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        content_type,
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    assert_eq!(plain, body, "the same memoized frames");

    let (status, content_type, json_body) = get(&sender, &harness, &path, "application/json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "application/json");
    assert_eq!(json_events(&json_body), proto, "JSON and protobuf agree");
    assert_eq!(
        harness.pods_cache().metrics().serializations() - serializations_before,
        6,
        "three events, once per encoding, however many watchers"
    );

    // WatchList in protobuf: the state as ADDED, then the annotated end bookmark.
    let path = format!(
        "/api/v1/namespaces/{NAMESPACE}/pods?watch=true&sendInitialEvents=true\
         &allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan\
         &timeoutSeconds={WATCH_SECONDS}"
    );
    let (status, _, body) = get(&sender, &harness, &path, PROTOBUF_ACCEPT).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let events = protobuf_events(&body);
    let end = events
        .iter()
        .position(|(t, _)| t == "BOOKMARK")
        .expect("an end bookmark");
    let bookmark = &events[end].1;
    assert_eq!(bookmark["kind"], "Pod");
    assert_eq!(
        bookmark["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let bookmark_rv: i64 = bookmark["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("bookmark rv");
    assert!(bookmark_rv >= last);
    let added: Vec<&str> = events[..end]
        .iter()
        .inspect(|(t, _)| assert_eq!(t, "ADDED"))
        .map(|(_, o)| o["metadata"]["name"].as_str().expect("name"))
        .collect();
    for name in ["proto-0", "proto-1", "proto-2"] {
        assert!(added.contains(&name), "{name} in {added:?}");
    }
    // Nothing was written since: what follows are the ticker's bookmarks (one comes just
    // before the deadline), unannotated.
    for (event_type, object) in &events[end + 1..] {
        assert_eq!(event_type, "BOOKMARK");
        assert!(object["metadata"]["annotations"].is_null(), "{object}");
    }

    // Watches still refuse YAML.
    let (status, _, _) = get(&sender, &harness, &path, "application/yaml").await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
}
