//! The node's registration, status and Lease against a real apiserver (`TestServer`),
//! written with a node's own credentials (`system:node:<name>` in `system:nodes`, bound to
//! the bootstrap `system:node` role): the Node is created with the host's real capacity and
//! allocatable after reservations; a second start reconciles the existing Node; the Lease is
//! renewed; a readiness change is posted at once while an unchanged status is not re-posted
//! before the report period; the podCIDR the IPAM controller sets reaches the CNI setup and
//! makes the node Ready.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, NodeCondition};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Client, ListParams, Patch, PatchParams, PostParams};
use skerry_node::cni::{self, CniConfig};
use skerry_node::machine::{EVICTION_HARD_DEFAULT, Reservations, meminfo_field};
use skerry_node::nodestatus::flags::{parse_node_labels, parse_taints};
use skerry_node::nodestatus::{
    Image, LeaseConfig, NODE_LEASE_NAMESPACE, NodeStatusConfig, NodeStatusManager, Readiness,
    RuntimeInfo, RuntimeVersion,
};
use tokio_util::sync::CancellationToken;

/// How long a test waits for the node agent. Generous: two cores shared with other builds.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How often [`eventually`] polls.
const POLL: Duration = Duration::from_millis(50);
/// The group every node's credentials carry.
const NODES_GROUP: &str = "system:nodes";

/// The runtime as the CRI client will answer: a version and two images.
struct FakeRuntime;

impl RuntimeInfo for FakeRuntime {
    fn version(&self) -> BoxFuture<'_, anyhow::Result<RuntimeVersion>> {
        Box::pin(async {
            Ok(RuntimeVersion {
                runtime_name: "containerd".into(),
                runtime_version: "1.6.20".into(),
            })
        })
    }
    fn list_images(&self) -> BoxFuture<'_, anyhow::Result<Vec<Image>>> {
        Box::pin(async {
            Ok(vec![
                Image {
                    id: "sha256:pause".into(),
                    repo_tags: vec!["registry.k8s.io/pause:3.10".into()],
                    repo_digests: vec![],
                    size: 300_000,
                },
                Image {
                    id: "sha256:busybox".into(),
                    repo_tags: vec!["skerry.test/busybox:1".into()],
                    repo_digests: vec!["skerry.test/busybox@sha256:aa".into()],
                    size: 2_000_000,
                },
            ])
        })
    }
}

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

fn admin(server: &TestServer) -> Client {
    client_with_cert(server, server.admin_cert_pem(), server.admin_key_pem())
}

/// A server, its admin, and the client of node `name` with the `system:node` role bound to
/// the nodes' group (Kubernetes binds it through the Node authorizer; the role's rules are
/// what a kubelet may do).
async fn setup(name: &str) -> (TestServer, Client, Client) {
    let server = TestServer::start().await.unwrap();
    let admin = admin(&server);
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("test-nodes".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "system:node".into(),
        },
        subjects: Some(vec![Subject {
            kind: "Group".into(),
            name: NODES_GROUP.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
    };
    admin
        .api::<ClusterRoleBinding>(None)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let (cert, key) = server
        .issue_client_cert(&format!("system:node:{name}"), &[NODES_GROUP])
        .unwrap();
    let node = client_with_cert(&server, &cert, &key);
    (server, admin, node)
}

fn config(name: &str, root: &std::path::Path) -> NodeStatusConfig {
    let mut config = NodeStatusConfig::new(name, root.to_path_buf());
    config.reservations = Reservations::parse(
        "cpu=100m,memory=256Mi,ephemeral-storage=1Gi,pid=1000",
        "memory=128Mi",
        EVICTION_HARD_DEFAULT,
    )
    .unwrap();
    config.node_labels = parse_node_labels("tier=edge,node.kubernetes.io/pool=a").unwrap();
    config.register_with_taints = parse_taints("dedicated=edge:NoSchedule").unwrap();
    config.status_update_frequency = Duration::from_millis(200);
    config.lease = LeaseConfig {
        renew_interval: Duration::from_millis(200),
        ..LeaseConfig::default()
    };
    config
}

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

fn condition<'a>(node: &'a Node, kind: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
}

fn quantity(node: &Node, list: &str, name: &str) -> String {
    let status = node.status.as_ref().unwrap();
    let map = match list {
        "capacity" => status.capacity.as_ref(),
        _ => status.allocatable.as_ref(),
    };
    map.unwrap()[name].0.clone()
}

/// Bytes of a `<n>Ki` / `<n>Mi` / plain quantity (what the node status writes for bytes).
fn bytes(q: &str) -> u128 {
    for (suffix, mult) in [("Ki", 1u128 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)] {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u128>().unwrap() * mult;
        }
    }
    q.parse().unwrap()
}

/// Millicores of `2` / `1900m`.
fn millis(q: &str) -> u128 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => q.parse::<u128>().unwrap() * 1000,
    }
}

fn start(manager: NodeStatusManager) -> (Arc<NodeStatusManager>, CancellationToken) {
    let manager = Arc::new(manager);
    let stop = CancellationToken::new();
    tokio::spawn(manager.clone().run(stop.clone()));
    (manager, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_creates_the_node_with_the_hosts_capacity() {
    let (_server, admin, node_client) = setup("edge-1").await;
    let root = tempfile::tempdir().unwrap();
    let manager = NodeStatusManager::new(
        node_client,
        config("edge-1", root.path()),
        Arc::new(FakeRuntime),
        Readiness::new(),
    )
    .unwrap();
    let (_manager, stop) = start(manager);
    let nodes = admin.api::<Node>(None);
    let node = eventually("the Node", || async {
        nodes
            .get_opt("edge-1")
            .await
            .unwrap()
            .filter(|n| condition(n, "Ready").is_some())
    })
    .await;

    let labels = node.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], "edge-1");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(
        labels["kubernetes.io/arch"],
        std::env::consts::ARCH
            .replace("x86_64", "amd64")
            .replace("aarch64", "arm64")
    );
    assert_eq!(labels["tier"], "edge");
    assert_eq!(labels["node.kubernetes.io/pool"], "a");
    let taints = node.spec.as_ref().unwrap().taints.as_ref().unwrap();
    assert_eq!(taints[0].key, "dedicated");
    assert_eq!(taints[0].effect, "NoSchedule");

    // Capacity: the CPUs this process may use and MemTotal, read independently here.
    let cpus = std::thread::available_parallelism().unwrap().get() as u128;
    assert_eq!(millis(&quantity(&node, "capacity", "cpu")), cpus * 1000);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let mem_total = u128::from(meminfo_field(&meminfo, "MemTotal").unwrap());
    assert_eq!(bytes(&quantity(&node, "capacity", "memory")), mem_total);
    assert_eq!(quantity(&node, "capacity", "pods"), "110");
    let storage = bytes(&quantity(&node, "capacity", "ephemeral-storage"));
    assert!(storage > 0);

    // Allocatable: cpu minus 100m; memory minus 256Mi + 128Mi + the 100Mi eviction threshold
    // and the hugepages; storage minus 1Gi and the 10 % eviction threshold.
    assert_eq!(
        millis(&quantity(&node, "allocatable", "cpu")),
        cpus * 1000 - 100
    );
    let hugepages: u128 = node
        .status
        .as_ref()
        .unwrap()
        .capacity
        .as_ref()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("hugepages-"))
        .map(|(_, v)| bytes(&v.0))
        .sum();
    assert_eq!(
        bytes(&quantity(&node, "allocatable", "memory")),
        mem_total - (256 << 20) - (128 << 20) - (100 << 20) - hugepages
    );
    assert_eq!(
        bytes(&quantity(&node, "allocatable", "ephemeral-storage")),
        storage - (1 << 30) - (storage / 10)
    );

    let status = node.status.as_ref().unwrap();
    let info = status.node_info.as_ref().unwrap();
    assert_eq!(info.container_runtime_version, "containerd://1.6.20");
    assert_eq!(
        info.boot_id,
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim()
    );
    assert_eq!(
        info.machine_id,
        std::fs::read_to_string("/etc/machine-id").unwrap().trim()
    );
    assert_eq!(info.operating_system, "linux");
    assert!(info.kubelet_version.starts_with("v1.32."));
    assert!(!info.kernel_version.is_empty() && !info.os_image.is_empty());
    let addresses = status.addresses.as_ref().unwrap();
    assert_eq!(addresses[0].type_, "InternalIP");
    let ip: std::net::IpAddr = addresses[0].address.parse().unwrap();
    assert!(!ip.is_loopback());
    assert_eq!(addresses[1].type_, "Hostname");
    assert_eq!(addresses[1].address, "edge-1");
    assert_eq!(
        status
            .daemon_endpoints
            .as_ref()
            .unwrap()
            .kubelet_endpoint
            .as_ref()
            .unwrap()
            .port,
        10250
    );
    let images = status.images.as_ref().unwrap();
    assert_eq!(images.len(), 2);
    assert_eq!(
        images[0].names.as_deref().unwrap(),
        ["skerry.test/busybox@sha256:aa", "skerry.test/busybox:1"],
        "the largest image first, digests before tags"
    );

    // Not ready until the runtime and the network say so, with upstream's words.
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some(
            "[container runtime status check may not have completed yet, container runtime \
             network not ready: NetworkReady=false reason:NetworkPluginNotReady message:network \
             plugin is not ready: cni config uninitialized]"
        )
    );
    let memory = condition(&node, "MemoryPressure").unwrap();
    assert_eq!(memory.status, "False");
    assert_eq!(memory.reason.as_deref(), Some("KubeletHasSufficientMemory"));
    assert_eq!(
        condition(&node, "PIDPressure").unwrap().reason.as_deref(),
        Some("KubeletHasSufficientPID")
    );

    // The kubelet's first events, about its Node, from `kubelet` on `edge-1`.
    let events = admin.api::<Event>(Some("default"));
    let event = eventually("the NodeHasSufficientMemory event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("NodeHasSufficientMemory"))
    })
    .await;
    assert_eq!(
        event.message.as_deref(),
        Some("Node edge-1 status is now: NodeHasSufficientMemory")
    );
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(event.involved_object.name.as_deref(), Some("edge-1"));
    let source = event.source.unwrap();
    assert_eq!(source.component.as_deref(), Some("kubelet"));
    assert_eq!(source.host.as_deref(), Some("edge-1"));
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_reconciles_the_existing_node() {
    let (_server, admin, node_client) = setup("edge-2").await;
    let root = tempfile::tempdir().unwrap();
    let first = NodeStatusManager::new(
        node_client.clone(),
        config("edge-2", root.path()),
        Arc::new(FakeRuntime),
        Readiness::new(),
    )
    .unwrap();
    let stop = CancellationToken::new();
    assert!(first.register(&stop).await);
    let nodes = admin.api::<Node>(None);
    let created = nodes.get("edge-2").await.unwrap();

    // Someone removed a default label and a device plugin advertised a resource.
    nodes
        .patch(
            "edge-2",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"kubernetes.io/os": null, "user": "kept"}}}),
            ),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            "edge-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": {"example.com/gpu": "2"},
                "allocatable": {"example.com/gpu": "2"},
            }})),
        )
        .await
        .unwrap();

    // The restarted kubelet: its create meets AlreadyExists, and it reconciles instead of
    // failing.
    let second = NodeStatusManager::new(
        node_client,
        config("edge-2", root.path()),
        Arc::new(FakeRuntime),
        Readiness::new(),
    )
    .unwrap();
    let node = second.initial_node().await;
    second.try_register(node).await.unwrap();
    let node = nodes.get("edge-2").await.unwrap();
    assert_eq!(
        node.metadata.uid, created.metadata.uid,
        "the same Node, not a new one"
    );
    let labels = node.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels["kubernetes.io/os"], "linux",
        "the default label is back"
    );
    assert_eq!(labels["user"], "kept", "other labels are left alone");
    assert_eq!(quantity(&node, "capacity", "example.com/gpu"), "0");
    assert_eq!(quantity(&node, "allocatable", "example.com/gpu"), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_renewed_and_owned_by_the_node() {
    let (_server, admin, node_client) = setup("edge-3").await;
    let root = tempfile::tempdir().unwrap();
    let manager = NodeStatusManager::new(
        node_client,
        config("edge-3", root.path()),
        Arc::new(FakeRuntime),
        Readiness::new(),
    )
    .unwrap();
    let (_manager, stop) = start(manager);
    let leases = admin.api::<Lease>(Some(NODE_LEASE_NAMESPACE));
    let first = eventually("the node Lease", || async {
        leases.get_opt("edge-3").await.unwrap()
    })
    .await;
    let spec = first.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("edge-3"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let node = admin.api::<Node>(None).get("edge-3").await.unwrap();
    let owner = &first.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.kind, "Node");
    assert_eq!(owner.api_version, "v1");
    assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());
    let first_renew = spec.renew_time.clone().unwrap().0;
    // Renewed every 200 ms here: within a few seconds the renewTime has moved several times.
    let mut seen = vec![first_renew];
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while seen.len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "renewTime did not advance: {seen:?}"
        );
        let lease = leases.get("edge-3").await.unwrap();
        let renew = lease.spec.unwrap().renew_time.unwrap().0;
        assert!(renew >= *seen.last().unwrap(), "renewTime went back");
        if renew > *seen.last().unwrap() {
            seen.push(renew);
        }
        tokio::time::sleep(POLL).await;
    }
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_posted_at_once_and_an_unchanged_status_waits_for_the_report_period() {
    let (_server, admin, node_client) = setup("edge-4").await;
    let root = tempfile::tempdir().unwrap();
    let mut config = config("edge-4", root.path());
    // Computed every 200 ms, but an unchanged status is posted at most once an hour.
    config.status_report_frequency = Duration::from_secs(3600);
    // A sync loop this slow would take a minute to notice: changes must not wait for it.
    config.status_update_frequency = Duration::from_secs(60);
    let readiness = Readiness::new();
    let manager = NodeStatusManager::new(
        node_client,
        config,
        Arc::new(FakeRuntime),
        readiness.clone(),
    )
    .unwrap();
    let (_manager, stop) = start(manager);
    let nodes = admin.api::<Node>(None);
    eventually("the Node", || async {
        nodes
            .get_opt("edge-4")
            .await
            .unwrap()
            .filter(|n| condition(n, "Ready").is_some())
    })
    .await;

    readiness.set_runtime_up();
    readiness.set_network_ready();
    let started = tokio::time::Instant::now();
    let node = eventually("Ready=True", || async {
        let node = nodes.get("edge-4").await.unwrap();
        (condition(&node, "Ready").unwrap().status == "True").then_some(node)
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "posted at once, not at the next 60 s sync"
    );
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some("kubelet is posting ready status")
    );

    // Nothing changes: the Node is not written again (its resourceVersion stays).
    let rv = node.metadata.resource_version.clone();
    readiness.set_runtime_up(); // no change: no wake-up, no post
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = nodes.get("edge-4").await.unwrap();
    assert_eq!(
        again.metadata.resource_version, rv,
        "an unchanged status is not re-posted"
    );

    readiness.set_runtime_down(None);
    let node = eventually("Ready=False", || async {
        let node = nodes.get("edge-4").await.unwrap();
        (condition(&node, "Ready").unwrap().status == "False").then_some(node)
    })
    .await;
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
    assert_eq!(ready.message.as_deref(), Some("container runtime is down"));
    assert!(ready.last_transition_time > condition(&again, "Ready").unwrap().last_transition_time);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_status_is_posted_again_after_the_report_period() {
    let (_server, admin, node_client) = setup("edge-5").await;
    let root = tempfile::tempdir().unwrap();
    let mut config = config("edge-5", root.path());
    config.status_report_frequency = Duration::from_secs(1);
    let manager =
        NodeStatusManager::new(node_client, config, Arc::new(FakeRuntime), Readiness::new())
            .unwrap();
    let (_manager, stop) = start(manager);
    let nodes = admin.api::<Node>(None);
    let node = eventually("the Node", || async {
        nodes
            .get_opt("edge-5")
            .await
            .unwrap()
            .filter(|n| condition(n, "Ready").is_some())
    })
    .await;
    let heartbeat = condition(&node, "Ready")
        .unwrap()
        .last_heartbeat_time
        .clone();
    let transition = condition(&node, "Ready")
        .unwrap()
        .last_transition_time
        .clone();
    let node = eventually("a later heartbeat", || async {
        let node = nodes.get("edge-5").await.unwrap();
        (condition(&node, "Ready").unwrap().last_heartbeat_time > heartbeat).then_some(node)
    })
    .await;
    assert_eq!(
        condition(&node, "Ready").unwrap().last_transition_time,
        transition,
        "a heartbeat is not a transition"
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_cidr_reaches_the_cni_setup_and_the_node_turns_ready() {
    let (_server, admin, node_client) = setup("edge-6").await;
    let root = tempfile::tempdir().unwrap();
    // The plugins as files: this test is about the wiring; `nodestatus_cni.rs` runs the real
    // ones.
    let plugins = root.path().join("bin");
    std::fs::create_dir_all(&plugins).unwrap();
    for p in cni::REQUIRED_PLUGINS {
        std::fs::write(plugins.join(p), b"").unwrap();
    }
    let cni_config = CniConfig {
        plugin_dir: plugins,
        ..CniConfig::under(root.path())
    };
    let readiness = Readiness::new();
    readiness.set_runtime_up();
    let mut config = config("edge-6", root.path());
    config.status_update_frequency = Duration::from_secs(60);
    let manager = NodeStatusManager::new(
        node_client,
        config,
        Arc::new(FakeRuntime),
        readiness.clone(),
    )
    .unwrap()
    .with_pod_cidr_handler(cni::pod_cidr_handler(cni_config.clone(), readiness.clone()));
    let (_manager, stop) = start(manager);
    let nodes = admin.api::<Node>(None);
    let node = eventually("the Node", || async {
        nodes
            .get_opt("edge-6")
            .await
            .unwrap()
            .filter(|n| condition(n, "Ready").is_some())
    })
    .await;
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .as_deref()
            .unwrap()
            .ends_with("message:network plugin is not ready: cni config uninitialized")
    );
    assert!(!cni_config.conflist_path().exists());

    // The IPAM controller's patch, as it sends it.
    nodes
        .patch(
            "edge-6",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"podCIDR": "10.42.7.0/24", "podCIDRs": ["10.42.7.0/24"]}}),
            ),
        )
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    eventually("Ready=True", || async {
        let node = nodes.get("edge-6").await.unwrap();
        (condition(&node, "Ready").unwrap().status == "True").then_some(())
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the own-node watch wakes the loop, not the 60 s sync"
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cni_config.conflist_path()).unwrap()).unwrap();
    assert_eq!(
        written["plugins"][0]["ipam"]["ranges"][0][0],
        json!({"subnet": "10.42.7.0/24", "gateway": "10.42.7.1"})
    );
    stop.cancel();
}
