//! Passes of the controller over caches the tests fill themselves, a fake apiserver and a
//! manual clock.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Status};
use parking_lot::Mutex;

use super::*;
use crate::nodelifecycle::health::REASON_NODE_STATUS_UNKNOWN;
use crate::nodelifecycle::taints::{MEMORY_PRESSURE, NO_SCHEDULE, UNSCHEDULABLE, condition};

fn start() -> Timestamp {
    Timestamp::from_second(1_700_000_000).unwrap()
}

fn api_error(code: i32, reason: &str) -> Error {
    Error::Api(Box::new(Status {
        code: Some(code),
        reason: Some(reason.into()),
        ..Status::default()
    }))
}

/// An apiserver in memory: nodes with optimistic concurrency, live leases, and a record of
/// every write.
#[derive(Default)]
struct FakeApi {
    nodes: Mutex<HashMap<String, Node>>,
    leases: Mutex<HashMap<String, Lease>>,
    lease_reads: AtomicUsize,
    fail_lease_reads: Mutex<bool>,
    status_writes: Mutex<Vec<String>>,
    node_writes: Mutex<Vec<String>>,
    deleted_pods: Mutex<Vec<String>>,
    resource_version: AtomicU64,
}

impl FakeApi {
    fn next_rv(&self) -> String {
        (self.resource_version.fetch_add(1, Ordering::SeqCst) + 100).to_string()
    }

    fn node(&self, name: &str) -> Node {
        self.nodes.lock()[name].clone()
    }

    fn write(&self, node: &Node, status: bool) -> Result<Node, Error> {
        let name = node.metadata.name.clone().unwrap();
        let mut nodes = self.nodes.lock();
        let Some(stored) = nodes.get(&name) else {
            return Err(api_error(404, "NotFound"));
        };
        if node.metadata.resource_version != stored.metadata.resource_version {
            return Err(api_error(409, "Conflict"));
        }
        let mut next = stored.clone();
        if status {
            next.status = node.status.clone();
        } else {
            next.spec = node.spec.clone();
        }
        next.metadata.resource_version = Some(self.next_rv());
        nodes.insert(name, next.clone());
        Ok(next)
    }
}

impl NodeLifecycleClient for FakeApi {
    fn get_lease<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Option<Lease>, Error>> {
        self.lease_reads.fetch_add(1, Ordering::SeqCst);
        let result = if *self.fail_lease_reads.lock() {
            Err(Error::Transport("connection refused".into()))
        } else {
            Ok(self.leases.lock().get(node).cloned())
        };
        Box::pin(async move { result })
    }
    fn get_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Node>, Error>> {
        let node = self.nodes.lock().get(name).cloned();
        Box::pin(async move { Ok(node) })
    }
    fn replace_node<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, Result<Node, Error>> {
        let result = self.write(node, false);
        if result.is_ok() {
            self.node_writes
                .lock()
                .push(node.metadata.name.clone().unwrap());
        }
        Box::pin(async move { result })
    }
    fn replace_node_status<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, Result<Node, Error>> {
        let result = self.write(node, true);
        if result.is_ok() {
            self.status_writes
                .lock()
                .push(node.metadata.name.clone().unwrap());
        }
        Box::pin(async move { result })
    }
    fn delete_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        _uid: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.deleted_pods.lock().push(format!("{namespace}/{name}"));
        Box::pin(async move { Ok(()) })
    }
}

struct Harness {
    api: Arc<FakeApi>,
    clock: Arc<ManualClock>,
    nodes: Indexer<Node>,
    leases: Indexer<Lease>,
    pods: Indexer<Pod>,
    controller: Arc<NodeLifecycleController>,
}

impl Harness {
    fn new() -> Harness {
        let api = Arc::new(FakeApi::default());
        let clock = Arc::new(ManualClock::new(start()));
        let (nodes, leases, pods) = (Indexer::new(), Indexer::new(), Indexer::new());
        let controller = NodeLifecycleController::from_parts(Parts {
            nodes: nodes.clone(),
            leases: leases.clone(),
            pods: pods.clone(),
            client: api.clone(),
            clock: clock.clone(),
            config: NodeLifecycleConfig::default(),
        })
        .unwrap();
        Harness {
            api,
            clock,
            nodes,
            leases,
            pods,
            controller,
        }
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn advance(&self, seconds: u64) {
        self.clock.advance(Duration::from_secs(seconds));
    }

    /// The kubelet posts a status: `ready` with a fresh heartbeat (its own clock, an hour
    /// off), and `taints` (NoExecute ones with the given `timeAdded`).
    fn post_node(&self, name: &str, ready: &str, taints: Vec<Taint>) {
        let heartbeat = Time(self.now().checked_add(Duration::from_secs(3_600)).unwrap());
        let mut node = self
            .api
            .nodes
            .lock()
            .get(name)
            .cloned()
            .unwrap_or_else(|| Node {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    uid: Some(format!("uid-{name}")),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            });
        node.spec = Some(NodeSpec {
            taints: Some(taints),
            ..NodeSpec::default()
        });
        node.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                reason: Some("KubeletReady".into()),
                last_heartbeat_time: Some(heartbeat.clone()),
                last_transition_time: Some(heartbeat),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        node.metadata.resource_version = Some(self.api.next_rv());
        self.api.nodes.lock().insert(name.into(), node);
        self.sync_caches();
    }

    /// Copies the apiserver's nodes into the cache: the informer catching up.
    fn sync_caches(&self) {
        for (name, node) in self.api.nodes.lock().iter() {
            self.nodes.upsert(name, Arc::new(node.clone()));
        }
    }

    /// The kubelet renews its Lease; `cache` says whether the informer sees it.
    fn renew_lease(&self, name: &str, cache: bool) {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NODE_LEASE_NAMESPACE.into()),
                resource_version: Some(self.api.next_rv()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.into()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(self.now())),
                ..LeaseSpec::default()
            }),
        };
        self.api.leases.lock().insert(name.into(), lease.clone());
        if cache {
            self.leases
                .upsert(&format!("{NODE_LEASE_NAMESPACE}/{name}"), Arc::new(lease));
        }
    }

    fn add_pod(&self, name: &str, node: &str, tolerations: Vec<Toleration>) {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                tolerations: Some(tolerations),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        self.pods.upsert(&format!("default/{name}"), Arc::new(pod));
    }

    /// One pass, then the informer catches up with what it wrote.
    async fn pass(&self) -> PassOutcome {
        let outcome = self.controller.monitor_node_health().await;
        self.sync_caches();
        for key in self.api.deleted_pods.lock().iter() {
            self.pods.remove(key);
        }
        outcome
    }

    async fn completed(&self) -> PassReport {
        match self.pass().await {
            PassOutcome::Completed(r) => r,
            PassOutcome::Aborted(a) => panic!("pass aborted: {a:?}"),
        }
    }

    fn no_execute_keys(&self, node: &str) -> Vec<String> {
        taints::taints_of(&self.api.node(node))
            .iter()
            .filter(|t| t.effect == NO_EXECUTE)
            .map(|t| t.key.clone())
            .collect()
    }

    fn deleted(&self) -> Vec<String> {
        let mut d = self.api.deleted_pods.lock().clone();
        d.sort();
        d
    }
}

fn unreachable_at(at: Timestamp) -> Taint {
    taints::taint(UNREACHABLE, NO_EXECUTE, Some(Time(at)))
}

fn tolerate_unreachable(seconds: Option<i64>) -> Toleration {
    Toleration {
        key: Some(UNREACHABLE.into()),
        operator: Some("Exists".into()),
        effect: Some(NO_EXECUTE.into()),
        toleration_seconds: seconds,
        ..Toleration::default()
    }
}

/// Two healthy nodes that keep heartbeating, so the zone is never fully disrupted.
fn healthy_pair(h: &Harness) {
    for n in ["healthy-1", "healthy-2"] {
        h.post_node(n, "True", vec![]);
        h.renew_lease(n, true);
    }
}

fn heartbeat_healthy(h: &Harness) {
    for n in ["healthy-1", "healthy-2"] {
        h.renew_lease(n, true);
    }
}

#[tokio::test]
async fn grace_period_then_unknown_through_the_status_subresource() {
    let h = Harness::new();
    healthy_pair(&h);
    h.post_node("n1", "True", vec![]);
    h.renew_lease("n1", true);
    assert_eq!(h.completed().await, PassReport::default());

    // 50 s of silence from n1 is exactly the grace period: nothing yet.
    h.advance(50);
    heartbeat_healthy(&h);
    let report = h.completed().await;
    assert!(report.marked_unknown.is_empty(), "{report:?}");

    h.advance(1);
    heartbeat_healthy(&h);
    let report = h.completed().await;
    assert_eq!(report.marked_unknown, vec!["n1"]);
    assert_eq!(
        report.lease_checks, 1,
        "the node's lease was confirmed live first"
    );
    assert_eq!(*h.api.status_writes.lock(), vec!["n1"]);
    let node = h.api.node("n1");
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.status, "Unknown");
    assert_eq!(ready.reason.as_deref(), Some(REASON_NODE_STATUS_UNKNOWN));
    for type_ in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(
            condition(&node, type_).unwrap().status,
            "Unknown",
            "{type_}"
        );
    }
    // In the same pass the node got its unreachable taint (the first token of the zone).
    assert_eq!(
        report.tainted,
        vec![("n1".to_string(), UNREACHABLE.to_string())]
    );
    assert_eq!(h.no_execute_keys("n1"), vec![UNREACHABLE]);
}

#[tokio::test]
async fn not_ready_and_unreachable_swap_and_ready_removes_both() {
    let h = Harness::new();
    healthy_pair(&h);
    h.post_node("n1", "False", vec![]);
    let report = h.completed().await;
    assert_eq!(
        report.tainted,
        vec![("n1".to_string(), NOT_READY.to_string())]
    );
    assert_eq!(h.no_execute_keys("n1"), vec![NOT_READY]);
    let added = taints::taints_of(&h.api.node("n1"))[0].time_added.clone();
    assert_eq!(
        added,
        Some(Time(h.now())),
        "timeAdded is the controller's clock"
    );

    // Ready goes Unknown: swapped at once, not waiting for the rate limiter (whose single
    // token was spent above).
    h.advance(1);
    let mut node = h.api.node("n1");
    let ready = node
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
        .unwrap();
    ready.status = "Unknown".into();
    node.metadata.resource_version = Some(h.api.next_rv());
    h.api.nodes.lock().insert("n1".into(), node);
    h.sync_caches();
    let report = h.completed().await;
    assert_eq!(
        report.tainted,
        vec![("n1".to_string(), UNREACHABLE.to_string())]
    );
    assert_eq!(
        report.untainted,
        vec![("n1".to_string(), NOT_READY.to_string())]
    );
    assert_eq!(h.no_execute_keys("n1"), vec![UNREACHABLE]);

    // And back to False: swapped back.
    h.advance(1);
    h.post_node("n1", "False", taints::taints_of(&h.api.node("n1")).to_vec());
    h.completed().await;
    assert_eq!(h.no_execute_keys("n1"), vec![NOT_READY]);

    // Ready: the taint comes off.
    h.advance(1);
    h.post_node("n1", "True", taints::taints_of(&h.api.node("n1")).to_vec());
    let report = h.completed().await;
    assert_eq!(
        report.untainted,
        vec![("n1".to_string(), NOT_READY.to_string())]
    );
    assert!(h.no_execute_keys("n1").is_empty());
}

#[tokio::test]
async fn first_taints_are_rate_limited_per_zone() {
    let h = Harness::new();
    for n in ["h1", "h2", "h3", "h4"] {
        h.post_node(n, "True", vec![]);
    }
    h.post_node("sick-1", "False", vec![]);
    h.post_node("sick-2", "False", vec![]);
    let report = h.completed().await;
    assert_eq!(report.tainted.len(), 1, "one node per token: {report:?}");
    h.advance(5);
    assert!(
        h.completed().await.tainted.is_empty(),
        "0.1 nodes/s: next token at 10 s"
    );
    h.advance(5);
    assert_eq!(h.completed().await.tainted.len(), 1);
    assert_eq!(h.no_execute_keys("sick-1"), vec![NOT_READY]);
    assert_eq!(h.no_execute_keys("sick-2"), vec![NOT_READY]);
}

#[tokio::test]
async fn partial_disruption_of_a_small_cluster_stops_tainting() {
    let h = Harness::new();
    for n in ["h1", "h2"] {
        h.post_node(n, "True", vec![]);
    }
    for n in ["s1", "s2", "s3"] {
        h.post_node(n, "False", vec![]);
    }
    // 3 of 5 not Ready = 60 % >= 55 %, in a cluster of at most 50 nodes: rate 0.
    let report = h.completed().await;
    assert!(report.tainted.is_empty(), "{report:?}");
    h.advance(100);
    assert!(h.completed().await.tainted.is_empty());
}

#[tokio::test]
async fn pods_that_do_not_tolerate_go_at_once_tolerating_ones_after_their_seconds() {
    let h = Harness::new();
    healthy_pair(&h);
    let t0 = h.now();
    h.post_node("n1", "Unknown", vec![unreachable_at(t0)]);
    h.add_pod("intolerant", "n1", vec![]);
    h.add_pod("patient", "n1", vec![tolerate_unreachable(Some(300))]);
    h.add_pod("forever", "n1", vec![tolerate_unreachable(None)]);
    h.add_pod("elsewhere", "healthy-1", vec![]);

    let report = h.completed().await;
    assert_eq!(report.evicted, vec!["default/intolerant"]);
    assert_eq!(
        report.lease_checks, 1,
        "n1's lease was confirmed before evicting"
    );

    h.advance(295);
    heartbeat_healthy(&h);
    assert!(h.completed().await.evicted.is_empty(), "295 s < 300 s");
    h.advance(5);
    heartbeat_healthy(&h);
    assert_eq!(h.completed().await.evicted, vec!["default/patient"]);
    h.advance(3_600);
    heartbeat_healthy(&h);
    assert!(h.completed().await.evicted.is_empty());
    assert_eq!(h.deleted(), vec!["default/intolerant", "default/patient"]);
}

#[tokio::test]
async fn full_disruption_stops_evictions_and_lifts_the_taints() {
    let h = Harness::new();
    let t0 = h.now();
    for n in ["n1", "n2", "n3"] {
        h.post_node(n, "Unknown", vec![unreachable_at(t0)]);
        h.add_pod(&format!("pod-{n}"), n, vec![]);
    }
    let report = h.completed().await;
    assert!(report.evicted.is_empty(), "{report:?}");
    assert!(h.deleted().is_empty());
    assert_eq!(
        report.untainted.len(),
        3,
        "the controller's taints come off: {report:?}"
    );
    assert_eq!(
        h.controller.state.lock().await.zone_states[""],
        ZoneState::FullDisruption
    );
    h.advance(600);
    let report = h.completed().await;
    assert!(
        report.evicted.is_empty() && report.tainted.is_empty(),
        "{report:?}"
    );

    // One node comes back: disruption mode ends, and everyone's silence restarts from now,
    // so nobody is marked or evicted for the outage itself.
    h.post_node("n1", "True", vec![]);
    let report = h.completed().await;
    assert!(report.evicted.is_empty(), "{report:?}");
    assert_eq!(
        h.controller.state.lock().await.zone_states[""],
        ZoneState::Normal
    );
}

#[tokio::test]
async fn a_stale_lease_cache_aborts_the_whole_pass() {
    let h = Harness::new();
    healthy_pair(&h);
    h.post_node("n1", "True", vec![]);
    h.renew_lease("n1", true);
    // A node whose pod is due for eviction, to show the *whole* pass stops.
    h.post_node("n2", "Unknown", vec![unreachable_at(h.now())]);
    h.add_pod("doomed", "n2", vec![]);
    h.renew_lease("n2", true);
    h.completed().await;
    assert_eq!(h.deleted(), vec!["default/doomed"]);
    h.add_pod("doomed-2", "n2", vec![]);

    // n1's kubelet keeps renewing its lease, but the informer stalls: the cache still holds
    // the old renewal, so n1 looks silent for 51 s.
    for _ in 0..10 {
        h.advance(6);
        h.renew_lease("n1", false);
        heartbeat_healthy(&h);
    }
    let writes_before = (
        h.api.status_writes.lock().len(),
        h.api.node_writes.lock().len(),
    );
    let outcome = h.pass().await;
    let PassOutcome::Aborted(aborted) = outcome else {
        panic!("expected an aborted pass, got {outcome:?}");
    };
    assert_eq!(aborted.node, "n1");
    assert!(aborted.reason.contains("renewed"), "{}", aborted.reason);
    assert_eq!(
        (
            h.api.status_writes.lock().len(),
            h.api.node_writes.lock().len()
        ),
        writes_before,
        "nothing written"
    );
    assert_eq!(
        condition(&h.api.node("n1"), "Ready").unwrap().status,
        "True"
    );
    assert_eq!(
        h.deleted(),
        vec!["default/doomed"],
        "no eviction anywhere in the cluster"
    );
    assert!(h.no_execute_keys("n1").is_empty());

    // The informer catches up: the renewal counts, n1 is healthy, and the pass goes on with
    // the eviction it held back.
    h.renew_lease("n1", true);
    let report = h.completed().await;
    assert!(report.marked_unknown.is_empty(), "{report:?}");
    assert_eq!(report.evicted, vec!["default/doomed-2"]);
}

#[tokio::test]
async fn a_failed_live_read_aborts_too() {
    let h = Harness::new();
    healthy_pair(&h);
    h.post_node("n1", "True", vec![]);
    h.completed().await;
    h.advance(51);
    heartbeat_healthy(&h);
    *h.api.fail_lease_reads.lock() = true;
    assert!(matches!(h.pass().await, PassOutcome::Aborted(_)));
    assert!(h.api.status_writes.lock().is_empty());
    *h.api.fail_lease_reads.lock() = false;
    assert_eq!(h.completed().await.marked_unknown, vec!["n1"]);
}

#[tokio::test]
async fn healthy_passes_read_nothing_live() {
    let h = Harness::new();
    healthy_pair(&h);
    for _ in 0..5 {
        h.advance(5);
        heartbeat_healthy(&h);
        assert_eq!(h.completed().await, PassReport::default());
    }
    assert_eq!(h.api.lease_reads.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn no_schedule_condition_taints_follow_conditions_through_conflicts() {
    let h = Harness::new();
    h.post_node(
        "n1",
        "True",
        vec![taints::taint("dedicated", NO_SCHEDULE, None)],
    );
    let mut node = h.api.node("n1");
    node.spec.as_mut().unwrap().unschedulable = Some(true);
    node.status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()
        .push(NodeCondition {
            type_: "MemoryPressure".into(),
            status: "True".into(),
            ..NodeCondition::default()
        });
    h.api.nodes.lock().insert("n1".into(), node);
    h.sync_caches();
    // The apiserver moves on behind the cache's back: the first write conflicts.
    let mut moved = h.api.node("n1");
    moved.metadata.resource_version = Some(h.api.next_rv());
    h.api.nodes.lock().insert("n1".into(), moved);

    h.controller.sync("n1").await.unwrap();
    let node = h.api.node("n1");
    let keys: Vec<(&str, &str)> = taints::taints_of(&node)
        .iter()
        .map(|t| (t.key.as_str(), t.effect.as_str()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("dedicated", NO_SCHEDULE),
            (MEMORY_PRESSURE, NO_SCHEDULE),
            (UNSCHEDULABLE, NO_SCHEDULE)
        ]
    );
    // Idempotent: a second sync writes nothing.
    h.sync_caches();
    let writes = h.api.node_writes.lock().len();
    h.controller.sync("n1").await.unwrap();
    assert_eq!(h.api.node_writes.lock().len(), writes);
}

#[test]
fn config_validation() {
    assert_eq!(NodeLifecycleConfig::default().validate(), Ok(()));
    let bad = NodeLifecycleConfig {
        node_monitor_period: Duration::from_secs(60),
        ..NodeLifecycleConfig::default()
    };
    assert!(matches!(
        bad.validate(),
        Err(ConfigError::MonitorPeriod { .. })
    ));
    let bad = NodeLifecycleConfig {
        unhealthy_zone_threshold: 1.5,
        ..NodeLifecycleConfig::default()
    };
    assert!(matches!(
        bad.validate(),
        Err(ConfigError::UnhealthyZoneThreshold(_))
    ));
    let bad = NodeLifecycleConfig {
        node_eviction_rate: -1.0,
        ..NodeLifecycleConfig::default()
    };
    assert!(matches!(bad.validate(), Err(ConfigError::EvictionRate(_))));
}
