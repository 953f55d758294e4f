//! The scheduler against a real apiserver (`TestServer`): nodes and pods created through the
//! API, no kubelet. The scheduler runs with its real identity, `system:kube-scheduler` (a
//! client certificate the test server issues), so the bootstrap RBAC role is exercised as in
//! `skerry server`: list/watch pods, nodes, PDBs and namespaces, `pods/binding`,
//! `pods/status`, events.
//!
//! What it shows: pods are bound within seconds and spread by LeastAllocated; a pod too big
//! for every node gets kube-scheduler's FailedScheduling message and a `PodScheduled=False`
//! condition and stays pending; adding a big enough node schedules it (the queue moves it on
//! the NodeAdd event); a nodeSelector pod lands on the labelled node; the Lease-elected
//! scheduler binds pods too.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, Event, Node, NodeStatus, Pod, PodSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::leaderelection::LeaderElectionConfig;
use skerry_client::{Client, ListParams, Patch, PatchParams, PostParams};
use skerry_scheduler::metrics::{self, AttemptResult};
use skerry_scheduler::scheduler::{self, Scheduler};
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

/// The scheduler's identity in `skerry server` (bound to `system:kube-scheduler`).
const SCHEDULER_USER: &str = "system:kube-scheduler";

/// How long a test waits for the scheduler. Generous: two cores shared with other builds;
/// binding itself takes milliseconds.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of `server` authenticating with a client certificate, unthrottled.
fn client_with_cert(server: &TestServer, cert_pem: &str, key_pem: &str) -> Client {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: cert_pem.to_string(),
        key_pem: key_pem.to_string(),
    };
    config.qps = 0.0;
    Client::new(config).unwrap()
}

struct Cluster {
    _server: TestServer,
    /// The admin: what the test itself reads and writes with.
    admin: Client,
    /// The scheduler's own client.
    scheduler_client: Client,
    stop: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn cluster() -> Cluster {
    let server = TestServer::start().await.unwrap();
    let admin = client_with_cert(&server, server.admin_cert_pem(), server.admin_key_pem());
    let (cert, key) = server.issue_client_cert(SCHEDULER_USER, &[]).unwrap();
    let scheduler_client = client_with_cert(&server, &cert, &key);
    Cluster {
        _server: server,
        admin,
        scheduler_client,
        stop: CancellationToken::new(),
    }
}

impl Cluster {
    /// Starts a scheduler with the default plugins (seeded, so ties break the same way).
    fn start_scheduler(&self) -> Arc<Scheduler> {
        let config = scheduler::Config {
            seed: Some(1),
            ..scheduler::Config::default()
        };
        let scheduler = Scheduler::new(self.scheduler_client.clone(), config).unwrap();
        tokio::spawn(scheduler.clone().run(self.stop.clone()));
        scheduler
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

/// Registers a Ready node with `cpu` and `memory` allocatable and room for 110 pods, as a
/// kubelet would (create, then the status).
async fn create_node(
    client: &Client,
    name: &str,
    cpu: &str,
    memory: &str,
    labels: &[(&str, &str)],
) {
    let mut all_labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    all_labels.insert("kubernetes.io/hostname".into(), name.into());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(all_labels),
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
    let allocatable = quantities(&[("cpu", cpu), ("memory", memory), ("pods", "110")]);
    let status = NodeStatus {
        allocatable: Some(allocatable.clone()),
        capacity: Some(allocatable),
        ..NodeStatus::default()
    };
    let mut status = serde_json::to_value(status).unwrap();
    status["conditions"] = json!([{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]);
    client
        .api::<Node>(None)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap();
}

/// A pending pod requesting `cpu` and `memory`.
fn pod(name: &str, cpu: &str, memory: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("pause:3.10".into()),
                resources: Some(ResourceRequirements {
                    requests: Some(quantities(&[("cpu", cpu), ("memory", memory)])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

async fn create_pod(client: &Client, pod: &Pod) {
    client
        .api::<Pod>(Some(NS))
        .create(&PostParams::default(), pod)
        .await
        .unwrap();
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after [`CONVERGE_TIMEOUT`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + CONVERGE_TIMEOUT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn node_of(client: &Client, name: &str) -> Option<String> {
    let pod = client.api::<Pod>(Some(NS)).get(name).await.unwrap();
    pod.spec?.node_name.filter(|n| !n.is_empty())
}

/// The events about pod `name` with `reason`.
async fn events_for(client: &Client, name: &str, reason: &str) -> Vec<Event> {
    client
        .api::<Event>(Some(NS))
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_bound_and_spread_by_least_allocated() {
    let cluster = cluster().await;
    for name in ["node-a", "node-b", "node-c"] {
        create_node(&cluster.admin, name, "4", "8Gi", &[]).await;
    }
    let scheduler = cluster.start_scheduler();
    let before =
        metrics::schedule_attempts(scheduler::DEFAULT_SCHEDULER_NAME, AttemptResult::Scheduled);
    // Six identical pods, each an eighth of a node's CPU and memory: after each
    // one, the node it went to scores lower under LeastAllocated, so the next goes elsewhere.
    for i in 0..6 {
        create_pod(&cluster.admin, &pod(&format!("web-{i}"), "500m", "1Gi")).await;
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..6 {
        let name = format!("web-{i}");
        let node = eventually(&format!("{name} bound"), || node_of(&cluster.admin, &name)).await;
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(
        per_node,
        BTreeMap::from([
            ("node-a".to_string(), 2),
            ("node-b".to_string(), 2),
            ("node-c".to_string(), 2)
        ]),
        "LeastAllocated spreads identical pods evenly"
    );
    // The binding set PodScheduled=True, and the scheduler said where each pod went.
    let bound = cluster
        .admin
        .api::<Pod>(Some(NS))
        .get("web-0")
        .await
        .unwrap();
    let condition = bound
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "PodScheduled"))
        .unwrap();
    assert_eq!(condition.status, "True");
    let node = node_of(&cluster.admin, "web-0").await.unwrap();
    let events = eventually("a Scheduled event", || async {
        let events = events_for(&cluster.admin, "web-0", "Scheduled").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(
        events[0].message.as_deref(),
        Some(format!("Successfully assigned default/web-0 to {node}").as_str())
    );
    assert_eq!(events[0].type_.as_deref(), Some("Normal"));
    assert_eq!(scheduler.stats().scheduled(), 6);
    assert!(
        metrics::schedule_attempts(scheduler::DEFAULT_SCHEDULER_NAME, AttemptResult::Scheduled)
            >= before + 6
    );
    assert!(metrics::encode_text().contains("scheduler_pending_pods{queue=\"active\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_too_big_waits_with_the_reasons_until_a_node_fits() {
    let cluster = cluster().await;
    for name in ["node-a", "node-b", "node-c"] {
        create_node(&cluster.admin, name, "4", "8Gi", &[]).await;
    }
    let scheduler = cluster.start_scheduler();
    create_pod(&cluster.admin, &pod("huge", "16", "1Gi")).await;

    let events = eventually("a FailedScheduling event", || async {
        let events = events_for(&cluster.admin, "huge", "FailedScheduling").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    let message = events[0].message.clone().unwrap();
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    // kube-scheduler's message: the per-filter reasons, then what preemption said (no pod
    // runs, so no victims anywhere).
    assert!(
        message.starts_with("0/3 nodes are available: 3 Insufficient cpu."),
        "{message}"
    );
    assert!(
        message.contains(" preemption: 0/3 nodes are available"),
        "{message}"
    );

    // PodScheduled=False, reason Unschedulable, the same message; no node.
    let condition = eventually("PodScheduled=False", || async {
        let pod = cluster
            .admin
            .api::<Pod>(Some(NS))
            .get("huge")
            .await
            .unwrap();
        pod.status
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == "PodScheduled"))
    })
    .await;
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason.as_deref(), Some("Unschedulable"));
    assert_eq!(condition.message.as_deref(), Some(message.as_str()));
    assert_eq!(node_of(&cluster.admin, "huge").await, None);
    assert!(scheduler.stats().unschedulable() >= 1);

    // A node big enough arrives: the NodeAdd event moves the pod out of unschedulablePods.
    create_node(&cluster.admin, "node-big", "32", "64Gi", &[]).await;
    let node = eventually("huge bound", || node_of(&cluster.admin, "huge")).await;
    assert_eq!(node, "node-big");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_selector_pod_lands_on_the_labelled_node() {
    let cluster = cluster().await;
    create_node(&cluster.admin, "node-a", "4", "8Gi", &[]).await;
    create_node(&cluster.admin, "node-b", "4", "8Gi", &[("disktype", "ssd")]).await;
    create_node(&cluster.admin, "node-c", "4", "8Gi", &[]).await;
    cluster.start_scheduler();
    for i in 0..3 {
        let mut p = pod(&format!("db-{i}"), "100m", "128Mi");
        p.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
            "disktype".to_string(),
            "ssd".to_string(),
        )]));
        create_pod(&cluster.admin, &p).await;
    }
    for i in 0..3 {
        let name = format!("db-{i}");
        let node = eventually(&format!("{name} bound"), || node_of(&cluster.admin, &name)).await;
        assert_eq!(node, "node-b");
    }

    // No node has the label: the reason is NodeAffinity's.
    let mut p = pod("nowhere", "100m", "128Mi");
    p.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
        "disktype".to_string(),
        "nvme".to_string(),
    )]));
    create_pod(&cluster.admin, &p).await;
    let events = eventually("a FailedScheduling event", || async {
        let events = events_for(&cluster.admin, "nowhere", "FailedScheduling").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    let message = events[0].message.clone().unwrap();
    assert!(
        message.starts_with(
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
        ),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_elected_scheduler_binds_pods() {
    let cluster = cluster().await;
    create_node(&cluster.admin, "node-a", "4", "8Gi", &[]).await;
    let mut election = LeaderElectionConfig::new(
        scheduler::LEASE_NAMESPACE,
        scheduler::LEASE_NAME,
        "scheduler-test-1",
    );
    election.lease_duration = Duration::from_secs(4);
    election.renew_deadline = Duration::from_secs(3);
    election.retry_period = Duration::from_millis(500);
    tokio::spawn(scheduler::run_leader_elected_with(
        cluster.scheduler_client.clone(),
        election,
        scheduler::Config::default(),
        cluster.stop.clone(),
    ));
    create_pod(&cluster.admin, &pod("elected", "100m", "128Mi")).await;
    let node = eventually("elected bound", || node_of(&cluster.admin, "elected")).await;
    assert_eq!(node, "node-a");
    let lease = cluster
        .admin
        .api::<k8s_openapi::api::coordination::v1::Lease>(Some(scheduler::LEASE_NAMESPACE))
        .get(scheduler::LEASE_NAME)
        .await
        .unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("scheduler-test-1")
    );
}
