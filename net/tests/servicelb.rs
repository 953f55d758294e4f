//! The service load balancer against a real apiserver: a LoadBalancer Service's
//! `status.loadBalancer.ingress` gets the Ready nodes' addresses (ExternalIP over
//! InternalIP), loses a node that turns NotReady, and is cleared when the Service becomes a
//! ClusterIP; a Service of another `loadBalancerClass` is left alone.

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{Value, json};
use skerry_apiserver::testing::TestServer;
use skerry_client::api::{Patch, PatchParams, PostParams};
use skerry_net::servicelb;
use tokio_util::sync::CancellationToken;

/// Generous next to one sync: the election's first acquisition, two informers' lists and
/// a status PATCH, on a loaded two-core machine.
const CONVERGE: Duration = Duration::from_secs(30);

fn ready_status(ready: &str, addresses: Value) -> Value {
    json!({"status": {"conditions": [{"type": "Ready", "status": ready}], "addresses": addresses}})
}

async fn ingress_of(client: &skerry_client::Client, name: &str) -> Vec<String> {
    let svc = client
        .api::<Service>(Some("default"))
        .get(name)
        .await
        .expect("service");
    svc.status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i.ip)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_follows_ready_nodes_and_is_cleared_on_type_change() {
    let server = TestServer::start().await.expect("apiserver");
    let client = common::admin_client(&server);
    let nodes = client.api::<Node>(None);
    let merge = PatchParams::default();
    for (name, addresses) in [
        (
            "box-a",
            json!([{"type": "InternalIP", "address": "192.0.2.10"}]),
        ),
        (
            "box-b",
            json!([{"type": "InternalIP", "address": "192.0.2.11"}, {"type": "ExternalIP", "address": "198.51.100.11"}]),
        ),
    ] {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).expect("node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("node created");
        nodes
            .patch_status(name, &merge, &Patch::Merge(ready_status("True", addresses)))
            .await
            .expect("node status");
    }
    let services = client.api::<Service>(Some("default"));
    for (name, spec) in [
        (
            "lb",
            json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        ),
        (
            "theirs",
            json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/other", "ports": [{"port": 80}]}),
        ),
    ] {
        let svc: Service = serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
        )
        .expect("service");
        services
            .create(&PostParams::default(), &svc)
            .await
            .expect("service created");
    }

    let stop = CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    tokio::spawn(servicelb::run(
        client.clone(),
        servicelb::Config::new("box-a"),
        stop.clone(),
    ));

    let both = vec!["192.0.2.10".to_string(), "198.51.100.11".to_string()];
    common::eventually(CONVERGE, "both nodes published", || async {
        (ingress_of(&client, "lb").await == both).then_some(())
    })
    .await;

    // box-b turns NotReady: only box-a is left.
    nodes
        .patch_status(
            "box-b",
            &merge,
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
        )
        .await
        .expect("box-b NotReady");
    common::eventually(CONVERGE, "box-b withdrawn", || async {
        (ingress_of(&client, "lb").await == ["192.0.2.10"]).then_some(())
    })
    .await;

    // No longer a LoadBalancer: cleared.
    services
        .patch(
            "lb",
            &merge,
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .expect("type changed");
    common::eventually(CONVERGE, "ingress cleared", || async {
        ingress_of(&client, "lb").await.is_empty().then_some(())
    })
    .await;
    // Another implementation's Service was never written.
    assert!(ingress_of(&client, "theirs").await.is_empty());
}
