//! PriorityClasses, PodDisruptionBudgets and Priority admission, checked as a 1.32 apiserver
//! answers them:
//!
//! - `scheduling.k8s.io/v1` priorityclasses (cluster-scoped, `pc`) and `policy/v1`
//!   poddisruptionbudgets (namespaced, `pdb`, with `status`) are discovered, documented in
//!   OpenAPI, created, listed from the watch cache, printed as kubectl's tables, validated
//!   and deleted;
//! - bootstrap creates `system-node-critical` and `system-cluster-critical`;
//! - a pod's `priorityClassName` becomes `spec.priority` and `spec.preemptionPolicy` on
//!   create; no name means the global default class, else 0; an unknown class or a
//!   contradicting `spec.priority` is 403; a second global default is 403.
//!
//! Requests go straight to the registry ([`skerry_apiserver::verbs::serve`]) as an
//! authenticated admin, as `patch_preconditions.rs` does: what is under test is the API.

mod common;

use common::{Server, start};

use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use skerry_apiserver::handler::Request;

const CLASSES: &str = "/apis/scheduling.k8s.io/v1/priorityclasses";
const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
const PODS: &str = "/api/v1/namespaces/default/pods";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

fn request(
    method: Method,
    path_and_query: &str,
    accept: Option<&str>,
    body: Option<Value>,
) -> Request {
    let content_type = body.as_ref().map(|_| "application/json");
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    common::request(method, path_and_query, accept, content_type, body)
}

/// One request through the registry: status and the JSON body (errors as their Status-like
/// `{"message", "reason", "causes"}`).
async fn call_as(
    server: &Server,
    method: Method,
    path_and_query: &str,
    accept: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let request = request(method, path_and_query, accept, body);
    match common::exchange(server, request).await {
        Ok((status, body)) => (
            status,
            serde_json::from_slice(&body).expect("a JSON answer"),
        ),
        Err(e) => (
            e.code,
            json!({"message": e.message, "reason": e.reason,
                   "causes": e.causes.iter().map(|c| c.field.clone()).collect::<Vec<_>>()}),
        ),
    }
}

async fn call(server: &Server, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    call_as(server, method, path, None, body).await
}

fn priority_class(name: &str, value: i64) -> Value {
    json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
           "metadata": {"name": name}, "value": value})
}

fn pod(name: &str, spec_extra: Value) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "nginx"}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        spec.extend(extra.clone());
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

async fn create_pod(server: &Server, name: &str, spec_extra: Value) -> (u16, Value) {
    call(server, Method::POST, PODS, Some(pod(name, spec_extra))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_kinds_are_discovered_and_documented() {
    let scheduling = skerry_apiserver::discovery::resource_list("scheduling.k8s.io", "v1")
        .expect("scheduling.k8s.io/v1 is served");
    let classes = scheduling["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "priorityclasses")
        .expect("priorityclasses are listed");
    assert_eq!(classes["namespaced"], false);
    assert_eq!(classes["kind"], "PriorityClass");
    assert_eq!(classes["shortNames"], json!(["pc"]));

    let policy =
        skerry_apiserver::discovery::resource_list("policy", "v1").expect("policy/v1 is served");
    let names: Vec<&str> = policy["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["poddisruptionbudgets", "poddisruptionbudgets/status"]
    );
    let pdbs = &policy["resources"][0];
    assert_eq!(pdbs["namespaced"], true);
    assert_eq!(pdbs["shortNames"], json!(["pdb"]));

    // OpenAPI v3 documents both group-versions with their schemas (kubectl explain).
    for (group_version, definition) in [
        (
            "apis/scheduling.k8s.io/v1",
            "io.k8s.api.scheduling.v1.PriorityClass",
        ),
        ("apis/policy/v1", "io.k8s.api.policy.v1.PodDisruptionBudget"),
    ] {
        let req = request(
            Method::GET,
            &format!("/openapi/v3/{group_version}"),
            Some("application/json"),
            None,
        );
        let response =
            skerry_apiserver::openapi::v3(&req, group_version).expect("the document is served");
        assert_eq!(response.status(), 200);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let document: Value = serde_json::from_slice(&body).expect("JSON");
        assert!(
            document["components"]["schemas"].get(definition).is_some(),
            "{definition} missing from {group_version}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_classes_exist_from_the_start() {
    let server = start().await;
    for (name, value) in [
        ("system-node-critical", 2_000_001_000),
        ("system-cluster-critical", 2_000_000_000),
    ] {
        let (status, class) = call(&server, Method::GET, &format!("{CLASSES}/{name}"), None).await;
        assert_eq!(status, 200, "{class}");
        assert_eq!(class["value"], value);
        assert_eq!(class["preemptionPolicy"], "PreemptLowerPriority");
        assert!(class.get("globalDefault").is_none_or(|g| g == false));
    }
    // A pod of a system class gets its value without any class created by the test.
    let (status, created) = create_pod(
        &server,
        "critical",
        json!({"priorityClassName": "system-node-critical"}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["spec"]["priority"], 2_000_001_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_class_crud_and_table() {
    let server = start().await;
    let (status, created) = call(
        &server,
        Method::POST,
        CLASSES,
        Some(priority_class("high", 1000)),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["preemptionPolicy"], "PreemptLowerPriority");
    assert!(created["metadata"].get("namespace").is_none());

    // The description may change; the value may not.
    let mut described = created.clone();
    described["description"] = json!("for the web tier");
    let (status, updated) = call(
        &server,
        Method::PUT,
        &format!("{CLASSES}/high"),
        Some(described),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    let mut revalued = updated.clone();
    revalued["value"] = json!(2000);
    let (status, refused) = call(
        &server,
        Method::PUT,
        &format!("{CLASSES}/high"),
        Some(revalued),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["message"],
        "PriorityClass.scheduling.k8s.io \"high\" is invalid: value: Forbidden: may not be changed in an update."
    );

    // `kubectl get pc`, served from the watch cache (resourceVersion=0), which trails the
    // store by milliseconds: wait until it holds the update.
    wait_cached(&server, &format!("{CLASSES}/high")).await;
    let (status, table) = call_as(
        &server,
        Method::GET,
        &format!("{CLASSES}?resourceVersion=0"),
        Some(TABLE),
        None,
    )
    .await;
    assert_eq!(status, 200, "{table}");
    let headers: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        headers,
        ["Name", "Value", "Global-Default", "Age", "PreemptionPolicy"]
    );
    let rows: Vec<(String, i64)> = table["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["cells"][0].as_str().unwrap_or("").to_string(),
                r["cells"][1].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    for expected in [
        ("high".to_string(), 1000),
        ("system-cluster-critical".to_string(), 2_000_000_000),
        ("system-node-critical".to_string(), 2_000_001_000),
    ] {
        assert!(rows.contains(&expected), "{expected:?} not in {rows:?}");
    }

    let (status, _) = call(&server, Method::DELETE, &format!("{CLASSES}/high"), None).await;
    assert_eq!(status, 200);
    let (status, _) = call(&server, Method::GET, &format!("{CLASSES}/high"), None).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_class_validation_and_the_single_default() {
    let server = start().await;
    let (status, body) = call(
        &server,
        Method::POST,
        CLASSES,
        Some(priority_class("too-high", 1_000_000_001)),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["message"],
        "PriorityClass.scheduling.k8s.io \"too-high\" is invalid: value: Forbidden: maximum allowed value of a user defined priority is 1000000000"
    );
    let (status, body) = call(
        &server,
        Method::POST,
        CLASSES,
        Some(priority_class("system-mine", 10)),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["causes"], json!(["metadata.name"]));

    let mut first = priority_class("default-low", 100);
    first["globalDefault"] = json!(true);
    let (status, body) = call(&server, Method::POST, CLASSES, Some(first)).await;
    assert_eq!(status, 201, "{body}");
    // Re-saving the default is fine.
    let (status, body) = call(
        &server,
        Method::PUT,
        &format!("{CLASSES}/default-low"),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut second = priority_class("default-high", 200);
    second["globalDefault"] = json!(true);
    // Admission judges the second default against the watch cache, as Kubernetes' plugin
    // judges it against its informer: wait until the cache holds the first.
    wait_cached(&server, &format!("{CLASSES}/default-low")).await;
    let (status, body) = call(&server, Method::POST, CLASSES, Some(second)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["message"],
        "priorityclasses.scheduling.k8s.io \"default-high\" is forbidden: PriorityClass default-low is already marked as default. Only one default can exist"
    );
}

/// Polls of the watch cache while waiting for it to hold a new object: it trails the store
/// by milliseconds, so this many 20 ms polls (a second) is generous.
const CACHE_POLLS_MAX: usize = 50;

/// Waits until the watch cache serves `path` (a GET at `resourceVersion=0` is answered from
/// the cache).
async fn wait_cached(server: &Server, path: &str) {
    for _ in 0..CACHE_POLLS_MAX {
        let (status, _) = call(
            server,
            Method::GET,
            &format!("{path}?resourceVersion=0"),
            None,
        )
        .await;
        if status == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the watch cache never served {path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_their_priority_from_their_class() {
    let server = start().await;

    // No class and no default: 0, preempting lower priorities, no class name.
    let (status, plain) = create_pod(&server, "plain", json!({})).await;
    assert_eq!(status, 201, "{plain}");
    assert_eq!(plain["spec"]["priority"], 0);
    assert_eq!(plain["spec"]["preemptionPolicy"], "PreemptLowerPriority");
    assert!(plain["spec"].get("priorityClassName").is_none());

    // A class created a moment ago is found, with its preemption policy.
    let mut batch = priority_class("batch", 50);
    batch["preemptionPolicy"] = json!("Never");
    let (status, body) = call(&server, Method::POST, CLASSES, Some(batch)).await;
    assert_eq!(status, 201, "{body}");
    let (status, classed) =
        create_pod(&server, "classed", json!({"priorityClassName": "batch"})).await;
    assert_eq!(status, 201, "{classed}");
    assert_eq!(classed["spec"]["priority"], 50);
    assert_eq!(classed["spec"]["preemptionPolicy"], "Never");

    // A pod may repeat the value its class gives, not contradict it.
    let (status, body) = create_pod(
        &server,
        "repeats",
        json!({"priorityClassName": "batch", "priority": 50}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = create_pod(
        &server,
        "contradicts",
        json!({"priorityClassName": "batch", "priority": 7}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["message"],
        "pods \"contradicts\" is forbidden: the integer value of priority (7) must not be provided in pod spec; priority admission controller computed 50 from the given PriorityClass name"
    );

    // An unknown class is refused with Kubernetes' words.
    let (status, body) =
        create_pod(&server, "lost", json!({"priorityClassName": "nonexistent"})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(
        body["message"],
        "pods \"lost\" is forbidden: no PriorityClass with name nonexistent was found"
    );

    // With a global default, a pod naming no class gets it, name included.
    let mut default = priority_class("everyday", 10);
    default["globalDefault"] = json!(true);
    let (status, body) = call(&server, Method::POST, CLASSES, Some(default)).await;
    assert_eq!(status, 201, "{body}");
    wait_cached(&server, &format!("{CLASSES}/everyday")).await;
    let (status, defaulted) = create_pod(&server, "defaulted", json!({})).await;
    assert_eq!(status, 201, "{defaulted}");
    assert_eq!(defaulted["spec"]["priority"], 10);
    assert_eq!(defaulted["spec"]["priorityClassName"], "everyday");
    assert_eq!(
        defaulted["spec"]["preemptionPolicy"],
        "PreemptLowerPriority"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_disruption_budget_crud_status_and_table() {
    let server = start().await;
    let pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 99, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0},
    });
    let (status, created) = call(&server, Method::POST, PDBS, Some(pdb)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["metadata"]["namespace"], "default");
    assert!(
        created
            .get("status")
            .is_none_or(|s| s.get("disruptionsAllowed").is_none()),
        "a create may not set status: {created}"
    );

    // The disruption controller's status write.
    let mut with_status = created.clone();
    with_status["status"] = json!({"disruptionsAllowed": 1, "currentHealthy": 3,
        "desiredHealthy": 2, "expectedPods": 3, "observedGeneration": 1});
    let (status, updated) = call(
        &server,
        Method::PUT,
        &format!("{PDBS}/web/status"),
        Some(with_status),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["status"]["disruptionsAllowed"], 1);

    // `kubectl get pdb`.
    let (status, table) = call_as(&server, Method::GET, PDBS, Some(TABLE), None).await;
    assert_eq!(status, 200, "{table}");
    assert_eq!(
        table["rows"][0]["cells"],
        json!(["web", "N/A", "1", 1, table["rows"][0]["cells"][4]])
    );

    // minAvailable xor maxUnavailable.
    let both = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "both"},
        "spec": {"minAvailable": 1, "maxUnavailable": 1, "selector": {}},
    });
    let (status, body) = call(&server, Method::POST, PDBS, Some(both)).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("minAvailable and maxUnavailable cannot be both set")),
        "{body}"
    );

    let (status, _) = call(&server, Method::DELETE, &format!("{PDBS}/web"), None).await;
    assert_eq!(status, 200);
    let (status, list) = call(&server, Method::GET, PDBS, None).await;
    assert_eq!(status, 200);
    assert_eq!(list["kind"], "PodDisruptionBudgetList");
    assert_eq!(list["items"], json!([]));
}
