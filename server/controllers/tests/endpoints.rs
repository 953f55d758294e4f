//! The Endpoints and EndpointSlice controllers against a real apiserver (`TestServer`).
//! There is no kubelet: each test registers its nodes and writes its pods' IPs and readiness
//! through the status subresource, as a kubelet would.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Endpoints, Node, Pod, PodSpec, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{
    Client, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use skerry_controllers::context::Context;
use skerry_controllers::endpoints::{EndpointsController, MANAGED_BY_LABEL};
use skerry_controllers::endpointslice::EndpointSliceController;
use skerry_controllers::endpointslice::topology::{TOPOLOGY_MODE_ANNOTATION, ZONE_LABEL};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

/// How long a test waits for the controllers to converge. Generous: two cores shared with
/// other builds; convergence itself takes well under a second (plus the one-second delay
/// before a slice event is acted on).
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
    // Unlimited: these tests check behaviour, not the rate limiter.
    config.qps = 0.0;
    let client = Client::new(config).unwrap();
    let ctx = Context::new(client.clone());
    let endpoints = EndpointsController::new(&ctx);
    let slices = EndpointSliceController::new(&ctx);
    let stop = CancellationToken::new();
    ctx.informers.start(&stop);
    tokio::spawn(endpoints.run(2, stop.clone()));
    tokio::spawn(slices.run(2, stop.clone()));
    Cluster {
        _server: server,
        client,
        stop,
    }
}

/// Registers a Ready node in `zone` with `cpu` allocatable, as a kubelet does.
async fn register_node(client: &Client, name: &str, zone: &str, cpu: &str) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(ZONE_LABEL.into(), zone.into())])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    let nodes = client.api::<Node>(None);
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let now = serde_json::to_value(Time(Timestamp::now())).unwrap();
    let status = json!({"status": {
        "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
        "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

async fn create_service(
    client: &Client,
    name: &str,
    annotations: Option<BTreeMap<String, String>>,
) {
    let service = Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([("tier".into(), "front".into())])),
            annotations,
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".into(), name.into())])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::String("http".into())),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    client
        .api::<Service>(Some(NS))
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
}

/// Creates pod `name` of `app` on `node`, then writes its IP and readiness as a kubelet.
async fn create_pod(client: &Client, app: &str, name: &str, node: &str, ip: &str) {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([("app".into(), app.into())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "web".into(),
                image: Some("nginx:1.27".into()),
                ports: Some(vec![ContainerPort {
                    name: Some("http".into()),
                    container_port: 8080,
                    ..ContainerPort::default()
                }]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    };
    client
        .api::<Pod>(Some(NS))
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    client
        .api::<Pod>(Some(NS))
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    set_ready(client, name, true).await;
}

async fn set_ready(client: &Client, name: &str, ready: bool) {
    let now = serde_json::to_value(Time(Timestamp::now())).unwrap();
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": if ready { "True" } else { "False" },
        "lastTransitionTime": now,
    }]}});
    client
        .api::<Pod>(Some(NS))
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// The (ready, not ready) IPs of the Endpoints `name`, sorted.
async fn endpoint_ips(client: &Client, name: &str) -> Option<(Vec<String>, Vec<String>)> {
    let ep = client
        .api::<Endpoints>(Some(NS))
        .get_opt(name)
        .await
        .unwrap()?;
    let mut ready = Vec::new();
    let mut not_ready = Vec::new();
    for s in ep.subsets.as_deref().unwrap_or_default() {
        for p in s.ports.as_deref().unwrap_or_default() {
            assert_eq!(
                p.port, 8080,
                "the named target port resolves to the container port"
            );
        }
        ready.extend(s.addresses.iter().flatten().map(|a| a.ip.clone()));
        not_ready.extend(s.not_ready_addresses.iter().flatten().map(|a| a.ip.clone()));
    }
    ready.sort();
    not_ready.sort();
    Some((ready, not_ready))
}

async fn slices_of(client: &Client, service: &str) -> Vec<EndpointSlice> {
    let params = ListParams {
        label_selector: Some(format!("kubernetes.io/service-name={service}")),
        ..ListParams::default()
    };
    client
        .api::<EndpointSlice>(Some(NS))
        .list(&params)
        .await
        .unwrap()
        .items
}

/// One endpoint of a Service's slices, as the tests look at it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointRow {
    ip: String,
    ready: bool,
    serving: bool,
    terminating: bool,
    zone: Option<String>,
    hint: Option<String>,
}

async fn slice_endpoints(client: &Client, service: &str) -> Vec<EndpointRow> {
    let mut rows: Vec<EndpointRow> = slices_of(client, service)
        .await
        .iter()
        .flat_map(|s| s.endpoints.clone())
        .map(|e| {
            let c = e.conditions.unwrap_or_default();
            let hint = e
                .hints
                .and_then(|h| h.for_zones)
                .and_then(|z| z.first().map(|z| z.name.clone()));
            EndpointRow {
                ip: e.addresses[0].clone(),
                ready: c.ready.unwrap_or(true),
                serving: c.serving.unwrap_or(true),
                terminating: c.terminating.unwrap_or(false),
                zone: e.zone,
                hint,
            }
        })
        .collect();
    rows.sort();
    rows
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_pods_become_endpoints_and_an_unready_pod_moves() {
    let c = cluster().await;
    register_node(&c.client, "node-a", "zone-a", "4").await;
    create_service(&c.client, "web", None).await;
    for (i, name) in ["web-0", "web-1", "web-2"].iter().enumerate() {
        create_pod(
            &c.client,
            "web",
            name,
            "node-a",
            &format!("10.244.0.{}", i + 10),
        )
        .await;
    }
    let all = strings(&["10.244.0.10", "10.244.0.11", "10.244.0.12"]);

    // Endpoints: all three ready, managed-by label set.
    common::eventually(
        CONVERGE_TIMEOUT,
        "three ready addresses in the Endpoints",
        || async {
            (endpoint_ips(&c.client, "web").await? == (all.clone(), Vec::new())).then_some(())
        },
    )
    .await;
    let ep = c
        .client
        .api::<Endpoints>(Some(NS))
        .get("web")
        .await
        .unwrap();
    let labels = ep.metadata.labels.unwrap();
    assert_eq!(labels[MANAGED_BY_LABEL], "endpoint-controller");
    assert_eq!(labels["tier"], "front");

    // One EndpointSlice with all three, ready and serving, in zone-a, port 8080.
    let rows = common::eventually(
        CONVERGE_TIMEOUT,
        "three ready endpoints in one slice",
        || async {
            let rows = slice_endpoints(&c.client, "web").await;
            (rows.len() == 3 && rows.iter().all(|r| r.ready)).then_some(rows)
        },
    )
    .await;
    assert!(
        rows.iter()
            .all(|r| r.serving && r.zone.as_deref() == Some("zone-a") && r.hint.is_none())
    );
    let slices = slices_of(&c.client, "web").await;
    assert_eq!(slices.len(), 1);
    let slice = &slices[0];
    assert_eq!(slice.address_type, "IPv4");
    assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(8080));
    assert!(slice.metadata.name.as_deref().unwrap().starts_with("web-"));
    let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Service", "web")
    );
    assert_eq!(
        slice.metadata.labels.as_ref().unwrap()["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );

    // web-1 turns unready: it moves to notReadyAddresses, and its endpoint to ready=false.
    set_ready(&c.client, "web-1", false).await;
    common::eventually(
        CONVERGE_TIMEOUT,
        "web-1 not ready in the Endpoints",
        || async {
            let want = (
                strings(&["10.244.0.10", "10.244.0.12"]),
                strings(&["10.244.0.11"]),
            );
            (endpoint_ips(&c.client, "web").await? == want).then_some(())
        },
    )
    .await;
    common::eventually(CONVERGE_TIMEOUT, "web-1 not ready in the slice", || async {
        let rows = slice_endpoints(&c.client, "web").await;
        let r = rows.iter().find(|r| r.ip == "10.244.0.11")?;
        (!r.ready && !r.serving && !r.terminating).then_some(())
    })
    .await;
    // Updated in place: still the one slice.
    let slices = slices_of(&c.client, "web").await;
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].metadata.name, slice.metadata.name);

    // A deleted pod with a grace period (no kubelet ends it) is terminating: it leaves the
    // Endpoints, and stays in the slice as serving but not ready, so that
    // proxies can drain it.
    let pods = c.client.api::<Pod>(Some(NS));
    pods.delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    common::eventually(CONVERGE_TIMEOUT, "web-0 terminating", || async {
        let (ready, _) = endpoint_ips(&c.client, "web").await?;
        let rows = slice_endpoints(&c.client, "web").await;
        let r = rows.iter().find(|r| r.ip == "10.244.0.10")?;
        (ready == strings(&["10.244.0.12"]) && !r.ready && r.serving && r.terminating).then_some(())
    })
    .await;
    // Gone for good: out of the slice too.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    pods.delete("web-0", &now).await.unwrap();
    common::eventually(CONVERGE_TIMEOUT, "web-0 gone", || async {
        let rows = slice_endpoints(&c.client, "web").await;
        (rows.len() == 2 && rows.iter().all(|r| r.ip != "10.244.0.10")).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_edits_are_reverted_and_deleted_objects_come_back() {
    let c = cluster().await;
    register_node(&c.client, "node-a", "zone-a", "4").await;
    create_service(&c.client, "api", None).await;
    create_pod(&c.client, "api", "api-0", "node-a", "10.244.1.10").await;
    let slice = common::eventually(CONVERGE_TIMEOUT, "the slice", || async {
        let slices = slices_of(&c.client, "api").await;
        (slices.len() == 1 && slices[0].endpoints.len() == 1).then(|| slices[0].clone())
    })
    .await;
    let name = slice.metadata.name.clone().unwrap();

    // Someone empties the slice: it is filled again.
    c.client
        .api::<EndpointSlice>(Some(NS))
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": []})),
        )
        .await
        .unwrap();
    common::eventually(CONVERGE_TIMEOUT, "the slice refilled", || async {
        let slices = slices_of(&c.client, "api").await;
        (slices.len() == 1 && slices[0].endpoints.len() == 1).then_some(())
    })
    .await;

    // Someone deletes the Endpoints: it is re-created.
    common::eventually(CONVERGE_TIMEOUT, "the Endpoints", || async {
        endpoint_ips(&c.client, "api").await
    })
    .await;
    c.client
        .api::<Endpoints>(Some(NS))
        .delete("api", &DeleteParams::default())
        .await
        .unwrap();
    common::eventually(CONVERGE_TIMEOUT, "the Endpoints re-created", || async {
        (endpoint_ips(&c.client, "api").await? == (strings(&["10.244.1.10"]), Vec::new()))
            .then_some(())
    })
    .await;

    // The Service goes: so does its Endpoints.
    c.client
        .api::<Service>(Some(NS))
        .delete("api", &DeleteParams::default())
        .await
        .unwrap();
    common::eventually(CONVERGE_TIMEOUT, "the Endpoints deleted", || async {
        endpoint_ips(&c.client, "api").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_mode_auto_hints_each_endpoint_for_its_zone() {
    let c = cluster().await;
    register_node(&c.client, "node-a", "zone-a", "2").await;
    register_node(&c.client, "node-b", "zone-b", "2").await;
    let annotations = BTreeMap::from([(TOPOLOGY_MODE_ANNOTATION.to_string(), "Auto".to_string())]);
    create_service(&c.client, "zonal", Some(annotations)).await;
    for (i, node) in ["node-a", "node-a", "node-b", "node-b"].iter().enumerate() {
        create_pod(
            &c.client,
            "zonal",
            &format!("zonal-{i}"),
            node,
            &format!("10.244.2.{}", i + 10),
        )
        .await;
    }
    // Equal CPU, two endpoints a zone: every endpoint hinted for its own zone.
    let rows = common::eventually(CONVERGE_TIMEOUT, "four hinted endpoints", || async {
        let rows = slice_endpoints(&c.client, "zonal").await;
        (rows.len() == 4 && rows.iter().all(|r| r.hint.is_some())).then_some(rows)
    })
    .await;
    for r in &rows {
        assert_eq!(r.zone, r.hint, "endpoint {} hinted for its own zone", r.ip);
    }

    // One pod of zone-b turns unready: 3 endpoints for 2 equal zones (1.5 each, minimum 2
    // within 20 %) cannot be hinted without overloading one; the hints go, all of them.
    set_ready(&c.client, "zonal-3", false).await;
    common::eventually(CONVERGE_TIMEOUT, "hints removed", || async {
        let rows = slice_endpoints(&c.client, "zonal").await;
        (rows.len() == 4 && rows.iter().all(|r| r.hint.is_none())).then_some(())
    })
    .await;
}

/// Reference: `docs/tricks.md` #27, expectations — a burst of pod events must not create a second
/// slice while the controller's first write is still on its way back through the watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pods_never_makes_a_second_slice() {
    let c = cluster().await;
    register_node(&c.client, "node-a", "zone-a", "4").await;
    // Every slice ever created for the Service, from a watch started before it exists.
    let created = Arc::new(Mutex::new(BTreeSet::new()));
    let params = WatchParams {
        label_selector: Some("kubernetes.io/service-name=burst".into()),
        ..WatchParams::default()
    };
    let mut events = c
        .client
        .api::<EndpointSlice>(Some(NS))
        .watch(&params)
        .await
        .unwrap();
    let seen = created.clone();
    tokio::spawn(async move {
        while let Some(Ok(event)) = events.next().await {
            if let WatchEvent::Added(slice) = event {
                seen.lock()
                    .unwrap()
                    .insert(slice.metadata.name.unwrap_or_default());
            }
        }
    });
    create_service(&c.client, "burst", None).await;
    let mut tasks = Vec::new();
    for i in 0..30 {
        let client = c.client.clone();
        tasks.push(tokio::spawn(async move {
            let ip = format!("10.244.3.{i}");
            create_pod(&client, "burst", &format!("burst-{i}"), "node-a", &ip).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    common::eventually(CONVERGE_TIMEOUT, "thirty ready endpoints", || async {
        let rows = slice_endpoints(&c.client, "burst").await;
        (rows.len() == 30 && rows.iter().all(|r| r.ready)).then_some(())
    })
    .await;
    // Let any late duplicate show up in the watch.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let created = created.lock().unwrap().clone();
    assert_eq!(
        created.len(),
        1,
        "30 endpoints fit one slice, created once: {created:?}"
    );
    assert_eq!(slices_of(&c.client, "burst").await.len(), 1);
}
