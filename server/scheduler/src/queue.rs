//! The scheduling queue: which pending pod the scheduler tries next, and when a pod that did
//! not fit is worth trying again (Kubernetes' `pkg/scheduler/internal/queue`, 1.32).
//!
//! The scheduler's part of `docs/tricks.md` (#1-4) is about making each cycle cheap; this
//! module makes sure the cycles are spent on pods that can now succeed.
//! Three sub-queues hold every pending pod exactly once:
//!
//! - **activeQ**: pods to try now, a heap ordered as Kubernetes' `PrioritySort` plugin orders
//!   it: higher `spec.priority` first, then the earlier queue timestamp (FIFO within a
//!   priority).
//! - **backoffQ**: pods that will be retried when their backoff expires (1 s doubling per
//!   attempt to 10 s), a heap ordered by that expiry. [`SchedulingQueue::run`] flushes the
//!   expired ones to activeQ every second.
//! - **unschedulablePods**: pods that failed and that nothing has changed for since. A
//!   cluster event ([`ClusterEvent`]) moves only the pods whose rejecting plugins registered
//!   for that event (QueueingHint-lite, [`events_to_register`]): a node label change
//!   retries pods that NodeAffinity rejected, not pods that were short of CPU. Pods stuck
//!   longer than 5 minutes are moved anyway, in case an event was missed.
//!
//! A pod handed out by [`SchedulingQueue::pop`] is *in flight* until it comes back through
//! [`SchedulingQueue::add_unschedulable_if_not_present`] or [`SchedulingQueue::done`]. The
//! events that arrive while it is in flight are remembered, so a pod rejected because no node
//! had room goes to backoffQ rather than unschedulablePods when a node was added during its
//! own cycle (with queueing hints off, the coarser `moveRequestCycle` rule is used instead).
//!
//! The queue also keeps the nominator: pods that preemption nominated to a node
//! (`status.nominatedNodeName`), which filters count as if they ran there.
//!
//! Invariants: a pod key (`namespace/name`) is in at most one of the three sub-queues; a pod
//! is never both queued and in flight unless it was re-added by [`SchedulingQueue::add`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::framework::{PodInfo, Resource};

/// The first retry delay of a pod that failed to schedule (Kubernetes'
/// `DefaultPodInitialBackoffDuration`, `podInitialBackoffSeconds: 1`). Shorter retries a pod
/// before the cluster had time to change; longer delays pods that a transient failure hit.
pub const POD_INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// The longest retry delay (Kubernetes' `DefaultPodMaxBackoffDuration`,
/// `podMaxBackoffSeconds: 10`): the delay doubles per attempt up to this, so a pod that keeps
/// failing costs at most one cycle per 10 s.
pub const POD_MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How long a pod may stay in unschedulablePods with no relevant event before it is retried
/// anyway (Kubernetes' `DefaultPodMaxInUnschedulablePodsDuration`, 5 min): the safety net for
/// an event the plugin registrations did not foresee.
pub const POD_MAX_IN_UNSCHEDULABLE_PODS_DURATION: Duration = Duration::from_secs(5 * 60);

/// How often backoffQ is flushed into activeQ (Kubernetes' `flushBackoffQCompleted` runs
/// every 1 s): the granularity of the backoff, which is itself in whole seconds.
pub const BACKOFF_FLUSH_PERIOD: Duration = Duration::from_secs(1);

/// How often unschedulablePods is scanned for pods past
/// [`POD_MAX_IN_UNSCHEDULABLE_PODS_DURATION`] (Kubernetes' `flushUnschedulablePodsLeftover`
/// period, 30 s): a pod is retried between 5 min and 5 min 30 s after it failed.
pub const UNSCHEDULABLE_FLUSH_PERIOD: Duration = Duration::from_secs(30);

/// Cluster events remembered while pods are in flight. Kubernetes keeps an unbounded list
/// (trimmed when the oldest in-flight pod finishes); we bound it so a stuck binding cannot
/// grow it forever. Past the bound the oldest events are dropped and a pod that was in flight
/// when they happened is conservatively sent to backoffQ. Semi-arbitrary: a busy cluster
/// produces a few hundred events per second and a cycle takes milliseconds.
pub const IN_FLIGHT_EVENTS_MAX: usize = 10_000;

/// The PreEnqueue plugin that keeps pods with `spec.schedulingGates` out of activeQ
/// (Kubernetes' `SchedulingGates`); gated pods wait in unschedulablePods, counted as "gated".
pub const SCHEDULING_GATES_PLUGIN: &str = "SchedulingGates";

/// The metric [`PendingPodCounts::samples`] feeds, with a `queue` label.
pub const PENDING_PODS_METRIC: &str = "scheduler_pending_pods";

/// The queue's tunables (Kubernetes' `KubeSchedulerConfiguration` fields and feature gate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// `podInitialBackoffSeconds`.
    pub pod_initial_backoff: Duration,
    /// `podMaxBackoffSeconds`.
    pub pod_max_backoff: Duration,
    /// How long a pod may sit in unschedulablePods without a relevant event.
    pub pod_max_in_unschedulable_pods_duration: Duration,
    /// Kubernetes' `SchedulerQueueingHints` gate (beta, on by default since 1.32): a failed
    /// pod goes to backoffQ only if an event relevant to its rejecting plugins arrived during
    /// its cycle. Off: any move request during its cycle sends it there (`moveRequestCycle`).
    pub queueing_hints: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            pod_initial_backoff: POD_INITIAL_BACKOFF,
            pod_max_backoff: POD_MAX_BACKOFF,
            pod_max_in_unschedulable_pods_duration: POD_MAX_IN_UNSCHEDULABLE_PODS_DURATION,
            queueing_hints: true,
        }
    }
}

impl QueueConfig {
    /// Checks the values as kube-scheduler's config validation does.
    pub fn validate(&self) -> Result<(), QueueError> {
        if self.pod_initial_backoff.is_zero() {
            return Err(QueueError::InvalidConfig(
                "podInitialBackoffSeconds must be greater than 0".into(),
            ));
        }
        if self.pod_max_backoff < self.pod_initial_backoff {
            return Err(QueueError::InvalidConfig(
                "podMaxBackoffSeconds must be greater than or equal to podInitialBackoffSeconds"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Errors of the queue's operations.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueError {
    /// The pod handed back is already queued (a scheduler bug or a racing `add`).
    #[error("pod {key} is already present in the {queue} queue")]
    AlreadyPresent {
        /// `namespace/name`.
        key: String,
        /// Which sub-queue holds it.
        queue: QueueName,
    },
    /// A [`QueueConfig`] value is out of range.
    #[error("invalid scheduling queue configuration: {0}")]
    InvalidConfig(String),
}

/// The sub-queues, named as the `queue` label of `scheduler_pending_pods`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueName {
    /// activeQ.
    Active,
    /// backoffQ.
    Backoff,
    /// unschedulablePods (not gated).
    Unschedulable,
    /// unschedulablePods held back by scheduling gates.
    Gated,
}

impl QueueName {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueName::Active => "active",
            QueueName::Backoff => "backoff",
            QueueName::Unschedulable => "unschedulable",
            QueueName::Gated => "gated",
        }
    }
}

impl std::fmt::Display for QueueName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// Cluster events

/// What happened to an object, as a bit set (Kubernetes' `framework.ActionType`). The
/// `UPDATE_*` bits say which part of the object changed, so a plugin can register for the
/// changes that matter to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ActionType(u32);

impl ActionType {
    /// Nothing relevant changed.
    pub const NONE: ActionType = ActionType(0);
    /// Created.
    pub const ADD: ActionType = ActionType(1 << 0);
    /// Deleted.
    pub const DELETE: ActionType = ActionType(1 << 1);
    /// A node's `status.allocatable` changed.
    pub const UPDATE_NODE_ALLOCATABLE: ActionType = ActionType(1 << 2);
    /// A node's labels changed.
    pub const UPDATE_NODE_LABEL: ActionType = ActionType(1 << 3);
    /// A node's taints (or `spec.unschedulable`, which acts as a taint) changed.
    pub const UPDATE_NODE_TAINT: ActionType = ActionType(1 << 4);
    /// A node's conditions changed (status, not heartbeat times).
    pub const UPDATE_NODE_CONDITION: ActionType = ActionType(1 << 5);
    /// A node's annotations changed.
    pub const UPDATE_NODE_ANNOTATION: ActionType = ActionType(1 << 6);
    /// A pod's labels changed.
    pub const UPDATE_POD_LABEL: ActionType = ActionType(1 << 7);
    /// A pod's resource requests went down (in-place resize).
    pub const UPDATE_POD_SCALE_DOWN: ActionType = ActionType(1 << 8);
    /// A pod's tolerations changed.
    pub const UPDATE_POD_TOLERATIONS: ActionType = ActionType(1 << 9);
    /// A pod's last scheduling gate was removed.
    pub const UPDATE_POD_SCHEDULING_GATES_ELIMINATED: ActionType = ActionType(1 << 10);
    /// Any other pod change.
    pub const UPDATE_POD_OTHER: ActionType = ActionType(1 << 11);
    /// Any update.
    pub const UPDATE: ActionType = ActionType(
        Self::UPDATE_NODE_ALLOCATABLE.0
            | Self::UPDATE_NODE_LABEL.0
            | Self::UPDATE_NODE_TAINT.0
            | Self::UPDATE_NODE_CONDITION.0
            | Self::UPDATE_NODE_ANNOTATION.0
            | Self::UPDATE_POD_LABEL.0
            | Self::UPDATE_POD_SCALE_DOWN.0
            | Self::UPDATE_POD_TOLERATIONS.0
            | Self::UPDATE_POD_SCHEDULING_GATES_ELIMINATED.0
            | Self::UPDATE_POD_OTHER.0,
    );
    /// Anything.
    pub const ALL: ActionType = ActionType(Self::ADD.0 | Self::DELETE.0 | Self::UPDATE.0);

    /// Both sets of bits.
    pub const fn union(self, other: ActionType) -> ActionType {
        ActionType(self.0 | other.0)
    }
    /// Whether the two sets share a bit.
    pub const fn intersects(self, other: ActionType) -> bool {
        self.0 & other.0 != 0
    }
    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for ActionType {
    type Output = ActionType;
    fn bitor(self, other: ActionType) -> ActionType {
        self.union(other)
    }
}

/// The kind of object an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventResource {
    /// Any pod (matches [`EventResource::AssignedPod`] and [`EventResource::UnscheduledPod`]
    /// events; used in registrations).
    Pod,
    /// A pod bound to a node (`spec.nodeName` set).
    AssignedPod,
    /// A pending pod other than the one being requeued.
    UnscheduledPod,
    /// A node.
    Node,
    /// Everything: the event matches every registration (timeouts, forced retries).
    WildCard,
}

/// A change in the cluster that may make unschedulable pods schedulable (Kubernetes'
/// `framework.ClusterEvent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClusterEvent {
    /// What kind of object.
    pub resource: EventResource,
    /// What happened to it.
    pub action_type: ActionType,
    /// A name for logs and metrics (`NodeAdd`, `AssignedPodDelete`...).
    pub label: &'static str,
}

impl ClusterEvent {
    /// A node was created.
    pub const NODE_ADD: ClusterEvent =
        ClusterEvent::new(EventResource::Node, ActionType::ADD, "NodeAdd");
    /// A node was deleted.
    pub const NODE_DELETE: ClusterEvent =
        ClusterEvent::new(EventResource::Node, ActionType::DELETE, "NodeDelete");
    /// A bound pod appeared (or a pod was bound).
    pub const ASSIGNED_POD_ADD: ClusterEvent = ClusterEvent::new(
        EventResource::AssignedPod,
        ActionType::ADD,
        "AssignedPodAdd",
    );
    /// A bound pod was deleted: its resources, ports and spread count are free.
    pub const ASSIGNED_POD_DELETE: ClusterEvent = ClusterEvent::new(
        EventResource::AssignedPod,
        ActionType::DELETE,
        "AssignedPodDelete",
    );
    /// A pending pod was deleted (its nomination no longer reserves room).
    pub const UNSCHEDULED_POD_DELETE: ClusterEvent = ClusterEvent::new(
        EventResource::UnscheduledPod,
        ActionType::DELETE,
        "UnscheduledPodDelete",
    );
    /// A pod stayed in unschedulablePods past the limit.
    pub const UNSCHEDULABLE_TIMEOUT: ClusterEvent = ClusterEvent::new(
        EventResource::WildCard,
        ActionType::ALL,
        "UnschedulableTimeout",
    );
    /// Retry everything (e.g. after a plugin's external state changed).
    pub const FORCE_ACTIVATE: ClusterEvent =
        ClusterEvent::new(EventResource::WildCard, ActionType::ALL, "ForceActivate");

    /// An event.
    pub const fn new(
        resource: EventResource,
        action_type: ActionType,
        label: &'static str,
    ) -> Self {
        ClusterEvent {
            resource,
            action_type,
            label,
        }
    }

    /// A node update; `changes` from [`node_scheduling_properties_change`].
    pub const fn node_update(changes: ActionType) -> Self {
        ClusterEvent::new(EventResource::Node, changes, "NodeUpdate")
    }

    /// A bound pod's update; `changes` from [`pod_scheduling_properties_change`].
    pub const fn assigned_pod_update(changes: ActionType) -> Self {
        ClusterEvent::new(EventResource::AssignedPod, changes, "AssignedPodUpdate")
    }

    /// Whether this (incoming) event is one that `registered` asked for.
    pub fn matches(&self, registered: &ClusterEvent) -> bool {
        if self.resource == EventResource::WildCard
            || registered.resource == EventResource::WildCard
        {
            return true;
        }
        let resource_matches = registered.resource == self.resource
            || (registered.resource == EventResource::Pod
                && matches!(
                    self.resource,
                    EventResource::AssignedPod | EventResource::UnscheduledPod
                ));
        resource_matches && registered.action_type.intersects(self.action_type)
    }
}

const fn register(resource: EventResource, action_type: ActionType) -> ClusterEvent {
    ClusterEvent::new(resource, action_type, "")
}

// The registrations follow the plugins' `EventsToRegister` in Kubernetes 1.32 with
// `SchedulerQueueingHints` on. The pod's own updates (tolerations, gates, scale-down of the
// pending pod) are not listed: `SchedulingQueue::update` requeues a pod whose spec changed.
const NODE_RESOURCES_FIT_EVENTS: &[ClusterEvent] = &[
    // Another pod leaving (or shrinking) frees resources.
    register(
        EventResource::Pod,
        ActionType::DELETE.union(ActionType::UPDATE_POD_SCALE_DOWN),
    ),
    register(
        EventResource::Node,
        ActionType::ADD.union(ActionType::UPDATE_NODE_ALLOCATABLE),
    ),
];
const NODE_AFFINITY_EVENTS: &[ClusterEvent] = &[register(
    EventResource::Node,
    ActionType::ADD.union(ActionType::UPDATE_NODE_LABEL),
)];
const TAINT_TOLERATION_EVENTS: &[ClusterEvent] = &[register(
    EventResource::Node,
    ActionType::ADD.union(ActionType::UPDATE_NODE_TAINT),
)];
const NODE_UNSCHEDULABLE_EVENTS: &[ClusterEvent] = &[register(
    EventResource::Node,
    ActionType::ADD.union(ActionType::UPDATE_NODE_TAINT),
)];
const NODE_NAME_EVENTS: &[ClusterEvent] = &[register(EventResource::Node, ActionType::ADD)];
const NODE_PORTS_EVENTS: &[ClusterEvent] = &[
    register(EventResource::Pod, ActionType::DELETE),
    register(EventResource::Node, ActionType::ADD),
];
const INTER_POD_AFFINITY_EVENTS: &[ClusterEvent] = &[
    register(
        EventResource::Pod,
        ActionType::ADD
            .union(ActionType::UPDATE_POD_LABEL)
            .union(ActionType::DELETE),
    ),
    register(
        EventResource::Node,
        ActionType::ADD.union(ActionType::UPDATE_NODE_LABEL),
    ),
];
const POD_TOPOLOGY_SPREAD_EVENTS: &[ClusterEvent] = &[
    register(
        EventResource::Pod,
        ActionType::ADD
            .union(ActionType::UPDATE_POD_LABEL)
            .union(ActionType::DELETE),
    ),
    register(
        EventResource::Node,
        ActionType::ADD
            .union(ActionType::DELETE)
            .union(ActionType::UPDATE_NODE_LABEL)
            .union(ActionType::UPDATE_NODE_TAINT),
    ),
];

/// The cluster events that may make a pod rejected by `plugin` schedulable (Kubernetes'
/// `EnqueueExtensions.EventsToRegister`). `None` for a plugin we know nothing about: as in
/// Kubernetes, such a plugin is treated as interested in every event.
pub fn events_to_register(plugin: &str) -> Option<&'static [ClusterEvent]> {
    Some(match plugin {
        "NodeResourcesFit" => NODE_RESOURCES_FIT_EVENTS,
        "NodeAffinity" => NODE_AFFINITY_EVENTS,
        "TaintToleration" => TAINT_TOLERATION_EVENTS,
        "NodeUnschedulable" => NODE_UNSCHEDULABLE_EVENTS,
        "NodeName" => NODE_NAME_EVENTS,
        "NodePorts" => NODE_PORTS_EVENTS,
        "InterPodAffinity" => INTER_POD_AFFINITY_EVENTS,
        "PodTopologySpread" => POD_TOPOLOGY_SPREAD_EVENTS,
        // Only the pod's own update (its gates removed) helps; `update` handles that.
        SCHEDULING_GATES_PLUGIN => &[],
        _ => return None,
    })
}

/// What changed between two versions of a node, as far as scheduling cares (Kubernetes'
/// `nodeSchedulingPropertiesChange`). [`ActionType::NONE`] for a heartbeat-only update, which
/// should not be sent to the queue at all.
pub fn node_scheduling_properties_change(old: &Node, new: &Node) -> ActionType {
    let mut changes = ActionType::NONE;
    let old_spec = old.spec.clone().unwrap_or_default();
    let new_spec = new.spec.clone().unwrap_or_default();
    if old_spec.unschedulable != new_spec.unschedulable || old_spec.taints != new_spec.taints {
        changes = changes | ActionType::UPDATE_NODE_TAINT;
    }
    let allocatable = |node: &Node| node.status.as_ref().and_then(|s| s.allocatable.clone());
    if allocatable(old) != allocatable(new) {
        changes = changes | ActionType::UPDATE_NODE_ALLOCATABLE;
    }
    if old.metadata.labels != new.metadata.labels {
        changes = changes | ActionType::UPDATE_NODE_LABEL;
    }
    if old.metadata.annotations != new.metadata.annotations {
        changes = changes | ActionType::UPDATE_NODE_ANNOTATION;
    }
    // Conditions compare by type and status only: heartbeat times change every 10 s.
    let conditions = |node: &Node| -> BTreeMap<String, String> {
        node.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| {
                cs.iter()
                    .map(|c| (c.type_.clone(), c.status.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    if conditions(old) != conditions(new) {
        changes = changes | ActionType::UPDATE_NODE_CONDITION;
    }
    changes
}

/// What changed between two versions of a pod, as far as other pods' scheduling cares
/// (Kubernetes' `PodSchedulingPropertiesChange`): labels, tolerations, gates removed,
/// requests lowered; anything else in the spec is `UPDATE_POD_OTHER`.
pub fn pod_scheduling_properties_change(old: &Pod, new: &Pod) -> ActionType {
    let mut changes = ActionType::NONE;
    if old.metadata.labels != new.metadata.labels {
        changes = changes | ActionType::UPDATE_POD_LABEL;
    }
    let spec = |pod: &Pod| pod.spec.clone().unwrap_or_default();
    let (old_spec, new_spec) = (spec(old), spec(new));
    if old_spec.tolerations != new_spec.tolerations {
        changes = changes | ActionType::UPDATE_POD_TOLERATIONS;
    }
    let gated = |s: &k8s_openapi::api::core::v1::PodSpec| {
        s.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty())
    };
    if gated(&old_spec) && !gated(&new_spec) {
        changes = changes | ActionType::UPDATE_POD_SCHEDULING_GATES_ELIMINATED;
    }
    if requests_lowered(old, new) {
        changes = changes | ActionType::UPDATE_POD_SCALE_DOWN;
    }
    if changes.is_empty() && old_spec != new_spec {
        changes = ActionType::UPDATE_POD_OTHER;
    }
    changes
}

/// Whether the pod's total request of any resource went down or away (in-place resize;
/// Kubernetes' `extractPodScaleDown` compares the pods' aggregated requests).
fn requests_lowered(old: &Pod, new: &Pod) -> bool {
    let (old, new) = (
        Resource::from_pod_requests(old),
        Resource::from_pod_requests(new),
    );
    new.milli_cpu < old.milli_cpu
        || new.memory < old.memory
        || new.ephemeral_storage < old.ephemeral_storage
        || old
            .scalar
            .iter()
            .any(|(name, value)| new.scalar.get(name).is_none_or(|n| n < value))
}

// ---------------------------------------------------------------------------------------------
// Queued pods

/// A pending pod as the queue holds it (Kubernetes' `framework.QueuedPodInfo`).
#[derive(Clone, Debug)]
pub struct QueuedPodInfo {
    /// The pod, parsed once.
    pub pod_info: Arc<PodInfo>,
    /// When it entered the queue, or last came back as unschedulable: orders activeQ within a
    /// priority and starts the backoff.
    pub timestamp: Instant,
    /// Scheduling attempts so far (incremented by `pop`).
    pub attempts: u32,
    /// When it first entered activeQ (for the e2e scheduling latency metric).
    pub initial_attempt_timestamp: Option<Instant>,
    /// The plugins that rejected it in its last attempt; the scheduler fills this in before
    /// handing it back, and `pop` clears it. Empty means an error rather than a rejection.
    pub unschedulable_plugins: BTreeSet<String>,
    /// Held back by a PreEnqueue plugin (scheduling gates).
    pub gated: bool,
}

impl QueuedPodInfo {
    fn new(pod: Arc<Pod>, now: Instant) -> Self {
        QueuedPodInfo {
            pod_info: new_pod_info(pod),
            timestamp: now,
            attempts: 0,
            initial_attempt_timestamp: None,
            unschedulable_plugins: BTreeSet::new(),
            gated: false,
        }
    }
    /// The pod.
    pub fn pod(&self) -> &Arc<Pod> {
        &self.pod_info.pod
    }
    /// `namespace/name`.
    pub fn key(&self) -> String {
        queue_key(&self.pod_info.pod)
    }
}

/// A pod's queue key, `namespace/name` (Kubernetes keys its queues by namespace and name;
/// identity checks use the UID).
pub fn queue_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A pod's identity: its UID, or its queue key for a pod without one (tests, or a pod the
/// apiserver has not stored yet).
fn pod_uid(pod: &Pod) -> String {
    match crate::framework::pod_key(pod) {
        Some(uid) => uid.to_owned(),
        None => queue_key(pod),
    }
}

/// `spec.priority`, 0 when unset (Kubernetes' `corev1helpers.PodPriority`).
fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn nominated_node_name(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref())
        .unwrap_or_default()
}

/// Parses the pod once for every plugin (affinity terms).
fn new_pod_info(pod: Arc<Pod>) -> Arc<PodInfo> {
    Arc::new(PodInfo::new(pod))
}

/// Whether an update may have made the pod schedulable: anything but status and bookkeeping
/// changed (Kubernetes' `isPodUpdated`).
fn is_pod_updated(old: &Pod, new: &Pod) -> bool {
    fn strip(pod: &Pod) -> Pod {
        let mut p = pod.clone();
        p.metadata.resource_version = None;
        p.metadata.generation = None;
        p.metadata.managed_fields = None;
        p.metadata.finalizers = None;
        p.status = pod.status.as_ref().and_then(|s| {
            s.resource_claim_statuses.as_ref().map(|claims| PodStatus {
                resource_claim_statuses: Some(claims.clone()),
                ..Default::default()
            })
        });
        p
    }
    strip(old) != strip(new)
}

/// The order of activeQ: higher priority first, then earlier timestamp, then insertion.
type ActiveOrder = (Reverse<i32>, Instant, u64);
/// The order of backoffQ: earlier backoff expiry first, then insertion.
type BackoffOrder = (Instant, u64);

/// A heap with removal and update by key: a map for lookup plus an ordered set for the head.
struct KeyedHeap<O: Ord + Clone> {
    items: HashMap<String, (O, QueuedPodInfo)>,
    order: BTreeSet<(O, String)>,
}

impl<O: Ord + Clone> KeyedHeap<O> {
    fn new() -> Self {
        KeyedHeap {
            items: HashMap::new(),
            order: BTreeSet::new(),
        }
    }
    fn len(&self) -> usize {
        self.items.len()
    }
    fn contains(&self, key: &str) -> bool {
        self.items.contains_key(key)
    }
    fn get(&self, key: &str) -> Option<&QueuedPodInfo> {
        self.items.get(key).map(|(_, p)| p)
    }
    fn insert(&mut self, key: String, order: O, info: QueuedPodInfo) {
        self.remove(&key);
        self.order.insert((order.clone(), key.clone()));
        self.items.insert(key, (order, info));
    }
    fn remove(&mut self, key: &str) -> Option<QueuedPodInfo> {
        let (order, info) = self.items.remove(key)?;
        self.order.remove(&(order, key.to_owned()));
        Some(info)
    }
    fn peek(&self) -> Option<&QueuedPodInfo> {
        let (_, key) = self.order.first()?;
        self.get(key)
    }
    fn pop(&mut self) -> Option<QueuedPodInfo> {
        let (_, key) = self.order.pop_first()?;
        self.items.remove(&key).map(|(_, p)| p)
    }
    /// Replaces the pod of a queued item, keeping its place.
    fn replace_pod(&mut self, key: &str, pod_info: Arc<PodInfo>) -> Option<&QueuedPodInfo> {
        let (_, info) = self.items.get_mut(key)?;
        info.pod_info = pod_info;
        Some(info)
    }
    fn values(&self) -> impl Iterator<Item = &QueuedPodInfo> {
        self.items.values().map(|(_, p)| p)
    }
}

/// A popped pod not yet handed back.
struct InFlightPod {
    /// The sequence number the next in-flight event gets at pop time: events at or after it
    /// happened during this pod's cycle.
    first_event_seq: u64,
    /// The newest version of the pod, if it was updated while in flight.
    latest_pod: Option<Arc<Pod>>,
    /// Deleted while in flight: it must not be requeued.
    deleted: bool,
}

/// Where a pod goes back to (Kubernetes' `queueingStrategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Requeue {
    /// Stay in (or go to) unschedulablePods.
    Skip,
    /// backoffQ if still backing off, else activeQ.
    AfterBackoff,
}

/// Everything behind the queue's lock.
struct Inner {
    active: KeyedHeap<ActiveOrder>,
    backoff: KeyedHeap<BackoffOrder>,
    unschedulable: HashMap<String, QueuedPodInfo>,
    /// Incremented by every pop.
    scheduling_cycle: i64,
    /// The cycle during which the last move request came (Kubernetes' `moveRequestCycle`).
    move_request_cycle: i64,
    /// Popped pods by UID.
    in_flight: HashMap<String, InFlightPod>,
    /// Events that arrived while some pod was in flight, oldest first, with their sequence.
    in_flight_events: VecDeque<(u64, ClusterEvent)>,
    next_event_seq: u64,
    /// Events before this sequence were dropped at [`IN_FLIGHT_EVENTS_MAX`].
    events_dropped_before: u64,
    /// Tie-breaker making both heaps FIFO among equals.
    next_insert_seq: u64,
    closed: bool,
}

/// Pending pods per sub-queue: the values of `scheduler_pending_pods{queue}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingPodCounts {
    /// In activeQ.
    pub active: usize,
    /// In backoffQ.
    pub backoff: usize,
    /// In unschedulablePods, not gated.
    pub unschedulable: usize,
    /// In unschedulablePods because of scheduling gates.
    pub gated: usize,
}

impl PendingPodCounts {
    /// `(queue label, value)` pairs for [`PENDING_PODS_METRIC`].
    pub fn samples(&self) -> [(&'static str, usize); 4] {
        [
            (QueueName::Active.as_str(), self.active),
            (QueueName::Backoff.as_str(), self.backoff),
            (QueueName::Unschedulable.as_str(), self.unschedulable),
            (QueueName::Gated.as_str(), self.gated),
        ]
    }
    /// All pending pods.
    pub fn total(&self) -> usize {
        self.active + self.backoff + self.unschedulable + self.gated
    }
}

/// Pods nominated to nodes by preemption, which filters treat as already running there
/// (Kubernetes' `nominator`). Keyed by UID so a renamed object cannot alias another.
#[derive(Default)]
struct Nominator {
    nominated_pods: HashMap<String, Vec<Arc<PodInfo>>>,
    nominated_pod_to_node: HashMap<String, String>,
}

impl Nominator {
    /// Records `pod_info` as nominated to `node` (`Some`: preemption's choice, `Some("")`
    /// clears it) or to its `status.nominatedNodeName` (`None`).
    ///
    /// With `None` and no nominatedNodeName in the status, an in-memory nomination is kept:
    /// preemption records the node here before its status patch comes back through the
    /// informer, and forgetting it in between would let the next cycle give the room away.
    fn add(&mut self, pod_info: Arc<PodInfo>, node: Option<&str>) {
        let uid = pod_uid(&pod_info.pod);
        let previous = self.delete_uid(&uid);
        let node = match node {
            Some(node) => node.to_owned(),
            None => match nominated_node_name(&pod_info.pod) {
                "" => match previous {
                    Some(previous) => previous,
                    None => return,
                },
                node => node.to_owned(),
            },
        };
        if node.is_empty() {
            return;
        }
        // A bound pod is counted on its node by the cache, not here.
        if pod_info
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
        {
            return;
        }
        self.nominated_pod_to_node.insert(uid, node.clone());
        self.nominated_pods.entry(node).or_default().push(pod_info);
    }

    /// Forgets the pod; returns the node it was nominated to.
    fn delete_uid(&mut self, uid: &str) -> Option<String> {
        let node = self.nominated_pod_to_node.remove(uid)?;
        if let Some(pods) = self.nominated_pods.get_mut(&node) {
            pods.retain(|p| pod_uid(&p.pod) != uid);
            if pods.is_empty() {
                self.nominated_pods.remove(&node);
            }
        }
        Some(node)
    }

    /// Kubernetes' `UpdateNominatedPod`: an update that removes `status.nominatedNodeName`
    /// clears the nomination; one that neither has nor had it keeps the in-memory one.
    fn update(&mut self, old: Option<&Pod>, new: Arc<PodInfo>) {
        let had = old.is_some_and(|o| !nominated_node_name(o).is_empty());
        if had && nominated_node_name(&new.pod).is_empty() {
            if let Some(old) = old {
                self.delete_uid(&pod_uid(old));
            }
            return;
        }
        self.add(new, None);
    }
}

/// The scheduling queue. Shared by `Arc` between the informer handlers (add / update / delete /
/// move), the scheduling loop (`pop`, `add_unschedulable_if_not_present`) and [`Self::run`].
pub struct SchedulingQueue {
    config: QueueConfig,
    /// All sub-queues behind one lock: a pod moves between them atomically, and every critical
    /// section is short with no `.await` inside (pop waits on `active_ready`, not the lock).
    inner: Mutex<Inner>,
    /// The nominator has its own lock because filters read it during a cycle while informer
    /// handlers write the queue. Lock order: `inner` then `nominator`, never the reverse.
    nominator: RwLock<Nominator>,
    /// Wakes `pop` when activeQ gains a pod or the queue closes (Kubernetes' `cond.Broadcast`).
    active_ready: Notify,
    /// Cancelled by `close`, which stops `run`.
    closed: CancellationToken,
}

impl Default for SchedulingQueue {
    fn default() -> Self {
        SchedulingQueue::new(QueueConfig::default())
    }
}

impl SchedulingQueue {
    /// An empty queue. Call [`QueueConfig::validate`] first on user-supplied values.
    pub fn new(config: QueueConfig) -> Self {
        SchedulingQueue {
            config,
            inner: Mutex::new(Inner {
                active: KeyedHeap::new(),
                backoff: KeyedHeap::new(),
                unschedulable: HashMap::new(),
                scheduling_cycle: 0,
                move_request_cycle: -1,
                in_flight: HashMap::new(),
                in_flight_events: VecDeque::new(),
                next_event_seq: 0,
                events_dropped_before: 0,
                next_insert_seq: 0,
                closed: false,
            }),
            nominator: RwLock::new(Nominator::default()),
            active_ready: Notify::new(),
            closed: CancellationToken::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// The backoff after `attempts` failed attempts: initial, doubling, capped (Kubernetes'
    /// `calculateBackoffDuration`); 0 for a pod never tried.
    pub fn backoff_duration(&self, attempts: u32) -> Duration {
        if attempts == 0 {
            return Duration::ZERO;
        }
        let max = self.config.pod_max_backoff;
        let mut duration = self.config.pod_initial_backoff;
        for _ in 1..attempts {
            // Compare before doubling so a large attempt count cannot overflow.
            if duration > max.saturating_sub(duration) {
                return max;
            }
            duration += duration;
        }
        duration.min(max)
    }

    fn backoff_expiry(&self, info: &QueuedPodInfo) -> Instant {
        info.timestamp + self.backoff_duration(info.attempts)
    }

    fn is_backing_off(&self, info: &QueuedPodInfo, now: Instant) -> bool {
        !info.gated && self.backoff_expiry(info) > now
    }

    /// A new pending pod (the informer's add of an unscheduled pod): to activeQ, unless gated.
    pub fn add(&self, pod: Arc<Pod>) {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let info = QueuedPodInfo::new(pod, now);
        if self.move_to_active(&mut inner, info, now) {
            self.active_ready.notify_waiters();
        }
    }

    /// Removes the head of activeQ, waiting while activeQ is empty. Returns it with one more
    /// attempt and marks it in flight; `None` once the queue is closed (even if pods remain:
    /// a closed queue belongs to a scheduler that is shutting down or lost its lease).
    pub async fn pop(&self) -> Option<QueuedPodInfo> {
        loop {
            let notified = self.active_ready.notified();
            tokio::pin!(notified);
            // Register for the wake-up before looking, so an add between the check and the
            // await is not missed.
            notified.as_mut().enable();
            if let Some(popped) = self.try_pop_inner()? {
                return Some(popped);
            }
            notified.await;
        }
    }

    /// [`Self::pop`] without waiting: `None` if activeQ is empty or the queue is closed.
    pub fn try_pop(&self) -> Option<QueuedPodInfo> {
        self.try_pop_inner().flatten()
    }

    /// `None`: closed; `Some(None)`: empty.
    fn try_pop_inner(&self) -> Option<Option<QueuedPodInfo>> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return None;
        }
        let Some(mut info) = inner.active.pop() else {
            return Some(None);
        };
        info.attempts = info.attempts.saturating_add(1);
        info.unschedulable_plugins.clear();
        inner.scheduling_cycle += 1;
        let first_event_seq = inner.next_event_seq;
        inner.in_flight.insert(
            pod_uid(info.pod()),
            InFlightPod {
                first_event_seq,
                latest_pod: None,
                deleted: false,
            },
        );
        Some(Some(info))
    }

    /// The number of pods popped so far; read it right after `pop` to get the pod's cycle.
    pub fn scheduling_cycle(&self) -> i64 {
        self.inner.lock().scheduling_cycle
    }

    /// A popped pod's cycle is over (bound, or given up on): it is no longer in flight.
    pub fn done(&self, uid: &str) {
        let mut inner = self.inner.lock();
        inner.in_flight.remove(uid);
        Self::trim_in_flight_events(&mut inner);
    }

    /// Drops the events no in-flight pod can still need.
    fn trim_in_flight_events(inner: &mut Inner) {
        match inner.in_flight.values().map(|p| p.first_event_seq).min() {
            None => inner.in_flight_events.clear(),
            Some(oldest) => {
                while inner
                    .in_flight_events
                    .front()
                    .is_some_and(|(seq, _)| *seq < oldest)
                {
                    inner.in_flight_events.pop_front();
                }
            }
        }
    }

    /// Hands back a popped pod that did not schedule, with `unschedulable_plugins` set to the
    /// plugins that rejected it (empty for an error). `scheduling_cycle` is the cycle it was
    /// popped in. It goes to backoffQ if something relevant happened during its cycle (or it
    /// failed with an error), else to unschedulablePods to wait for a relevant event. Ends
    /// the pod's in-flight state either way.
    pub fn add_unschedulable_if_not_present(
        &self,
        mut info: QueuedPodInfo,
        scheduling_cycle: i64,
    ) -> Result<(), QueueError> {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let uid = pod_uid(info.pod());
        let in_flight = inner.in_flight.remove(&uid);
        let result = self.requeue_failed(&mut inner, &mut info, in_flight, scheduling_cycle, now);
        Self::trim_in_flight_events(&mut inner);
        result
    }

    fn requeue_failed(
        &self,
        inner: &mut Inner,
        info: &mut QueuedPodInfo,
        in_flight: Option<InFlightPod>,
        scheduling_cycle: i64,
        now: Instant,
    ) -> Result<(), QueueError> {
        let mut updated_in_flight = false;
        if let Some(flight) = &in_flight {
            if flight.deleted {
                tracing::debug!(pod = %info.key(), "pod deleted during its cycle; not requeued");
                return Ok(());
            }
            if let Some(latest) = &flight.latest_pod {
                updated_in_flight = is_pod_updated(info.pod(), latest);
                info.pod_info = new_pod_info(latest.clone());
            }
        }
        let key = info.key();
        let present = if inner.unschedulable.contains_key(&key) {
            Some(QueueName::Unschedulable)
        } else if inner.active.contains(&key) {
            Some(QueueName::Active)
        } else if inner.backoff.contains(&key) {
            Some(QueueName::Backoff)
        } else {
            None
        };
        if let Some(queue) = present {
            return Err(QueueError::AlreadyPresent { key, queue });
        }
        // The backoff counts from now.
        info.timestamp = now;

        let strategy = if info.unschedulable_plugins.is_empty() || updated_in_flight {
            // An error (not a rejection) is retried after backoff, as is a pod whose spec
            // changed while it was being scheduled.
            Requeue::AfterBackoff
        } else if self.config.queueing_hints {
            match &in_flight {
                // Not popped from this queue: we cannot know what it missed.
                None => Requeue::AfterBackoff,
                Some(flight) if flight.first_event_seq < inner.events_dropped_before => {
                    Requeue::AfterBackoff
                }
                Some(flight) => {
                    let relevant = inner
                        .in_flight_events
                        .iter()
                        .filter(|(seq, _)| *seq >= flight.first_event_seq)
                        .any(|(_, event)| is_pod_worth_requeuing(info, event));
                    if relevant {
                        Requeue::AfterBackoff
                    } else {
                        Requeue::Skip
                    }
                }
            }
        } else if inner.move_request_cycle >= scheduling_cycle {
            Requeue::AfterBackoff
        } else {
            Requeue::Skip
        };
        let queue = self.requeue(inner, info.clone(), strategy, now);
        tracing::debug!(pod = %key, queue = %queue, "pod requeued after a failed attempt");
        self.nominator.write().add(info.pod_info.clone(), None);
        if queue == QueueName::Active {
            self.active_ready.notify_waiters();
        }
        Ok(())
    }

    /// Puts a pod that is in no sub-queue into the one `strategy` says (Kubernetes'
    /// `requeuePodViaQueueingHint`).
    fn requeue(
        &self,
        inner: &mut Inner,
        info: QueuedPodInfo,
        strategy: Requeue,
        now: Instant,
    ) -> QueueName {
        if strategy == Requeue::Skip {
            let gated = info.gated;
            inner.unschedulable.insert(info.key(), info);
            return if gated {
                QueueName::Gated
            } else {
                QueueName::Unschedulable
            };
        }
        // The pod may have finished its backoff while it waited in unschedulablePods.
        if self.is_backing_off(&info, now) {
            let order = (self.backoff_expiry(&info), inner.next_insert_seq);
            inner.next_insert_seq += 1;
            inner.backoff.insert(info.key(), order, info);
            return QueueName::Backoff;
        }
        let key = info.key();
        if self.move_to_active(inner, info, now) {
            return QueueName::Active;
        }
        match inner.unschedulable.get(&key) {
            Some(i) if i.gated => QueueName::Gated,
            _ => QueueName::Unschedulable,
        }
    }

    /// Runs the PreEnqueue check (scheduling gates) and puts the pod in activeQ, or in
    /// unschedulablePods if gated. Returns whether it entered activeQ (Kubernetes'
    /// `moveToActiveQ`).
    fn move_to_active(&self, inner: &mut Inner, mut info: QueuedPodInfo, now: Instant) -> bool {
        let key = info.key();
        let gated = info
            .pod()
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| !g.is_empty());
        info.gated = gated;
        if gated {
            info.unschedulable_plugins
                .insert(SCHEDULING_GATES_PLUGIN.to_owned());
            if inner.active.contains(&key) || inner.backoff.contains(&key) {
                return false;
            }
            inner.unschedulable.insert(key, info);
            return false;
        }
        info.initial_attempt_timestamp.get_or_insert(now);
        inner.unschedulable.remove(&key);
        inner.backoff.remove(&key);
        let order = (
            Reverse(pod_priority(info.pod())),
            info.timestamp,
            inner.next_insert_seq,
        );
        inner.next_insert_seq += 1;
        let pod_info = info.pod_info.clone();
        inner.active.insert(key, order, info);
        self.nominator.write().add(pod_info, None);
        true
    }

    /// A pending pod changed (the informer's update of an unscheduled pod). Queued pods get the
    /// new object; a pod in unschedulablePods whose spec (or labels...) changed may now fit and
    /// moves to backoffQ or activeQ; a pod in flight gets it when it comes back; a pod in no
    /// queue is added.
    pub fn update(&self, old: Option<&Pod>, new: Arc<Pod>) {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let uid = pod_uid(&new);
        if let Some(flight) = inner.in_flight.get_mut(&uid) {
            // Kubernetes 1.32 records the update as an in-flight event; the pod is requeued
            // (with this version) when its cycle fails, or dropped when it binds.
            flight.latest_pod = Some(new);
            return;
        }
        let key = queue_key(&new);
        let new_info = new_pod_info(new.clone());
        if inner.active.contains(&key) || inner.backoff.contains(&key) {
            // Update in place; the order (priority, timestamp) does not change because
            // spec.priority is immutable.
            if inner.active.contains(&key) {
                inner.active.replace_pod(&key, new_info.clone());
            } else {
                inner.backoff.replace_pod(&key, new_info.clone());
            }
            self.nominator.write().update(old, new_info);
            return;
        }
        if let Some(mut info) = inner.unschedulable.remove(&key) {
            info.pod_info = new_info.clone();
            self.nominator.write().update(old, new_info);
            let updated = old.is_none_or(|old| is_pod_updated(old, &new));
            if !updated {
                // Only status or bookkeeping changed: nothing that helps it fit.
                inner.unschedulable.insert(key, info);
                return;
            }
            if self.requeue(&mut inner, info, Requeue::AfterBackoff, now) == QueueName::Active {
                self.active_ready.notify_waiters();
            }
            return;
        }
        let info = QueuedPodInfo::new(new, now);
        if self.move_to_active(&mut inner, info, now) {
            self.active_ready.notify_waiters();
        }
    }

    /// A pending pod was deleted (or got bound by someone else): removed from whichever
    /// sub-queue holds it and from the nominator; an in-flight pod is marked so it is not
    /// requeued. Returns whether it was queued. The caller may then send
    /// [`ClusterEvent::UNSCHEDULED_POD_DELETE`] if the pod was nominated.
    pub fn delete(&self, pod: &Pod) -> bool {
        let mut inner = self.inner.lock();
        self.nominator.write().delete_uid(&pod_uid(pod));
        if let Some(flight) = inner.in_flight.get_mut(&pod_uid(pod)) {
            flight.deleted = true;
        }
        let key = queue_key(pod);
        inner.active.remove(&key).is_some()
            || inner.backoff.remove(&key).is_some()
            || inner.unschedulable.remove(&key).is_some()
    }

    /// A cluster event: moves the unschedulable pods whose rejecting plugins registered for it
    /// to backoffQ (still backing off) or activeQ, and remembers it for in-flight pods.
    /// Returns how many pods moved.
    pub fn move_all_to_active_or_backoff(&self, event: ClusterEvent) -> usize {
        self.move_all_to_active_or_backoff_with_check(event, |_| true)
    }

    /// [`Self::move_all_to_active_or_backoff`], moving only pods `pre_check` accepts
    /// (Kubernetes' `PreEnqueueCheck`, e.g. "fits the added node's basic checks").
    /// `pre_check` runs under the queue's lock: it must be quick and must not call back into
    /// the queue.
    pub fn move_all_to_active_or_backoff_with_check(
        &self,
        event: ClusterEvent,
        pre_check: impl Fn(&Pod) -> bool,
    ) -> usize {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let keys: Vec<String> = inner
            .unschedulable
            .iter()
            .filter(|(_, info)| is_pod_worth_requeuing(info, &event) && pre_check(info.pod()))
            .map(|(key, _)| key.clone())
            .collect();
        self.move_pods(&mut inner, keys, event, now)
    }

    /// Moves the unschedulable pods `keys` (Kubernetes' `movePodsToActiveOrBackoffQueue`).
    fn move_pods(
        &self,
        inner: &mut Inner,
        keys: Vec<String>,
        event: ClusterEvent,
        now: Instant,
    ) -> usize {
        let mut activated = false;
        let mut moved = 0;
        for key in keys {
            let Some(info) = inner.unschedulable.remove(&key) else {
                continue;
            };
            let queue = self.requeue(inner, info, Requeue::AfterBackoff, now);
            if matches!(queue, QueueName::Active | QueueName::Backoff) {
                moved += 1;
            }
            activated |= queue == QueueName::Active;
        }
        inner.move_request_cycle = inner.scheduling_cycle;
        if self.config.queueing_hints && !inner.in_flight.is_empty() {
            let seq = inner.next_event_seq;
            inner.next_event_seq += 1;
            inner.in_flight_events.push_back((seq, event));
            if inner.in_flight_events.len() > IN_FLIGHT_EVENTS_MAX
                && let Some((dropped, _)) = inner.in_flight_events.pop_front()
            {
                inner.events_dropped_before = dropped + 1;
            }
        }
        if moved > 0 {
            tracing::debug!(event = event.label, moved, "moved unschedulable pods");
        }
        if activated {
            self.active_ready.notify_waiters();
        }
        moved
    }

    /// Moves the pods of backoffQ whose backoff has expired to activeQ. Returns how many.
    pub fn flush_backoff_completed(&self) -> usize {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let mut moved = 0;
        while let Some(head) = inner.backoff.peek() {
            if self.is_backing_off(head, now) {
                break;
            }
            let Some(info) = inner.backoff.pop() else {
                break;
            };
            if self.move_to_active(&mut inner, info, now) {
                moved += 1;
            }
        }
        if moved > 0 {
            self.active_ready.notify_waiters();
        }
        moved
    }

    /// Moves pods that have waited in unschedulablePods longer than
    /// `pod_max_in_unschedulable_pods_duration` (a safety net for a missed event). Gated pods
    /// stay: only removing their gates can release them. Returns how many moved.
    pub fn flush_unschedulable_left_over(&self) -> usize {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let limit = self.config.pod_max_in_unschedulable_pods_duration;
        let keys: Vec<String> = inner
            .unschedulable
            .iter()
            .filter(|(_, info)| !info.gated && now.duration_since(info.timestamp) > limit)
            .map(|(key, _)| key.clone())
            .collect();
        if keys.is_empty() {
            return 0;
        }
        self.move_pods(&mut inner, keys, ClusterEvent::UNSCHEDULABLE_TIMEOUT, now)
    }

    /// Drives both flushes until `stop` is cancelled or the queue is closed (Kubernetes'
    /// `PriorityQueue.Run`). Spawn it next to the scheduling loop.
    pub async fn run(&self, stop: CancellationToken) {
        let mut backoff_tick = tokio::time::interval(BACKOFF_FLUSH_PERIOD);
        backoff_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut leftover_tick = tokio::time::interval(UNSCHEDULABLE_FLUSH_PERIOD);
        leftover_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.closed.cancelled() => return,
                _ = backoff_tick.tick() => {
                    self.flush_backoff_completed();
                }
                _ = leftover_tick.tick() => {
                    self.flush_unschedulable_left_over();
                }
            }
        }
    }

    /// Closes the queue: waiting and future `pop`s return `None`, and `run` returns.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.closed.cancel();
        self.active_ready.notify_waiters();
    }

    /// Pending pods per sub-queue (`scheduler_pending_pods`). In-flight pods are not pending.
    pub fn pending_pods(&self) -> PendingPodCounts {
        let inner = self.inner.lock();
        let gated = inner.unschedulable.values().filter(|i| i.gated).count();
        PendingPodCounts {
            active: inner.active.len(),
            backoff: inner.backoff.len(),
            unschedulable: inner.unschedulable.len() - gated,
            gated,
        }
    }

    /// Every pending pod with its sub-queue (for debugging dumps).
    pub fn pending_pod_list(&self) -> Vec<(QueueName, Arc<Pod>)> {
        let inner = self.inner.lock();
        let active = inner.active.values().map(|i| (QueueName::Active, i));
        let backoff = inner.backoff.values().map(|i| (QueueName::Backoff, i));
        let unschedulable = inner.unschedulable.values().map(|i| {
            let queue = if i.gated {
                QueueName::Gated
            } else {
                QueueName::Unschedulable
            };
            (queue, i)
        });
        active
            .chain(backoff)
            .chain(unschedulable)
            .map(|(q, i)| (q, i.pod().clone()))
            .collect()
    }

    /// Which sub-queue holds the pod with this `namespace/name`, if any.
    pub fn queue_of(&self, key: &str) -> Option<QueueName> {
        let inner = self.inner.lock();
        if inner.active.contains(key) {
            Some(QueueName::Active)
        } else if inner.backoff.contains(key) {
            Some(QueueName::Backoff)
        } else {
            inner.unschedulable.get(key).map(|i| {
                if i.gated {
                    QueueName::Gated
                } else {
                    QueueName::Unschedulable
                }
            })
        }
    }

    /// Nominates a pod to a node: `Some(node)` is preemption's choice (`Some("")` clears);
    /// `None` takes the pod's `status.nominatedNodeName`.
    pub fn add_nominated_pod(&self, pod_info: Arc<PodInfo>, nominated_node: Option<&str>) {
        self.nominator.write().add(pod_info, nominated_node);
    }

    /// Forgets a pod's nomination (it was bound, or deleted).
    pub fn delete_nominated_pod(&self, pod: &Pod) {
        self.nominator.write().delete_uid(&pod_uid(pod));
    }

    /// Applies a pod update to its nomination (see [`Self::update`], which calls this for
    /// queued pods).
    pub fn update_nominated_pod(&self, old: Option<&Pod>, new: Arc<PodInfo>) {
        self.nominator.write().update(old, new);
    }

    /// The pods nominated to `node`, which filters count as if they ran there.
    pub fn nominated_pods_for_node(&self, node: &str) -> Vec<Arc<PodInfo>> {
        self.nominator
            .read()
            .nominated_pods
            .get(node)
            .cloned()
            .unwrap_or_default()
    }

    /// Whether any pod is nominated to any node (empty node entries are removed).
    pub fn has_nominated_pods(&self) -> bool {
        !self.nominator.read().nominated_pods.is_empty()
    }

    /// The node a pod (by UID) is nominated to.
    pub fn nominated_node_of(&self, uid: &str) -> Option<String> {
        self.nominator
            .read()
            .nominated_pod_to_node
            .get(uid)
            .cloned()
    }
}

/// Whether `event` may make `info` schedulable: its rejecting plugins registered for it, or
/// it has none (an error), or the event is a wildcard (Kubernetes' `isPodWorthRequeuing`).
fn is_pod_worth_requeuing(info: &QueuedPodInfo, event: &ClusterEvent) -> bool {
    if info.unschedulable_plugins.is_empty() || event.resource == EventResource::WildCard {
        return true;
    }
    info.unschedulable_plugins
        .iter()
        .any(|plugin| match events_to_register(plugin) {
            None => true,
            Some(registered) => registered.iter().any(|r| event.matches(r)),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, NodeSpec, NodeStatus, PodSchedulingGate, PodSpec, ResourceRequirements, Taint,
        Toleration,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, priority: i32) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                priority: Some(priority),
                containers: vec![Container {
                    name: "app".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn key(name: &str) -> String {
        format!("default/{name}")
    }

    fn name(info: &QueuedPodInfo) -> &str {
        info.pod().metadata.name.as_deref().unwrap()
    }

    fn hints_off() -> SchedulingQueue {
        SchedulingQueue::new(QueueConfig {
            queueing_hints: false,
            ..Default::default()
        })
    }

    /// Pops the head (which must be `expected`) and returns it with its cycle.
    fn pop_expect(q: &SchedulingQueue, expected: &str) -> (QueuedPodInfo, i64) {
        let info = q.try_pop().expect("a pod in activeQ");
        assert_eq!(name(&info), expected);
        (info, q.scheduling_cycle())
    }

    /// Hands a popped pod back as rejected by `plugins` (empty: an error).
    fn reject(q: &SchedulingQueue, (mut info, cycle): (QueuedPodInfo, i64), plugins: &[&str]) {
        info.unschedulable_plugins = plugins.iter().map(|p| p.to_string()).collect();
        q.add_unschedulable_if_not_present(info, cycle).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn active_queue_orders_by_priority_then_fifo() {
        let q = SchedulingQueue::default();
        for (n, p) in [
            ("low", 0),
            ("high", 100),
            ("mid", 50),
            ("high2", 100),
            ("low2", 0),
        ] {
            q.add(Arc::new(pod(n, p)));
        }
        let order: Vec<String> = std::iter::from_fn(|| q.try_pop())
            .map(|i| name(&i).to_owned())
            .collect();
        assert_eq!(order, ["high", "high2", "mid", "low", "low2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn earlier_timestamp_wins_within_a_priority() {
        let q = SchedulingQueue::default();
        q.add(Arc::new(pod("first", 0)));
        tokio::time::advance(Duration::from_secs(1)).await;
        q.add(Arc::new(pod("second", 0)));
        // "first" fails and comes back later than "second" entered: it now queues behind.
        let first = pop_expect(&q, "first");
        reject(&q, first, &[]);
        tokio::time::advance(Duration::from_secs(1)).await;
        q.flush_backoff_completed();
        pop_expect(&q, "second");
        pop_expect(&q, "first");
    }

    #[test]
    fn backoff_doubles_from_one_second_to_ten() {
        let q = SchedulingQueue::default();
        let secs: Vec<u64> = (1..=6).map(|a| q.backoff_duration(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 10, 10]);
        assert_eq!(q.backoff_duration(0), Duration::ZERO);
        assert_eq!(q.backoff_duration(u32::MAX), POD_MAX_BACKOFF);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_pod_waits_its_backoff_in_backoff_queue() {
        let q = SchedulingQueue::default();
        q.add(Arc::new(pod("p", 0)));
        let mut waited = Vec::new();
        for _ in 0..6 {
            let popped = pop_expect(&q, "p");
            // An error (no rejecting plugin) always goes to backoffQ.
            reject(&q, popped, &[]);
            assert_eq!(q.queue_of(&key("p")), Some(QueueName::Backoff));
            let mut elapsed = Duration::ZERO;
            while q.flush_backoff_completed() == 0 {
                assert_eq!(q.try_pop().map(|i| name(&i).to_owned()), None);
                tokio::time::advance(Duration::from_millis(100)).await;
                elapsed += Duration::from_millis(100);
            }
            assert_eq!(q.queue_of(&key("p")), Some(QueueName::Active));
            waited.push(elapsed.as_secs());
        }
        assert_eq!(waited, [1, 2, 4, 8, 10, 10]);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_relevant_event_moves_an_unschedulable_pod() {
        let q = SchedulingQueue::default();
        q.add(Arc::new(pod("cpu", 0)));
        q.add(Arc::new(pod("taint", 0)));
        q.add(Arc::new(pod("unknown", 0)));
        let cpu = pop_expect(&q, "cpu");
        reject(&q, cpu, &["NodeResourcesFit"]);
        let taint = pop_expect(&q, "taint");
        reject(&q, taint, &["TaintToleration"]);
        let unknown = pop_expect(&q, "unknown");
        reject(&q, unknown, &["VolumeBinding"]);
        for n in ["cpu", "taint", "unknown"] {
            assert_eq!(q.queue_of(&key(n)), Some(QueueName::Unschedulable));
        }

        // A plugin we have no registration for is interested in everything.
        let label = ClusterEvent::node_update(ActionType::UPDATE_NODE_LABEL);
        assert_eq!(q.move_all_to_active_or_backoff(label), 1);
        assert_eq!(q.queue_of(&key("unknown")), Some(QueueName::Backoff));
        assert_eq!(q.queue_of(&key("cpu")), Some(QueueName::Unschedulable));
        assert_eq!(q.queue_of(&key("taint")), Some(QueueName::Unschedulable));

        // A taint change helps the pod that did not tolerate a taint, not the one short of CPU.
        let taint_change = ClusterEvent::node_update(ActionType::UPDATE_NODE_TAINT);
        assert_eq!(q.move_all_to_active_or_backoff(taint_change), 1);
        assert_eq!(q.queue_of(&key("taint")), Some(QueueName::Backoff));
        assert_eq!(q.queue_of(&key("cpu")), Some(QueueName::Unschedulable));
        assert_eq!(
            q.move_all_to_active_or_backoff(ClusterEvent::ASSIGNED_POD_ADD),
            0
        );
        assert_eq!(q.queue_of(&key("cpu")), Some(QueueName::Unschedulable));

        // Once its backoff is over, a relevant event sends the pod straight to activeQ.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            q.move_all_to_active_or_backoff(ClusterEvent::ASSIGNED_POD_DELETE),
            1
        );
        assert_eq!(q.queue_of(&key("cpu")), Some(QueueName::Active));
    }

    #[tokio::test(start_paused = true)]
    async fn a_moved_pod_still_backing_off_goes_to_backoff_then_active() {
        let q = SchedulingQueue::default();
        q.add(Arc::new(pod("p", 0)));
        let p = pop_expect(&q, "p");
        reject(&q, p, &["NodeResourcesFit"]);
        assert_eq!(q.move_all_to_active_or_backoff(ClusterEvent::NODE_ADD), 1);
        assert_eq!(q.queue_of(&key("p")), Some(QueueName::Backoff));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.flush_backoff_completed(), 1);
        pop_expect(&q, "p");
    }

    #[tokio::test(start_paused = true)]
    async fn move_request_during_cycle_sends_pod_to_backoff_with_hints_off() {
        let q = hints_off();
        q.add(Arc::new(pod("a", 0)));
        q.add(Arc::new(pod("b", 0)));
        let a = pop_expect(&q, "a");
        // Any move request while "a" is being scheduled (here one that moves nothing).
        q.move_all_to_active_or_backoff(ClusterEvent::NODE_ADD);
        reject(&q, a, &["NodeAffinity"]);
        assert_eq!(q.queue_of(&key("a")), Some(QueueName::Backoff));
        // "b"'s cycle saw no move request: it waits for an event.
        let b = pop_expect(&q, "b");
        reject(&q, b, &["NodeAffinity"]);
        assert_eq!(q.queue_of(&key("b")), Some(QueueName::Unschedulable));
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_events_requeue_only_when_relevant() {
        let q = SchedulingQueue::default();
        for n in ["a", "b", "c"] {
            q.add(Arc::new(pod(n, 0)));
        }
        let a = pop_expect(&q, "a");
        q.move_all_to_active_or_backoff(ClusterEvent::node_update(ActionType::UPDATE_NODE_LABEL));
        reject(&q, a, &["NodeResourcesFit"]);
        assert_eq!(q.queue_of(&key("a")), Some(QueueName::Unschedulable));

        let b = pop_expect(&q, "b");
        q.move_all_to_active_or_backoff(ClusterEvent::NODE_DELETE);
        // A node added during b's cycle may have the room b lacked. (It also moves "a".)
        assert_eq!(q.move_all_to_active_or_backoff(ClusterEvent::NODE_ADD), 1);
        reject(&q, b, &["NodeResourcesFit"]);
        assert_eq!(q.queue_of(&key("b")), Some(QueueName::Backoff));

        // "c" was popped after the node was added: its failure already accounts for it.
        let c = pop_expect(&q, "c");
        reject(&q, c, &["NodeResourcesFit"]);
        assert_eq!(q.queue_of(&key("c")), Some(QueueName::Unschedulable));
        assert!(q.inner.lock().in_flight.is_empty());
        assert!(q.inner.lock().in_flight_events.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_in_flight_events_requeue_conservatively() {
        let q = SchedulingQueue::default();
        q.add(Arc::new(pod("a", 0)));
        let a = pop_expect(&q, "a");
        let irrelevant = ClusterEvent::node_update(ActionType::UPDATE_NODE_CONDITION);
        for _ in 0..=IN_FLIGHT_EVENTS_MAX {
            q.move_all_to_active_or_backoff(irrelevant);
        }
        assert_eq!(q.inner.lock().in_flight_events.len(), IN_FLIGHT_EVENTS_MAX);
        reject(&q, a, &["NodeResourcesFit"]);
        assert_eq!(q.queue_of(&key("a")), Some(QueueName::Backoff));
    }

    #[tokio::test(start_paused = true)]
    async fn leftover_unschedulable_pods_move_after_five_minutes() {
        let q = SchedulingQueue::default();
        q.add(Arc::new(pod("p", 0)));
        let p = pop_expect(&q, "p");
        reject(&q, p, &["NodeAffinity"]);
        tokio::time::advance(POD_MAX_IN_UNSCHEDULABLE_PODS_DURATION).await;
        assert_eq!(q.flush_unschedulable_left_over(), 0);
        assert_eq!(q.queue_of(&key("p")), Some(QueueName::Unschedulable));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.flush_unschedulable_left_over(), 1);
        assert_eq!(q.queue_of(&key("p")), Some(QueueName::Active));
    }

    #[tokio::test(start_paused = true)]
    async fn run_drives_both_flushes_until_stopped() {
        let q = Arc::new(SchedulingQueue::default());
        q.add(Arc::new(pod("error", 0)));
        q.add(Arc::new(pod("stuck", 0)));
        let error = pop_expect(&q, "error");
        reject(&q, error, &[]);
        let stuck = pop_expect(&q, "stuck");
        reject(&q, stuck, &["NodeAffinity"]);
        let stop = CancellationToken::new();
        let runner = tokio::spawn({
            let (q, stop) = (q.clone(), stop.clone());
            async move { q.run(stop).await }
        });
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(q.queue_of(&key("error")), Some(QueueName::Active));
        assert_eq!(q.queue_of(&key("stuck")), Some(QueueName::Unschedulable));
        tokio::time::sleep(POD_MAX_IN_UNSCHEDULABLE_PODS_DURATION + UNSCHEDULABLE_FLUSH_PERIOD)
            .await;
        assert_eq!(q.queue_of(&key("stuck")), Some(QueueName::Active));
        stop.cancel();
        runner.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn update_moves_an_unschedulable_pod_only_when_its_spec_changed() {
        let q = SchedulingQueue::default();
        let old = pod("p", 0);
        q.add(Arc::new(old.clone()));
        let p = pop_expect(&q, "p");
        reject(&q, p, &["NodeAffinity"]);

        let mut status_only = old.clone();
        status_only.status = Some(PodStatus {
            message: Some("0/3 nodes are available".into()),
            ..Default::default()
        });
        status_only.metadata.resource_version = Some("7".into());
        q.update(Some(&old), Arc::new(status_only.clone()));
        assert_eq!(q.queue_of(&key("p")), Some(QueueName::Unschedulable));

        let mut new_selector = status_only.clone();
        new_selector.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("disk".to_owned(), "ssd".to_owned())]));
        q.update(Some(&status_only), Arc::new(new_selector.clone()));
        // Still inside its 1 s backoff.
        assert_eq!(q.queue_of(&key("p")), Some(QueueName::Backoff));
        tokio::time::advance(Duration::from_secs(1)).await;
        q.flush_backoff_completed();
        let (info, _) = pop_expect(&q, "p");
        assert_eq!(
            info.pod().as_ref(),
            &new_selector,
            "the queue holds the new version"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn update_of_a_queued_pod_replaces_it_in_place() {
        let q = SchedulingQueue::default();
        let old = pod("a", 10);
        q.add(Arc::new(old.clone()));
        q.add(Arc::new(pod("b", 0)));
        let mut labelled = old.clone();
        labelled.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        q.update(Some(&old), Arc::new(labelled.clone()));
        assert_eq!(q.pending_pods().active, 2);
        let (a, _) = pop_expect(&q, "a");
        assert_eq!(a.pod().as_ref(), &labelled);
        // A pod in no queue is added by update.
        q.update(None, Arc::new(pod("c", 0)));
        assert_eq!(q.queue_of(&key("c")), Some(QueueName::Active));
    }

    #[tokio::test(start_paused = true)]
    async fn update_during_the_cycle_requeues_with_the_new_version() {
        let q = SchedulingQueue::default();
        let old = pod("p", 0);
        q.add(Arc::new(old.clone()));
        let p = pop_expect(&q, "p");
        let mut tolerating = old.clone();
        tolerating.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        q.update(Some(&old), Arc::new(tolerating.clone()));
        assert_eq!(
            q.pending_pods().total(),
            0,
            "an in-flight pod is not queued twice"
        );
        reject(&q, p, &["TaintToleration"]);
        assert_eq!(q.queue_of(&key("p")), Some(QueueName::Backoff));
        tokio::time::advance(Duration::from_secs(1)).await;
        q.flush_backoff_completed();
        let (info, _) = pop_expect(&q, "p");
        assert_eq!(info.pod().as_ref(), &tolerating);
    }

    #[tokio::test(start_paused = true)]
    async fn gated_pods_wait_until_their_gates_are_removed() {
        let q = SchedulingQueue::default();
        let mut gated = pod("g", 0);
        gated.spec.as_mut().unwrap().scheduling_gates = Some(vec![PodSchedulingGate {
            name: "example.com/quota".into(),
        }]);
        q.add(Arc::new(gated.clone()));
        assert_eq!(q.pending_pods().gated, 1);
        assert!(q.try_pop().is_none());
        q.move_all_to_active_or_backoff(ClusterEvent::NODE_ADD);
        q.move_all_to_active_or_backoff(ClusterEvent::FORCE_ACTIVATE);
        tokio::time::advance(Duration::from_secs(600)).await;
        q.flush_unschedulable_left_over();
        assert_eq!(q.queue_of(&key("g")), Some(QueueName::Gated));

        let mut ungated = gated.clone();
        ungated.spec.as_mut().unwrap().scheduling_gates = None;
        q.update(Some(&gated), Arc::new(ungated));
        assert_eq!(q.queue_of(&key("g")), Some(QueueName::Active));
        pop_expect(&q, "g");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_deleted_during_its_cycle_is_not_requeued() {
        let q = SchedulingQueue::default();
        q.add(Arc::new(pod("p", 0)));
        let p = pop_expect(&q, "p");
        assert!(
            !q.delete(&pod("p", 0)),
            "an in-flight pod is in no sub-queue"
        );
        reject(&q, p, &["NodeAffinity"]);
        assert_eq!(q.queue_of(&key("p")), None);
        assert_eq!(q.pending_pods().total(), 0);
        assert!(!q.delete(&pod("never-added", 0)));
    }

    #[tokio::test(start_paused = true)]
    async fn delete_from_each_sub_queue() {
        let q = SchedulingQueue::default();
        for n in ["u", "b", "a"] {
            q.add(Arc::new(pod(n, 0)));
        }
        let u = pop_expect(&q, "u");
        reject(&q, u, &["NodeAffinity"]);
        let b = pop_expect(&q, "b");
        reject(&q, b, &[]);
        assert_eq!(q.queue_of(&key("a")), Some(QueueName::Active));
        assert_eq!(q.queue_of(&key("b")), Some(QueueName::Backoff));
        assert_eq!(q.queue_of(&key("u")), Some(QueueName::Unschedulable));
        for n in ["a", "b", "u"] {
            assert!(q.delete(&pod(n, 0)), "{n}");
            assert_eq!(q.queue_of(&key(n)), None);
        }
        assert_eq!(q.pending_pods(), PendingPodCounts::default());
    }

    #[tokio::test(start_paused = true)]
    async fn nominated_pods_are_tracked_per_node() {
        let q = SchedulingQueue::default();
        let mut nominated = pod("n", 0);
        nominated.status = Some(PodStatus {
            nominated_node_name: Some("node-1".into()),
            ..Default::default()
        });
        q.add(Arc::new(nominated.clone()));
        let on = |node: &str| -> Vec<String> {
            q.nominated_pods_for_node(node)
                .iter()
                .map(|p| p.pod.metadata.name.clone().unwrap())
                .collect()
        };
        assert_eq!(on("node-1"), ["n"]);

        // Preemption nominates "m" before its status patch lands; an update that carries no
        // nominatedNodeName keeps the in-memory nomination.
        let m = pod("m", 0);
        q.add_nominated_pod(Arc::new(PodInfo::new(Arc::new(m.clone()))), Some("node-2"));
        assert_eq!(on("node-2"), ["m"]);
        let mut m2 = m.clone();
        m2.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
        q.update_nominated_pod(Some(&m), Arc::new(PodInfo::new(Arc::new(m2.clone()))));
        assert_eq!(on("node-2"), ["m"]);
        assert_eq!(q.nominated_node_of("uid-m").as_deref(), Some("node-2"));
        q.delete_nominated_pod(&m2);
        assert!(on("node-2").is_empty());

        // The status losing nominatedNodeName clears the nomination.
        let mut cleared = nominated.clone();
        cleared.status = None;
        q.update(Some(&nominated), Arc::new(cleared));
        assert!(on("node-1").is_empty());

        // A bound pod is never nominated; deleting a pod drops its nomination.
        let mut bound = pod("bound", 0);
        bound.spec.as_mut().unwrap().node_name = Some("node-1".into());
        q.add_nominated_pod(Arc::new(PodInfo::new(Arc::new(bound))), Some("node-1"));
        assert!(on("node-1").is_empty());
        q.add(Arc::new(nominated.clone()));
        assert_eq!(on("node-1"), ["n"]);
        q.delete(&nominated);
        assert!(on("node-1").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn pending_counts_per_sub_queue() {
        let q = SchedulingQueue::default();
        for n in ["a", "b", "u"] {
            q.add(Arc::new(pod(n, 0)));
        }
        let mut gated = pod("g", 0);
        gated.spec.as_mut().unwrap().scheduling_gates = Some(vec![PodSchedulingGate {
            name: "wait".into(),
        }]);
        q.add(Arc::new(gated));
        let a = pop_expect(&q, "a");
        reject(&q, a, &[]);
        let b = pop_expect(&q, "b");
        reject(&q, b, &["NodeAffinity"]);
        let counts = q.pending_pods();
        assert_eq!(
            counts.samples(),
            [
                ("active", 1),
                ("backoff", 1),
                ("unschedulable", 1),
                ("gated", 1)
            ]
        );
        assert_eq!(q.pending_pod_list().len(), 4);
        // An in-flight pod is not pending.
        let _u = pop_expect(&q, "u");
        assert_eq!(q.pending_pods().total(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn pop_waits_for_an_add() {
        let q = Arc::new(SchedulingQueue::default());
        let popper = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!popper.is_finished());
        q.add(Arc::new(pod("p", 0)));
        let info = popper.await.unwrap().expect("a pod");
        assert_eq!(name(&info), "p");
        assert_eq!(info.attempts, 1);
        assert!(info.initial_attempt_timestamp.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn close_wakes_pop_with_none_and_stops_run() {
        let q = Arc::new(SchedulingQueue::default());
        let popper = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await }
        });
        let runner = tokio::spawn({
            let q = q.clone();
            async move { q.run(CancellationToken::new()).await }
        });
        tokio::task::yield_now().await;
        q.close();
        assert!(popper.await.unwrap().is_none());
        runner.await.unwrap();
        q.add(Arc::new(pod("late", 0)));
        assert!(q.pop().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn handing_back_a_pod_that_is_queued_again_is_an_error() {
        let q = SchedulingQueue::default();
        q.add(Arc::new(pod("p", 0)));
        let (info, cycle) = pop_expect(&q, "p");
        q.add(Arc::new(pod("p", 0)));
        assert_eq!(
            q.add_unschedulable_if_not_present(info, cycle),
            Err(QueueError::AlreadyPresent {
                key: key("p"),
                queue: QueueName::Active
            })
        );
    }

    fn node() -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(BTreeMap::from([("zone".into(), "a".into())])),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([("cpu".into(), Quantity("4".into()))])),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn node_changes_are_classified() {
        let old = node();
        let mut heartbeat = old.clone();
        heartbeat.metadata.resource_version = Some("9".into());
        assert_eq!(
            node_scheduling_properties_change(&old, &heartbeat),
            ActionType::NONE
        );

        let mut labels = old.clone();
        labels.metadata.labels = Some(BTreeMap::from([("zone".into(), "b".into())]));
        assert_eq!(
            node_scheduling_properties_change(&old, &labels),
            ActionType::UPDATE_NODE_LABEL
        );

        let mut tainted = old.clone();
        tainted.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: "k".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert_eq!(
            node_scheduling_properties_change(&old, &tainted),
            ActionType::UPDATE_NODE_TAINT
        );

        let mut cordoned = old.clone();
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_eq!(
            node_scheduling_properties_change(&old, &cordoned),
            ActionType::UPDATE_NODE_TAINT
        );

        let mut bigger = old.clone();
        bigger.status.as_mut().unwrap().allocatable =
            Some(BTreeMap::from([("cpu".into(), Quantity("8".into()))]));
        let both = {
            let mut n = bigger.clone();
            n.metadata.labels = None;
            n
        };
        assert_eq!(
            node_scheduling_properties_change(&old, &bigger),
            ActionType::UPDATE_NODE_ALLOCATABLE
        );
        assert_eq!(
            node_scheduling_properties_change(&old, &both),
            ActionType::UPDATE_NODE_ALLOCATABLE | ActionType::UPDATE_NODE_LABEL
        );
    }

    #[test]
    fn pod_changes_are_classified() {
        let with_cpu = |cpu: &str| {
            let mut p = pod("p", 0);
            p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
                ..Default::default()
            });
            p
        };
        let old = with_cpu("500m");
        assert_eq!(
            pod_scheduling_properties_change(&old, &old),
            ActionType::NONE
        );
        assert_eq!(
            pod_scheduling_properties_change(&old, &with_cpu("250m")),
            ActionType::UPDATE_POD_SCALE_DOWN
        );
        assert_eq!(
            pod_scheduling_properties_change(&old, &with_cpu("1")),
            ActionType::UPDATE_POD_OTHER
        );
        let mut labelled = old.clone();
        labelled.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
        assert_eq!(
            pod_scheduling_properties_change(&old, &labelled),
            ActionType::UPDATE_POD_LABEL
        );
        let mut gated = old.clone();
        gated.spec.as_mut().unwrap().scheduling_gates =
            Some(vec![PodSchedulingGate { name: "g".into() }]);
        assert_eq!(
            pod_scheduling_properties_change(&gated, &old),
            ActionType::UPDATE_POD_SCHEDULING_GATES_ELIMINATED
        );
    }

    #[test]
    fn events_match_registrations() {
        let fit = events_to_register("NodeResourcesFit").unwrap();
        let matches = |e: ClusterEvent| fit.iter().any(|r| e.matches(r));
        assert!(matches(ClusterEvent::NODE_ADD));
        assert!(matches(ClusterEvent::node_update(
            ActionType::UPDATE_NODE_ALLOCATABLE
        )));
        assert!(matches(ClusterEvent::ASSIGNED_POD_DELETE));
        assert!(matches(ClusterEvent::UNSCHEDULED_POD_DELETE));
        assert!(matches(ClusterEvent::UNSCHEDULABLE_TIMEOUT));
        assert!(!matches(ClusterEvent::node_update(
            ActionType::UPDATE_NODE_LABEL
        )));
        assert!(!matches(ClusterEvent::ASSIGNED_POD_ADD));
        assert!(!matches(ClusterEvent::NODE_DELETE));
        assert!(events_to_register("SomethingElse").is_none());
    }

    #[test]
    fn config_validation() {
        assert_eq!(QueueConfig::default().validate(), Ok(()));
        let zero = QueueConfig {
            pod_initial_backoff: Duration::ZERO,
            ..Default::default()
        };
        assert!(zero.validate().is_err());
        let inverted = QueueConfig {
            pod_max_backoff: Duration::from_millis(500),
            ..Default::default()
        };
        assert!(inverted.validate().is_err());
    }
}
