//! The DaemonSet controller against a real apiserver (`TestServer`): one pod per eligible node,
//! bound by node affinity (`matchFields metadata.name In [node]`) rather than `nodeName`, none
//! on a node whose taint it does not tolerate, one more when a node joins, and a status that
//! counts them. There is no kubelet or scheduler: pods stay Pending and unbound.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{Container, Node, NodeSpec, Pod, PodSpec, PodTemplateSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Client, ListParams, PostParams};
use skerry_controllers::context::Context;
use skerry_controllers::daemonset::{
    CONTROLLER_REVISION_HASH_LABEL, DaemonSetController, revision_hash, target_node_name,
};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

/// How long a test waits for the controller to converge. Generous: two cores shared with
/// other builds; convergence itself takes well under a second.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

struct Cluster {
    _server: TestServer,
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
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    let client = Client::new(config).unwrap();
    let ctx = Context::new(client.clone());
    let controller = DaemonSetController::new(&ctx);
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    tokio::spawn(controller.run(2, stop.clone()));
    Cluster {
        _server: server,
        client,
        stop,
    }
}

async fn create_node(client: &Client, name: &str, taints: Vec<Taint>) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                name.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..NodeSpec::default()
        }),
        status: None,
    };
    client
        .api::<Node>(None)
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

fn daemon_set(name: &str) -> DaemonSet {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "agent".into(),
                        image: Some("busybox:1.36".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

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

/// The target nodes of the live pods of `app`, sorted, once there are `n` of them.
async fn wait_for_targets(client: &Client, app: &str, n: usize) -> (Vec<Pod>, Vec<String>) {
    common::eventually(
        CONVERGE_TIMEOUT,
        &format!("{n} daemon pods of {app}"),
        || async {
            let pods = live_pods(client, app).await;
            if pods.len() != n {
                return None;
            }
            let mut targets: Vec<String> = pods
                .iter()
                .map(|p| target_node_name(p).unwrap_or_default().to_string())
                .collect();
            targets.sort();
            Some((pods, targets))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_per_node_by_node_affinity() {
    let c = cluster().await;
    create_node(&c.client, "n1", vec![]).await;
    create_node(&c.client, "n2", vec![]).await;
    // A node reserved for something else: the daemon does not tolerate its taint.
    create_node(
        &c.client,
        "n3",
        vec![Taint {
            key: "dedicated".into(),
            value: Some("db".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }],
    )
    .await;
    let ds = c
        .client
        .api::<DaemonSet>(Some(NS))
        .create(&PostParams::default(), &daemon_set("agent"))
        .await
        .unwrap();

    let (pods, targets) = wait_for_targets(&c.client, "agent", 2).await;
    assert_eq!(targets, vec!["n1", "n2"]);
    let hash = revision_hash(&ds);
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.node_name, None,
            "bound by the scheduler, not the controller"
        );
        let terms = &spec
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        let field = &terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!(field.key, "metadata.name");
        assert_eq!(field.operator, "In");
        let tolerations = spec.tolerations.as_ref().unwrap();
        assert!(
            tolerations
                .iter()
                .any(|t| t.key.as_deref() == Some("node.kubernetes.io/unreachable"))
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(CONTROLLER_REVISION_HASH_LABEL), Some(&hash));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "DaemonSet");
        assert_eq!(owner.uid, ds.metadata.uid.clone().unwrap());
    }

    let api = c.client.api::<DaemonSet>(Some(NS));
    common::eventually(CONVERGE_TIMEOUT, "daemonset status", || async {
        let s = api.get("agent").await.ok()?.status?;
        (s.desired_number_scheduled == 2
            && s.current_number_scheduled == 2
            && s.number_misscheduled == 0
            && s.number_ready == 0
            && s.number_unavailable == Some(2)
            && s.updated_number_scheduled == Some(2)
            && s.observed_generation == Some(1))
        .then_some(())
    })
    .await;

    // A node joins and gets its daemon; the others keep theirs.
    create_node(&c.client, "n4", vec![]).await;
    let (_, targets) = wait_for_targets(&c.client, "agent", 3).await;
    assert_eq!(targets, vec!["n1", "n2", "n4"]);
    // Steady: the expectations stop a second pod on any node.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(live_pods(&c.client, "agent").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_goes_away_loses_its_daemon_pod() {
    let c = cluster().await;
    create_node(&c.client, "n1", vec![]).await;
    create_node(&c.client, "n2", vec![]).await;
    c.client
        .api::<DaemonSet>(Some(NS))
        .create(&PostParams::default(), &daemon_set("agent"))
        .await
        .unwrap();
    wait_for_targets(&c.client, "agent", 2).await;
    c.client
        .api::<Node>(None)
        .delete("n2", &Default::default())
        .await
        .unwrap();
    let (_, targets) = wait_for_targets(&c.client, "agent", 1).await;
    assert_eq!(targets, vec!["n1"]);
}
