//! The node IPAM controller against a real apiserver (`TestServer`), writing as the node
//! controller's service account as `skerry server` runs it: two new nodes get distinct /24s,
//! a node registered with a range keeps it (and it is never handed out again, also across a
//! restart of the controller), a deleted node's range goes to the next node, and a full
//! range is a `CIDRNotAvailable` event until a range is freed.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use skerry_api::node::pod_cidrs;
use skerry_apiserver::testing::TestServer;
use skerry_client::{Client, DeleteParams, ListParams, PostParams};
use skerry_controllers::context::{Context, DEFAULT_RESYNC, InformerFactory};
use skerry_controllers::nodeipam::{NodeIpamConfig, NodeIpamController};
use tokio_util::sync::CancellationToken;

use common::{admin_client, controller_client, eventually};

/// How long a test waits for the controller: generous, two cores shared with other builds.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The controller as the manager runs it: informers reading as the controller manager
/// (the node controller's role may not watch), writes as the node controller.
fn start(server: &TestServer, config: NodeIpamConfig) -> CancellationToken {
    let ctx = Context {
        client: controller_client(server, "node-controller"),
        informers: InformerFactory::new(admin_client(server), Some(DEFAULT_RESYNC)),
    };
    let controller = NodeIpamController::new(&ctx, config);
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    tokio::spawn(controller.run(4, stop.clone()));
    stop
}

async fn create_node(client: &Client, name: &str, pod_cidr: Option<&str>) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: pod_cidr.map(|c| NodeSpec {
            pod_cidr: Some(c.into()),
            pod_cidrs: Some(vec![c.into()]),
            ..NodeSpec::default()
        }),
        ..Node::default()
    };
    client
        .api::<Node>(None)
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

async fn cidr_of(client: &Client, name: &str) -> String {
    let nodes = client.api::<Node>(None);
    eventually(TIMEOUT, &format!("a pod CIDR for {name}"), || async {
        let node = nodes.get(name).await.unwrap();
        let cidrs = pod_cidrs(&node);
        let spec = node.spec.as_ref()?;
        // Both fields, as kube-controller-manager writes them.
        assert_eq!(spec.pod_cidr.as_deref(), cidrs.first().map(String::as_str));
        cidrs.first().cloned()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_distinct_ranges_a_preset_one_is_kept_and_a_deleted_ones_is_reused() {
    let server = TestServer::start().await.unwrap();
    let admin = admin_client(&server);
    // Registered with a range before the controller starts: it must be marked, not replaced.
    create_node(&admin, "preset", Some("10.42.0.0/24")).await;
    let stop = start(&server, NodeIpamConfig::default());

    create_node(&admin, "a", None).await;
    create_node(&admin, "b", None).await;
    let a = cidr_of(&admin, "a").await;
    let b = cidr_of(&admin, "b").await;
    let mut got = vec![a.clone(), b.clone()];
    got.sort();
    assert_eq!(
        got,
        ["10.42.1.0/24", "10.42.2.0/24"],
        "the lowest free /24s, distinct"
    );
    assert_eq!(cidr_of(&admin, "preset").await, "10.42.0.0/24", "kept");

    // A deleted node's range goes to the next node.
    admin
        .api::<Node>(None)
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    create_node(&admin, "c", None).await;
    assert_eq!(cidr_of(&admin, "c").await, a);

    // A restarted controller rebuilds its bitmap from the nodes: the next range is new.
    stop.cancel();
    let stop = start(&server, NodeIpamConfig::default());
    create_node(&admin, "d", None).await;
    assert_eq!(cidr_of(&admin, "d").await, "10.42.3.0/24");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_range_is_reported_and_served_when_a_range_is_freed() {
    let server = TestServer::start().await.unwrap();
    let admin = admin_client(&server);
    // Two /24s in all.
    let config = NodeIpamConfig::parse(true, "10.42.0.0/23", Some(24), None).unwrap();
    let stop = start(&server, config);
    create_node(&admin, "a", None).await;
    create_node(&admin, "b", None).await;
    let a = cidr_of(&admin, "a").await;
    cidr_of(&admin, "b").await;

    create_node(&admin, "c", None).await;
    let events = admin.api::<Event>(None);
    let event = eventually(TIMEOUT, "a CIDRNotAvailable event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("CIDRNotAvailable")
                    && e.involved_object.name.as_deref() == Some("c")
            })
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.message.as_deref(),
        Some("Node c status is now: CIDRNotAvailable")
    );
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    let c = admin.api::<Node>(None).get("c").await.unwrap();
    assert!(pod_cidrs(&c).is_empty(), "no range to give");

    admin
        .api::<Node>(None)
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        cidr_of(&admin, "c").await,
        a,
        "the waiting node gets the freed range"
    );
    stop.cancel();
}

/// An informer that cannot watch (the node controller's own role has no `watch` on nodes)
/// only relists: a deletion then arrives as a tombstone whose last state may predate the
/// range the controller gave. The range is released all the same, from what the controller
/// remembers giving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_seen_only_as_a_tombstone_still_releases_the_range() {
    let server = TestServer::start().await.unwrap();
    let admin = admin_client(&server);
    let ctx = Context::new(controller_client(&server, "node-controller"));
    let controller = NodeIpamController::new(&ctx, NodeIpamConfig::default());
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    tokio::spawn(controller.clone().run(4, stop.clone()));
    create_node(&admin, "a", None).await;
    let a = cidr_of(&admin, "a").await;
    admin
        .api::<Node>(None)
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    eventually(Duration::from_secs(90), "the range released", || async {
        (controller.used() == [0]).then_some(())
    })
    .await;
    create_node(&admin, "b", None).await;
    assert_eq!(cidr_of(&admin, "b").await, a);
    stop.cancel();
}
