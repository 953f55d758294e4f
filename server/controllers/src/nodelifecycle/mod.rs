//! The node lifecycle controller (kube-controller-manager's `pkg/controller/nodelifecycle`,
//! with the taint-based eviction of `pkg/controller/tainteviction` folded in): notices nodes
//! that stopped reporting, marks them `Unknown`, taints them, and evicts their pods once the
//! pods' tolerations run out.
//!
//! It carries `docs/tricks.md` #30, re-reading the lease live and aborting the pass when the
//! cache is stale. Everything here is decided from informer caches, and a cache that
//! silently stopped updating makes every node look dead at once. So every pass, before it
//! marks a node `Unknown`, adds a `NoExecute` taint or deletes a pod, re-reads the affected
//! nodes' Leases live from the apiserver; if any live Lease is newer than the cached one,
//! the whole pass is abandoned without a single write ([`lease_check`]).
//!
//! The pieces:
//! - every `node_monitor_period` a pass ([`NodeLifecycleController::monitor_node_health`])
//!   over all nodes: [`health`] turns the nodes' `Ready` heartbeats and Lease renewals into
//!   "last heard from" readings of the controller's own clock and marks nodes silent past
//!   their grace period `Unknown`; [`disruption`] judges each zone and rate-limits the
//!   `NoExecute` tainting (`not-ready` for `Ready=False`, `unreachable` for `Unknown`,
//!   swapped one for the other, removed when `Ready=True`); [`eviction`] deletes the pods
//!   that no longer tolerate their node's `NoExecute` taints;
//! - a work queue of node names, fed by node events, keeps the `NoSchedule` condition taints
//!   (TaintNodesByCondition, [`taints`]) in step with each node's conditions.
//!
//! Where to start: [`NodeLifecycleController::monitor_node_health`].
//!
//! Differences from Kubernetes, on purpose: a node's taints follow the `Ready` status *after*
//! the pass's own status write (Kubernetes taints one pass later); a status write that
//! conflicts is not retried in the same pass (the conflict is most likely the kubelet's own
//! heartbeat, and the next pass sees it); a node never heard from is timed from when the
//! controller first saw it rather than from its `creationTimestamp`; evictions run inside the
//! pass, so a `tolerationSeconds` deadline is met within one `node_monitor_period`; and pods
//! are deleted, without first being marked `NotReady` or given a `DisruptionTarget`
//! condition.

pub mod disruption;
pub mod eviction;
pub mod health;
pub mod lease_check;
pub mod taints;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use skerry_client::cache::Indexer;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::retry::{Backoff, retry_on_conflict};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, DeleteParams, Error, PostParams};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::Context;
use crate::runtime::{self, Reconciler};
use disruption::{ZoneState, ZoneTainter};
use health::NodeHealth;
use taints::{NO_EXECUTE, NOT_READY, UNREACHABLE};

/// How often a pass looks at every node: kube-controller-manager's `--node-monitor-period`
/// default. Shorter notices a dead node sooner but lists every node more often; it must stay
/// well under the grace period or the controller itself adds to the detection delay.
pub const DEFAULT_NODE_MONITOR_PERIOD: Duration = Duration::from_secs(5);

/// How long a running node may go unheard before it is marked `Unknown`:
/// `--node-monitor-grace-period`, 50 s since Kubernetes 1.32 (kubernetes/kubernetes#126287,
/// up from 40 s). It must exceed the kubelet's HTTP/2 health check — a read-idle timeout of
/// 30 s plus a ping timeout of 15 s, 45 s in all — so a kubelet whose connection died
/// silently can notice, reconnect and renew its Lease before it is declared dead; and it
/// must be several Lease renewals (10 s each) long so one lost renewal is not fatal.
pub const DEFAULT_NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(50);

/// How long a node that has never reported may stay silent: `--node-startup-grace-period`
/// (60 s). Longer than the running grace because a booting kubelet registers its Node
/// before it can post a first status.
pub const DEFAULT_NODE_STARTUP_GRACE_PERIOD: Duration = Duration::from_secs(60);

/// Nodes per second that get a `NoExecute` taint (and so have their pods evicted) in a
/// healthy zone: `--node-eviction-rate` (0.1, one node every 10 s), so an outage that is
/// really a misjudgement costs a few nodes' pods, not the cluster's.
pub const DEFAULT_NODE_EVICTION_RATE: f64 = 0.1;

/// The same in a partially disrupted zone of a large cluster: `--secondary-node-eviction-rate`
/// (0.01, one node every 100 s).
pub const DEFAULT_SECONDARY_NODE_EVICTION_RATE: f64 = 0.01;

/// Zones of at most this many nodes stop evicting altogether when partially disrupted,
/// instead of using the secondary rate: `--large-cluster-size-threshold` (50). In a small
/// cluster the surviving nodes could not absorb the evicted pods anyway.
pub const DEFAULT_LARGE_CLUSTER_SIZE_THRESHOLD: usize = 50;

/// The share of not-Ready nodes (with more than two of them) at which a zone counts as
/// partially disrupted: `--unhealthy-zone-threshold` (0.55). Past half a zone down, a
/// network or power problem is likelier than independent node failures, and evicting would
/// pile everything onto the remainder.
pub const DEFAULT_UNHEALTHY_ZONE_THRESHOLD: f64 = 0.55;

// A pass must run several times within a grace period, or the pass period, not the grace
// period, decides when a node is declared dead.
const _: () = assert!(
    DEFAULT_NODE_MONITOR_PERIOD.as_secs() * 5 <= DEFAULT_NODE_MONITOR_GRACE_PERIOD.as_secs()
);

/// The namespace of the kubelets' heartbeat Leases, one per node, named after the node.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The pod index by `spec.nodeName` (Kubernetes' `nodeNameKeyIndex`), so finding a node's
/// pods costs the node's pods rather than the cluster's.
pub const POD_NODE_NAME_INDEX: &str = "spec.nodeName";

/// Workers applying `NoSchedule` condition taints: Kubernetes' `nodeUpdateWorkerSize` (8).
/// Each node's taints are one small write; more workers only queue on the client's QPS.
pub const DEFAULT_WORKERS: usize = 8;

/// The schedule of one taint write that hits conflicts: after a 409 the node is read again
/// and the change recomputed, at most five runs, 100 ms apart stretched by up to 100 %
/// (Kubernetes' `UpdateTaintBackoff` in `pkg/controller/controller_utils.go`, which
/// `AddOrUpdateTaintOnNode` and `RemoveTaintOffNode` retry with). The jitter spreads the
/// controller's writes away from the kubelet's status writes it lost to.
pub const UPDATE_TAINT_BACKOFF: Backoff = Backoff {
    duration: Duration::from_millis(100),
    factor: 0.0,
    jitter: 1.0,
    steps: 5,
    cap: Duration::ZERO,
};

/// The controller's name (logs, work-queue metrics).
const NAME: &str = "node-lifecycle";

/// The controller's tunables; [`Default`] is Kubernetes 1.32's.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLifecycleConfig {
    /// How often a pass runs ([`DEFAULT_NODE_MONITOR_PERIOD`]).
    pub node_monitor_period: Duration,
    /// Silence before a running node is marked `Unknown`
    /// ([`DEFAULT_NODE_MONITOR_GRACE_PERIOD`]).
    pub node_monitor_grace_period: Duration,
    /// Silence before a node that never reported is marked `Unknown`
    /// ([`DEFAULT_NODE_STARTUP_GRACE_PERIOD`]).
    pub node_startup_grace_period: Duration,
    /// Nodes tainted per second in a healthy zone ([`DEFAULT_NODE_EVICTION_RATE`]).
    pub node_eviction_rate: f64,
    /// Nodes tainted per second in a partially disrupted large zone
    /// ([`DEFAULT_SECONDARY_NODE_EVICTION_RATE`]).
    pub secondary_node_eviction_rate: f64,
    /// Zone size up to which partial disruption stops evictions
    /// ([`DEFAULT_LARGE_CLUSTER_SIZE_THRESHOLD`]).
    pub large_cluster_size_threshold: usize,
    /// Share of not-Ready nodes making a zone partially disrupted
    /// ([`DEFAULT_UNHEALTHY_ZONE_THRESHOLD`]).
    pub unhealthy_zone_threshold: f64,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        NodeLifecycleConfig {
            node_monitor_period: DEFAULT_NODE_MONITOR_PERIOD,
            node_monitor_grace_period: DEFAULT_NODE_MONITOR_GRACE_PERIOD,
            node_startup_grace_period: DEFAULT_NODE_STARTUP_GRACE_PERIOD,
            node_eviction_rate: DEFAULT_NODE_EVICTION_RATE,
            secondary_node_eviction_rate: DEFAULT_SECONDARY_NODE_EVICTION_RATE,
            large_cluster_size_threshold: DEFAULT_LARGE_CLUSTER_SIZE_THRESHOLD,
            unhealthy_zone_threshold: DEFAULT_UNHEALTHY_ZONE_THRESHOLD,
        }
    }
}

/// A [`NodeLifecycleConfig`] that cannot work.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The pass period is zero or not shorter than the grace period.
    #[error(
        "node_monitor_period ({period:?}) must be positive and shorter than node_monitor_grace_period ({grace:?})"
    )]
    MonitorPeriod {
        /// The pass period.
        period: Duration,
        /// The grace period.
        grace: Duration,
    },
    /// An eviction rate is negative or not a number.
    #[error("eviction rates must be >= 0, got {0}")]
    EvictionRate(f64),
    /// The unhealthy-zone threshold is outside (0, 1].
    #[error("unhealthy_zone_threshold must be in (0, 1], got {0}")]
    UnhealthyZoneThreshold(f64),
}

impl NodeLifecycleConfig {
    /// Checks that the numbers can work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_monitor_period.is_zero()
            || self.node_monitor_period >= self.node_monitor_grace_period
        {
            return Err(ConfigError::MonitorPeriod {
                period: self.node_monitor_period,
                grace: self.node_monitor_grace_period,
            });
        }
        for rate in [self.node_eviction_rate, self.secondary_node_eviction_rate] {
            if rate.is_nan() || rate < 0.0 {
                return Err(ConfigError::EvictionRate(rate));
            }
        }
        let threshold = self.unhealthy_zone_threshold;
        if threshold.is_nan() || threshold <= 0.0 || threshold > 1.0 {
            return Err(ConfigError::UnhealthyZoneThreshold(threshold));
        }
        Ok(())
    }
}

/// The controller's wall clock: every probe timestamp, `timeAdded` and transition time it
/// records is a reading of this, so tests substitute a [`ManualClock`].
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    /// The reading; a mutex because a test advances it while the controller reads it.
    now: parking_lot::Mutex<Timestamp>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock {
            now: parking_lot::Mutex::new(start),
        }
    }

    /// Moves the clock forward by `by`.
    ///
    /// # Panics
    /// If that leaves the calendar (year 9999).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now = now
            .checked_add(by)
            .expect("a test advances the clock by a sane amount");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock()
    }
}

/// The reads and writes the controller makes against the apiserver (not its caches).
/// Object-safe so tests substitute a fake; [`Client`] implements it.
pub trait NodeLifecycleClient: Send + Sync + 'static {
    /// GET the node's Lease in [`NODE_LEASE_NAMESPACE`] *live* (not from any cache);
    /// `None` on 404.
    fn get_lease<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Option<Lease>, Error>>;
    /// GET the node; `None` on 404.
    fn get_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Node>, Error>>;
    /// PUT the node (its `resourceVersion` makes it conditional: 409 when stale).
    fn replace_node<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, Result<Node, Error>>;
    /// PUT the node's status subresource (conditional like [`Self::replace_node`]).
    fn replace_node_status<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, Result<Node, Error>>;
    /// DELETE the pod, on condition that it still has `uid` (a pod re-created under the same
    /// name is not evicted for its predecessor).
    fn delete_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), Error>>;
}

impl NodeLifecycleClient for Client {
    fn get_lease<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Option<Lease>, Error>> {
        Box::pin(async move {
            self.api::<Lease>(Some(NODE_LEASE_NAMESPACE))
                .get_opt(node)
                .await
        })
    }

    fn get_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Node>, Error>> {
        Box::pin(async move { self.api::<Node>(None).get_opt(name).await })
    }

    fn replace_node<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, Result<Node, Error>> {
        Box::pin(async move {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            self.api::<Node>(None)
                .replace(name, &PostParams::default(), node)
                .await
        })
    }

    fn replace_node_status<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, Result<Node, Error>> {
        Box::pin(async move {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            self.api::<Node>(None)
                .replace_status(name, &PostParams::default(), node)
                .await
        })
    }

    fn delete_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let params = DeleteParams {
                precondition_uid: uid.map(str::to_string),
                ..DeleteParams::default()
            };
            self.api::<Pod>(Some(namespace))
                .delete(name, &params)
                .await
                .map(|_| ())
        })
    }
}

/// The pods of `pod`'s node for [`POD_NODE_NAME_INDEX`].
pub fn pod_node_name_index(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
        .into_iter()
        .collect()
}

/// Whether the pod index by node name is there after trying to add it.
fn index_added(result: Result<(), String>) -> bool {
    match result {
        Ok(()) => true,
        // Another controller added it first: same name, same meaning.
        Err(e) if e.contains("already exists") => true,
        Err(e) => {
            tracing::warn!(error = %e, "no pod index by node name; scanning all pods instead");
            false
        }
    }
}

/// What a [`NodeLifecycleController`] is built from, for tests that fill the caches
/// themselves and fake the apiserver.
pub struct Parts {
    /// The node lister's store.
    pub nodes: Indexer<Node>,
    /// The Lease lister's store (all namespaces; only [`NODE_LEASE_NAMESPACE`] is read).
    pub leases: Indexer<Lease>,
    /// The pod lister's store; indexed by [`POD_NODE_NAME_INDEX`] if it has that index,
    /// scanned otherwise.
    pub pods: Indexer<Pod>,
    /// Live reads and writes.
    pub client: Arc<dyn NodeLifecycleClient>,
    /// The controller's clock.
    pub clock: Arc<dyn Clock>,
    /// The tunables.
    pub config: NodeLifecycleConfig,
}

/// Why a pass was abandoned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassAborted {
    /// The node whose Lease could not be confirmed.
    pub node: String,
    /// What was wrong.
    pub reason: String,
}

/// What a completed pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Nodes whose conditions were set to `Unknown`.
    pub marked_unknown: Vec<String>,
    /// `NoExecute` taints added, as `(node, key)`.
    pub tainted: Vec<(String, String)>,
    /// `NoExecute` taints removed, as `(node, key)`.
    pub untainted: Vec<(String, String)>,
    /// Pods deleted, as `namespace/name`.
    pub evicted: Vec<String>,
    /// Live Lease reads made to confirm the cache.
    pub lease_checks: usize,
    /// Writes that failed (retried by the next pass).
    pub failures: usize,
}

/// How a pass ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassOutcome {
    /// The pass acted on what it decided.
    Completed(PassReport),
    /// The informer cache was behind the apiserver (or a live read failed): nothing was
    /// written and nothing remembered; the next pass starts over.
    Aborted(PassAborted),
}

/// What one pass carries to the next. A pass works on a copy and stores it back only when it
/// completes, so an abandoned pass leaves no trace, not even in memory.
#[derive(Clone, Debug, Default)]
struct MonitorState {
    /// Per node: what was last heard, and when by our clock.
    health: HashMap<String, NodeHealth>,
    /// Per zone: its last judged state.
    zone_states: HashMap<String, ZoneState>,
    /// Per zone: nodes waiting for a `NoExecute` taint, and the rate limiter.
    tainters: HashMap<String, ZoneTainter>,
    /// When the controller first saw a `NoExecute` taint that has no `timeAdded`, by
    /// `(node, key)`: the start of its pods' toleration periods.
    taint_first_seen: HashMap<(String, String), Timestamp>,
}

/// A `NoExecute` taint change for one node.
#[derive(Clone, Debug, Default)]
struct TaintChange {
    add: Option<&'static str>,
    remove: Vec<&'static str>,
    /// Taken from the zone's rate-limited queue: re-queued if the write fails.
    from_queue: bool,
}

/// What a pass intends for one node.
struct NodePlan {
    name: String,
    zone: String,
    node: Arc<Node>,
    cached_lease: Option<Arc<Lease>>,
    status_update: Option<Node>,
    ready_after: Option<String>,
    taint_change: Option<TaintChange>,
    evictions: Vec<Arc<Pod>>,
}

impl NodePlan {
    /// Whether carrying the plan out could take pods away from a node, so the node's
    /// Lease must first be confirmed live.
    fn needs_lease_check(&self) -> bool {
        self.status_update.is_some()
            || !self.evictions.is_empty()
            || self.taint_change.as_ref().is_some_and(|c| c.add.is_some())
    }
}

/// The node lifecycle controller. Build it with [`NodeLifecycleController::new`], then run
/// it with [`NodeLifecycleController::run`] once the informers are started.
pub struct NodeLifecycleController {
    config: NodeLifecycleConfig,
    nodes: Indexer<Node>,
    leases: Indexer<Lease>,
    pods: Indexer<Pod>,
    pods_indexed: bool,
    client: Arc<dyn NodeLifecycleClient>,
    clock: Arc<dyn Clock>,
    /// The state between passes. A tokio mutex because it is held across a whole pass,
    /// awaits and all: passes never overlap, and an abandoned pass simply drops its copy.
    state: tokio::sync::Mutex<MonitorState>,
    /// Node names whose `NoSchedule` condition taints need a look.
    queue: WorkQueue<String>,
    /// The shared informers `run` waits for (none when built from [`Parts`]).
    informers: Option<(
        SharedInformer<Node>,
        SharedInformer<Lease>,
        SharedInformer<Pod>,
    )>,
}

impl NodeLifecycleController {
    /// A controller with Kubernetes' default tunables over the context's shared Node, Lease
    /// and Pod informers.
    pub fn new(ctx: &Context) -> Arc<NodeLifecycleController> {
        match Self::with_config(ctx, NodeLifecycleConfig::default()) {
            Ok(c) => c,
            Err(e) => unreachable!("the default configuration is valid: {e}"),
        }
    }

    /// A controller with `config` over the context's shared Node, Lease and Pod informers,
    /// with its node event handler registered and the pod index by node name added.
    pub fn with_config(
        ctx: &Context,
        config: NodeLifecycleConfig,
    ) -> Result<Arc<NodeLifecycleController>, ConfigError> {
        config.validate()?;
        let node_informer = ctx.informers.informer::<Node>();
        let lease_informer = ctx.informers.informer::<Lease>();
        let pod_informer = ctx.informers.informer::<Pod>();
        let pods_indexed =
            index_added(pod_informer.add_index(POD_NODE_NAME_INDEX, Arc::new(pod_node_name_index)));
        let controller = Arc::new(Self::build(
            Parts {
                nodes: node_informer.store(),
                leases: lease_informer.store(),
                pods: pod_informer.store(),
                client: Arc::new(ctx.client.clone()),
                clock: Arc::new(SystemClock),
                config,
            },
            pods_indexed,
            Some((node_informer.clone(), lease_informer, pod_informer)),
        ));
        node_informer.add_handler(NodeHandler(Arc::downgrade(&controller)));
        Ok(controller)
    }

    /// A controller over caches and an apiserver the caller provides; no handlers are
    /// registered and nothing runs until the caller calls
    /// [`Self::monitor_node_health`] or [`Reconciler::sync`].
    pub fn from_parts(parts: Parts) -> Result<Arc<NodeLifecycleController>, ConfigError> {
        parts.config.validate()?;
        let pods_indexed = index_added(
            parts
                .pods
                .add_index(POD_NODE_NAME_INDEX, Arc::new(pod_node_name_index)),
        );
        Ok(Arc::new(Self::build(parts, pods_indexed, None)))
    }

    fn build(
        parts: Parts,
        pods_indexed: bool,
        informers: Option<(
            SharedInformer<Node>,
            SharedInformer<Lease>,
            SharedInformer<Pod>,
        )>,
    ) -> NodeLifecycleController {
        NodeLifecycleController {
            config: parts.config,
            nodes: parts.nodes,
            leases: parts.leases,
            pods: parts.pods,
            pods_indexed,
            client: parts.client,
            clock: parts.clock,
            state: tokio::sync::Mutex::new(MonitorState::default()),
            queue: WorkQueue::new(NAME),
            informers,
        }
    }

    /// The controller's tunables.
    pub fn config(&self) -> &NodeLifecycleConfig {
        &self.config
    }

    /// The work queue of node names for `NoSchedule` tainting.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits for the informers' first lists, then runs a pass every `node_monitor_period`
    /// and `workers` `NoSchedule`-tainting workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        if let Some((nodes, leases, pods)) = &self.informers
            && (!nodes.wait_for_sync(&stop).await
                || !leases.wait_for_sync(&stop).await
                || !pods.wait_for_sync(&stop).await)
        {
            tracing::info!("node lifecycle controller stopped before its caches synced");
            return;
        }
        tracing::info!(workers, period = ?self.config.node_monitor_period, "starting node lifecycle controller");
        let monitor = tokio::spawn(self.clone().monitor_loop(stop.clone()));
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
        let _ = monitor.await;
    }

    async fn monitor_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut ticker = tokio::time::interval(self.config.node_monitor_period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let pass = self
                .monitor_node_health()
                .instrument(tracing::debug_span!("node_lifecycle_pass"));
            tokio::select! {
                // Dropping a pass half-way is safe: its state copy is never stored.
                _ = stop.cancelled() => return,
                outcome = pass => match outcome {
                    PassOutcome::Completed(report) if report != PassReport::default() => {
                        tracing::debug!(?report, "node lifecycle pass acted");
                    }
                    // Quiet passes log nothing; aborted ones logged their reason already.
                    PassOutcome::Completed(_) | PassOutcome::Aborted(_) => {}
                }
            }
        }
    }

    fn pods_on_node(&self, node: &str) -> Vec<Arc<Pod>> {
        if self.pods_indexed {
            self.pods.by_index(POD_NODE_NAME_INDEX, node)
        } else {
            self.pods
                .list()
                .into_iter()
                .filter(|p| pod_node_name_index(p).iter().any(|n| n == node))
                .collect()
        }
    }

    /// One pass over every node (Kubernetes' `monitorNodeHealth` plus the taint eviction
    /// controller's decisions):
    /// 1. fold each node's heartbeat and Lease into its health record and decide which nodes
    ///    to mark `Unknown`;
    /// 2. judge the zones and set their tainting rates;
    /// 3. decide the `NoExecute` taint changes, rate-limited per zone;
    /// 4. decide which pods no longer tolerate their node's `NoExecute` taints;
    /// 5. **re-read live the Lease of every node about to be marked, tainted or evicted, and
    ///    abandon the whole pass if the cache is behind**;
    /// 6. write.
    pub async fn monitor_node_health(&self) -> PassOutcome {
        let mut saved = self.state.lock().await;
        let mut state = saved.clone();
        let now = self.clock.now();
        let mut nodes = self.nodes.list();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        forget_deleted_nodes(&mut state, &nodes);

        // 1. Health.
        let mut plans = Vec::with_capacity(nodes.len());
        for node in nodes {
            let Some(name) = node.metadata.name.clone().filter(|n| !n.is_empty()) else {
                continue;
            };
            let zone = disruption::zone_key(&node);
            state
                .tainters
                .entry(zone.clone())
                .or_insert_with(|| ZoneTainter::new(self.config.node_eviction_rate, now));
            let cached_lease = self.leases.get_by(NODE_LEASE_NAMESPACE, &name);
            let (health, observation) = health::observe(
                state.health.get(&name),
                &node,
                cached_lease.as_deref(),
                now,
                &self.config,
            );
            state.health.insert(name.clone(), health);
            plans.push(NodePlan {
                name,
                zone,
                node,
                cached_lease,
                status_update: observation.status_update,
                ready_after: observation.current_ready,
                taint_change: None,
                evictions: Vec::new(),
            });
        }

        // 2. Zones.
        let mut zone_ready: HashMap<String, Vec<Option<&str>>> = HashMap::new();
        for plan in plans
            .iter()
            .filter(|p| !disruption::excluded_from_disruption(&p.node))
        {
            zone_ready
                .entry(plan.zone.clone())
                .or_default()
                .push(plan.ready_after.as_deref());
        }
        let change = disruption::handle_disruption(
            &mut state.zone_states,
            &mut state.tainters,
            &zone_ready,
            now,
            &self.config,
        );
        if change.exited_full_disruption {
            // The silence was the controller's, not the nodes': everyone starts afresh.
            for health in state.health.values_mut() {
                health.probe_timestamp = now;
                health.ready_transition_timestamp = now;
            }
        }

        // 3. NoExecute taints.
        for plan in &mut plans {
            plan.taint_change = decide_no_execute(&mut state, plan, change.entered_full_disruption);
        }
        let mut from_queue = Vec::new();
        for tainter in state.tainters.values_mut() {
            from_queue.extend(tainter.take_ready(now));
        }
        for name in from_queue {
            let Some(plan) = plans.iter_mut().find(|p| p.name == name) else {
                continue;
            };
            let (add, remove) = match plan.ready_after.as_deref() {
                Some("False") => (NOT_READY, UNREACHABLE),
                Some("Unknown") => (UNREACHABLE, NOT_READY),
                _ => continue,
            };
            plan.taint_change = Some(TaintChange {
                add: Some(add),
                remove: vec![remove],
                from_queue: true,
            });
        }

        // 4. Evictions.
        let mut taints_without_time = HashSet::new();
        for plan in &mut plans {
            let node_taints: Vec<&Taint> =
                eviction::no_execute_taints(taints::taints_of(&plan.node))
                    .into_iter()
                    // With every zone dark the controller's own taints evict nobody: they are
                    // coming off, and they most likely describe the controller's blindness.
                    .filter(|t| {
                        !(change.all_fully_disrupted
                            && (t.key == NOT_READY || t.key == UNREACHABLE))
                    })
                    .collect();
            if node_taints.is_empty() {
                continue;
            }
            for t in node_taints.iter().filter(|t| t.time_added.is_none()) {
                let key = (plan.name.clone(), t.key.clone());
                state.taint_first_seen.entry(key.clone()).or_insert(now);
                taints_without_time.insert(key);
            }
            let added_at = |t: &Taint| {
                t.time_added.as_ref().map(|t| t.0).unwrap_or_else(|| {
                    state
                        .taint_first_seen
                        .get(&(plan.name.clone(), t.key.clone()))
                        .copied()
                        .unwrap_or(now)
                })
            };
            for pod in self.pods_on_node(&plan.name) {
                if pod.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                if let eviction::Eviction::At(at) =
                    eviction::eviction_time(&pod, &node_taints, added_at, now)
                    && at <= now
                {
                    plan.evictions.push(pod);
                }
            }
        }
        state
            .taint_first_seen
            .retain(|key, _| taints_without_time.contains(key));

        // 5. `docs/tricks.md` #30: is the cache behind the apiserver for any node we are about
        // to act on?
        let mut report = PassReport::default();
        for plan in plans.iter().filter(|p| p.needs_lease_check()) {
            report.lease_checks += 1;
            let reason = match self.client.get_lease(&plan.name).await {
                Ok(live) => lease_check::stale_reason(plan.cached_lease.as_deref(), live.as_ref()),
                Err(e) => Some(format!("could not read the live lease: {e}")),
            };
            if let Some(reason) = reason {
                tracing::warn!(
                    node = %plan.name,
                    %reason,
                    "informer cache is behind the apiserver; abandoning this pass without acting on it"
                );
                return PassOutcome::Aborted(PassAborted {
                    node: plan.name.clone(),
                    reason,
                });
            }
        }

        // 6. Act.
        for plan in plans {
            self.carry_out(plan, &mut state, now, &mut report).await;
        }
        *saved = state;
        PassOutcome::Completed(report)
    }

    async fn carry_out(
        &self,
        plan: NodePlan,
        state: &mut MonitorState,
        now: Timestamp,
        report: &mut PassReport,
    ) {
        let requeue = |state: &mut MonitorState, plan: &NodePlan| {
            if plan.taint_change.as_ref().is_some_and(|c| c.from_queue)
                && let Some(t) = state.tainters.get_mut(&plan.zone)
            {
                t.queue.push_front(plan.name.clone());
            }
        };
        let mut latest = plan.node.clone();
        if let Some(update) = &plan.status_update {
            match self.client.replace_node_status(update).await {
                Ok(written) => {
                    tracing::info!(node = %plan.name, "node stopped reporting; marked its conditions Unknown");
                    report.marked_unknown.push(plan.name.clone());
                    if let Some(h) = state.health.get_mut(&plan.name) {
                        h.ready = taints::condition(&written, "Ready").cloned();
                        h.ready_transition_timestamp = now;
                    }
                    latest = Arc::new(written);
                }
                Err(e) => {
                    // A conflict is most likely the kubelet's own status write: alive after
                    // all. Either way, nothing more for this node until the next pass.
                    tracing::debug!(node = %plan.name, error = %e, "marking the node Unknown failed");
                    report.failures += 1;
                    requeue(state, &plan);
                    return;
                }
            }
        }
        if let Some(change) = &plan.taint_change {
            let add: Vec<Taint> = change
                .add
                .map(|k| taints::taint(k, NO_EXECUTE, Some(Time(now))))
                .into_iter()
                .collect();
            let remove: Vec<Taint> = change
                .remove
                .iter()
                .map(|k| taints::taint(k, NO_EXECUTE, None))
                .collect();
            let result = self
                .update_taints(&plan.name, &latest, |n| {
                    taints::swap_taints(taints::taints_of(n), &add, &remove)
                })
                .await;
            match result {
                Ok(Some(_)) => {
                    for t in &add {
                        tracing::info!(node = %plan.name, taint = %t.key, "added NoExecute taint");
                        report.tainted.push((plan.name.clone(), t.key.clone()));
                    }
                    for t in remove.iter().filter(|r| {
                        taints::has_taint(taints::taints_of(&latest), &r.key, NO_EXECUTE)
                    }) {
                        tracing::info!(node = %plan.name, taint = %t.key, "removed NoExecute taint");
                        report.untainted.push((plan.name.clone(), t.key.clone()));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %plan.name, error = %e, "updating the node's NoExecute taints failed");
                    report.failures += 1;
                    requeue(state, &plan);
                }
            }
        }
        for pod in &plan.evictions {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let key = format!("{namespace}/{name}");
            match self
                .client
                .delete_pod(namespace, name, pod.metadata.uid.as_deref())
                .await
            {
                Ok(()) => {
                    tracing::info!(pod = %key, node = %plan.name, "evicted pod: it does not tolerate the node's NoExecute taints");
                    report.evicted.push(key);
                }
                // Gone already, or replaced by a pod with another UID: nothing to evict.
                Err(e) if e.is_not_found() || e.is_conflict() => {}
                Err(e) => {
                    tracing::warn!(pod = %key, error = %e, "evicting pod failed");
                    report.failures += 1;
                }
            }
        }
    }

    /// Rewrites the node's taints with `change` (given the node, the new list or `None` for
    /// no change), conditionally on the node's resourceVersion; on a 409 conflict the node
    /// is read again and `change` recomputed, on [`UPDATE_TAINT_BACKOFF`]'s schedule
    /// (Kubernetes' `AddOrUpdateTaintOnNode`: the cached node first, then live reads).
    /// Returns the written node, or `None` when there was nothing to change (or the node is
    /// gone).
    async fn update_taints(
        &self,
        name: &str,
        cached: &Node,
        change: impl Fn(&Node) -> Option<Vec<Taint>>,
    ) -> Result<Option<Node>, Error> {
        let (client, change) = (&self.client, &change);
        let mut runs = 0;
        retry_on_conflict(UPDATE_TAINT_BACKOFF, || {
            runs += 1;
            let fresh = runs > 1;
            async move {
                let current = if fresh {
                    match client.get_node(name).await? {
                        Some(node) => node,
                        None => return Ok(None),
                    }
                } else {
                    cached.clone()
                };
                let Some(next) = change(&current) else {
                    return Ok(None);
                };
                let mut updated = current;
                updated.spec.get_or_insert_with(NodeSpec::default).taints =
                    (!next.is_empty()).then_some(next);
                client.replace_node(&updated).await.map(Some)
            }
        })
        .await
    }

    /// The `NoSchedule` condition taints of one node (Kubernetes' `doNoScheduleTaintingPass`).
    async fn sync_no_schedule_taints(&self, name: &str) -> anyhow::Result<()> {
        let Some(node) = self.nodes.get(name) else {
            return Ok(());
        };
        self.update_taints(name, &node, |n| {
            taints::reconcile_no_schedule(
                taints::taints_of(n),
                &taints::desired_no_schedule_taints(n),
            )
        })
        .await?;
        Ok(())
    }
}

/// Drops what the state remembers of nodes that are gone.
fn forget_deleted_nodes(state: &mut MonitorState, nodes: &[Arc<Node>]) {
    let names: HashSet<&str> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    state.health.retain(|n, _| names.contains(n.as_str()));
    state
        .taint_first_seen
        .retain(|(n, _), _| names.contains(n.as_str()));
    for tainter in state.tainters.values_mut() {
        tainter.queue.retain(|n| names.contains(n.as_str()));
    }
}

/// The `NoExecute` change one node needs now, outside the rate limit (Kubernetes'
/// `processTaintBaseEviction`): a swap between not-ready and unreachable is immediate, as is
/// removal from a Ready node; a first `NoExecute` taint waits in the zone's queue.
fn decide_no_execute(
    state: &mut MonitorState,
    plan: &NodePlan,
    entered_full_disruption: bool,
) -> Option<TaintChange> {
    let current = taints::taints_of(&plan.node);
    let not_ready = taints::has_taint(current, NOT_READY, NO_EXECUTE);
    let unreachable = taints::has_taint(current, UNREACHABLE, NO_EXECUTE);
    let tainter = state.tainters.get_mut(&plan.zone)?;
    let remove_both = || TaintChange {
        add: None,
        remove: vec![NOT_READY, UNREACHABLE],
        from_queue: false,
    };
    if entered_full_disruption {
        tainter.remove(&plan.name);
        return (not_ready || unreachable).then(remove_both);
    }
    let (want, opposite, has_want, has_opposite) = match plan.ready_after.as_deref() {
        Some("False") => (NOT_READY, UNREACHABLE, not_ready, unreachable),
        Some("Unknown") => (UNREACHABLE, NOT_READY, unreachable, not_ready),
        Some("True") => {
            tainter.remove(&plan.name);
            return (not_ready || unreachable).then(remove_both);
        }
        // No Ready condition yet: the startup grace period is still running.
        _ => return None,
    };
    if has_opposite {
        tainter.remove(&plan.name);
        return Some(TaintChange {
            add: Some(want),
            remove: vec![opposite],
            from_queue: false,
        });
    }
    if has_want {
        tainter.remove(&plan.name);
    } else {
        tainter.add(&plan.name);
    }
    None
}

impl Reconciler for NodeLifecycleController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn sync(&self, key: &str) -> impl std::future::Future<Output = anyhow::Result<()>> + Send {
        self.sync_no_schedule_taints(key)
    }
}

/// Feeds node events to the `NoSchedule` queue. Holds the controller weakly: the informer
/// outlives it.
struct NodeHandler(Weak<NodeLifecycleController>);

impl EventHandler<Node> for NodeHandler {
    fn on_add(&self, obj: &Arc<Node>, _is_initial_list: bool) {
        if let (Some(c), Some(name)) = (self.0.upgrade(), obj.metadata.name.as_ref()) {
            c.queue.add(name.clone());
        }
    }
    fn on_update(&self, _old: &Arc<Node>, new: &Arc<Node>) {
        if let (Some(c), Some(name)) = (self.0.upgrade(), new.metadata.name.as_ref()) {
            c.queue.add(name.clone());
        }
    }
    fn on_delete(&self, _obj: &Deleted<Node>) {
        // The next pass forgets the node; there are no taints left to manage.
    }
}

#[cfg(test)]
mod tests;
