//! The namespace and service-account controllers against a real apiserver (`TestServer`):
//! a new namespace gets its `default` ServiceAccount (and gets it back when it is deleted); a
//! deleted namespace goes `Terminating`, loses its content, and is removed once the
//! controller finalizes it; content held by a finalizer keeps the namespace, reported in its
//! conditions, until the finalizer goes. There is no kubelet: pods are never bound to a node,
//! so the apiserver deletes them at once.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, NamespaceCondition, Pod, PodSpec, PodTemplateSpec, Secret,
    ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Client, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use skerry_controllers::context::Context;
use skerry_controllers::namespace::{NAMESPACE_DELETION_GRACE_PERIOD, NamespaceController};
use skerry_controllers::serviceaccount::ServiceAccountController;
use tokio_util::sync::CancellationToken;

/// How long a test waits for the controllers to converge: the namespace controller's first
/// pass alone waits [`NAMESPACE_DELETION_GRACE_PERIOD`] (5 s); the rest is generous room for
/// two cores shared with other builds.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

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
    // Unlimited: these tests check behaviour, not the rate limiter.
    config.qps = 0.0;
    let client = Client::new(config).unwrap();
    let ctx = Context::new(client.clone());
    let namespaces = NamespaceController::new(&ctx);
    let service_accounts = ServiceAccountController::new(&ctx);
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    tokio::spawn(namespaces.run(2, stop.clone()));
    tokio::spawn(service_accounts.run(1, stop.clone()));
    Cluster {
        _server: server,
        client,
        stop,
    }
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        ..ObjectMeta::default()
    }
}

async fn create_namespace(client: &Client, name: &str) -> Namespace {
    client
        .api::<Namespace>(None)
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta(name, None),
                ..Namespace::default()
            },
        )
        .await
        .unwrap()
}

async fn delete_namespace(client: &Client, name: &str) {
    client
        .api::<Namespace>(None)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
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

fn deployment(name: &str, namespace: &str) -> Deployment {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    Deployment {
        metadata: meta(name, Some(namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec()),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// Creates a ConfigMap, a Secret, a Pod and a Deployment in `namespace`.
async fn fill(client: &Client, namespace: &str) {
    let ns = Some(namespace);
    let params = PostParams::default();
    client
        .api::<ConfigMap>(ns)
        .create(
            &params,
            &ConfigMap {
                metadata: meta("settings", ns),
                data: Some(BTreeMap::from([("k".to_string(), "v".to_string())])),
                ..ConfigMap::default()
            },
        )
        .await
        .unwrap();
    client
        .api::<Secret>(ns)
        .create(
            &params,
            &Secret {
                metadata: meta("password", ns),
                string_data: Some(BTreeMap::from([("p".to_string(), "hunter2".to_string())])),
                ..Secret::default()
            },
        )
        .await
        .unwrap();
    client
        .api::<Pod>(ns)
        .create(
            &params,
            &Pod {
                metadata: meta("lonely", ns),
                spec: Some(pod_spec()),
                status: None,
            },
        )
        .await
        .unwrap();
    client
        .api::<Deployment>(ns)
        .create(&params, &deployment("web", namespace))
        .await
        .unwrap();
}

/// How many ConfigMaps, Secrets, Pods and Deployments `namespace` holds.
async fn content(client: &Client, namespace: &str) -> usize {
    let ns = Some(namespace);
    let all = ListParams::default();
    client
        .api::<ConfigMap>(ns)
        .list(&all)
        .await
        .unwrap()
        .items
        .len()
        + client
            .api::<Secret>(ns)
            .list(&all)
            .await
            .unwrap()
            .items
            .len()
        + client.api::<Pod>(ns).list(&all).await.unwrap().items.len()
        + client
            .api::<Deployment>(ns)
            .list(&all)
            .await
            .unwrap()
            .items
            .len()
}

fn condition<'a>(namespace: &'a Namespace, type_: &str) -> Option<&'a NamespaceCondition> {
    namespace
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

async fn wait_for_default_service_account(client: &Client, namespace: &str) -> ServiceAccount {
    let api = client.api::<ServiceAccount>(Some(namespace));
    common::eventually(
        CONVERGE_TIMEOUT,
        &format!("the default service account of {namespace}"),
        || {
            let api = api.clone();
            async move { api.get_opt("default").await.unwrap() }
        },
    )
    .await
}

async fn wait_until_gone(client: &Client, namespace: &str) {
    let api = client.api::<Namespace>(None);
    common::eventually(
        CONVERGE_TIMEOUT,
        &format!("namespace {namespace} to be removed"),
        || {
            let api = api.clone();
            async move {
                api.get_opt(namespace)
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_namespace_gets_a_default_service_account_and_gets_it_back() {
    let c = cluster().await;
    create_namespace(&c.client, "team-a").await;
    let first = wait_for_default_service_account(&c.client, "team-a").await;
    assert_eq!(first.metadata.namespace.as_deref(), Some("team-a"));

    c.client
        .api::<ServiceAccount>(Some("team-a"))
        .delete("default", &DeleteParams::default())
        .await
        .unwrap();
    let api = c.client.api::<ServiceAccount>(Some("team-a"));
    let second = common::eventually(
        CONVERGE_TIMEOUT,
        "the default service account to be re-created",
        || {
            let api = api.clone();
            let first_uid = first.metadata.uid.clone();
            async move {
                api.get_opt("default")
                    .await
                    .unwrap()
                    .filter(|sa| sa.metadata.uid != first_uid)
            }
        },
    )
    .await;
    assert_ne!(second.metadata.uid, first.metadata.uid);

    // Namespaces that existed before the controller started (the bootstrap ones) get theirs
    // too, from the informer's initial list.
    wait_for_default_service_account(&c.client, "kube-system").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_namespace_loses_its_content_and_then_itself() {
    let c = cluster().await;
    create_namespace(&c.client, "doomed").await;
    fill(&c.client, "doomed").await;
    wait_for_default_service_account(&c.client, "doomed").await;
    assert_eq!(content(&c.client, "doomed").await, 4);

    let started = tokio::time::Instant::now();
    delete_namespace(&c.client, "doomed").await;
    let ns = c.client.api::<Namespace>(None).get("doomed").await.unwrap();
    assert!(ns.metadata.deletion_timestamp.is_some());
    assert_eq!(
        ns.status.as_ref().unwrap().phase.as_deref(),
        Some("Terminating")
    );
    // The apiserver refuses new content in a terminating namespace.
    let refused = c
        .client
        .api::<ConfigMap>(Some("doomed"))
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: meta("late", Some("doomed")),
                ..ConfigMap::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(403), "{refused}");

    wait_until_gone(&c.client, "doomed").await;
    // The controller waited for the other apiservers before acting.
    assert!(
        started.elapsed() >= NAMESPACE_DELETION_GRACE_PERIOD,
        "gone after {:?}",
        started.elapsed()
    );
    assert_eq!(content(&c.client, "doomed").await, 0);
    let service_accounts = c
        .client
        .api::<ServiceAccount>(Some("doomed"))
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(service_accounts.items.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_held_by_a_finalizer_keeps_the_namespace_until_it_goes() {
    let c = cluster().await;
    create_namespace(&c.client, "held").await;
    let configmaps = c.client.api::<ConfigMap>(Some("held"));
    configmaps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    finalizers: Some(vec!["example.com/hold".to_string()]),
                    ..meta("pinned", Some("held"))
                },
                ..ConfigMap::default()
            },
        )
        .await
        .unwrap();
    c.client
        .api::<Secret>(Some("held"))
        .create(
            &PostParams::default(),
            &Secret {
                metadata: meta("free", Some("held")),
                ..Secret::default()
            },
        )
        .await
        .unwrap();
    delete_namespace(&c.client, "held").await;

    // The controller deletes what it can, and reports what is held and by what.
    let api = c.client.api::<Namespace>(None);
    let ns = common::eventually(
        CONVERGE_TIMEOUT,
        "the namespace to report its finalizers",
        || {
            let api = api.clone();
            async move {
                let ns = api.get("held").await.unwrap();
                let c = condition(&ns, "NamespaceFinalizersRemaining")?;
                (c.status == "True").then_some(ns)
            }
        },
    )
    .await;
    let finalizers = condition(&ns, "NamespaceFinalizersRemaining").unwrap();
    assert_eq!(finalizers.reason.as_deref(), Some("SomeFinalizersRemain"));
    assert_eq!(
        finalizers.message.as_deref(),
        Some(
            "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
        )
    );
    let remaining = condition(&ns, "NamespaceContentRemaining").unwrap();
    assert_eq!(remaining.status, "True");
    assert_eq!(
        remaining.message.as_deref(),
        Some("Some resources are remaining: configmaps. has 1 resource instances")
    );
    let failure = condition(&ns, "NamespaceDeletionContentFailure").unwrap();
    assert_eq!(failure.status, "False");
    assert_eq!(failure.reason.as_deref(), Some("ContentDeleted"));
    assert_eq!(
        ns.spec.as_ref().unwrap().finalizers.as_deref(),
        Some(&["kubernetes".to_string()][..]),
        "not finalized while content remains"
    );
    let secrets = c
        .client
        .api::<Secret>(Some("held"))
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(secrets.items.is_empty(), "unheld content is deleted");
    let pinned = configmaps.get("pinned").await.unwrap();
    assert!(pinned.metadata.deletion_timestamp.is_some());

    // Whoever owns the finalizer lets go; the namespace follows its content out.
    configmaps
        .patch(
            "pinned",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    wait_until_gone(&c.client, "held").await;
    assert!(configmaps.get_opt("pinned").await.unwrap().is_none());
}
