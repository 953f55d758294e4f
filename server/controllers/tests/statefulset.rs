//! The StatefulSet controller against a real apiserver (`TestServer`), playing the kubelet's
//! part by hand: with OrderedReady, `web-1` appears only once `web-0` is Running and Ready,
//! and so on; a scale-down removes the highest ordinal first, one at a time; Parallel creates
//! every pod at once.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Client, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use skerry_controllers::context::Context;
use skerry_controllers::statefulset::{
    PARALLEL, POD_INDEX_LABEL, POD_NAME_LABEL, StatefulSetController, update_revision,
};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

/// How long a test waits for the controller to converge (two cores shared with other builds).
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a test watches for something that must NOT happen (the next ordinal appearing
/// early): several sync round trips on a loaded machine.
const QUIET_PERIOD: Duration = Duration::from_millis(700);

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
    let controller = StatefulSetController::new(&ctx);
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    tokio::spawn(controller.run(2, stop.clone()));
    Cluster {
        _server: server,
        client,
        stop,
    }
}

fn stateful_set(name: &str, replicas: i32) -> StatefulSet {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(name.into()),
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
                        name: "web".into(),
                        image: Some("nginx:1.27".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}

/// The names of the live (not terminating) pods of `app`, sorted.
async fn live_names(client: &Client, app: &str) -> Vec<String> {
    let params = ListParams {
        label_selector: Some(format!("app={app}")),
        ..ListParams::default()
    };
    let mut names: Vec<String> = client
        .api::<Pod>(Some(NS))
        .list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

async fn wait_for_names(client: &Client, app: &str, want: &[&str]) {
    common::eventually(CONVERGE_TIMEOUT, &format!("pods {want:?}"), || async {
        (live_names(client, app).await == want).then_some(())
    })
    .await;
}

/// No kubelet: mark the pod Running and Ready through the status subresource.
async fn make_ready(client: &Client, name: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    client
        .api::<Pod>(Some(NS))
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            }})),
        )
        .await
        .unwrap();
}

async fn scale(client: &Client, name: &str, replicas: i32) {
    client
        .api::<StatefulSet>(Some(NS))
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_ready_creates_one_ordinal_at_a_time() {
    let c = cluster().await;
    let set = c
        .client
        .api::<StatefulSet>(Some(NS))
        .create(&PostParams::default(), &stateful_set("web", 3))
        .await
        .unwrap();
    wait_for_names(&c.client, "web", &["web-0"]).await;
    // web-0 is Pending: web-1 must not appear.
    tokio::time::sleep(QUIET_PERIOD).await;
    assert_eq!(live_names(&c.client, "web").await, vec!["web-0"]);

    let pod = c.client.api::<Pod>(Some(NS)).get("web-0").await.unwrap();
    let labels = pod.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels.get(POD_NAME_LABEL).map(String::as_str),
        Some("web-0")
    );
    assert_eq!(labels.get(POD_INDEX_LABEL).map(String::as_str), Some("0"));
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.hostname.as_deref(), Some("web-0"));
    assert_eq!(spec.subdomain.as_deref(), Some("web"));
    let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.uid, set.metadata.uid.clone().unwrap());

    make_ready(&c.client, "web-0").await;
    wait_for_names(&c.client, "web", &["web-0", "web-1"]).await;
    tokio::time::sleep(QUIET_PERIOD).await;
    assert_eq!(live_names(&c.client, "web").await, vec!["web-0", "web-1"]);
    make_ready(&c.client, "web-1").await;
    wait_for_names(&c.client, "web", &["web-0", "web-1", "web-2"]).await;
    make_ready(&c.client, "web-2").await;

    let revision = update_revision(&set);
    let api = c.client.api::<StatefulSet>(Some(NS));
    common::eventually(CONVERGE_TIMEOUT, "statefulset status", || async {
        let s = api.get("web").await.ok()?.status?;
        (s.replicas == 3
            && s.ready_replicas == Some(3)
            && s.available_replicas == Some(3)
            && s.updated_replicas == Some(3)
            && s.current_replicas == Some(3)
            && s.update_revision.as_deref() == Some(revision.as_str())
            && s.observed_generation == Some(1))
        .then_some(())
    })
    .await;

    // Scale down: the highest ordinal goes first. Unbound pods are deleted at once, so the
    // intermediate state may be too brief to poll; watch the deletions instead.
    let pods = c.client.api::<Pod>(Some(NS));
    let listed = pods
        .list(&ListParams {
            label_selector: Some("app=web".into()),
            ..ListParams::default()
        })
        .await
        .unwrap();
    let mut events = pods
        .watch(&WatchParams {
            label_selector: Some("app=web".into()),
            resource_version: listed.metadata.resource_version.clone(),
            ..WatchParams::default()
        })
        .await
        .unwrap();
    scale(&c.client, "web", 1).await;
    let mut gone: Vec<String> = Vec::new();
    tokio::time::timeout(CONVERGE_TIMEOUT, async {
        while gone.len() < 2 {
            let event = events.next().await.unwrap().unwrap();
            let pod = match event {
                WatchEvent::Deleted(p) => p,
                WatchEvent::Modified(p) if p.metadata.deletion_timestamp.is_some() => p,
                _ => continue,
            };
            let name = pod.metadata.name.unwrap();
            if !gone.contains(&name) {
                gone.push(name);
            }
        }
    })
    .await
    .expect("two pods deleted");
    assert_eq!(gone, vec!["web-2", "web-1"]);
    wait_for_names(&c.client, "web", &["web-0"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_creates_every_pod_at_once() {
    let c = cluster().await;
    let mut set = stateful_set("db", 3);
    set.spec.as_mut().unwrap().pod_management_policy = Some(PARALLEL.into());
    c.client
        .api::<StatefulSet>(Some(NS))
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    wait_for_names(&c.client, "db", &["db-0", "db-1", "db-2"]).await;
}
