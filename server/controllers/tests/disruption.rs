//! The disruption controller against a real apiserver (`TestServer`): a PodDisruptionBudget's
//! status follows its pods and their controllers' scale, the eviction API spends what it
//! allows, and a budget it cannot compute allows nothing.
//!
//! No other controller runs: the tests make the ReplicaSets, Deployments and pods themselves
//! (pods with controller references, as their controller would) and play the kubelet's part
//! by writing pod status. The controller writes with its real identity, the
//! `disruption-controller` service account, so its bootstrap RBAC role is exercised; the
//! informers read with the admin client, as the controller manager's do.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{admin_client, controller_client};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::api::http_method::Method;
use skerry_client::{Client, Patch, PatchParams, PostParams};
use skerry_controllers::context::{Context, DEFAULT_RESYNC, InformerFactory};
use skerry_controllers::disruption::{
    self, DISRUPTION_ALLOWED_CONDITION, DISRUPTION_TARGET_CONDITION, DisruptionController,
    INSUFFICIENT_PODS_REASON, SUFFICIENT_PODS_REASON, SYNC_FAILED_REASON,
};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

/// The controller's service account in `kube-system` (its identity in `skerry server`).
const CONTROLLER_SA: &str = "disruption-controller";

/// How long a test waits for the controller to converge. Generous: two cores shared with
/// other builds; convergence itself takes well under a second.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The stale `DisruptionTarget` timeout the tests run with (2 minutes in production).
const STALE_TIMEOUT: Duration = Duration::from_secs(1);

struct Cluster {
    _server: TestServer,
    /// The admin: what the test itself reads and writes with.
    client: Client,
    stop: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn cluster() -> Cluster {
    let server = TestServer::start().await.unwrap();
    let client = admin_client(&server);
    let ctx = Context {
        client: controller_client(&server, CONTROLLER_SA),
        informers: InformerFactory::new(client.clone(), Some(DEFAULT_RESYNC)),
    };
    let config = disruption::Config {
        stale_pod_disruption_timeout: STALE_TIMEOUT,
    };
    let controller = DisruptionController::with_config(&ctx, config);
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    tokio::spawn(controller.run(1, stop.clone()));
    Cluster {
        _server: server,
        client,
        stop,
    }
}

fn labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_string(), app.to_string())])
}

fn selector(app: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(app)),
        match_expressions: None,
    }
}

fn template(app: &str) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(app)),
            ..ObjectMeta::default()
        }),
        spec: Some(pod_spec()),
    }
}

fn pod_spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "web".into(),
            image: Some("nginx:1.27".into()),
            ..Container::default()
        }],
        ..PodSpec::default()
    }
}

/// Creates a ReplicaSet of `app` with `spec.replicas = replicas` (no controller makes its pods).
async fn create_replica_set(
    c: &Cluster,
    name: &str,
    app: &str,
    replicas: i32,
    owner: Option<OwnerReference>,
) -> ReplicaSet {
    let rs = ReplicaSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            selector: selector(app),
            template: Some(template(app)),
            min_ready_seconds: None,
        }),
        status: None,
    };
    c.client
        .api::<ReplicaSet>(Some(NS))
        .create(&PostParams::default(), &rs)
        .await
        .unwrap()
}

fn controller_ref(kind: &str, meta: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        name: meta.name.clone().unwrap(),
        uid: meta.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Creates pod `name` of `app` controlled by `owner`, and makes it Running and (if `ready`)
/// Ready, as its kubelet would.
async fn create_pod(
    c: &Cluster,
    name: &str,
    app: &str,
    owner: Option<OwnerReference>,
    ready: bool,
) {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(labels(app)),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec()),
        status: None,
    };
    c.client
        .api::<Pod>(Some(NS))
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    set_ready(c, name, ready).await;
}

/// The kubelet's part: the pod is Running, and Ready or not.
async fn set_ready(c: &Cluster, name: &str, ready: bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = if ready { "True" } else { "False" };
    c.client
        .api::<Pod>(Some(NS))
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": now}],
            }})),
        )
        .await
        .unwrap();
}

async fn create_pdb(
    c: &Cluster,
    name: &str,
    app: &str,
    min_available: Option<IntOrString>,
    max_unavailable: Option<IntOrString>,
) {
    let pdb = PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available,
            max_unavailable,
            selector: Some(selector(app)),
            unhealthy_pod_eviction_policy: None,
        }),
        status: None,
    };
    c.client
        .api::<PodDisruptionBudget>(Some(NS))
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
}

/// Waits until budget `name` has observed its generation and reports `expected` pods,
/// `desired` and `current` healthy and `allowed` disruptions; returns the budget.
async fn wait_for_status(
    c: &Cluster,
    name: &str,
    (expected, desired, current, allowed): (i32, i32, i32, i32),
) -> PodDisruptionBudget {
    let api = c.client.api::<PodDisruptionBudget>(Some(NS));
    let what = format!(
        "{name}: expected {expected}, desired {desired}, current {current}, allowed {allowed}"
    );
    let deadline = tokio::time::Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let pdb = api.get(name).await.unwrap();
        let s = pdb.status.clone().unwrap_or_default();
        if s.observed_generation == pdb.metadata.generation
            && (
                s.expected_pods,
                s.desired_healthy,
                s.current_healthy,
                s.disruptions_allowed,
            ) == (expected, desired, current, allowed)
        {
            return pdb;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; last status {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn condition(status: &PodDisruptionBudgetStatus) -> (String, String) {
    let c = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_ALLOWED_CONDITION)
        .unwrap();
    (c.status.clone(), c.reason.clone())
}

/// POSTs an Eviction for pod `name`.
async fn evict(c: &Cluster, name: &str) -> Result<serde_json::Value, skerry_client::Error> {
    let eviction = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": NS},
    });
    c.client
        .api::<Pod>(Some(NS))
        .subresource(Method::Post, name, "eviction", Some(&eviction))
        .await
}

/// A Deployment-less ReplicaSet of 3 ready pods under `minAvailable: 2`.
async fn three_ready_pods(c: &Cluster) -> ReplicaSet {
    let rs = create_replica_set(c, "web", "web", 3, None).await;
    for i in 0..3 {
        let owner = controller_ref("ReplicaSet", &rs.metadata);
        create_pod(c, &format!("web-{i}"), "web", Some(owner), true).await;
    }
    rs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_available_allows_one_eviction_and_the_next_is_refused() {
    let c = cluster().await;
    three_ready_pods(&c).await;
    create_pdb(&c, "web", "web", Some(IntOrString::Int(2)), None).await;
    let pdb = wait_for_status(&c, "web", (3, 2, 3, 1)).await;
    let status = pdb.status.unwrap();
    assert_eq!(
        condition(&status),
        ("True".into(), SUFFICIENT_PODS_REASON.into())
    );
    assert_eq!(status.disrupted_pods, None);

    // The eviction API spends the one allowed disruption...
    evict(&c, "web-0").await.unwrap();
    // ...so the next is refused with 429 until the budget recovers.
    let refused = evict(&c, "web-1").await.unwrap_err();
    assert_eq!(refused.code(), Some(429), "{refused:?}");
    // The controller agrees: two healthy pods, none to spare, and the evicted pod (gone or
    // going) is no longer listed as disrupted.
    let pdb = wait_for_status(&c, "web", (2, 2, 2, 0)).await;
    let status = pdb.status.unwrap();
    assert_eq!(
        condition(&status),
        ("False".into(), INSUFFICIENT_PODS_REASON.into())
    );
    // A replacement pod becoming ready makes room for one more eviction.
    let rs = c
        .client
        .api::<ReplicaSet>(Some(NS))
        .get("web")
        .await
        .unwrap();
    let owner = controller_ref("ReplicaSet", &rs.metadata);
    create_pod(&c, "web-3", "web", Some(owner), true).await;
    wait_for_status(&c, "web", (3, 2, 3, 1)).await;
    evict(&c, "web-1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_going_not_ready_lowers_disruptions_allowed() {
    let c = cluster().await;
    three_ready_pods(&c).await;
    create_pdb(&c, "web", "web", Some(IntOrString::Int(1)), None).await;
    wait_for_status(&c, "web", (3, 1, 3, 2)).await;
    set_ready(&c, "web-2", false).await;
    wait_for_status(&c, "web", (3, 1, 2, 1)).await;
    set_ready(&c, "web-1", false).await;
    let pdb = wait_for_status(&c, "web", (3, 1, 1, 0)).await;
    assert_eq!(
        condition(&pdb.status.unwrap()),
        ("False".into(), INSUFFICIENT_PODS_REASON.into())
    );
    set_ready(&c, "web-2", true).await;
    wait_for_status(&c, "web", (3, 1, 2, 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_unavailable_percent_follows_the_replica_set_scale() {
    let c = cluster().await;
    // The ReplicaSet wants 4; only 3 pods exist (the fourth is, say, unschedulable).
    let rs = create_replica_set(&c, "web", "web", 4, None).await;
    for i in 0..3 {
        let owner = controller_ref("ReplicaSet", &rs.metadata);
        create_pod(&c, &format!("web-{i}"), "web", Some(owner), true).await;
    }
    create_pdb(
        &c,
        "web",
        "web",
        None,
        Some(IntOrString::String("50%".into())),
    )
    .await;
    // Expected from the scale, 4; 50% of 4 = 2 unavailable; 2 desired; 3 healthy: 1 allowed.
    wait_for_status(&c, "web", (4, 2, 3, 1)).await;
    // Scaling the ReplicaSet alone (no pod changes) re-sizes the budget: 50% of 7 rounds up
    // to 4 unavailable, 3 desired, 3 healthy: nothing to spare.
    c.client
        .api::<ReplicaSet>(Some(NS))
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 7}})),
        )
        .await
        .unwrap();
    wait_for_status(&c, "web", (7, 3, 3, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployments_scale_counts_not_its_replica_sets() {
    let c = cluster().await;
    let deployment = Deployment {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: selector("web"),
            template: template("web"),
            ..DeploymentSpec::default()
        }),
        status: None,
    };
    let deployment = c
        .client
        .api::<Deployment>(Some(NS))
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    // Mid-rollout: an old and a new ReplicaSet, whose replicas (5 + 5) are not the
    // Deployment's (2).
    let owner = controller_ref("Deployment", &deployment.metadata);
    let old = create_replica_set(&c, "web-old", "web", 5, Some(owner.clone())).await;
    let new = create_replica_set(&c, "web-new", "web", 5, Some(owner)).await;
    create_pod(
        &c,
        "web-a",
        "web",
        Some(controller_ref("ReplicaSet", &old.metadata)),
        true,
    )
    .await;
    create_pod(
        &c,
        "web-b",
        "web",
        Some(controller_ref("ReplicaSet", &new.metadata)),
        true,
    )
    .await;
    create_pdb(&c, "web", "web", None, Some(IntOrString::Int(1))).await;
    wait_for_status(&c, "web", (2, 1, 2, 1)).await;
    // Scaling the Deployment re-sizes the budget.
    c.client
        .api::<Deployment>(Some(NS))
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    wait_for_status(&c, "web", (3, 2, 2, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_controller_cannot_be_found_fails_safe() {
    let c = cluster().await;
    let rs = three_ready_pods(&c).await;
    create_pdb(&c, "web", "web", None, Some(IntOrString::Int(1))).await;
    wait_for_status(&c, "web", (3, 2, 3, 1)).await;
    // A pod whose controller reference names a ReplicaSet that does not exist.
    let mut ghost = controller_ref("ReplicaSet", &rs.metadata);
    ghost.name = "ghost".into();
    ghost.uid = "00000000-0000-0000-0000-000000000000".into();
    create_pod(&c, "web-9", "web", Some(ghost), true).await;
    let status = common::eventually(CONVERGE_TIMEOUT, "the SyncFailed condition", || async {
        let pdb = c
            .client
            .api::<PodDisruptionBudget>(Some(NS))
            .get("web")
            .await
            .ok()?;
        let status = pdb.status?;
        (condition(&status).1 == SYNC_FAILED_REASON).then_some(status)
    })
    .await;
    assert_eq!(status.disruptions_allowed, 0);
    assert_eq!(condition(&status).0, "False");
    let message = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_ALLOWED_CONDITION)
        .map(|c| c.message.clone())
        .unwrap();
    assert_eq!(message, "found no controllers for pod \"web-9\"");
    assert_eq!(evict(&c, "web-0").await.unwrap_err().code(), Some(429));
    // The pod gone, the budget recovers.
    c.client
        .api::<Pod>(Some(NS))
        .delete(
            "web-9",
            &skerry_client::DeleteParams {
                grace_period_seconds: Some(0),
                ..skerry_client::DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let pdb = wait_for_status(&c, "web", (3, 2, 3, 1)).await;
    assert_eq!(
        condition(&pdb.status.unwrap()),
        ("True".into(), SUFFICIENT_PODS_REASON.into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_disrupted_pods_count_again_and_fresh_ones_do_not() {
    let c = cluster().await;
    three_ready_pods(&c).await;
    create_pdb(&c, "web", "web", Some(IntOrString::Int(1)), None).await;
    let pdb = wait_for_status(&c, "web", (3, 1, 3, 2)).await;
    // Two approved evictions whose pods were never deleted: one long ago, one just now.
    let now = k8s_openapi::jiff::Timestamp::now();
    let long_ago = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(
            disruption::DELETION_TIMEOUT.as_secs() as i64 + 60,
        ))
        .unwrap();
    let mut status = pdb.status.clone().unwrap();
    status.disrupted_pods = Some(BTreeMap::from([
        (
            "web-0".to_string(),
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(long_ago),
        ),
        (
            "web-1".to_string(),
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        ),
    ]));
    let mut next = pdb;
    next.status = Some(status);
    c.client
        .api::<PodDisruptionBudget>(Some(NS))
        .replace_status("web", &PostParams::default(), &next)
        .await
        .unwrap();
    // web-0's entry expired: dropped, and web-0 healthy; web-1's stands: not healthy.
    let pdb = wait_for_status(&c, "web", (3, 1, 2, 1)).await;
    let disrupted = pdb.status.unwrap().disrupted_pods.unwrap();
    assert_eq!(disrupted.keys().collect::<Vec<_>>(), vec!["web-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_disruption_target_condition_is_cleared() {
    let c = cluster().await;
    create_pod(&c, "web-0", "web", None, true).await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    c.client
        .api::<Pod>(Some(NS))
        .patch_status(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
                {"type": DISRUPTION_TARGET_CONDITION, "status": "True",
                 "reason": "PreemptionByScheduler", "lastTransitionTime": now},
            ]}})),
        )
        .await
        .unwrap();
    let condition = common::eventually(CONVERGE_TIMEOUT, "DisruptionTarget=False", || async {
        let pod = c.client.api::<Pod>(Some(NS)).get("web-0").await.ok()?;
        pod.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == DISRUPTION_TARGET_CONDITION && c.status == "False")
    })
    .await;
    assert_eq!(condition.reason, None);
    // The Ready condition is untouched.
    let pod = c.client.api::<Pod>(Some(NS)).get("web-0").await.unwrap();
    let ready = pod
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
}
