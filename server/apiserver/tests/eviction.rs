//! `pods/eviction` and its PodDisruptionBudgets, and the registry details that came with
//! them, checked as a 1.32 apiserver answers:
//!
//! - `POST pods/<name>/eviction` (policy/v1 Eviction) is discovered as `kubectl drain` looks
//!   for it, documented in OpenAPI, and authorized as `create` on `pods/eviction`;
//! - without a budget the pod is deleted; a budget allowing one disruption lets one pod go,
//!   spends the disruption (`disruptionsAllowed` 0, the pod in `disruptedPods`, the
//!   `DisruptionAllowed` condition False) and refuses the next with 429 and a
//!   `DisruptionBudget` cause; two budgets are a 500; a Pending pod goes without a look at
//!   its budget; a budget the controller has not processed is a 429 with a retry hint;
//! - the built-in PriorityClasses cannot be deleted (403);
//! - mutating admission runs before validation: a pod replaced without its resolved
//!   `spec.priority` keeps it instead of failing pod-update validation, an invalid pod naming
//!   an unknown class is refused by admission, and a server-side apply that creates a pod
//!   resolves its priority.
//!
//! Requests go straight to the registry ([`skerry_apiserver::verbs::serve`]) as an
//! authenticated admin, as `priority.rs` does: what is under test is the API.

mod common;

use common::{Server, start};

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use skerry_apiserver::auth::UserInfo;
use skerry_apiserver::auth::rbac::{self, Attributes};
use skerry_apiserver::handler::Request;
use skerry_apiserver::request::RequestInfo;

const PODS: &str = "/api/v1/namespaces/default/pods";
const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
const CLASSES: &str = "/apis/scheduling.k8s.io/v1/priorityclasses";

/// What kubectl prints for a refused eviction (after `Error from server (TooManyRequests):`).
const BLOCKED: &str =
    "Too many requests: Cannot evict pod as it would violate the pod's disruption budget.";

fn request(
    method: Method,
    path_and_query: &str,
    content_type: &str,
    body: Option<&[u8]>,
) -> Request {
    common::request(
        method,
        path_and_query,
        None,
        body.map(|_| content_type),
        body.map(Bytes::copy_from_slice).unwrap_or_default(),
    )
}

/// One request through the registry: the HTTP status and the JSON body (an error as the
/// `Status` the client would read).
async fn send(server: &Server, request: Request) -> (u16, Value) {
    match common::exchange(server, request).await {
        Ok((status, body)) => (
            status,
            serde_json::from_slice(&body).expect("a JSON answer"),
        ),
        Err(e) => (e.code, e.to_status()),
    }
}

async fn call(server: &Server, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string());
    let request = request(
        method,
        path,
        "application/json",
        bytes.as_deref().map(str::as_bytes),
    );
    send(server, request).await
}

fn pod(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": labels},
           "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
}

/// Creates a pod and, unless `phase` is Pending, gives it that phase (and readiness) the
/// way its kubelet would.
async fn create_pod(server: &Server, name: &str, labels: Value, phase: &str, ready: bool) {
    let (status, created) = call(server, Method::POST, PODS, Some(pod(name, labels))).await;
    assert_eq!(status, 201, "{created}");
    if phase == "Pending" {
        return;
    }
    let mut running = created;
    let ready = if ready { "True" } else { "False" };
    running["status"] = json!({"phase": phase, "conditions": [
        {"type": "Ready", "status": ready, "lastTransitionTime": "2024-06-01T12:00:00Z"}]});
    let (status, body) = call(
        server,
        Method::PUT,
        &format!("{PODS}/{name}/status"),
        Some(running),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// A budget over `app=<app>` allowing `allowed` disruptions of `healthy` pods, as the
/// disruption controller would have written its status.
async fn create_pdb(server: &Server, name: &str, app: &str, allowed: i64, healthy: (i64, i64)) {
    let pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": app}}},
    });
    let (status, created) = call(server, Method::POST, PDBS, Some(pdb)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["metadata"]["generation"], 1, "{created}");
    let mut with_status = created;
    let (current, desired) = healthy;
    with_status["status"] = json!({"disruptionsAllowed": allowed, "currentHealthy": current,
        "desiredHealthy": desired, "expectedPods": current, "observedGeneration": 1});
    let (status, body) = call(
        server,
        Method::PUT,
        &format!("{PDBS}/{name}/status"),
        Some(with_status),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

fn eviction(name: &str) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "Eviction",
           "metadata": {"name": name, "namespace": "default"}})
}

async fn evict(server: &Server, name: &str) -> (u16, Value) {
    call(
        server,
        Method::POST,
        &format!("{PODS}/{name}/eviction"),
        Some(eviction(name)),
    )
    .await
}

async fn pod_exists(server: &Server, name: &str) -> bool {
    let (status, body) = call(server, Method::GET, &format!("{PODS}/{name}"), None).await;
    assert!(status == 200 || status == 404, "{status}: {body}");
    status == 200
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_is_discovered_documented_and_authorized_as_create() {
    // kubectl drain's `CheckEvictionSupport`: `pods/eviction` in `/api/v1` with kind
    // Eviction and a group and version.
    let core = skerry_apiserver::discovery::resource_list("", "v1").expect("v1 is served");
    let entry = core["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "pods/eviction")
        .expect("pods/eviction is listed")
        .clone();
    assert_eq!(entry["kind"], "Eviction");
    assert_eq!(entry["group"], "policy");
    assert_eq!(entry["version"], "v1");
    assert_eq!(entry["verbs"], json!(["create"]));

    let doc_request = request(Method::GET, "/openapi/v3/api/v1", "", None);
    let response =
        skerry_apiserver::openapi::v3(&doc_request, "api/v1").expect("the document is served");
    assert_eq!(response.status(), 200);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let document: Value = serde_json::from_slice(&body).expect("JSON");
    assert!(
        document["paths"]
            .get("/api/v1/namespaces/{namespace}/pods/{name}/eviction")
            .is_some_and(|p| p.get("post").is_some()),
        "no POST eviction path"
    );
    assert!(
        document["components"]["schemas"]
            .get("io.k8s.api.policy.v1.Eviction")
            .is_some()
    );

    // The request reads as `create` on `pods/eviction`, and RBAC grants that through the
    // `edit` role (its `system:aggregate-to-edit` rule), not through `view`.
    let info = RequestInfo::parse(
        &Method::POST,
        &format!("{PODS}/web/eviction"),
        &HashMap::new(),
    );
    assert_eq!(
        (
            info.verb.as_str(),
            info.resource.as_str(),
            info.subresource.as_deref()
        ),
        ("create", "pods", Some("eviction"))
    );
    let server = start().await;
    for (user, role) in [("drainer", "edit"), ("watcher", "view")] {
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        });
        let (status, body) = call(
            &server,
            Method::POST,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
            Some(binding),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let may_evict = |user: &str| {
        let attributes = Attributes::resource(
            UserInfo::authenticated(user, "", vec![]),
            "create",
            "",
            "pods",
            "default",
            "web",
        )
        .with_subresource("eviction");
        rbac::authorize(&attributes, server.api.rbac.as_ref()).allowed
    };
    // The RBAC cache trails the store by a moment.
    let mut polls = 0;
    while !may_evict("drainer") {
        polls += 1;
        assert!(
            polls < CACHE_POLLS_MAX,
            "the edit binding never took effect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!may_evict("watcher"), "view does not grant evictions");
}

/// Polls of a cache while waiting for it to catch up: it trails the store by
/// milliseconds, so this many 20 ms polls (a second) is generous.
const CACHE_POLLS_MAX: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_budget_the_pod_is_deleted() {
    let server = start().await;
    create_pod(&server, "lonely", json!({"app": "lonely"}), "Running", true).await;
    let (status, body) = evict(&server, "lonely").await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["status"], "Success");
    assert!(!pod_exists(&server, "lonely").await);

    // The Eviction must name the pod of the URL.
    create_pod(&server, "named", json!({}), "Running", true).await;
    let (status, body) = call(
        &server,
        Method::POST,
        &format!("{PODS}/named/eviction"),
        Some(eviction("other")),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["message"],
        "name in URL does not match name in Eviction object"
    );
    // A missing pod is a 404 about the pod.
    let (status, body) = evict(&server, "ghost").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["message"], "pods \"ghost\" not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_one_lets_one_pod_go_and_refuses_the_next() {
    let server = start().await;
    create_pdb(&server, "web", "web", 1, (2, 1)).await;
    create_pod(&server, "web-1", json!({"app": "web"}), "Running", true).await;
    create_pod(&server, "web-2", json!({"app": "web"}), "Running", true).await;

    // A dry run judges without spending anything.
    let (status, body) = call(
        &server,
        Method::POST,
        &format!("{PODS}/web-1/eviction?dryRun=All"),
        Some(eviction("web-1")),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert!(pod_exists(&server, "web-1").await);
    let (_, pdb) = call(&server, Method::GET, &format!("{PDBS}/web"), None).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 1, "{pdb}");

    let (status, body) = evict(&server, "web-1").await;
    assert_eq!(status, 201, "{body}");
    assert!(!pod_exists(&server, "web-1").await);
    let (status, pdb) = call(&server, Method::GET, &format!("{PDBS}/web"), None).await;
    assert_eq!(status, 200, "{pdb}");
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "{pdb}");
    assert!(
        pdb["status"]["disruptedPods"].get("web-1").is_some(),
        "the evicted pod is reported to the disruption controller: {pdb}"
    );
    let condition = pdb["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionAllowed"))
        .expect("the DisruptionAllowed condition");
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "InsufficientPods");
    // A status write is not a spec change.
    assert_eq!(pdb["metadata"]["generation"], 1);

    let (status, body) = evict(&server, "web-2").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(body["message"], BLOCKED);
    assert_eq!(body["details"]["causes"][0]["reason"], "DisruptionBudget");
    assert_eq!(
        body["details"]["causes"][0]["message"],
        "The disruption budget web needs 1 healthy pods and has 2 currently"
    );
    assert!(
        body["details"].get("retryAfterSeconds").is_none(),
        "no hint when the budget is simply spent: {body}"
    );
    assert!(pod_exists(&server, "web-2").await);
}

/// Evictions racing for one budget: each that loses the budget's compare-and-swap reads the
/// budget as it now is and spends from that (Kubernetes' `RetryOnConflict(EvictionsRetry)`),
/// so a budget of four lets four concurrent evictions through, each disruption counted once,
/// and the fifth is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_racing_for_one_budget_each_spend_one_disruption() {
    let server = start().await;
    create_pdb(&server, "web", "web", 4, (5, 1)).await;
    for i in 1..=5 {
        create_pod(
            &server,
            &format!("web-{i}"),
            json!({"app": "web"}),
            "Running",
            true,
        )
        .await;
    }
    let (a, b, c, d) = tokio::join!(
        evict(&server, "web-1"),
        evict(&server, "web-2"),
        evict(&server, "web-3"),
        evict(&server, "web-4"),
    );
    for (status, body) in [a, b, c, d] {
        assert_eq!(status, 201, "{body}");
    }
    let (_, pdb) = call(&server, Method::GET, &format!("{PDBS}/web"), None).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "{pdb}");
    let disrupted = pdb["status"]["disruptedPods"]
        .as_object()
        .map(|m| m.len())
        .unwrap_or_default();
    assert_eq!(disrupted, 4, "{pdb}");
    let (status, body) = evict(&server, "web-5").await;
    assert_eq!(status, 429, "{body}");
    assert!(pod_exists(&server, "web-5").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_budgets_over_one_pod_are_a_server_error() {
    let server = start().await;
    create_pdb(&server, "first", "db", 1, (1, 0)).await;
    create_pdb(&server, "second", "db", 1, (1, 0)).await;
    create_pod(&server, "db-0", json!({"app": "db"}), "Running", true).await;
    let (status, body) = evict(&server, "db-0").await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["status"], "Failure");
    assert_eq!(
        body["message"],
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
    assert!(pod_exists(&server, "db-0").await);
    for name in ["first", "second"] {
        let (_, pdb) = call(&server, Method::GET, &format!("{PDBS}/{name}"), None).await;
        assert_eq!(
            pdb["status"]["disruptionsAllowed"], 1,
            "nothing spent: {pdb}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_the_budget_does_not_count_go_without_spending_it() {
    let server = start().await;
    // A budget with nothing to spare.
    create_pdb(&server, "tight", "tight", 0, (1, 1)).await;

    // Pending: not running yet, nothing to disrupt.
    create_pod(
        &server,
        "tight-pending",
        json!({"app": "tight"}),
        "Pending",
        false,
    )
    .await;
    let (status, body) = evict(&server, "tight-pending").await;
    assert_eq!(status, 201, "{body}");
    assert!(!pod_exists(&server, "tight-pending").await);

    // Terminal: its disruption already happened.
    create_pod(
        &server,
        "tight-done",
        json!({"app": "tight"}),
        "Succeeded",
        false,
    )
    .await;
    let (status, body) = evict(&server, "tight-done").await;
    assert_eq!(status, 201, "{body}");
    assert!(!pod_exists(&server, "tight-done").await);

    // Running but not ready, while the budget has its healthy pods without it.
    create_pod(
        &server,
        "tight-sick",
        json!({"app": "tight"}),
        "Running",
        false,
    )
    .await;
    let (status, body) = evict(&server, "tight-sick").await;
    assert_eq!(status, 201, "{body}");
    assert!(!pod_exists(&server, "tight-sick").await);

    // A ready one is what the budget protects.
    create_pod(
        &server,
        "tight-ready",
        json!({"app": "tight"}),
        "Running",
        true,
    )
    .await;
    let (status, body) = evict(&server, "tight-ready").await;
    assert_eq!(status, 429, "{body}");
    assert!(pod_exists(&server, "tight-ready").await);
    let (_, pdb) = call(&server, Method::GET, &format!("{PDBS}/tight"), None).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
    assert!(pdb["status"].get("disruptedPods").is_none(), "{pdb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_not_yet_processed_asks_to_retry() {
    let server = start().await;
    // Created but never processed by the disruption controller: observedGeneration 0 is
    // behind generation 1, so its (empty) numbers cannot be trusted.
    let pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "fresh"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "fresh"}}},
    });
    let (status, body) = call(&server, Method::POST, PDBS, Some(pdb)).await;
    assert_eq!(status, 201, "{body}");
    create_pod(&server, "fresh-0", json!({"app": "fresh"}), "Running", true).await;
    let (status, body) = evict(&server, "fresh-0").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["message"], BLOCKED);
    assert_eq!(body["details"]["retryAfterSeconds"], 10);
    assert_eq!(
        body["details"]["causes"][0]["message"],
        "The disruption budget fresh is still being processed by the server."
    );
    assert!(pod_exists(&server, "fresh-0").await);

    // A spec change moves the generation past what the controller observed.
    create_pdb(&server, "edited", "edited", 1, (2, 1)).await;
    let (_, mut edited) = call(&server, Method::GET, &format!("{PDBS}/edited"), None).await;
    edited["spec"]["maxUnavailable"] = json!(2);
    let (status, edited) = call(
        &server,
        Method::PUT,
        &format!("{PDBS}/edited"),
        Some(edited),
    )
    .await;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(edited["metadata"]["generation"], 2);
    create_pod(
        &server,
        "edited-0",
        json!({"app": "edited"}),
        "Running",
        true,
    )
    .await;
    let (status, body) = evict(&server, "edited-0").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["details"]["retryAfterSeconds"], 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_priority_classes_cannot_be_deleted() {
    let server = start().await;
    for name in ["system-node-critical", "system-cluster-critical"] {
        let (status, body) =
            call(&server, Method::DELETE, &format!("{CLASSES}/{name}"), None).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["reason"], "Forbidden");
        assert_eq!(
            body["message"],
            format!(
                "priorityclasses.scheduling.k8s.io {name:?} is forbidden: this is a system priority class and cannot be deleted"
            )
        );
        assert_eq!(body["details"]["kind"], "priorityclasses");
        let (status, _) = call(&server, Method::GET, &format!("{CLASSES}/{name}"), None).await;
        assert_eq!(status, 200, "{name} is still there");
    }
    // Any other class goes as usual.
    let class = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": "batch"}, "value": 10});
    let (status, body) = call(&server, Method::POST, CLASSES, Some(class)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["metadata"]["generation"], 1);
    let (status, body) = call(&server, Method::DELETE, &format!("{CLASSES}/batch"), None).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_admission_runs_before_validation() {
    let server = start().await;
    let class = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": "high"}, "value": 1000});
    let (status, body) = call(&server, Method::POST, CLASSES, Some(class)).await;
    assert_eq!(status, 201, "{body}");

    let mut classed = pod("classed", json!({}));
    classed["spec"]["priorityClassName"] = json!("high");
    let (status, created) = call(&server, Method::POST, PODS, Some(classed)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["spec"]["priority"], 1000);

    // A replacement that leaves the resolved fields out (a client that kept only what it
    // wrote) keeps them: Priority admission copies them back before pod-update validation,
    // which would otherwise refuse the "change".
    let mut replacement = created.clone();
    let spec = replacement["spec"].as_object_mut().expect("spec");
    spec.remove("priority");
    spec.remove("preemptionPolicy");
    replacement["spec"]["containers"][0]["image"] = json!("nginx:1.27");
    let (status, replaced) = call(
        &server,
        Method::PUT,
        &format!("{PODS}/classed"),
        Some(replacement),
    )
    .await;
    assert_eq!(status, 200, "{replaced}");
    assert_eq!(replaced["spec"]["priority"], 1000);
    assert_eq!(replaced["spec"]["preemptionPolicy"], "PreemptLowerPriority");
    assert_eq!(replaced["spec"]["containers"][0]["image"], "nginx:1.27");
    // A real change of the priority is still validation's to refuse.
    let mut changed = replaced.clone();
    changed["spec"]["priority"] = json!(5);
    let (status, body) = call(
        &server,
        Method::PUT,
        &format!("{PODS}/classed"),
        Some(changed),
    )
    .await;
    assert_eq!(status, 422, "{body}");

    // An invalid pod naming an unknown class meets admission first, as in Kubernetes.
    let mut invalid = pod("broken", json!({}));
    invalid["spec"]["containers"][0]["image"] = json!("");
    invalid["spec"]["priorityClassName"] = json!("nonexistent");
    let (status, body) = call(&server, Method::POST, PODS, Some(invalid.clone())).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["message"],
        "pods \"broken\" is forbidden: no PriorityClass with name nonexistent was found"
    );
    invalid["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("priorityClassName");
    let (status, body) = call(&server, Method::POST, PODS, Some(invalid)).await;
    assert_eq!(status, 422, "{body}");

    // A server-side apply that creates a pod goes through admission too.
    let mut applied = pod("applied", json!({}));
    applied["spec"]["priorityClassName"] = json!("high");
    let body = applied.to_string();
    let (status, created) = send(
        &server,
        request(
            Method::PATCH,
            &format!("{PODS}/applied?fieldManager=test"),
            "application/apply-patch+yaml",
            Some(body.as_bytes()),
        ),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["spec"]["priority"], 1000);
}

/// Kubernetes 1.31+: the eviction marks the pod `DisruptionTarget=True` before deleting it,
/// so whoever watches the pod (a Job's pod-failure policy) learns why it goes. A bound pod is
/// deleted gracefully, so the marked pod is still there to read; a dry run marks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_is_marked_as_a_disruption_target_first() {
    let server = start().await;
    for name in ["bound", "dry"] {
        let mut bound = pod(name, json!({"app": "web"}));
        bound["spec"]["nodeName"] = json!("box-a");
        let (status, created) = call(&server, Method::POST, PODS, Some(bound)).await;
        assert_eq!(status, 201, "{created}");
        let mut running = created;
        running["status"] = json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2024-06-01T12:00:00Z"}]});
        let (status, body) = call(
            &server,
            Method::PUT,
            &format!("{PODS}/{name}/status"),
            Some(running),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }

    let (status, body) = evict(&server, "bound").await;
    assert_eq!(status, 201, "{body}");
    let (status, evicted) = call(&server, Method::GET, &format!("{PODS}/bound"), None).await;
    assert_eq!(status, 200, "a bound pod is deleted gracefully: {evicted}");
    assert!(
        evicted["metadata"]["deletionTimestamp"].is_string(),
        "{evicted}"
    );
    let conditions = evicted["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let target = conditions
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .unwrap_or_else(|| panic!("no DisruptionTarget condition: {evicted}"));
    assert_eq!(target["status"], "True");
    assert_eq!(target["reason"], "EvictionByEvictionAPI");
    assert_eq!(target["message"], "Eviction API: evicting");
    assert!(target["lastTransitionTime"].is_string(), "{target}");
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        "the other conditions stay: {evicted}"
    );

    let (status, body) = call(
        &server,
        Method::POST,
        &format!("{PODS}/dry/eviction?dryRun=All"),
        Some(eviction("dry")),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (_, untouched) = call(&server, Method::GET, &format!("{PODS}/dry"), None).await;
    assert!(
        untouched["metadata"]["deletionTimestamp"].is_null(),
        "{untouched}"
    );
    let marked = untouched["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "DisruptionTarget"));
    assert!(!marked, "a dry run writes nothing: {untouched}");
}
