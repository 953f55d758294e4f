//! The garbage collector against a real apiserver (`TestServer`), watching through
//! metadata-only informers: background cascades, orphaning, foreground deletion that waits
//! for blocking dependents, dependents whose owner's UID differs, and the cycle breaker for
//! two objects in foreground deletion blocking each other. ConfigMaps stand in for owners
//! and dependents: any object can own any other in the same namespace.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Api, Client, DeleteParams, Patch, PatchParams, PostParams};
use skerry_controllers::context::Context;
use skerry_controllers::garbagecollector::GarbageCollector;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

/// How long a test waits for the collector to converge. Generous: two cores shared with
/// other builds; a cascade itself takes well under a second.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// A finalizer no controller handles, to hold an object in deletion while a test looks.
const HOLD: &str = "example.com/hold";

struct Cluster {
    _server: TestServer,
    client: Client,
    stop: CancellationToken,
}

impl Cluster {
    /// Starts the collector (its monitors list what exists by then).
    fn start_collector(&self) {
        let ctx = Context::new(self.client.clone());
        let gc = GarbageCollector::new(&ctx);
        ctx.informers.start(&self.stop);
        tokio::spawn(gc.run(2, self.stop.clone()));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A cluster with the collector running.
async fn cluster() -> Cluster {
    let c = cluster_without_collector().await;
    c.start_collector();
    c
}

async fn cluster_without_collector() -> Cluster {
    let server = TestServer::start().await.unwrap();
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    Cluster {
        _server: server,
        client: Client::new(config).unwrap(),
        stop: CancellationToken::new(),
    }
}

fn config_maps(c: &Cluster) -> Api<ConfigMap> {
    c.client.api::<ConfigMap>(Some(NS))
}

fn owner_ref(owner: &ConfigMap, blocking: bool) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.metadata.name.clone().unwrap(),
        uid: owner.metadata.uid.clone().unwrap(),
        controller: None,
        block_owner_deletion: Some(blocking),
    }
}

async fn create_config_map(
    c: &Cluster,
    name: &str,
    owners: Vec<OwnerReference>,
    finalizers: Vec<&str>,
) -> ConfigMap {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            owner_references: (!owners.is_empty()).then_some(owners),
            finalizers: (!finalizers.is_empty())
                .then(|| finalizers.into_iter().map(str::to_string).collect()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    config_maps(c)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap()
}

async fn delete_with(c: &Cluster, name: &str, policy: &str) {
    let params = DeleteParams {
        propagation_policy: Some(policy.into()),
        ..DeleteParams::default()
    };
    config_maps(c).delete(name, &params).await.unwrap();
}

async fn wait_gone(c: &Cluster, name: &str) {
    let api = config_maps(c);
    common::eventually(
        CONVERGE_TIMEOUT,
        &format!("{name} to be deleted"),
        || async { api.get_opt(name).await.unwrap().is_none().then_some(()) },
    )
    .await;
}

/// Drops every finalizer of `name` (a user releasing the hold).
async fn release(c: &Cluster, name: &str) {
    config_maps(c)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_deletion_collects_the_dependents() {
    let c = cluster().await;
    let owner = create_config_map(&c, "owner", vec![], vec![]).await;
    create_config_map(&c, "dependent", vec![owner_ref(&owner, false)], vec![]).await;
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("dependent-pod".into()),
            namespace: Some(NS.into()),
            owner_references: Some(vec![owner_ref(&owner, true)]),
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
        status: None,
    };
    let pods = c.client.api::<Pod>(Some(NS));
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let bystander = create_config_map(&c, "bystander", vec![], vec![]).await;

    delete_with(&c, "owner", "Background").await;
    wait_gone(&c, "dependent").await;
    common::eventually(
        CONVERGE_TIMEOUT,
        "the dependent pod to be deleted",
        || async {
            pods.get_opt("dependent-pod")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    let still = config_maps(&c).get("bystander").await.unwrap();
    assert_eq!(
        still.metadata.uid, bystander.metadata.uid,
        "an unowned object stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_deletion_keeps_dependents_without_the_reference() {
    let c = cluster().await;
    let owner = create_config_map(&c, "owner", vec![], vec![]).await;
    let other = create_config_map(&c, "other-owner", vec![], vec![]).await;
    create_config_map(
        &c,
        "dependent",
        vec![owner_ref(&owner, true), owner_ref(&other, false)],
        vec![],
    )
    .await;

    delete_with(&c, "owner", "Orphan").await;
    wait_gone(&c, "owner").await;
    let dependent = config_maps(&c).get("dependent").await.unwrap();
    assert!(dependent.metadata.deletion_timestamp.is_none());
    let refs = dependent.metadata.owner_references.unwrap_or_default();
    assert_eq!(
        refs.len(),
        1,
        "only the orphaning owner's reference is removed"
    );
    assert_eq!(refs[0].name, "other-owner");
    // And it stays: the collector does not come back for it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        config_maps(&c)
            .get_opt("dependent")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_deletion_waits_for_the_blocking_dependent() {
    let c = cluster().await;
    let owner = create_config_map(&c, "owner", vec![], vec![]).await;
    // The blocking dependent is held in deletion by a finalizer, so the order is visible.
    create_config_map(&c, "blocker", vec![owner_ref(&owner, true)], vec![HOLD]).await;
    create_config_map(&c, "free", vec![owner_ref(&owner, false)], vec![]).await;

    delete_with(&c, "owner", "Foreground").await;
    let api = config_maps(&c);
    common::eventually(
        CONVERGE_TIMEOUT,
        "the blocker to be deleted by the collector",
        || async {
            let blocker = api.get("blocker").await.unwrap();
            blocker.metadata.deletion_timestamp.is_some().then_some(())
        },
    )
    .await;
    wait_gone(&c, "free").await;
    // The owner waits while its blocking dependent exists.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = api.get("owner").await.unwrap();
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert_eq!(
        waiting.metadata.finalizers.as_deref(),
        Some(&["foregroundDeletion".to_string()][..])
    );

    release(&c, "blocker").await;
    wait_gone(&c, "blocker").await;
    wait_gone(&c, "owner").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_whose_owner_uid_differs_is_deleted() {
    let c = cluster().await;
    let owner = create_config_map(&c, "owner", vec![], vec![]).await;
    // Same name, another (a predecessor's) UID: the owner it names is gone.
    let stale = OwnerReference {
        uid: "00000000-0000-0000-0000-000000000001".into(),
        ..owner_ref(&owner, false)
    };
    create_config_map(&c, "stale-dependent", vec![stale.clone()], vec![]).await;
    // One solid owner and one dangling: kept, but the dangling reference is dropped.
    let keeper = create_config_map(&c, "keeper", vec![], vec![]).await;
    create_config_map(
        &c,
        "mixed-dependent",
        vec![owner_ref(&keeper, false), stale],
        vec![],
    )
    .await;

    wait_gone(&c, "stale-dependent").await;
    let api = config_maps(&c);
    common::eventually(
        CONVERGE_TIMEOUT,
        "the dangling reference to be removed",
        || async {
            let mixed = api.get("mixed-dependent").await.unwrap();
            let refs = mixed.metadata.owner_references.unwrap_or_default();
            (refs.len() == 1 && refs[0].name == "keeper").then_some(())
        },
    )
    .await;
    assert!(
        api.get_opt("owner").await.unwrap().is_some(),
        "the real owner is untouched"
    );
}

/// a owns b and b owns a, both blocking.
async fn cycle(c: &Cluster) {
    let a = create_config_map(c, "a", vec![], vec![]).await;
    let b = create_config_map(c, "b", vec![owner_ref(&a, true)], vec![]).await;
    config_maps(c)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": [owner_ref(&b, true)]}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_object_cycle_deleted_in_the_foreground_resolves() {
    // Kubernetes' e2e "should not be blocked by dependency circle": one of them is deleted
    // in the foreground; the collector deletes the other in the foreground after making its
    // reference non-blocking.
    let c = cluster().await;
    cycle(&c).await;
    delete_with(&c, "a", "Foreground").await;
    wait_gone(&c, "a").await;
    wait_gone(&c, "b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_objects_both_in_foreground_deletion_blocking_each_other_resolve() {
    // Both deleted in the foreground before the collector looks: each waits for the
    // other, and the collector deletes neither; only the cycle breaker ends it.
    let c = cluster_without_collector().await;
    cycle(&c).await;
    delete_with(&c, "a", "Foreground").await;
    delete_with(&c, "b", "Foreground").await;
    for name in ["a", "b"] {
        let object = config_maps(&c).get(name).await.unwrap();
        assert!(object.metadata.deletion_timestamp.is_some());
    }
    c.start_collector();
    wait_gone(&c, "a").await;
    wait_gone(&c, "b").await;
}
