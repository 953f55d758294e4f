//! An Event expires however it was written: a POST, a server-side apply that creates it, and
//! every later update attach it to the shared store lease of the Event TTL (the Event
//! strategy's `ttl_leases`, Kubernetes' Event storage `TTLFunc`), while other objects ride
//! no lease. The apply is what broke before the create paths shared one store write: an
//! Event `kubectl apply --server-side` created lived forever.
//!
//! The requests go straight to the registry ([`skerry_apiserver::verbs::serve`]) as an
//! authenticated admin, as `patch_preconditions.rs` does; the lease is read from the store.

mod common;

use common::{Server, start};

use bytes::Bytes;
use http::Method;
use serde_json::json;
use skerry_store::pb::etcdserverpb::RangeRequest;

const EVENTS: &str = "/api/v1/namespaces/default/events";
const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";

/// One write through the registry; its status.
async fn write(
    server: &Server,
    method: Method,
    path: &str,
    content_type: &str,
    body: String,
) -> u16 {
    let request = common::request(method, path, None, Some(content_type), Bytes::from(body));
    match common::exchange(server, request).await {
        Ok((status, _)) => status,
        Err(e) => panic!("{path}: {} {}", e.code, e.message),
    }
}

/// The store lease the object at `key` is attached to (0: none).
fn lease_of(server: &Server, key: &str) -> i64 {
    let resp = server
        .api
        .store
        .range(&RangeRequest {
            key: Bytes::from(key.to_string()),
            ..Default::default()
        })
        .expect("range");
    resp.kvs.first().expect("the object is stored").lease
}

fn event(name: &str, reason: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": reason, "message": "seen", "type": "Normal"})
    .to_string()
}

#[tokio::test]
async fn an_event_rides_the_ttl_lease_however_it_is_written() {
    let server = start().await;

    let status = write(
        &server,
        Method::POST,
        EVENTS,
        "application/json",
        event("posted", "A"),
    )
    .await;
    assert_eq!(status, 201);
    assert_ne!(lease_of(&server, "/registry/events/default/posted"), 0);

    let applied = format!("{EVENTS}/applied?fieldManager=test");
    let status = write(
        &server,
        Method::PATCH,
        &applied,
        APPLY,
        event("applied", "A"),
    )
    .await;
    assert_eq!(status, 201, "the apply created the Event");
    let first = lease_of(&server, "/registry/events/default/applied");
    assert_ne!(first, 0, "an applied Event expires too");

    let status = write(
        &server,
        Method::PATCH,
        &format!("{EVENTS}/applied"),
        MERGE,
        json!({"count": 2}).to_string(),
    )
    .await;
    assert_eq!(status, 200);
    assert_ne!(
        lease_of(&server, "/registry/events/default/applied"),
        0,
        "an update keeps a TTL"
    );

    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default"}, "data": {"a": "b"}})
    .to_string();
    let path = "/api/v1/namespaces/default/configmaps/settings?fieldManager=test";
    assert_eq!(
        write(&server, Method::PATCH, path, APPLY, config_map).await,
        201
    );
    assert_eq!(
        lease_of(&server, "/registry/configmaps/default/settings"),
        0,
        "other objects live until deleted"
    );
}
