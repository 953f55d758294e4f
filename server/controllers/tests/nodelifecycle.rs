//! The node lifecycle controller against a real apiserver (`TestServer`), with grace periods
//! shortened through `NodeLifecycleConfig`: a node whose Lease stops being renewed is marked
//! `Unknown`, tainted `unreachable:NoExecute`, and a pod bound to it is deleted once its
//! toleration runs out, while a pod that tolerates the taint forever stays. Two other nodes
//! keep renewing their Leases, as kubelets would, so the zone is never fully disrupted.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Client, Patch, PatchParams, PostParams};
use skerry_controllers::context::Context;
use skerry_controllers::nodelifecycle::taints::{NO_EXECUTE, UNREACHABLE};
use skerry_controllers::nodelifecycle::{
    NODE_LEASE_NAMESPACE, NodeLifecycleConfig, NodeLifecycleController,
};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

/// How long a test waits for the controller. Generous: two cores shared with other builds;
/// with the shortened periods below the whole story takes about five seconds.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the healthy nodes' "kubelets" renew their Leases: well inside the grace period.
const RENEW_INTERVAL: Duration = Duration::from_millis(300);

/// The toleration of the pod that is to be evicted.
const TOLERATION_SECONDS: i64 = 2;

fn config() -> NodeLifecycleConfig {
    NodeLifecycleConfig {
        node_monitor_period: Duration::from_millis(200),
        node_monitor_grace_period: Duration::from_secs(2),
        node_startup_grace_period: Duration::from_secs(3),
        ..NodeLifecycleConfig::default()
    }
}

async fn client(server: &TestServer) -> Client {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    Client::new(config).unwrap()
}

fn now_micro() -> serde_json::Value {
    serde_json::to_value(MicroTime(Timestamp::now())).unwrap()
}

/// Registers a Ready node and its Lease, as a kubelet does.
async fn register_node(client: &Client, name: &str) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    client
        .api::<Node>(None)
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let now = serde_json::to_value(Time(Timestamp::now())).unwrap();
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    client
        .api::<Node>(None)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NODE_LEASE_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    client
        .api::<Lease>(Some(NODE_LEASE_NAMESPACE))
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
}

/// Renews the Leases of `nodes` every [`RENEW_INTERVAL`] until `stop`.
fn keep_renewing(client: Client, nodes: &'static [&'static str], stop: CancellationToken) {
    tokio::spawn(async move {
        let leases = client.api::<Lease>(Some(NODE_LEASE_NAMESPACE));
        while !stop.is_cancelled() {
            for name in nodes {
                let patch = Patch::Merge(json!({"spec": {"renewTime": now_micro()}}));
                let _ = leases.patch(name, &PatchParams::default(), &patch).await;
            }
            tokio::time::sleep(RENEW_INTERVAL).await;
        }
    });
}

fn pod(name: &str, node: &str, toleration_seconds: Option<i64>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("nginx:1.27".into()),
                ..Container::default()
            }],
            tolerations: Some(vec![Toleration {
                key: Some(UNREACHABLE.into()),
                operator: Some("Exists".into()),
                effect: Some(NO_EXECUTE.into()),
                toleration_seconds,
                ..Toleration::default()
            }]),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// Whether the pod is gone or going.
async fn evicted(client: &Client, name: &str) -> bool {
    match client.api::<Pod>(Some(NS)).get_opt(name).await.unwrap() {
        None => true,
        Some(p) => p.metadata.deletion_timestamp.is_some(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_goes_unknown_is_tainted_and_its_pods_are_evicted() {
    let server = TestServer::start().await.unwrap();
    let client = client(&server).await;
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();

    for name in ["healthy-1", "healthy-2", "silent"] {
        register_node(&client, name).await;
    }
    keep_renewing(client.clone(), &["healthy-1", "healthy-2"], stop.clone());
    let pods = client.api::<Pod>(Some(NS));
    pods.create(
        &PostParams::default(),
        &pod("victim", "silent", Some(TOLERATION_SECONDS)),
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod("stayer", "silent", None))
        .await
        .unwrap();

    let ctx = Context::new(client.clone());
    let controller = NodeLifecycleController::with_config(&ctx, config()).unwrap();
    ctx.informers.start(&stop);
    tokio::spawn(controller.run(2, stop.clone()));

    // The silent node: Unknown, through the status subresource, with Kubernetes' reason.
    let nodes = client.api::<Node>(None);
    common::eventually(
        CONVERGE_TIMEOUT,
        "the silent node to be marked Unknown",
        || async {
            let node = nodes.get("silent").await.unwrap();
            let ready = node
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "Unknown" && ready.reason.as_deref() == Some("NodeStatusUnknown"))
                .then_some(())
        },
    )
    .await;

    // ... and tainted unreachable:NoExecute, with the time it was added.
    let time_added = common::eventually(CONVERGE_TIMEOUT, "the unreachable taint", || async {
        let node = nodes.get("silent").await.unwrap();
        node.spec?
            .taints?
            .into_iter()
            .find(|t| t.key == UNREACHABLE && t.effect == NO_EXECUTE)
            .and_then(|t| t.time_added)
    })
    .await;

    // The pod tolerating for 2 s goes after them; the one tolerating forever stays.
    common::eventually(CONVERGE_TIMEOUT, "the victim pod to be evicted", || async {
        evicted(&client, "victim").await.then_some(())
    })
    .await;
    let evicted_after = Timestamp::now().duration_since(time_added.0);
    assert!(
        evicted_after >= k8s_openapi::jiff::SignedDuration::from_secs(TOLERATION_SECONDS - 1),
        "evicted {evicted_after} after the taint, before its toleration ran out"
    );
    // A few more passes: the forever-tolerating pod is still there, and the healthy nodes
    // were never touched.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!evicted(&client, "stayer").await);
    for name in ["healthy-1", "healthy-2"] {
        let node = nodes.get(name).await.unwrap();
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
            .unwrap();
        assert_eq!(ready.status, "True", "{name}");
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            taints.iter().all(|t| t.effect != NO_EXECUTE),
            "{name}: {taints:?}"
        );
    }
}
