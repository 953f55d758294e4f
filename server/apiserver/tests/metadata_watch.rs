//! The metadata-only view the garbage collector reads (`docs/tricks.md` #29, solid / dangling
//! / waiting): `Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1` on a
//! WATCH streams events whose objects are `meta.k8s.io/v1` PartialObjectMetadata, as
//! client-go's metadata informer expects; and the deletion semantics the collector relies
//! on: `propagationPolicy=Foreground` / `Orphan` put their finalizers on the object, and
//! removing the last finalizer of an object being deleted removes it.
//!
//! The requests go straight to the registry ([`skerry_apiserver::verbs::serve`]) as an
//! authenticated admin: what is under test is the verbs' behaviour, not TLS or RBAC.

mod common;

use common::{Server, start};

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};

/// What client-go's metadata client sends on a watch.
const METADATA_ACCEPT: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// One request through the registry: status and body (read to its end).
async fn call(
    server: &Server,
    method: Method,
    path_and_query: &str,
    accept: Option<&str>,
    content_type: Option<&str>,
    body: Option<Value>,
) -> (u16, Bytes) {
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let request = common::request(method, path_and_query, accept, content_type, body);
    match common::exchange(server, request).await {
        Ok(answer) => answer,
        Err(e) => (
            e.code,
            Bytes::from(serde_json::to_vec(&json!({"message": e.message})).expect("json")),
        ),
    }
}

async fn create_config_map(server: &Server, name: &str) -> Value {
    let (status, body) = call(
        server,
        Method::POST,
        "/api/v1/namespaces/default/configmaps",
        None,
        Some("application/json"),
        Some(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app": "gc"}},
            "data": {"secret-ish": "not in the metadata view"},
        })),
    )
    .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).expect("created object")
}

async fn get_config_map(server: &Server, name: &str) -> (u16, Value) {
    let (status, body) = call(
        server,
        Method::GET,
        &format!("/api/v1/namespaces/default/configmaps/{name}"),
        None,
        None,
        None,
    )
    .await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn frames(body: &[u8]) -> Vec<Value> {
    body.split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice(line).expect("a JSON frame"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_watch_streams_partial_object_metadata() {
    let server = start().await;
    let first = create_config_map(&server, "meta-a").await;
    let start_rv = first["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    create_config_map(&server, "meta-b").await;
    let (status, _) = call(
        &server,
        Method::DELETE,
        "/api/v1/namespaces/default/configmaps/meta-b",
        None,
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);

    // A resumed watch: everything after the first create, then the stream ends.
    let (status, body) = call(
        &server,
        Method::GET,
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={start_rv}&timeoutSeconds=1"
        ),
        Some(METADATA_ACCEPT),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let events = frames(&body);
    let seen: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().expect("type"),
                e["object"]["metadata"]["name"].as_str().expect("name"),
            )
        })
        .collect();
    assert_eq!(seen, [("ADDED", "meta-b"), ("DELETED", "meta-b")]);
    for event in &events {
        let object = &event["object"];
        assert_eq!(object["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(object["kind"], "PartialObjectMetadata");
        assert!(object.get("data").is_none(), "metadata only: {object}");
        assert_eq!(object["metadata"]["labels"]["app"], "gc");
        assert!(object["metadata"]["uid"].is_string());
    }

    // A WatchList in the metadata view: the state as ADDED, then the end bookmark, whose
    // object carries the annotation the reflector waits for.
    let (status, body) = call(
        &server,
        Method::GET,
        "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true\
         &allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
        Some(METADATA_ACCEPT),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let events = frames(&body);
    let added: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "ADDED")
        .map(|e| e["object"]["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert!(added.contains(&"meta-a"), "{added:?}");
    assert!(
        !added.contains(&"meta-b"),
        "deleted before the list: {added:?}"
    );
    let bookmark = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("an end bookmark");
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert!(bookmark["object"]["metadata"]["resourceVersion"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn propagation_policies_set_finalizers_and_the_last_finalizer_removal_deletes() {
    let server = start().await;
    for (name, policy, finalizer) in [
        ("fg", "Foreground", "foregroundDeletion"),
        ("or", "Orphan", "orphan"),
    ] {
        create_config_map(&server, name).await;
        let (status, body) = call(
            &server,
            Method::DELETE,
            &format!("/api/v1/namespaces/default/configmaps/{name}"),
            None,
            Some("application/json"),
            Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy})),
        )
        .await;
        assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
        let (status, object) = get_config_map(&server, name).await;
        assert_eq!(status, 200, "still there, waiting on its finalizer");
        assert_eq!(object["metadata"]["finalizers"], json!([finalizer]));
        assert!(object["metadata"]["deletionTimestamp"].is_string());

        // The garbage collector's finalizer removal: a JSON patch conditional on the uid and
        // the finalizers read, answered in the metadata view.
        let uid = object["metadata"]["uid"].clone();
        let (status, body) = call(
            &server,
            Method::PATCH,
            &format!("/api/v1/namespaces/default/configmaps/{name}"),
            Some(METADATA_ACCEPT),
            Some("application/json-patch+json"),
            Some(json!([
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "test", "path": "/metadata/finalizers", "value": [finalizer]},
                {"op": "replace", "path": "/metadata/finalizers", "value": []},
            ])),
        )
        .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(answer["kind"], "PartialObjectMetadata");
        let (status, _) = get_config_map(&server, name).await;
        assert_eq!(status, 404, "the last finalizer gone, the object is gone");
    }

    // A stale test fails the patch instead of overwriting a newer state.
    create_config_map(&server, "stale").await;
    let (status, _) = call(
        &server,
        Method::PATCH,
        "/api/v1/namespaces/default/configmaps/stale",
        None,
        Some("application/json-patch+json"),
        Some(json!([
            {"op": "test", "path": "/metadata/uid", "value": "not-the-uid"},
            {"op": "replace", "path": "/metadata/labels", "value": {}},
        ])),
    )
    .await;
    assert_eq!(status, 422);
}
