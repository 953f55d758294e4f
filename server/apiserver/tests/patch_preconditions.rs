//! Two registry behaviours the garbage collector and kubectl rely on, checked as Kubernetes
//! answers them:
//!
//! - PATCH honours the `metadata.resourceVersion` and `metadata.uid` the patched object
//!   carries. The patch is applied to the current object, so only a patch that *sets* a
//!   different resourceVersion conflicts (409, the optimistic-lock message); one that leaves
//!   it out is unconditional. A patched uid other than the object's is a change of an
//!   immutable field (422), and an apply that would create an object but names a uid is a
//!   409. A PUT naming another uid fails its UID precondition (409).
//! - DELETE of an object already being deleted applies the propagation policy to its
//!   finalizers again (`deletionFinalizersForGarbageCollection`) and answers 200 with the
//!   updated object; if the policy takes away the last finalizer, the object goes.
//!
//! The requests go straight to the registry ([`skerry_apiserver::verbs::serve`]) as an
//! authenticated admin, as `metadata_watch.rs` does: what is under test is the verbs.

mod common;

use common::{Server, start};

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};

/// Kubernetes' optimistic-lock message, which a stale patch must get.
const CONFLICT: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

const CONFIG_MAPS: &str = "/api/v1/namespaces/default/configmaps";

/// One request through the registry: status and the JSON body (errors as their Status-like
/// `{"message": ...}`).
async fn call(
    server: &Server,
    method: Method,
    path_and_query: &str,
    content_type: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let request = common::request(method, path_and_query, None, content_type, body);
    match common::exchange(server, request).await {
        Ok((status, body)) => (
            status,
            serde_json::from_slice(&body).expect("a JSON answer"),
        ),
        Err(e) => (e.code, json!({"message": e.message, "reason": e.reason})),
    }
}

async fn create_config_map(server: &Server, name: &str, finalizers: &[&str]) -> Value {
    let (status, body) = call(
        server,
        Method::POST,
        CONFIG_MAPS,
        Some("application/json"),
        Some(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "finalizers": finalizers},
            "data": {"k": "v"},
        })),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body
}

async fn get(server: &Server, name: &str) -> (u16, Value) {
    call(
        server,
        Method::GET,
        &format!("{CONFIG_MAPS}/{name}"),
        None,
        None,
    )
    .await
}

async fn patch(server: &Server, name: &str, content_type: &str, body: Value) -> (u16, Value) {
    call(
        server,
        Method::PATCH,
        &format!("{CONFIG_MAPS}/{name}"),
        Some(content_type),
        Some(body),
    )
    .await
}

async fn apply(server: &Server, name: &str, body: Value) -> (u16, Value) {
    call(
        server,
        Method::PATCH,
        &format!("{CONFIG_MAPS}/{name}?fieldManager=test-applier"),
        Some(APPLY),
        Some(body),
    )
    .await
}

async fn delete(server: &Server, name: &str, policy: Option<&str>) -> (u16, Value) {
    let options = match policy {
        Some(p) => json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": p}),
        None => json!({"kind": "DeleteOptions", "apiVersion": "v1"}),
    };
    call(
        server,
        Method::DELETE,
        &format!("{CONFIG_MAPS}/{name}"),
        Some("application/json"),
        Some(options),
    )
    .await
}

fn rv(object: &Value) -> String {
    object["metadata"]["resourceVersion"]
        .as_str()
        .expect("a resourceVersion")
        .to_string()
}

fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts a 409 carrying Kubernetes' optimistic-lock message.
fn assert_stale(status: u16, body: &Value) {
    assert_eq!(status, 409, "{body}");
    let message = body["message"].as_str().expect("message");
    assert!(message.ends_with(CONFLICT), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_that_sets_a_stale_resource_version_conflicts() {
    let server = start().await;
    let created = create_config_map(&server, "cm", &[]).await;
    let first_rv = rv(&created);
    // Another writer moves the object on.
    let (status, moved) = patch(&server, "cm", MERGE, json!({"data": {"k": "v2"}})).await;
    assert_eq!(status, 200, "{moved}");
    let current_rv = rv(&moved);
    assert_ne!(first_rv, current_rv);

    // Every patch type that sets the stale version conflicts and changes nothing.
    let stale_patches = [
        (
            MERGE,
            json!({"metadata": {"resourceVersion": first_rv}, "data": {"k": "merge"}}),
        ),
        (
            STRATEGIC,
            json!({"metadata": {"resourceVersion": first_rv}, "data": {"k": "smp"}}),
        ),
        (
            JSON_PATCH,
            json!([
                {"op": "replace", "path": "/metadata/resourceVersion", "value": first_rv},
                {"op": "replace", "path": "/data/k", "value": "json"},
            ]),
        ),
    ];
    for (content_type, body) in stale_patches {
        let (status, answer) = patch(&server, "cm", content_type, body).await;
        assert_stale(status, &answer);
    }
    let (_, now) = get(&server, "cm").await;
    assert_eq!(now["data"]["k"], "v2", "no stale patch was written");
    assert_eq!(rv(&now), current_rv);

    // The current version is a precondition that holds.
    let (status, answer) = patch(
        &server,
        "cm",
        MERGE,
        json!({"metadata": {"resourceVersion": current_rv}, "data": {"k": "v3"}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["data"]["k"], "v3");
    assert_ne!(rv(&answer), current_rv, "a new version was written");

    // No resourceVersion in the patch: no precondition, however old the client's copy.
    let (status, answer) = patch(&server, "cm", MERGE, json!({"data": {"k": "v4"}})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["data"]["k"], "v4");

    // A patch that removes the resourceVersion is unconditional too.
    let (status, answer) = patch(
        &server,
        "cm",
        MERGE,
        json!({"metadata": {"resourceVersion": null}, "data": {"k": "v5"}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["data"]["k"], "v5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patched_uid_must_be_the_objects_own() {
    let server = start().await;
    let created = create_config_map(&server, "cm", &[]).await;
    let uid = created["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();

    // Another uid: the object was replaced since the client read it.
    for (content_type, body) in [
        (
            MERGE,
            json!({"metadata": {"uid": "not-the-uid"}, "data": {"k": "x"}}),
        ),
        (
            STRATEGIC,
            json!({"metadata": {"uid": "not-the-uid", "labels": {"a": "b"}}}),
        ),
    ] {
        let (status, answer) = patch(&server, "cm", content_type, body).await;
        assert_eq!(status, 422, "{answer}");
        assert_eq!(answer["reason"], "Invalid");
        let message = answer["message"].as_str().expect("message");
        assert!(
            message.contains("metadata.uid: Invalid value: \"not-the-uid\": field is immutable"),
            "{message}"
        );
    }
    let (_, now) = get(&server, "cm").await;
    assert_eq!(now["data"]["k"], "v");
    assert!(now["metadata"].get("labels").is_none());

    // Its own uid: the patch applies (what the garbage collector's owner-reference patches
    // carry).
    let (status, answer) = patch(
        &server,
        "cm",
        STRATEGIC,
        json!({"metadata": {"uid": uid, "labels": {"a": "b"}}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["metadata"]["labels"]["a"], "b");
    assert_eq!(answer["metadata"]["uid"], uid.as_str());

    // A PUT that names another uid fails its UID precondition.
    let mut replacement = answer.clone();
    replacement["metadata"]["uid"] = json!("not-the-uid");
    replacement["data"]["k"] = json!("put");
    let (status, answer) = call(
        &server,
        Method::PUT,
        &format!("{CONFIG_MAPS}/cm"),
        Some("application/json"),
        Some(replacement),
    )
    .await;
    assert_eq!(status, 409, "{answer}");
    let message = answer["message"].as_str().expect("message");
    assert!(
        message.contains(&format!(
            "Precondition failed: UID in precondition: not-the-uid, UID in object meta: {uid}"
        )),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_checks_the_applied_resource_version_and_uid() {
    let server = start().await;
    let config = |data: &str, rv: Option<&str>| {
        let mut metadata = json!({"name": "applied"});
        if let Some(rv) = rv {
            metadata["resourceVersion"] = json!(rv);
        }
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": data}})
    };
    let (status, created) = apply(&server, "applied", config("one", None)).await;
    assert_eq!(status, 201, "{created}");
    let first_rv = rv(&created);
    let (status, second) = apply(&server, "applied", config("two", None)).await;
    assert_eq!(status, 200, "{second}");

    let (status, answer) = apply(&server, "applied", config("stale", Some(&first_rv))).await;
    assert_stale(status, &answer);
    let (status, answer) = apply(&server, "applied", config("three", Some(&rv(&second)))).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["data"]["k"], "three");

    // An apply that would create the object cannot name the uid of one that exists no more.
    let mut ghost = config("ghost", None);
    ghost["metadata"]["name"] = json!("ghost");
    ghost["metadata"]["uid"] = json!("a-deleted-uid");
    let (status, answer) = apply(&server, "ghost", ghost).await;
    assert_eq!(status, 409, "{answer}");
    let message = answer["message"].as_str().expect("message");
    assert!(
        message.contains("uid mismatch: the provided object specified uid a-deleted-uid"),
        "{message}"
    );
    let (status, _) = get(&server, "ghost").await;
    assert_eq!(status, 404, "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_terminating_object_again_applies_the_new_policy() {
    let server = start().await;
    // A finalizer of someone else's keeps the object alive throughout.
    const KEEP: &str = "example.com/keep";
    create_config_map(&server, "cm", &[KEEP]).await;
    let (status, first) = delete(&server, "cm", Some("Background")).await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(finalizers(&first), [KEEP]);
    let deletion_timestamp = first["metadata"]["deletionTimestamp"].clone();
    assert!(deletion_timestamp.is_string());

    // `kubectl delete --cascade=foreground` on the terminating object.
    let (status, answer) = delete(&server, "cm", Some("Foreground")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(finalizers(&answer), [KEEP, "foregroundDeletion"]);
    let (_, stored) = get(&server, "cm").await;
    assert_eq!(finalizers(&stored), [KEEP, "foregroundDeletion"]);
    assert_eq!(
        stored["metadata"]["deletionTimestamp"], deletion_timestamp,
        "the deletion keeps its start"
    );

    // Orphan replaces foreground.
    let (status, answer) = delete(&server, "cm", Some("Orphan")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(finalizers(&answer), [KEEP, "orphan"]);

    // No policy: the object's own finalizers stand, and nothing is written.
    let before = rv(&answer);
    let (status, answer) = delete(&server, "cm", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(finalizers(&answer), [KEEP, "orphan"]);
    assert_eq!(rv(&answer), before, "an idle re-delete writes nothing");

    // The same policy again: nothing to change either.
    let (status, answer) = delete(&server, "cm", Some("Orphan")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rv(&answer), before);

    // Background removes both garbage-collection finalizers; the foreign one stays.
    let (status, answer) = delete(&server, "cm", Some("Background")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(finalizers(&answer), [KEEP]);
    let (status, stored) = get(&server, "cm").await;
    assert_eq!(status, 200);
    assert_eq!(finalizers(&stored), [KEEP]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_removes_the_last_finalizer_deletes_at_once() {
    let server = start().await;
    // Terminating, held only by the orphan finalizer: a background re-delete drops it, and
    // with nothing left to wait for the object goes (Kubernetes' `errDeleteNow`).
    create_config_map(&server, "orphaning", &[]).await;
    let (status, first) = delete(&server, "orphaning", Some("Orphan")).await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(finalizers(&first), ["orphan"]);
    let (status, answer) = delete(&server, "orphaning", Some("Background")).await;
    assert_eq!(status, 200, "{answer}");
    let (status, _) = get(&server, "orphaning").await;
    assert_eq!(
        status, 404,
        "deleted, not left terminating without finalizers"
    );

    // The same on a first deletion: an object created with the orphan finalizer, deleted in
    // the background, has nothing to wait for.
    create_config_map(&server, "born-orphaning", &["orphan"]).await;
    let (status, answer) = delete(&server, "born-orphaning", Some("Background")).await;
    assert_eq!(status, 200, "{answer}");
    let (status, _) = get(&server, "born-orphaning").await;
    assert_eq!(status, 404);

    // Without a policy the object's own finalizer decides: it waits for the collector.
    create_config_map(&server, "kept", &["foregroundDeletion"]).await;
    let (status, answer) = delete(&server, "kept", None).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(finalizers(&answer), ["foregroundDeletion"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_deletion_bumps_a_tracked_generation() {
    let server = start().await;
    let (status, created) = call(
        &server,
        Method::POST,
        "/apis/apps/v1/namespaces/default/deployments",
        Some("application/json"),
        Some(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx"}]},
                },
            },
        })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["metadata"]["generation"], 1);
    let path = "/apis/apps/v1/namespaces/default/deployments/web";
    let options = |policy: &str| json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy});
    let (status, marked) = call(
        &server,
        Method::DELETE,
        path,
        Some("application/json"),
        Some(options("Foreground")),
    )
    .await;
    assert_eq!(status, 202, "{marked}");
    assert_eq!(
        marked["metadata"]["generation"], 2,
        "its controller must stand down"
    );
    // A repeated deletion is not a new one: the generation stays.
    let (status, again) = call(
        &server,
        Method::DELETE,
        path,
        Some("application/json"),
        Some(options("Orphan")),
    )
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["metadata"]["generation"], 2);
    assert_eq!(finalizers(&again), ["orphan"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_applies_keep_the_appliers_ownership() {
    // `kubectl apply --server-side` run again with a change: the applier keeps its `Apply`
    // entry (the write is not recorded a second time as an `Update` of the same manager,
    // which would make the third apply conflict with itself).
    let server = start().await;
    for value in ["one", "two", "three"] {
        let (status, answer) = apply(
            &server,
            "owned",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "owned"}, "data": {"k": value}}),
        )
        .await;
        assert!(status == 200 || status == 201, "{status} {answer}");
        assert_eq!(answer["data"]["k"], value);
        let entries = answer["metadata"]["managedFields"]
            .as_array()
            .expect("managedFields");
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0]["manager"], "test-applier");
        assert_eq!(entries[0]["operation"], "Apply");
    }
    // Any other patch is still an update of its manager.
    let (status, answer) = call(
        &server,
        Method::PATCH,
        &format!("{CONFIG_MAPS}/owned?fieldManager=editor"),
        Some(MERGE),
        Some(json!({"data": {"other": "x"}})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let editor = answer["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .find(|e| e["manager"] == "editor")
        .cloned()
        .expect("an entry of the editor");
    assert_eq!(editor["operation"], "Update");
}
