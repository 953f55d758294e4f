//! The ReplicaSet controller against a real apiserver (`TestServer`): pods are created with
//! owner references and generated names, a scale-down deletes the pods the Kubernetes ranking
//! picks, status follows, a deleted pod is replaced, and every pod write is an Event on the
//! ReplicaSet. There is no kubelet: pods stay Pending unless a test writes their status
//! itself.
//!
//! The controller writes with its real identity, the `replicaset-controller` service account
//! (a client certificate the test server issues), so the bootstrap RBAC role is exercised
//! exactly as in `skerry server`; the informers read with the admin client, as the
//! controller manager's do with its own broad identity.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{admin_client, controller_client};
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Container, Event, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::{Client, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use skerry_controllers::context::{Context, DEFAULT_RESYNC, InformerFactory};
use skerry_controllers::replicaset::{EVENT_COMPONENT, ReplicaSetController};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

/// The controller's service account in `kube-system` (its identity in `skerry server`).
const CONTROLLER_SA: &str = "replicaset-controller";

/// How long a test waits for the controller to converge. Generous: two cores shared with
/// other builds; convergence itself takes well under a second.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

struct Cluster {
    _server: TestServer,
    /// The admin: what the test itself reads and writes with.
    client: Client,
    /// The controller's own client (its service account).
    controller_client: Client,
    controller: Arc<ReplicaSetController>,
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
    let controller_client = controller_client(&server, CONTROLLER_SA);
    let ctx = Context {
        client: controller_client.clone(),
        informers: InformerFactory::new(client.clone(), Some(DEFAULT_RESYNC)),
    };
    let controller = ReplicaSetController::new(&ctx);
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    tokio::spawn(controller.clone().run(2, stop.clone()));
    Cluster {
        _server: server,
        client,
        controller_client,
        controller,
        stop,
    }
}

/// The events in [`NS`] about the ReplicaSet `name`, after the controller's recorder has
/// written everything it was given.
async fn events_about(c: &Cluster, name: &str) -> Vec<Event> {
    c.controller.flush_events().await;
    c.client
        .api::<Event>(Some(NS))
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("ReplicaSet")
                && e.involved_object.name.as_deref() == Some(name)
        })
        .collect()
}

/// The messages of the events with `reason`, sorted.
fn messages(events: &[Event], reason: &str) -> Vec<String> {
    let mut messages: Vec<String> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message.clone())
        .collect();
    messages.sort();
    messages
}

fn replica_set(name: &str, replicas: i32) -> ReplicaSet {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            template: Some(PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "web".into(),
                        image: Some("nginx:1.27".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            }),
            min_ready_seconds: None,
        }),
        status: None,
    }
}

/// The pods of `app` that are not being deleted.
async fn live_pods(client: &Client, app: &str) -> Vec<Pod> {
    let params = ListParams {
        label_selector: Some(format!("app={app}")),
        ..ListParams::default()
    };
    client
        .api::<Pod>(Some(NS))
        .list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

async fn wait_for_pods(client: &Client, app: &str, n: usize) -> Vec<Pod> {
    common::eventually(CONVERGE_TIMEOUT, &format!("{n} pods of {app}"), || async {
        let pods = live_pods(client, app).await;
        (pods.len() == n).then_some(pods)
    })
    .await
}

async fn wait_for_status(client: &Client, name: &str, replicas: i32, ready: i32) {
    let api = client.api::<ReplicaSet>(Some(NS));
    common::eventually(
        CONVERGE_TIMEOUT,
        &format!("status of {name}: {replicas} replicas, {ready} ready"),
        || async {
            let rs = api.get(name).await.ok()?;
            let s = rs.status?;
            (s.replicas == replicas && s.ready_replicas.unwrap_or(0) == ready).then_some(())
        },
    )
    .await
}

async fn scale(client: &Client, name: &str, replicas: i32) {
    client
        .api::<ReplicaSet>(Some(NS))
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_pods_with_owner_references_and_generated_names() {
    let c = cluster().await;
    let rs = c
        .client
        .api::<ReplicaSet>(Some(NS))
        .create(&PostParams::default(), &replica_set("web", 3))
        .await
        .unwrap();
    let pods = wait_for_pods(&c.client, "web", 3).await;
    for pod in &pods {
        let name = pod.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("web-") && name.len() > 4, "{name}");
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("web-"));
        let refs = pod.metadata.owner_references.as_deref().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].kind, "ReplicaSet");
        assert_eq!(refs[0].name, "web");
        assert_eq!(refs[0].uid, rs.metadata.uid.clone().unwrap());
        assert_eq!(refs[0].controller, Some(true));
        assert_eq!(refs[0].block_owner_deletion, Some(true));
    }
    wait_for_status(&c.client, "web", 3, 0).await;
    // Steady state: no more pods appear.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(live_pods(&c.client, "web").await.len(), 3);
    let rs = c
        .client
        .api::<ReplicaSet>(Some(NS))
        .get("web")
        .await
        .unwrap();
    let status = rs.status.unwrap();
    assert_eq!(status.fully_labeled_replicas, Some(3));
    assert_eq!(status.observed_generation, rs.metadata.generation);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_keeps_the_running_ready_pod() {
    let c = cluster().await;
    c.client
        .api::<ReplicaSet>(Some(NS))
        .create(&PostParams::default(), &replica_set("web", 3))
        .await
        .unwrap();
    let pods = wait_for_pods(&c.client, "web", 3).await;
    let survivor = pods[1].metadata.name.clone().unwrap();
    // No kubelet: play its part for one pod.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    c.client
        .api::<Pod>(Some(NS))
        .patch_status(
            &survivor,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            }})),
        )
        .await
        .unwrap();
    // The controller has seen it ready once its status says so.
    wait_for_status(&c.client, "web", 3, 1).await;
    scale(&c.client, "web", 1).await;
    let left = wait_for_pods(&c.client, "web", 1).await;
    assert_eq!(left[0].metadata.name.as_deref(), Some(survivor.as_str()));
    wait_for_status(&c.client, "web", 1, 1).await;
    // And it stays that way: the deletions were expected, nothing is re-created.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(live_pods(&c.client, "web").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_is_replaced() {
    let c = cluster().await;
    c.client
        .api::<ReplicaSet>(Some(NS))
        .create(&PostParams::default(), &replica_set("web", 2))
        .await
        .unwrap();
    let pods = wait_for_pods(&c.client, "web", 2).await;
    let victim = pods[0].metadata.name.clone().unwrap();
    c.client
        .api::<Pod>(Some(NS))
        .delete(
            &victim,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let replaced = common::eventually(CONVERGE_TIMEOUT, "a replacement pod", || async {
        let pods = live_pods(&c.client, "web").await;
        let names: Vec<String> = pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (names.len() == 2 && !names.contains(&victim)).then_some(names)
    })
    .await;
    assert!(replaced.iter().all(|n| n.starts_with("web-")));
    wait_for_status(&c.client, "web", 2, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_adopted() {
    let c = cluster().await;
    // A pod with the ReplicaSet's labels and no owner, made before the ReplicaSet.
    let template = replica_set("web", 2).spec.unwrap().template.unwrap();
    let orphan = Pod {
        metadata: ObjectMeta {
            name: Some("orphan".into()),
            namespace: Some(NS.into()),
            labels: template.metadata.and_then(|m| m.labels),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    };
    c.client
        .api::<Pod>(Some(NS))
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let rs = c
        .client
        .api::<ReplicaSet>(Some(NS))
        .create(&PostParams::default(), &replica_set("web", 2))
        .await
        .unwrap();
    let pods = wait_for_pods(&c.client, "web", 2).await;
    assert!(
        pods.iter()
            .any(|p| p.metadata.name.as_deref() == Some("orphan"))
    );
    let adopted = common::eventually(CONVERGE_TIMEOUT, "the orphan's owner reference", || async {
        let pod = c.client.api::<Pod>(Some(NS)).get("orphan").await.ok()?;
        pod.metadata.owner_references.filter(|r| !r.is_empty())
    })
    .await;
    assert_eq!(adopted[0].uid, rs.metadata.uid.unwrap());
    assert_eq!(adopted[0].controller, Some(true));
    wait_for_status(&c.client, "web", 2, 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(live_pods(&c.client, "web").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_writes_are_events_on_the_replica_set() {
    let c = cluster().await;
    let rs = c
        .client
        .api::<ReplicaSet>(Some(NS))
        .create(&PostParams::default(), &replica_set("web", 2))
        .await
        .unwrap();
    let pods = wait_for_pods(&c.client, "web", 2).await;
    let mut names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    let created: Vec<String> = names.iter().map(|n| format!("Created pod: {n}")).collect();
    let events = common::eventually(CONVERGE_TIMEOUT, "two SuccessfulCreate events", || async {
        let events = events_about(&c, "web").await;
        (messages(&events, "SuccessfulCreate") == created).then_some(events)
    })
    .await;
    for e in &events {
        // What `kubectl describe rs web` prints: type, reason, from, message.
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(
            e.source.as_ref().and_then(|s| s.component.as_deref()),
            Some(EVENT_COMPONENT)
        );
        assert_eq!(e.involved_object.uid, rs.metadata.uid);
        assert_eq!(e.involved_object.api_version.as_deref(), Some("apps/v1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some(NS));
        assert_eq!(e.count, Some(1));
    }

    // Scale-down: the deleted pod is named in a SuccessfulDelete event.
    scale(&c.client, "web", 1).await;
    let left = wait_for_pods(&c.client, "web", 1).await;
    let left = left[0].metadata.name.clone().unwrap();
    let deleted = names.iter().find(|n| **n != left).unwrap();
    common::eventually(CONVERGE_TIMEOUT, "a SuccessfulDelete event", || async {
        let events = events_about(&c, "web").await;
        (messages(&events, "SuccessfulDelete") == vec![format!("Deleted pod: {deleted}")])
            .then_some(())
    })
    .await;
    // Nothing failed under the controller's own RBAC role...
    let events = events_about(&c, "web").await;
    assert!(
        events.iter().all(|e| e.type_.as_deref() == Some("Normal")),
        "{events:?}"
    );
    // ...which really is that role, not the admin's.
    let secrets = c
        .controller_client
        .api::<k8s_openapi::api::core::v1::Secret>(Some(NS))
        .list(&ListParams::default())
        .await;
    assert_eq!(secrets.unwrap_err().code(), Some(403));
}
