//! The root CA publisher against a real apiserver (`TestServer`), writing as its own service
//! account (`root-ca-cert-publisher`, so its bootstrap RBAC role is exercised): every namespace
//! gets `kube-root-ca.crt` holding the server's CA with upstream's description; a deleted one
//! comes back, an edited one is restored, a new namespace gets one. Then, with the
//! ServiceAccount admission on and the serviceaccount controller running as `skerry server`
//! runs them, a pod created right after its namespace is admitted with its token volume.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{admin_client, controller_client, eventually};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use skerry_apiserver::testing::TestServer;
use skerry_client::{Client, DeleteParams, PostParams};
use skerry_controllers::context::{Context, DEFAULT_RESYNC, InformerFactory};
use skerry_controllers::rootcacertpublisher::{
    DESCRIPTION, DESCRIPTION_ANNOTATION, ROOT_CA_CONFIG_MAP, RootCaCertPublisher,
};
use skerry_controllers::serviceaccount::ServiceAccountController;
use tokio_util::sync::CancellationToken;

/// How long a test waits for the controller: one sync is a cache read and a write; the rest
/// is room for two cores shared with other builds.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

struct Running {
    server: TestServer,
    admin: Client,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The publisher (and the serviceaccount controller) as the manager runs them: informers
/// read as the admin, each controller writes as its own service account.
async fn start(server: TestServer) -> Running {
    let admin = admin_client(&server);
    let informers = InformerFactory::new(admin.clone(), Some(DEFAULT_RESYNC));
    let ctx = |name: &str| Context {
        client: controller_client(&server, name),
        informers: informers.clone(),
    };
    let publisher =
        RootCaCertPublisher::new(&ctx("root-ca-cert-publisher"), server.ca_pem().to_string());
    let accounts = ServiceAccountController::new(&ctx("service-account-controller"));
    let stop = CancellationToken::new();
    informers.start(&stop);
    tokio::spawn(publisher.run(1, stop.clone()));
    tokio::spawn(accounts.run(1, stop.clone()));
    Running {
        server,
        admin,
        stop,
    }
}

/// The namespace's `kube-root-ca.crt` once it holds `ca` and the description.
async fn published(client: &Client, namespace: &str, ca: &str) -> ConfigMap {
    let api = client.api::<ConfigMap>(Some(namespace));
    eventually(
        CONVERGE_TIMEOUT,
        &format!("{namespace}/kube-root-ca.crt with the CA"),
        || async {
            let cm = api.get_opt(ROOT_CA_CONFIG_MAP).await.unwrap()?;
            let data_ok = cm
                .data
                .as_ref()
                .and_then(|d| d.get("ca.crt"))
                .map(String::as_str)
                == Some(ca)
                && cm.data.as_ref().map(BTreeMap::len) == Some(1);
            let described = cm
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
                .map(String::as_str)
                == Some(DESCRIPTION);
            (data_ok && described).then_some(cm)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_namespace_has_the_root_ca_and_keeps_it() {
    let running = start(TestServer::start().await.unwrap()).await;
    let ca = running.server.ca_pem().to_string();
    let client = &running.admin;
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        published(client, ns, &ca).await;
    }

    // Deleted: recreated.
    let api = client.api::<ConfigMap>(Some("default"));
    let first = published(client, "default", &ca).await;
    api.delete(ROOT_CA_CONFIG_MAP, &DeleteParams::default())
        .await
        .unwrap();
    let again = eventually(CONVERGE_TIMEOUT, "the ConfigMap recreated", || async {
        api.get_opt(ROOT_CA_CONFIG_MAP)
            .await
            .unwrap()
            .filter(|cm| cm.metadata.uid != first.metadata.uid)
    })
    .await;
    assert_eq!(again.data.as_ref().unwrap()["ca.crt"], ca);

    // Edited: restored (data and annotation), the rest of the edit kept.
    let mut edited = published(client, "default", &ca).await;
    edited.data = Some(BTreeMap::from([(
        "ca.crt".to_string(),
        "forged".to_string(),
    )]));
    edited.metadata.annotations = None;
    edited.metadata.labels = Some(BTreeMap::from([("team".to_string(), "a".to_string())]));
    let written = api
        .replace(ROOT_CA_CONFIG_MAP, &PostParams::default(), &edited)
        .await
        .unwrap();
    let restored = eventually(CONVERGE_TIMEOUT, "the edit undone", || async {
        let cm = api.get_opt(ROOT_CA_CONFIG_MAP).await.unwrap()?;
        (cm.metadata.resource_version != written.metadata.resource_version).then_some(cm)
    })
    .await;
    assert_eq!(restored.data.as_ref().unwrap()["ca.crt"], ca);
    assert_eq!(
        restored.metadata.annotations.as_ref().unwrap()[DESCRIPTION_ANNOTATION],
        DESCRIPTION
    );
    assert_eq!(restored.metadata.labels, edited.metadata.labels);

    // A new namespace gets one.
    client
        .api::<Namespace>(None)
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("team-a".into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .unwrap();
    published(client, "team-a", &ca).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_created_right_after_its_namespace_is_admitted() {
    let running = start(
        TestServer::start_with_service_account_admission()
            .await
            .unwrap(),
    )
    .await;
    let client = &running.admin;
    client
        .api::<Namespace>(None)
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("fresh".into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .unwrap();
    // At once: the admission waits out the serviceaccount controller's moment.
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("first".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("busybox".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let created = client
        .api::<Pod>(Some("fresh"))
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let spec = created.spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    let volume = &spec.volumes.unwrap()[0];
    assert!(
        volume.name.starts_with("kube-api-access-"),
        "{}",
        volume.name
    );
    let sources = volume.projected.as_ref().unwrap().sources.as_ref().unwrap();
    assert_eq!(
        sources[1].config_map.as_ref().unwrap().name,
        ROOT_CA_CONFIG_MAP
    );
}
