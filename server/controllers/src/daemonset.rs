//! The DaemonSet controller (kube-controller-manager's `pkg/controller/daemon`): one pod of
//! each DaemonSet on every node that should run it, none anywhere else, and a status that
//! counts them.
//!
//! Which nodes should run a daemon pod ([`node_should_run_daemon_pod`]): those whose labels
//! satisfy the template's `nodeSelector` and required node affinity, and whose `NoSchedule` /
//! `NoExecute` taints the pod tolerates — with the tolerations every daemon pod gets on top of
//! its template's ([`add_default_tolerations`]: not-ready and unreachable `NoExecute`, the
//! pressure and unschedulable `NoSchedule` taints, network-unavailable for `hostNetwork`
//! pods), so a cordoned or NotReady node keeps its daemons. A node with an untolerated
//! `NoSchedule` taint only keeps a daemon pod it already has; an untolerated `NoExecute` taint
//! removes it.
//!
//! The controller does not bind pods itself: since Kubernetes 1.12 it creates each pod with a
//! required node affinity `matchFields metadata.name In [node]`
//! ([`replace_node_name_affinity`]) and lets the scheduler bind it, so daemon pods go through
//! the same admission, preemption and resource accounting as every other pod.
//!
//! It carries expectations (`docs/tricks.md` #27) exactly as the ReplicaSet
//! controller does: it raises the creations and the deletions (by UID) it is about to make
//! before writing, the pod handlers lower them as the writes come back through the watch, and
//! while they are unmet a sync only refreshes status. Without them, a sync that ran before
//! its own pod reached the cache would see the node empty and give it a second daemon pod.
//!
//! Rolling update, basic form (no `maxSurge`): pods whose `controller-revision-hash` label
//! differs from the template's hash are deleted, at most `maxUnavailable` counting the nodes
//! already without an available pod; the next sync creates their replacements from the
//! current template. The hash is [`crate::hash::compute_hash`] of the template (with the
//! status' `collisionCount`); no ControllerRevision objects are written (skerry's apiserver
//! does not serve them).
//!
//! Where to start: [`DaemonSetController::sync_daemon_set`]. The decisions — [`plan_manage`],
//! [`plan_rolling_update`] and [`calculate_status`] — are pure functions of the DaemonSet,
//! the nodes and the pods.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    PodTemplateSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use skerry_api::pod::nodeaffinity::{NODE_SELECTOR_OP_IN, RequiredNodeAffinity};
use skerry_api::pod::taints::{
    find_matching_untolerated_taint, is_do_not_schedule_taint, is_no_execute_taint, taints_of,
};
use skerry_api::selector::LabelSelector;
use skerry_client::cache::Indexer;
use skerry_client::informer::SharedInformer;
use skerry_client::retry::{Backoff, on_error};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, Error, PostParams, key_of};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::Context;
use crate::deployment::rolling::scaled_value;
use crate::expectations::{Clock, SystemClock, UidTrackingControllerExpectations};
use crate::hash::compute_hash;
use crate::nodelifecycle::taints::{
    DISK_PRESSURE, MEMORY_PRESSURE, NETWORK_UNAVAILABLE, NO_EXECUTE, NO_SCHEDULE, NOT_READY,
    PID_PRESSURE, UNREACHABLE, UNSCHEDULABLE,
};
use crate::podcontrol::{
    CreatePodError, PodControl, SLOW_START_INITIAL_BATCH_SIZE, adopt_patch,
    create_pod_from_template, is_namespace_terminating, release_patch, slow_start_batch,
};
use crate::runtime::{self, Reconciler};
use crate::util::{
    self, Forward, controller_of, is_pod_available, is_pod_ready, resolve_controller_ref,
};

/// The most pods one sync creates, and the most it deletes. Kubernetes' DaemonSet
/// `BurstReplicas` (250, half the ReplicaSet's 500: every daemon pod lands on a different
/// node, so a burst is also a burst of kubelet work across the whole cluster).
pub const BURST_REPLICAS: usize = 250;

/// Workers syncing DaemonSets at once: kube-controller-manager's
/// `--concurrent-daemonset-syncs` default. DaemonSets are few; more workers would idle.
pub const DEFAULT_WORKERS: usize = 2;

/// Extra attempts at a status write that failed, after a fresh GET; past it the key is
/// re-queued with backoff (Kubernetes' daemon `StatusUpdateRetries`).
pub const STATUS_UPDATE_RETRIES: u32 = 1;

/// The status write's schedule: Kubernetes' `storeDaemonSetStatus` writes again at once, on a
/// fresh GET, whatever the error was, [`STATUS_UPDATE_RETRIES`] times (a failed GET ends it:
/// it is the last run).
const STATUS_UPDATE_BACKOFF: Backoff = Backoff::immediate(STATUS_UPDATE_RETRIES + 1);

/// The label carrying the template hash a pod was created from (apps/v1
/// `DefaultDaemonSetUniqueLabelKey`, the same key as `ControllerRevisionHashLabelKey`).
pub const CONTROLLER_REVISION_HASH_LABEL: &str = "controller-revision-hash";

/// The field a daemon pod's node affinity selects its node by (metav1 `ObjectNameField`).
pub use skerry_api::pod::nodeaffinity::OBJECT_NAME_FIELD;

/// maxUnavailable when the update strategy names none: the apps/v1 default.
pub const DEFAULT_MAX_UNAVAILABLE: i32 = 1;

/// The `RollingUpdate` update strategy type (the default; the other is `OnDelete`).
pub const ROLLING_UPDATE: &str = "RollingUpdate";

/// The kind and apiVersion in a pod's controller reference to its DaemonSet.
const KIND: &str = "DaemonSet";
const API_VERSION: &str = "apps/v1";

// ---- which nodes run a daemon pod ---------------------------------------------------------

/// Whether a node should run a daemon pod, and whether a daemon pod already on it may stay
/// (Kubernetes' `NodeShouldRunDaemonPod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFit {
    /// A daemon pod should be created here if there is none.
    pub should_run: bool,
    /// A daemon pod already here may keep running (true whenever `should_run` is).
    pub should_continue_running: bool,
}

/// The tolerations Kubernetes gives every daemon pod (`AddOrUpdateDaemonPodTolerations`), so
/// that the node lifecycle controller's condition taints never evict or block a daemon: the
/// daemon is often what repairs the condition (a network plugin, a log shipper). Without
/// `tolerationSeconds`: a daemon tolerates a NotReady node forever.
pub fn default_daemon_tolerations(host_network: bool) -> Vec<Toleration> {
    let exists = |key: &str, effect: &str| Toleration {
        key: Some(key.to_string()),
        operator: Some("Exists".to_string()),
        effect: Some(effect.to_string()),
        value: None,
        toleration_seconds: None,
    };
    let mut tolerations = vec![
        exists(NOT_READY, NO_EXECUTE),
        exists(UNREACHABLE, NO_EXECUTE),
        exists(DISK_PRESSURE, NO_SCHEDULE),
        exists(MEMORY_PRESSURE, NO_SCHEDULE),
        exists(PID_PRESSURE, NO_SCHEDULE),
        exists(UNSCHEDULABLE, NO_SCHEDULE),
    ];
    if host_network {
        // A host-network pod does not need the pod network the taint says is missing.
        tolerations.push(exists(NETWORK_UNAVAILABLE, NO_SCHEDULE));
    }
    tolerations
}

/// Adds [`default_daemon_tolerations`] to `spec`, replacing a template toleration with the
/// same key, operator, value and effect (Kubernetes' `AddOrUpdateTolerationInPodSpec`).
pub fn add_default_tolerations(spec: &mut PodSpec) {
    let host_network = spec.host_network == Some(true);
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for wanted in default_daemon_tolerations(host_network) {
        let same = |t: &Toleration| {
            t.key == wanted.key
                && t.operator == wanted.operator
                && t.value == wanted.value
                && t.effect == wanted.effect
        };
        match tolerations.iter_mut().find(|t| same(t)) {
            Some(existing) => *existing = wanted,
            None => tolerations.push(wanted),
        }
    }
}

/// Whether `spec`'s `nodeSelector` and required node affinity select `node` (Kubernetes'
/// `nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)`, its parse errors ignored as the
/// DaemonSet controller ignores them: [`RequiredNodeAffinity`], shared with the scheduler).
pub fn node_affinity_matches(spec: &PodSpec, node: &Node) -> bool {
    RequiredNodeAffinity::from_spec(spec).matches(node)
}

/// Whether `node` should run a daemon pod of `ds` (Kubernetes' `NodeShouldRunDaemonPod` and
/// its `predicates`): node affinity first, then the node's `NoSchedule` and `NoExecute`
/// taints against the template's tolerations plus the daemon defaults. `spec.unschedulable`
/// itself is not consulted: cordoning shows up as the `unschedulable` taint, which every
/// daemon tolerates.
pub fn node_should_run_daemon_pod(node: &Node, ds: &DaemonSet) -> NodeFit {
    let mut spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .unwrap_or_default();
    add_default_tolerations(&mut spec);
    if !node_affinity_matches(&spec, node) {
        return NodeFit {
            should_run: false,
            should_continue_running: false,
        };
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let untolerated = |inclusion: fn(&Taint) -> bool| {
        find_matching_untolerated_taint(taints_of(node), tolerations, inclusion).is_some()
    };
    if untolerated(is_do_not_schedule_taint) {
        // A pod already here stays unless a NoExecute taint would evict it anyway.
        return NodeFit {
            should_run: false,
            should_continue_running: !untolerated(is_no_execute_taint),
        };
    }
    NodeFit {
        should_run: true,
        should_continue_running: true,
    }
}

// ---- the pods it creates ------------------------------------------------------------------

/// `affinity` with its required node affinity replaced by `matchFields metadata.name In
/// [node_name]` (Kubernetes' `ReplaceDaemonSetPodNodeNameNodeAffinity`). The template's own
/// required terms go: the controller has already checked them against this node, and ORing
/// them in would let the scheduler place the pod elsewhere. Preferred terms and pod
/// (anti-)affinity are kept.
pub fn replace_node_name_affinity(affinity: Option<Affinity>, node_name: &str) -> Affinity {
    let term = NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![NodeSelectorRequirement {
            key: OBJECT_NAME_FIELD.to_string(),
            operator: NODE_SELECTOR_OP_IN.to_string(),
            values: Some(vec![node_name.to_string()]),
        }]),
    };
    let mut affinity = affinity.unwrap_or_default();
    affinity
        .node_affinity
        .get_or_insert_with(Default::default)
        .required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![term],
    });
    affinity
}

/// The node a daemon pod is for: its `nodeName` once bound, else the single value of its
/// `matchFields metadata.name In [...]` requirement (Kubernetes' `GetTargetNodeName`).
pub fn target_node_name(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    if let Some(name) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(name);
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|r| r.key == OBJECT_NAME_FIELD && r.operator == NODE_SELECTOR_OP_IN)
        .and_then(|r| match r.values.as_deref() {
            Some([name]) => Some(name.as_str()),
            _ => None,
        })
}

/// The hash of `ds`'s template, with its collision count: the `controller-revision-hash`
/// label of the pods of the current revision.
pub fn revision_hash(ds: &DaemonSet) -> String {
    let template = ds
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let collision_count = ds.status.as_ref().and_then(|s| s.collision_count);
    compute_hash(&template, collision_count)
}

/// The template daemon pods are created from (Kubernetes' `CreatePodTemplate`): the
/// DaemonSet's, with the default tolerations and the revision hash label. The node affinity
/// is added per node.
pub fn daemon_pod_template(ds: &DaemonSet, hash: &str) -> PodTemplateSpec {
    let mut template = ds
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    add_default_tolerations(template.spec.get_or_insert_with(Default::default));
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(CONTROLLER_REVISION_HASH_LABEL.to_string(), hash.to_string());
    template
}

// ---- decisions ----------------------------------------------------------------------------

fn node_name_of(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), Some("Succeeded" | "Failed"))
}

fn is_scheduled(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// Bound pods first, then older first, then by name (Kubernetes'
/// `podByCreationTimestampAndPhase`): the pod a node keeps when it has several.
pub fn compare_oldest_first(a: &Pod, b: &Pod) -> Ordering {
    is_scheduled(b)
        .cmp(&is_scheduled(a))
        .then_with(|| {
            let ta = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let tb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
            ta.cmp(&tb)
        })
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The DaemonSet's pods grouped by the node they are for, each group oldest first. Pods with
/// no target node are left out, and so are finished pods already being deleted (they are
/// gone in all but name; Kubernetes' `getNodesToDaemonPods` without `includeDeletedTerminal`).
pub fn nodes_to_daemon_pods(pods: &[Arc<Pod>]) -> BTreeMap<String, Vec<Arc<Pod>>> {
    let mut by_node: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
    for pod in pods {
        if is_terminal(pod) && pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(node) = target_node_name(pod) {
            by_node
                .entry(node.to_string())
                .or_default()
                .push(pod.clone());
        }
    }
    for group in by_node.values_mut() {
        group.sort_by(|a, b| compare_oldest_first(a, b));
    }
    by_node
}

/// What one pass of `manage` does.
#[derive(Clone, Debug, Default)]
pub struct ManagePlan {
    /// Nodes that should run a daemon pod and have none, by name.
    pub create_on: Vec<String>,
    /// Daemon pods to delete: finished ones, all but the oldest on a node with several, and
    /// all on nodes that should not run one (or no longer exist).
    pub delete: Vec<Arc<Pod>>,
}

/// Kubernetes' `podsShouldBeOnNode` over every node, plus the pods of nodes that are gone.
///
/// Pods of a deleted node are deleted whether bound or not. Kubernetes deletes only the
/// unbound ones and leaves the bound ones to the pod garbage collector; skerry has none, and
/// a pod for a node that no longer exists can never run.
pub fn plan_manage(
    ds: &DaemonSet,
    nodes: &[Arc<Node>],
    node_to_pods: &BTreeMap<String, Vec<Arc<Pod>>>,
) -> ManagePlan {
    let mut plan = ManagePlan::default();
    let live = |pods: &[Arc<Pod>]| -> Vec<Arc<Pod>> {
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect()
    };
    let mut seen = HashSet::new();
    for node in nodes {
        let name = node_name_of(node);
        seen.insert(name);
        let fit = node_should_run_daemon_pod(node, ds);
        let pods = node_to_pods
            .get(name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if fit.should_run && pods.is_empty() {
            plan.create_on.push(name.to_string());
        } else if fit.should_continue_running {
            // A finished daemon pod is dead (daemons restart in place, never exit): replace
            // it. The replacement is created by the next sync, once this one is gone.
            let (finished, running): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) =
                live(pods).into_iter().partition(|p| is_terminal(p));
            plan.delete.extend(finished);
            // Oldest first already: keep it, delete the rest.
            plan.delete.extend(running.into_iter().skip(1));
        } else {
            plan.delete.extend(live(pods));
        }
    }
    for (node, pods) in node_to_pods {
        if !seen.contains(node.as_str()) {
            plan.delete.extend(live(pods));
        }
    }
    plan
}

/// The update strategy's maxUnavailable for `desired` nodes: percentages round up, and 0 (a
/// rounding artefact, or a strategy that would never progress) becomes 1 when there is a node
/// to update (Kubernetes' `updatedDesiredNodeCounts` with `maxSurge` 0).
pub fn max_unavailable(ds: &DaemonSet, desired: i32) -> i32 {
    let value = ds
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.clone())
        .unwrap_or(IntOrString::Int(DEFAULT_MAX_UNAVAILABLE));
    let n = scaled_value(&value, desired, true).unwrap_or(DEFAULT_MAX_UNAVAILABLE);
    if desired > 0 && n <= 0 { 1 } else { n.max(0) }
}

/// Whether `ds` rolls its pods on a template change (the default) rather than `OnDelete`.
pub fn is_rolling_update(ds: &DaemonSet) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        .is_none_or(|t| t == ROLLING_UPDATE)
}

fn is_updated(pod: &Pod, hash: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CONTROLLER_REVISION_HASH_LABEL))
        .is_some_and(|h| h == hash)
}

fn min_ready_seconds(ds: &DaemonSet) -> i32 {
    ds.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
}

/// The old pods a rolling update deletes now (Kubernetes' `rollingUpdate` without surge):
/// every old pod that is not available anyway, plus available old pods while fewer than
/// maxUnavailable nodes are without an available pod. A node counts as unavailable when it
/// should run a pod and has none, has an old and a new one (manage is mid-change), or has an
/// unavailable new one. Nodes are visited in name order, so the choice is deterministic.
pub fn plan_rolling_update(
    ds: &DaemonSet,
    nodes: &[Arc<Node>],
    node_to_pods: &BTreeMap<String, Vec<Arc<Pod>>>,
    hash: &str,
    now: &Time,
) -> Vec<Arc<Pod>> {
    let min_ready = min_ready_seconds(ds);
    let mut wanted: BTreeMap<&str, &[Arc<Pod>]> = node_to_pods
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_slice()))
        .collect();
    let mut desired = 0;
    for node in nodes {
        if node_should_run_daemon_pod(node, ds).should_run {
            desired += 1;
            wanted.entry(node_name_of(node)).or_default();
        }
    }
    let max_unavailable = max_unavailable(ds, desired);
    let mut unavailable = 0;
    let mut replace_now = Vec::new();
    let mut candidates = Vec::new();
    for pods in wanted.values() {
        let mut new_pod = None;
        let mut old_pod = None;
        let mut several = false;
        for pod in pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            let slot = if is_updated(pod, hash) {
                &mut new_pod
            } else {
                &mut old_pod
            };
            if slot.is_some() {
                several = true;
            }
            *slot = Some(pod);
        }
        if several {
            // Two of a kind on one node: manage deletes the extra first.
            continue;
        }
        match (new_pod, old_pod) {
            (None, None) | (Some(_), Some(_)) => unavailable += 1,
            (Some(new_pod), None) => {
                if !is_pod_available(new_pod, min_ready, now.clone()) {
                    unavailable += 1;
                }
            }
            (None, Some(old_pod)) => {
                if !is_pod_available(old_pod, min_ready, now.clone()) {
                    // Not serving anyway: replacing it costs no availability.
                    replace_now.push(old_pod.clone());
                } else if unavailable < max_unavailable {
                    candidates.push(old_pod.clone());
                }
            }
        }
    }
    let budget = usize::try_from(max_unavailable - unavailable).unwrap_or(0);
    replace_now.extend(candidates.into_iter().take(budget));
    replace_now
}

/// The status `ds` should have (Kubernetes' `updateDaemonSetStatus`): per node that should
/// run a pod, whether it has one, whether the oldest is ready / available / of the current
/// revision; per node that should not, whether it has one anyway. `observedGeneration`,
/// `collisionCount` and conditions are carried over; the caller sets the generation.
pub fn calculate_status(
    ds: &DaemonSet,
    nodes: &[Arc<Node>],
    node_to_pods: &BTreeMap<String, Vec<Arc<Pod>>>,
    hash: &str,
    now: &Time,
) -> DaemonSetStatus {
    let min_ready = min_ready_seconds(ds);
    let mut status = ds.status.clone().unwrap_or_default();
    let (mut desired, mut current, mut misscheduled) = (0, 0, 0);
    let (mut ready, mut available, mut updated) = (0, 0, 0);
    for node in nodes {
        let pods = node_to_pods.get(node_name_of(node));
        let oldest = pods.and_then(|p| p.first());
        if node_should_run_daemon_pod(node, ds).should_run {
            desired += 1;
            let Some(pod) = oldest else { continue };
            current += 1;
            if is_pod_ready(pod) {
                ready += 1;
                if is_pod_available(pod, min_ready, now.clone()) {
                    available += 1;
                }
            }
            if is_updated(pod, hash) {
                updated += 1;
            }
        } else if oldest.is_some() {
            misscheduled += 1;
        }
    }
    status.desired_number_scheduled = desired;
    status.current_number_scheduled = current;
    status.number_misscheduled = misscheduled;
    status.number_ready = ready;
    status.number_available = Some(available);
    status.updated_number_scheduled = Some(updated);
    status.number_unavailable = Some(desired - available);
    status
}

// ---- claiming pods (shared with the StatefulSet controller) --------------------------------

/// What a controller does with one pod of its namespace (Kubernetes' `ClaimObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Controlled by the owner and selected: keep it.
    Owned,
    /// An orphan the owner selects: adopt it.
    Adopt,
    /// Controlled by the owner but no longer selected: release it.
    Release,
    /// Someone else's, or nothing to do with the owner.
    Ignore,
}

/// The claim decision for `pod` by `owner`, whose selector is `selector` and whose
/// additional membership test (a StatefulSet's name prefix) is `member`.
pub fn claim_decision(
    owner: &ObjectMeta,
    selector: &LabelSelector,
    member: bool,
    pod: &Pod,
) -> Claim {
    let selected =
        member && !selector.is_empty() && selector.matches_opt(pod.metadata.labels.as_ref());
    let owner_deleting = owner.deletion_timestamp.is_some();
    match controller_of(&pod.metadata) {
        Some(r) if Some(r.uid.as_str()) != owner.uid.as_deref() => Claim::Ignore,
        Some(_) if selected => Claim::Owned,
        // A controller being deleted keeps its pods for the garbage collector.
        Some(_) if owner_deleting => Claim::Ignore,
        Some(_) => Claim::Release,
        None if selected && !owner_deleting && pod.metadata.deletion_timestamp.is_none() => {
            Claim::Adopt
        }
        None => Claim::Ignore,
    }
}

/// Adopts the orphans `owner` selects and releases the pods it no longer selects, returning
/// the pods it controls (Kubernetes' `PodControllerRefManager.ClaimPods`). Adoption is
/// preceded, once per call, by `recheck`: a live read that the owner still exists and is not
/// being deleted, so an orphan is never handed to a ghost the cache has not seen go.
pub(crate) async fn claim_pods(
    control: &dyn PodControl,
    owner: &ObjectMeta,
    controller_ref: &OwnerReference,
    selector: &LabelSelector,
    pods: Vec<Arc<Pod>>,
    is_member: impl Fn(&Pod) -> bool,
    recheck: impl AsyncFnOnce() -> Result<(), String>,
) -> anyhow::Result<Vec<Arc<Pod>>> {
    let namespace = owner.namespace.as_deref().unwrap_or_default();
    let owner_uid = owner.uid.as_deref().unwrap_or_default();
    let mut claimed = Vec::with_capacity(pods.len());
    let mut errors = Vec::new();
    let mut recheck = Some(recheck);
    let mut can_adopt: Option<Result<(), String>> = None;
    for pod in pods {
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
        match claim_decision(owner, selector, is_member(&pod), &pod) {
            Claim::Owned => claimed.push(pod),
            Claim::Ignore => {}
            Claim::Release => match control
                .patch_pod(namespace, pod_name, &release_patch(owner_uid, pod_uid))
                .await
            {
                Ok(_) => tracing::info!(pod = pod_name, owner = ?owner.name, "released pod"),
                // Gone, or replaced by another pod of the same name: nothing to release.
                Err(e) if e.is_not_found() || e.code() == Some(422) => {}
                Err(e) => errors.push(format!("release pod {pod_name}: {e}")),
            },
            Claim::Adopt => {
                if can_adopt.is_none()
                    && let Some(recheck) = recheck.take()
                {
                    can_adopt = Some(recheck().await);
                }
                if let Some(Err(e)) = &can_adopt {
                    errors.push(format!("cannot adopt pod {pod_name}: {e}"));
                    continue;
                }
                match control
                    .patch_pod(namespace, pod_name, &adopt_patch(controller_ref, pod_uid))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(pod = pod_name, owner = ?owner.name, "adopted pod");
                        claimed.push(pod);
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) => errors.push(format!("adopt pod {pod_name}: {e}")),
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(claimed)
    } else {
        Err(anyhow::anyhow!(errors.join("; ")))
    }
}

// ---- the controller -----------------------------------------------------------------------

/// The DaemonSet reads and writes the controller makes besides pods. Object-safe so tests
/// substitute a fake; [`Client`] implements it.
pub trait DaemonSetClient: Send + Sync + 'static {
    /// GET `namespace/name`.
    fn get_daemon_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<DaemonSet, Error>>;
    /// PUT the status subresource (409 on a stale resourceVersion).
    fn replace_daemon_set_status<'a>(
        &'a self,
        ds: &'a DaemonSet,
    ) -> BoxFuture<'a, Result<DaemonSet, Error>>;
}

impl DaemonSetClient for Client {
    fn get_daemon_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<DaemonSet, Error>> {
        Box::pin(async move { self.api::<DaemonSet>(Some(namespace)).get(name).await })
    }

    fn replace_daemon_set_status<'a>(
        &'a self,
        ds: &'a DaemonSet,
    ) -> BoxFuture<'a, Result<DaemonSet, Error>> {
        Box::pin(async move {
            let namespace = ds.metadata.namespace.as_deref().unwrap_or_default();
            let name = ds.metadata.name.as_deref().unwrap_or_default();
            self.api::<DaemonSet>(Some(namespace))
                .replace_status(name, &PostParams::default(), ds)
                .await
        })
    }
}

/// What a [`DaemonSetController`] is built from, for tests that fill the caches themselves
/// and fake the writes.
pub struct Parts {
    /// The DaemonSet lister's store.
    pub daemon_sets: Indexer<DaemonSet>,
    /// The pod lister's store.
    pub pods: Indexer<Pod>,
    /// The node lister's store.
    pub nodes: Indexer<Node>,
    /// Pod writes.
    pub pod_control: Arc<dyn PodControl>,
    /// DaemonSet GET and status writes.
    pub daemon_set_client: Arc<dyn DaemonSetClient>,
    /// The expectations' clock.
    pub clock: Arc<dyn Clock>,
}

type Informers = (
    SharedInformer<DaemonSet>,
    SharedInformer<Pod>,
    SharedInformer<Node>,
);

/// The DaemonSet controller. Build it with [`DaemonSetController::new`], then run it with
/// [`DaemonSetController::run`] once the informers are started.
pub struct DaemonSetController {
    daemon_sets: Indexer<DaemonSet>,
    pods: Indexer<Pod>,
    nodes: Indexer<Node>,
    pod_control: Arc<dyn PodControl>,
    daemon_set_client: Arc<dyn DaemonSetClient>,
    expectations: UidTrackingControllerExpectations,
    queue: WorkQueue<String>,
    /// The shared informers `run` waits for (none when built from [`Parts`]).
    informers: Option<Informers>,
}

impl DaemonSetController {
    /// A controller over the context's shared DaemonSet, Pod and Node informers, with its
    /// event handlers registered.
    pub fn new(ctx: &Context) -> Arc<DaemonSetController> {
        let ds_informer = ctx.informers.informer::<DaemonSet>();
        let pod_informer = ctx.informers.informer::<Pod>();
        let node_informer = ctx.informers.informer::<Node>();
        let parts = Parts {
            daemon_sets: ds_informer.store(),
            pods: pod_informer.store(),
            nodes: node_informer.store(),
            pod_control: Arc::new(ctx.client.clone()),
            daemon_set_client: Arc::new(ctx.client.clone()),
            clock: Arc::new(SystemClock),
        };
        let controller = Arc::new(Self::build(
            parts,
            Some((
                ds_informer.clone(),
                pod_informer.clone(),
                node_informer.clone(),
            )),
        ));
        ds_informer.add_handler(Forward::new(
            &controller,
            |c, ds| c.add_daemon_set(ds),
            |c, old, new| c.update_daemon_set(old, new),
            |c, ds| c.delete_daemon_set(ds),
        ));
        pod_informer.add_handler(Forward::new(
            &controller,
            |c, pod| c.add_pod(pod),
            |c, old, new| c.update_pod(old, new),
            |c, pod| c.delete_pod(pod),
        ));
        node_informer.add_handler(Forward::new(
            &controller,
            |c, node| c.add_node(node),
            |c, old, new| c.update_node(old, new),
            |c, node| c.delete_node(node),
        ));
        controller
    }

    /// A controller over caches and writers the caller provides; no handlers are registered
    /// (the caller calls [`Self::add_pod`] and friends to deliver events).
    pub fn from_parts(parts: Parts) -> Arc<DaemonSetController> {
        Arc::new(Self::build(parts, None))
    }

    fn build(parts: Parts, informers: Option<Informers>) -> DaemonSetController {
        DaemonSetController {
            daemon_sets: parts.daemon_sets,
            pods: parts.pods,
            nodes: parts.nodes,
            pod_control: parts.pod_control,
            daemon_set_client: parts.daemon_set_client,
            expectations: UidTrackingControllerExpectations::with_clock(parts.clock),
            queue: WorkQueue::new("daemonset"),
            informers,
        }
    }

    /// The controller's expectations.
    pub fn expectations(&self) -> &UidTrackingControllerExpectations {
        &self.expectations
    }

    /// The controller's work queue of DaemonSet keys.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits for the informers' first lists, then runs `workers` workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        if let Some((ds, pods, nodes)) = &self.informers
            && (!ds.wait_for_sync(&stop).await
                || !pods.wait_for_sync(&stop).await
                || !nodes.wait_for_sync(&stop).await)
        {
            tracing::info!("daemonset controller stopped before its caches synced");
            return;
        }
        tracing::info!(workers, "starting daemonset controller");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }

    // ---- event handlers -------------------------------------------------------------------

    fn enqueue(&self, ds: &DaemonSet) {
        self.queue.add(key_of(ds));
    }

    fn enqueue_all(&self) {
        for ds in self.daemon_sets.list() {
            self.enqueue(&ds);
        }
    }

    /// The DaemonSets whose selector matches an orphan `pod`.
    fn pod_daemon_sets(&self, pod: &Pod) -> Vec<Arc<DaemonSet>> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        self.daemon_sets
            .list_namespace(namespace)
            .into_iter()
            .filter(|ds| {
                ds.spec.as_ref().is_some_and(|s| {
                    LabelSelector::from_api(&s.selector).is_ok_and(|sel| {
                        !sel.is_empty() && sel.matches_opt(pod.metadata.labels.as_ref())
                    })
                })
            })
            .collect()
    }

    /// A DaemonSet appeared.
    pub fn add_daemon_set(&self, ds: &DaemonSet) {
        self.enqueue(ds);
    }

    /// A DaemonSet changed. A changed UID is a delete and re-create folded into one update.
    pub fn update_daemon_set(&self, old: &DaemonSet, cur: &DaemonSet) {
        if old.metadata.uid != cur.metadata.uid {
            self.delete_daemon_set(old);
        }
        self.enqueue(cur);
    }

    /// A DaemonSet was deleted: its expectations can never be met.
    pub fn delete_daemon_set(&self, ds: &DaemonSet) {
        let key = key_of(ds);
        self.expectations.delete_expectations(&key);
        self.queue.add(key);
    }

    /// A pod appeared: one of our creations came back, or an orphan to consider.
    pub fn add_pod(&self, pod: &Pod) {
        if pod.metadata.deletion_timestamp.is_some() {
            self.delete_pod(pod);
            return;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        if let Some(r) = controller_of(&pod.metadata) {
            if let Some(ds) = resolve_controller_ref(&self.daemon_sets, namespace, r) {
                let key = key_of(ds.as_ref());
                self.expectations.creation_observed(&key);
                self.queue.add(key);
            }
            return;
        }
        for ds in self.pod_daemon_sets(pod) {
            self.enqueue(&ds);
        }
    }

    /// A pod changed.
    pub fn update_pod(&self, old: &Pod, cur: &Pod) {
        if old.metadata.resource_version == cur.metadata.resource_version {
            return; // A resync.
        }
        if cur.metadata.deletion_timestamp.is_some() {
            // A graceful delete: the node needs its replacement now, not when the pod goes.
            self.delete_pod(cur);
            return;
        }
        let namespace = cur.metadata.namespace.as_deref().unwrap_or_default();
        let (old_ref, cur_ref) = (controller_of(&old.metadata), controller_of(&cur.metadata));
        if old_ref != cur_ref
            && let Some(ds) =
                old_ref.and_then(|r| resolve_controller_ref(&self.daemon_sets, namespace, r))
        {
            self.enqueue(&ds);
        }
        if let Some(r) = cur_ref {
            let Some(ds) = resolve_controller_ref(&self.daemon_sets, namespace, r) else {
                return;
            };
            self.enqueue(&ds);
            // Ready now, available minReadySeconds later, and nothing else wakes us then.
            let min_ready = min_ready_seconds(&ds);
            if !is_pod_ready(old) && is_pod_ready(cur) && min_ready > 0 {
                let delay = Duration::from_secs(u64::from(min_ready.unsigned_abs()) + 1);
                self.queue.add_after(key_of(ds.as_ref()), delay);
            }
            return;
        }
        if old.metadata.labels != cur.metadata.labels || old_ref != cur_ref {
            for ds in self.pod_daemon_sets(cur) {
                self.enqueue(&ds);
            }
        }
    }

    /// A pod was deleted (or found gone by a relist).
    pub fn delete_pod(&self, pod: &Pod) {
        let Some(r) = controller_of(&pod.metadata) else {
            return;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some(ds) = resolve_controller_ref(&self.daemon_sets, namespace, r) else {
            return;
        };
        let key = key_of(ds.as_ref());
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.expectations.deletion_observed(&key, uid);
        }
        self.queue.add(key);
    }

    /// A node appeared: every DaemonSet that should run on it.
    pub fn add_node(&self, node: &Node) {
        for ds in self.daemon_sets.list() {
            if node_should_run_daemon_pod(node, &ds).should_run {
                self.enqueue(&ds);
            }
        }
    }

    /// A node changed: the DaemonSets for which it changed fit. Status heartbeats and
    /// resyncs change nothing here and wake nobody.
    pub fn update_node(&self, old: &Node, cur: &Node) {
        for ds in self.daemon_sets.list() {
            if node_should_run_daemon_pod(old, &ds) != node_should_run_daemon_pod(cur, &ds) {
                self.enqueue(&ds);
            }
        }
    }

    /// A node was deleted: its daemon pods can never run.
    pub fn delete_node(&self, _node: &Node) {
        self.enqueue_all();
    }

    // ---- sync -------------------------------------------------------------------------------

    /// Brings the DaemonSet at `key` towards one current pod on every node that should run
    /// it, and writes its status.
    pub async fn sync_daemon_set(&self, key: &str) -> anyhow::Result<()> {
        let (namespace, name) = util::split_key(key);
        let Some(ds) = self.daemon_sets.get_by(namespace, name) else {
            tracing::debug!(daemonset = %key, "daemonset gone");
            self.expectations.delete_expectations(key);
            return Ok(());
        };
        let selector = match ds
            .spec
            .as_ref()
            .map(|s| LabelSelector::from_api(&s.selector).map_err(|e| e.message))
        {
            Some(Ok(s)) if !s.is_empty() => s,
            // Retrying cannot fix a selector; the next update of the DaemonSet will.
            other => {
                tracing::warn!(daemonset = %key, selector = ?other, "empty or invalid selector; nothing to do");
                return Ok(());
            }
        };
        if ds.metadata.deletion_timestamp.is_some() {
            // The garbage collector removes the pods.
            return Ok(());
        }
        let hash = revision_hash(&ds);
        // Read before listing pods: an event that lowers the expectations after this has its
        // pod in the list below, never the other way round.
        let satisfied = self.expectations.satisfied(key);
        let pods = self.claim(&ds, &selector, namespace).await?;
        let node_to_pods = nodes_to_daemon_pods(&pods);
        let mut nodes = self.nodes.list();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

        if !satisfied {
            // Writes are in flight: report what is known, but do not claim this generation.
            return self
                .update_status(&ds, &nodes, &node_to_pods, &hash, false)
                .await;
        }
        let plan = plan_manage(&ds, &nodes, &node_to_pods);
        let mut result = self
            .sync_nodes(&ds, key, &plan.create_on, plan.delete, &hash)
            .await;
        if result.is_ok() && self.expectations.satisfied(key) && is_rolling_update(&ds) {
            let victims = plan_rolling_update(&ds, &nodes, &node_to_pods, &hash, &util::now());
            if !victims.is_empty() {
                tracing::debug!(daemonset = %key, count = victims.len(), "rolling update: deleting old pods");
            }
            result = self.sync_nodes(&ds, key, &[], victims, &hash).await;
        }
        let status_result = self
            .update_status(&ds, &nodes, &node_to_pods, &hash, true)
            .await;
        result.and(status_result)
    }

    async fn claim(
        &self,
        ds: &DaemonSet,
        selector: &LabelSelector,
        namespace: &str,
    ) -> anyhow::Result<Vec<Arc<Pod>>> {
        let controller_ref = util::controller_ref(API_VERSION, KIND, &ds.metadata);
        let name = ds.metadata.name.as_deref().unwrap_or_default();
        let recheck = async || {
            let fresh = self
                .daemon_set_client
                .get_daemon_set(namespace, name)
                .await
                .map_err(|e| e.to_string())?;
            if fresh.metadata.uid != ds.metadata.uid {
                return Err(format!("original {namespace}/{name} is gone"));
            }
            if fresh.metadata.deletion_timestamp.is_some() {
                return Err(format!("{namespace}/{name} has just been deleted"));
            }
            Ok(())
        };
        claim_pods(
            self.pod_control.as_ref(),
            &ds.metadata,
            &controller_ref,
            selector,
            self.pods.list_namespace(namespace),
            |_| true,
            recheck,
        )
        .await
    }

    /// Raises the creations and the UID-tracked deletions of one `sync_nodes` at once.
    fn expect_writes(&self, key: &str, creations: usize, deletion_uids: Vec<String>) {
        self.expectations.expect_deletions(key, deletion_uids);
        // UidTrackingControllerExpectations has no setter for both counts: the record
        // expect_deletions just replaced is raised by the creations (lowered by a negative
        // count).
        self.expectations
            .lower_expectations(key, -i64::try_from(creations).unwrap_or(i64::MAX), 0);
    }

    /// Creates a daemon pod on each of `create_on` and deletes `delete`, at most
    /// [`BURST_REPLICAS`] of each, with the expectations raised first (Kubernetes'
    /// `syncNodes`).
    async fn sync_nodes(
        &self,
        ds: &DaemonSet,
        key: &str,
        create_on: &[String],
        mut delete: Vec<Arc<Pod>>,
        hash: &str,
    ) -> anyhow::Result<()> {
        let create_on = &create_on[..create_on.len().min(BURST_REPLICAS)];
        delete.truncate(BURST_REPLICAS);
        if create_on.is_empty() && delete.is_empty() {
            return Ok(());
        }
        let namespace = ds.metadata.namespace.as_deref().unwrap_or_default();
        let uids = delete
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        // Raised BEFORE the first write: an ADDED event can beat `create`'s return.
        self.expect_writes(key, create_on.len(), uids);

        let template = daemon_pod_template(ds, hash);
        let controller_ref = util::controller_ref(API_VERSION, KIND, &ds.metadata);
        let next = AtomicUsize::new(0);
        let creations = async {
            if create_on.is_empty() {
                return None;
            }
            tracing::debug!(daemonset = %key, count = create_on.len(), "creating daemon pods");
            let outcome = slow_start_batch(create_on.len(), SLOW_START_INITIAL_BATCH_SIZE, || {
                let i = next.fetch_add(1, AtomicOrdering::SeqCst);
                let node = create_on.get(i).cloned().unwrap_or_default();
                let mut template = template.clone();
                let spec = template.spec.get_or_insert_with(Default::default);
                spec.affinity = Some(replace_node_name_affinity(spec.affinity.take(), &node));
                let controller_ref = controller_ref.clone();
                async move {
                    create_pod_from_template(
                        self.pod_control.as_ref(),
                        namespace,
                        &template,
                        &ds.metadata,
                        controller_ref,
                    )
                    .await
                    .map(|_| ())
                }
            })
            .await;
            // Creations that failed or were never attempted will never be observed.
            let unobserved = create_on.len() - outcome.successes;
            if unobserved > 0 {
                self.expectations.lower_expectations(
                    key,
                    i64::try_from(unobserved).unwrap_or(i64::MAX),
                    0,
                );
            }
            match outcome.error {
                // The namespace is going away and the pods with it: not a failure.
                Some(CreatePodError::Api(e)) if is_namespace_terminating(&e) => None,
                Some(e) => Some(anyhow::Error::new(e).context("create daemon pods")),
                None => None,
            }
        };
        let deletions = async {
            let results = futures::future::join_all(delete.iter().map(|pod| async move {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                (pod, self.pod_control.delete_pod(namespace, name).await)
            }))
            .await;
            let mut first_error = None;
            for (pod, result) in results {
                if let Err(e) = result {
                    // No DELETED event will come for a delete that failed.
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        self.expectations.deletion_observed(key, uid);
                    }
                    if !e.is_not_found() && first_error.is_none() {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        first_error =
                            Some(anyhow::Error::new(e).context(format!("delete pod {name}")));
                    }
                }
            }
            first_error
        };
        let (create_error, delete_error) = futures::join!(creations, deletions);
        match create_error.or(delete_error) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Writes the status if it changed, retrying once on a fresh copy, and re-queues the
    /// DaemonSet for when its ready pods become available.
    async fn update_status(
        &self,
        ds: &DaemonSet,
        nodes: &[Arc<Node>],
        node_to_pods: &BTreeMap<String, Vec<Arc<Pod>>>,
        hash: &str,
        update_observed_generation: bool,
    ) -> anyhow::Result<()> {
        let mut status = calculate_status(ds, nodes, node_to_pods, hash, &util::now());
        if update_observed_generation {
            status.observed_generation = ds.metadata.generation;
        }
        let key = key_of(ds);
        let min_ready = min_ready_seconds(ds);
        if min_ready > 0 && Some(status.number_ready) != status.number_available {
            let delay = Duration::from_secs(u64::from(min_ready.unsigned_abs()));
            self.queue.add_after(key.clone(), delay);
        }
        if ds.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let namespace = ds.metadata.namespace.as_deref().unwrap_or_default();
        let name = ds.metadata.name.as_deref().unwrap_or_default();
        let client = &self.daemon_set_client;
        let (status, key) = (&status, &key);
        let mut runs = 0;
        on_error(
            STATUS_UPDATE_BACKOFF,
            // Any error: Kubernetes retries whatever made the write fail.
            |_: &Error| true,
            || {
                runs += 1;
                let fresh = runs > 1;
                async move {
                    let mut target = if fresh {
                        tracing::debug!(daemonset = %key, "status update failed; retrying on a fresh copy");
                        client.get_daemon_set(namespace, name).await?
                    } else {
                        ds.clone()
                    };
                    target.status = Some(status.clone());
                    client.replace_daemon_set_status(&target).await.map(|_| ())
                }
            },
        )
        .await
        .context("update daemonset status")
    }
}

impl Reconciler for DaemonSetController {
    fn name(&self) -> &'static str {
        "daemonset"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        let span = tracing::debug_span!("sync", daemonset = %key);
        self.sync_daemon_set(key).instrument(span).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use crate::expectations::ManualClock;
    use k8s_openapi::api::apps::v1::{
        DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
    };
    use k8s_openapi::api::core::v1::{
        Container, NodeAffinity, NodeSpec, PodCondition, PodStatus, PreferredSchedulingTerm, Taint,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Status};
    use k8s_openapi::jiff::SignedDuration;
    use parking_lot::Mutex;
    use serde_json::Value;

    const NS: &str = "default";

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn node(name: &str, node_labels: &[(&str, &str)], taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels(node_labels)),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }
    }

    fn daemon_set(name: &str) -> DaemonSet {
        let selector = labels(&[("app", name)]);
        DaemonSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                uid: Some(format!("ds-uid-{name}")),
                generation: Some(1),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(DaemonSetSpec {
                selector: LabelSelector {
                    match_labels: Some(selector.clone()),
                    match_expressions: None,
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(selector),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "agent".into(),
                            image: Some("agent:1".into()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..DaemonSetSpec::default()
            }),
            status: None,
        }
    }

    fn template_spec(ds: &mut DaemonSet) -> &mut PodSpec {
        ds.spec.as_mut().unwrap().template.spec.as_mut().unwrap()
    }

    fn ago(now: &Time, seconds: i64) -> Time {
        Time(now.0 - SignedDuration::from_secs(seconds))
    }

    /// A pod of `ds` for `node_name` (by affinity, as the controller makes them), created
    /// `age_s` seconds ago, of revision `hash`.
    fn daemon_pod(ds: &DaemonSet, name: &str, node_name: &str, age_s: i64, hash: &str) -> Pod {
        let now = util::now();
        let mut template = daemon_pod_template(ds, hash);
        let spec = template.spec.as_mut().unwrap();
        spec.affinity = Some(replace_node_name_affinity(None, node_name));
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("1".into()),
                creation_timestamp: Some(ago(&now, age_s)),
                labels: template.metadata.unwrap().labels,
                owner_references: Some(vec![util::controller_ref(API_VERSION, KIND, &ds.metadata)]),
                ..ObjectMeta::default()
            },
            spec: template.spec,
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..PodStatus::default()
            }),
        }
    }

    fn running_ready(mut pod: Pod) -> Pod {
        let now = util::now();
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_transition_time: Some(ago(&now, 600)),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<&str> {
        pods.iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect()
    }

    fn arcs<T>(items: Vec<T>) -> Vec<Arc<T>> {
        items.into_iter().map(Arc::new).collect()
    }

    fn requirement(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn required_affinity(terms: Vec<Vec<NodeSelectorRequirement>>) -> Affinity {
        Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms
                        .into_iter()
                        .map(|e| NodeSelectorTerm {
                            match_expressions: Some(e),
                            match_fields: None,
                        })
                        .collect(),
                }),
                preferred_during_scheduling_ignored_during_execution: None,
            }),
            ..Affinity::default()
        }
    }

    const RUN: NodeFit = NodeFit {
        should_run: true,
        should_continue_running: true,
    };
    const STAY: NodeFit = NodeFit {
        should_run: false,
        should_continue_running: true,
    };
    const NEVER: NodeFit = NodeFit {
        should_run: false,
        should_continue_running: false,
    };

    // ---- which nodes ------------------------------------------------------------------------

    #[test]
    fn daemons_tolerate_the_condition_taints_and_cordoning() {
        let ds = daemon_set("agent");
        for (key, effect) in [
            (NOT_READY, NO_EXECUTE),
            (UNREACHABLE, NO_EXECUTE),
            (DISK_PRESSURE, NO_SCHEDULE),
            (MEMORY_PRESSURE, NO_SCHEDULE),
            (PID_PRESSURE, NO_SCHEDULE),
            (UNSCHEDULABLE, NO_SCHEDULE),
        ] {
            let n = node("n1", &[], vec![taint(key, effect)]);
            assert_eq!(node_should_run_daemon_pod(&n, &ds), RUN, "{key}:{effect}");
        }
        // spec.unschedulable alone (no taint yet) does not keep a daemon off the node.
        let mut cordoned = node("n1", &[], vec![]);
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_eq!(node_should_run_daemon_pod(&cordoned, &ds), RUN);
    }

    #[test]
    fn network_unavailable_is_tolerated_only_with_host_network() {
        let mut ds = daemon_set("cni");
        let n = node("n1", &[], vec![taint(NETWORK_UNAVAILABLE, NO_SCHEDULE)]);
        assert_eq!(node_should_run_daemon_pod(&n, &ds), STAY);
        template_spec(&mut ds).host_network = Some(true);
        assert_eq!(node_should_run_daemon_pod(&n, &ds), RUN);
    }

    #[test]
    fn untolerated_no_schedule_keeps_a_pod_and_no_execute_removes_it() {
        let mut ds = daemon_set("agent");
        let dedicated = node("n1", &[], vec![taint("dedicated", NO_SCHEDULE)]);
        assert_eq!(node_should_run_daemon_pod(&dedicated, &ds), STAY);
        let evicting = node("n1", &[], vec![taint("dedicated", NO_EXECUTE)]);
        assert_eq!(node_should_run_daemon_pod(&evicting, &ds), NEVER);
        // PreferNoSchedule is only a preference.
        let soft = node("n1", &[], vec![taint("dedicated", "PreferNoSchedule")]);
        assert_eq!(node_should_run_daemon_pod(&soft, &ds), RUN);
        // The template's own toleration (empty effect: every effect) lets it run.
        template_spec(&mut ds).tolerations = Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }]);
        assert_eq!(node_should_run_daemon_pod(&evicting, &ds), RUN);
    }

    #[test]
    fn node_selector_and_required_affinity_pick_the_nodes() {
        let mut ds = daemon_set("agent");
        template_spec(&mut ds).node_selector = Some(labels(&[("disk", "ssd")]));
        let ssd = node(
            "n1",
            &[("disk", "ssd"), ("zone", "a"), ("cores", "8")],
            vec![],
        );
        let hdd = node("n2", &[("disk", "hdd"), ("zone", "a")], vec![]);
        let bare = node("n3", &[], vec![]);
        assert_eq!(node_should_run_daemon_pod(&ssd, &ds), RUN);
        assert_eq!(node_should_run_daemon_pod(&hdd, &ds), NEVER);
        assert_eq!(node_should_run_daemon_pod(&bare, &ds), NEVER);

        // Terms are ORed, requirements within a term ANDed.
        let mut ds = daemon_set("agent");
        template_spec(&mut ds).affinity = Some(required_affinity(vec![
            vec![
                requirement("zone", "In", &["a", "b"]),
                requirement("cores", "Gt", &["4"]),
            ],
            vec![requirement("disk", "DoesNotExist", &[])],
        ]));
        assert_eq!(
            node_should_run_daemon_pod(&ssd, &ds),
            RUN,
            "zone a, 8 cores"
        );
        assert_eq!(
            node_should_run_daemon_pod(&hdd, &ds),
            NEVER,
            "no cores label"
        );
        assert_eq!(node_should_run_daemon_pod(&bare, &ds), RUN, "no disk label");

        let spec = |reqs| PodSpec {
            affinity: Some(required_affinity(vec![reqs])),
            ..PodSpec::default()
        };
        assert!(!node_affinity_matches(
            &spec(vec![requirement("cores", "Lt", &["4"])]),
            &ssd
        ));
        assert!(node_affinity_matches(
            &spec(vec![requirement("zone", "NotIn", &["b"])]),
            &ssd
        ));
        assert!(!node_affinity_matches(
            &spec(vec![requirement("zone", "Exists", &[])]),
            &bare
        ));
        // A non-numeric label never satisfies Gt; an empty term selects nothing.
        let odd = node("n4", &[("cores", "many")], vec![]);
        assert!(!node_affinity_matches(
            &spec(vec![requirement("cores", "Gt", &["1"])]),
            &odd
        ));
        assert!(!node_affinity_matches(&spec(vec![]), &ssd));
        // matchFields selects by name.
        let by_name = PodSpec {
            affinity: Some(replace_node_name_affinity(None, "n2")),
            ..PodSpec::default()
        };
        assert!(node_affinity_matches(&by_name, &hdd));
        assert!(!node_affinity_matches(&by_name, &ssd));
    }

    /// Where this controller's own copy of the node affinity rules disagreed with Kubernetes'
    /// `nodeaffinity` (now the one copy in skerry-api), Kubernetes' reading holds.
    #[test]
    fn match_fields_follow_kubernetes_node_affinity() {
        let n1 = node("n1", &[], vec![]);
        let n2 = node("n2", &[], vec![]);
        let by_fields = |fields: Vec<NodeSelectorRequirement>| PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: None,
                            match_fields: Some(fields),
                        }],
                    }),
                    preferred_during_scheduling_ignored_during_execution: None,
                }),
                ..Affinity::default()
            }),
            ..PodSpec::default()
        };
        // `In` with two names is not a field selector (it needs exactly one value): the term
        // matches no node, where the old copy let the daemon run on both.
        let two_names = by_fields(vec![requirement("metadata.name", "In", &["n1", "n2"])]);
        assert!(!node_affinity_matches(&two_names, &n1));
        assert!(!node_affinity_matches(&two_names, &n2));
        // A field a node does not have reads as "": `NotIn ["true"]` holds, where the old copy
        // refused every field but `metadata.name`.
        let other_field = by_fields(vec![requirement("spec.unschedulable", "NotIn", &["true"])]);
        assert!(node_affinity_matches(&other_field, &n1));
    }

    #[test]
    fn default_tolerations_replace_a_matching_template_toleration() {
        let mut spec = PodSpec {
            tolerations: Some(vec![
                Toleration {
                    key: Some(NOT_READY.into()),
                    operator: Some("Exists".into()),
                    effect: Some(NO_EXECUTE.into()),
                    toleration_seconds: Some(300),
                    value: None,
                },
                Toleration {
                    key: Some("mine".into()),
                    operator: Some("Exists".into()),
                    ..Toleration::default()
                },
            ]),
            ..PodSpec::default()
        };
        add_default_tolerations(&mut spec);
        let tolerations = spec.tolerations.unwrap();
        assert_eq!(tolerations.len(), 7, "{tolerations:?}");
        let not_ready: Vec<_> = tolerations
            .iter()
            .filter(|t| t.key.as_deref() == Some(NOT_READY))
            .collect();
        assert_eq!(not_ready.len(), 1);
        assert_eq!(
            not_ready[0].toleration_seconds, None,
            "a daemon tolerates forever"
        );
        assert!(tolerations.iter().any(|t| t.key.as_deref() == Some("mine")));
    }

    #[test]
    fn node_name_affinity_replaces_required_terms_and_keeps_the_rest() {
        let mut affinity = required_affinity(vec![vec![requirement("zone", "In", &["a"])]]);
        let preferred = vec![PreferredSchedulingTerm {
            weight: 10,
            preference: NodeSelectorTerm {
                match_expressions: Some(vec![requirement("disk", "In", &["ssd"])]),
                match_fields: None,
            },
        }];
        affinity
            .node_affinity
            .as_mut()
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution = Some(preferred.clone());
        let replaced = replace_node_name_affinity(Some(affinity), "n7");
        let node_affinity = replaced.node_affinity.unwrap();
        let terms = node_affinity
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].match_expressions, None);
        let fields = terms[0].match_fields.as_ref().unwrap();
        assert_eq!(fields, &vec![requirement("metadata.name", "In", &["n7"])]);
        assert_eq!(
            node_affinity.preferred_during_scheduling_ignored_during_execution,
            Some(preferred)
        );
    }

    #[test]
    fn target_node_is_the_binding_or_the_affinity() {
        let ds = daemon_set("agent");
        let mut pod = daemon_pod(&ds, "p", "n2", 0, "h");
        assert_eq!(target_node_name(&pod), Some("n2"));
        pod.spec.as_mut().unwrap().node_name = Some("n3".into());
        assert_eq!(target_node_name(&pod), Some("n3"));
        let plain = Pod::default();
        assert_eq!(target_node_name(&plain), None);
    }

    // ---- manage ----------------------------------------------------------------------------

    #[test]
    fn manage_creates_on_empty_eligible_nodes_and_deletes_the_rest() {
        let mut ds = daemon_set("agent");
        template_spec(&mut ds).node_selector = Some(labels(&[("role", "worker")]));
        let worker = &[("role", "worker")];
        let nodes = arcs(vec![
            node("n1", worker, vec![]),
            node("n2", worker, vec![]),
            node("n3", &[("role", "db")], vec![]),
            node("n4", worker, vec![taint("dedicated", NO_SCHEDULE)]),
            node("n5", worker, vec![]),
        ]);
        let mut failed = daemon_pod(&ds, "failed", "n5", 50, "h");
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let mut leaving = daemon_pod(&ds, "leaving", "n3", 10, "h");
        leaving.metadata.deletion_timestamp = Some(util::now());
        let pods = arcs(vec![
            // n2: two pods; the older stays.
            daemon_pod(&ds, "n2-new", "n2", 10, "h"),
            daemon_pod(&ds, "n2-old", "n2", 100, "h"),
            // n3 does not match the selector any more.
            daemon_pod(&ds, "n3-pod", "n3", 100, "h"),
            leaving,
            // n4 has an untolerated NoSchedule taint: its existing pod stays.
            daemon_pod(&ds, "n4-pod", "n4", 100, "h"),
            failed,
            // A node that was deleted.
            daemon_pod(&ds, "gone-pod", "n9", 100, "h"),
        ]);
        let plan = plan_manage(&ds, &nodes, &nodes_to_daemon_pods(&pods));
        assert_eq!(plan.create_on, vec!["n1"]);
        let mut deleted = names(&plan.delete);
        deleted.sort_unstable();
        assert_eq!(deleted, vec!["failed", "gone-pod", "n2-new", "n3-pod"]);
    }

    #[test]
    fn a_bound_pod_is_kept_before_an_older_unbound_one() {
        let ds = daemon_set("agent");
        let unbound_old = daemon_pod(&ds, "a", "n1", 100, "h");
        let mut bound_new = daemon_pod(&ds, "b", "n1", 10, "h");
        bound_new.spec.as_mut().unwrap().node_name = Some("n1".into());
        let nodes = arcs(vec![node("n1", &[], vec![])]);
        let pods = arcs(vec![unbound_old, bound_new]);
        let plan = plan_manage(&ds, &nodes, &nodes_to_daemon_pods(&pods));
        assert!(plan.create_on.is_empty());
        assert_eq!(names(&plan.delete), vec!["a"]);
    }

    // ---- rolling update ---------------------------------------------------------------------

    fn with_max_unavailable(mut ds: DaemonSet, value: IntOrString) -> DaemonSet {
        ds.spec.as_mut().unwrap().update_strategy = Some(DaemonSetUpdateStrategy {
            type_: Some(ROLLING_UPDATE.into()),
            rolling_update: Some(RollingUpdateDaemonSet {
                max_unavailable: Some(value),
                max_surge: None,
            }),
        });
        ds
    }

    #[test]
    fn rolling_update_replaces_at_most_max_unavailable_available_pods() {
        let ds = daemon_set("agent");
        let hash = revision_hash(&ds);
        let nodes = arcs(vec![
            node("n1", &[], vec![]),
            node("n2", &[], vec![]),
            node("n3", &[], vec![]),
        ]);
        let old = |name: &str, n: &str| running_ready(daemon_pod(&ds, name, n, 100, "old"));
        let pods = arcs(vec![old("a", "n1"), old("b", "n2"), old("c", "n3")]);
        let by_node = nodes_to_daemon_pods(&pods);
        let now = util::now();
        // Default maxUnavailable 1: one pod, the first node's.
        assert_eq!(
            names(&plan_rolling_update(&ds, &nodes, &by_node, &hash, &now)),
            vec!["a"]
        );
        // 50 % of 3 rounds up to 2.
        let half = with_max_unavailable(ds.clone(), IntOrString::String("50%".into()));
        assert_eq!(
            names(&plan_rolling_update(&half, &nodes, &by_node, &hash, &now)),
            vec!["a", "b"]
        );
        // 0 would never progress: it counts as 1.
        let zero = with_max_unavailable(ds.clone(), IntOrString::Int(0));
        assert_eq!(
            plan_rolling_update(&zero, &nodes, &by_node, &hash, &now).len(),
            1
        );

        // n1 already has its new pod, not yet ready: that uses up the budget...
        let pods = arcs(vec![
            daemon_pod(&ds, "a2", "n1", 1, &hash),
            old("b", "n2"),
            old("c", "n3"),
        ]);
        let by_node = nodes_to_daemon_pods(&pods);
        assert!(plan_rolling_update(&ds, &nodes, &by_node, &hash, &now).is_empty());
        // ...and once it is available, the next old pod goes.
        let pods = arcs(vec![
            running_ready(daemon_pod(&ds, "a2", "n1", 1, &hash)),
            old("b", "n2"),
            old("c", "n3"),
        ]);
        let by_node = nodes_to_daemon_pods(&pods);
        assert_eq!(
            names(&plan_rolling_update(&ds, &nodes, &by_node, &hash, &now)),
            vec!["b"]
        );
    }

    #[test]
    fn rolling_update_replaces_unavailable_old_pods_regardless_of_budget() {
        let ds = daemon_set("agent");
        let hash = revision_hash(&ds);
        let nodes = arcs(vec![node("n1", &[], vec![]), node("n2", &[], vec![])]);
        // Both old pods are Pending: replacing them costs no availability.
        let pods = arcs(vec![
            daemon_pod(&ds, "a", "n1", 100, "old"),
            daemon_pod(&ds, "b", "n2", 100, "old"),
        ]);
        let by_node = nodes_to_daemon_pods(&pods);
        let victims = plan_rolling_update(&ds, &nodes, &by_node, &hash, &util::now());
        assert_eq!(names(&victims), vec!["a", "b"]);
        // A node that should run a pod and has none counts against the budget.
        let nodes = arcs(vec![node("n0", &[], vec![]), node("n1", &[], vec![])]);
        let pods = arcs(vec![running_ready(daemon_pod(&ds, "a", "n1", 100, "old"))]);
        let by_node = nodes_to_daemon_pods(&pods);
        assert!(plan_rolling_update(&ds, &nodes, &by_node, &hash, &util::now()).is_empty());
    }

    #[test]
    fn status_counts_nodes() {
        let mut ds = daemon_set("agent");
        template_spec(&mut ds).node_selector = Some(labels(&[("role", "worker")]));
        let hash = revision_hash(&ds);
        let worker = &[("role", "worker")];
        let nodes = arcs(vec![
            node("n1", worker, vec![]),
            node("n2", worker, vec![]),
            node("n3", worker, vec![]),
            node("n4", &[], vec![]),
        ]);
        let pods = arcs(vec![
            running_ready(daemon_pod(&ds, "a", "n1", 100, &hash)),
            daemon_pod(&ds, "b", "n2", 100, "old"),
            daemon_pod(&ds, "d", "n4", 100, &hash),
        ]);
        let status = calculate_status(
            &ds,
            &nodes,
            &nodes_to_daemon_pods(&pods),
            &hash,
            &util::now(),
        );
        assert_eq!(status.desired_number_scheduled, 3);
        assert_eq!(status.current_number_scheduled, 2);
        assert_eq!(status.number_misscheduled, 1);
        assert_eq!(status.number_ready, 1);
        assert_eq!(status.number_available, Some(1));
        assert_eq!(status.number_unavailable, Some(2));
        assert_eq!(status.updated_number_scheduled, Some(1));
    }

    // ---- the controller over fakes ----------------------------------------------------------

    fn api_error(code: i32, reason: &str) -> Error {
        Error::Api(Box::new(Status {
            code: Some(code),
            reason: Some(reason.to_string()),
            ..Status::default()
        }))
    }

    /// Records pod writes; nothing reaches the cache until the test delivers it.
    #[derive(Default)]
    struct FakePods {
        created: Mutex<Vec<Pod>>,
        deleted: Mutex<Vec<String>>,
    }

    impl PodControl for FakePods {
        fn create_pod<'a>(
            &'a self,
            _namespace: &'a str,
            pod: &'a Pod,
        ) -> BoxFuture<'a, Result<Pod, Error>> {
            Box::pin(async move {
                let mut created = self.created.lock();
                let n = created.len();
                let mut pod = pod.clone();
                let prefix = pod.metadata.generate_name.clone().unwrap_or_default();
                pod.metadata.name = Some(format!("{prefix}{n}"));
                pod.metadata.uid = Some(format!("uid-created-{n}"));
                pod.metadata.resource_version = Some("1".into());
                pod.metadata.creation_timestamp = Some(util::now());
                created.push(pod.clone());
                Ok(pod)
            })
        }
        fn delete_pod<'a>(
            &'a self,
            _namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async move {
                self.deleted.lock().push(name.to_string());
                Ok(())
            })
        }
        fn patch_pod<'a>(
            &'a self,
            _namespace: &'a str,
            _name: &'a str,
            _patch: &'a Value,
        ) -> BoxFuture<'a, Result<Pod, Error>> {
            Box::pin(async move { Err(api_error(404, "NotFound")) })
        }
    }

    struct FakeDaemonSets {
        store: Indexer<DaemonSet>,
        status_writes: Mutex<Vec<DaemonSetStatus>>,
    }

    impl DaemonSetClient for FakeDaemonSets {
        fn get_daemon_set<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<DaemonSet, Error>> {
            Box::pin(async move {
                self.store
                    .get_by(namespace, name)
                    .map(|d| (*d).clone())
                    .ok_or_else(|| api_error(404, "NotFound"))
            })
        }
        fn replace_daemon_set_status<'a>(
            &'a self,
            ds: &'a DaemonSet,
        ) -> BoxFuture<'a, Result<DaemonSet, Error>> {
            Box::pin(async move {
                self.status_writes
                    .lock()
                    .push(ds.status.clone().unwrap_or_default());
                self.store.upsert(&key_of(ds), Arc::new(ds.clone()));
                Ok(ds.clone())
            })
        }
    }

    struct Harness {
        controller: Arc<DaemonSetController>,
        pods: Indexer<Pod>,
        nodes: Indexer<Node>,
        daemon_sets: Indexer<DaemonSet>,
        pod_writes: Arc<FakePods>,
        ds_client: Arc<FakeDaemonSets>,
    }

    impl Harness {
        fn new() -> Harness {
            let pods = Indexer::new();
            let nodes = Indexer::new();
            let daemon_sets = Indexer::new();
            let pod_writes = Arc::new(FakePods::default());
            let ds_client = Arc::new(FakeDaemonSets {
                store: daemon_sets.clone(),
                status_writes: Mutex::new(Vec::new()),
            });
            let controller = DaemonSetController::from_parts(Parts {
                daemon_sets: daemon_sets.clone(),
                pods: pods.clone(),
                nodes: nodes.clone(),
                pod_control: pod_writes.clone(),
                daemon_set_client: ds_client.clone(),
                clock: Arc::new(ManualClock::new()),
            });
            Harness {
                controller,
                pods,
                nodes,
                daemon_sets,
                pod_writes,
                ds_client,
            }
        }

        fn add_node(&self, n: Node) {
            self.nodes.upsert(&key_of(&n), Arc::new(n.clone()));
            self.controller.add_node(&n);
        }

        fn deliver_created(&self) {
            for pod in self.pod_writes.created.lock().clone() {
                let key = key_of(&pod);
                if self.pods.get(&key).is_none() {
                    self.pods.upsert(&key, Arc::new(pod.clone()));
                    self.controller.add_pod(&pod);
                }
            }
        }

        async fn sync(&self) -> anyhow::Result<()> {
            self.controller.sync_daemon_set("default/agent").await
        }
    }

    #[tokio::test]
    async fn one_pod_per_node_with_node_affinity_and_no_double_create() {
        let h = Harness::new();
        h.add_node(node("n1", &[], vec![]));
        h.add_node(node("n2", &[], vec![taint(NOT_READY, NO_EXECUTE)]));
        let ds = daemon_set("agent");
        h.daemon_sets.upsert(&key_of(&ds), Arc::new(ds.clone()));
        h.sync().await.unwrap();

        let created = h.pod_writes.created.lock().clone();
        assert_eq!(created.len(), 2);
        let mut targets: Vec<&str> = created
            .iter()
            .map(|p| target_node_name(p).unwrap())
            .collect();
        targets.sort_unstable();
        assert_eq!(targets, vec!["n1", "n2"]);
        let hash = revision_hash(&ds);
        for pod in &created {
            let spec = pod.spec.as_ref().unwrap();
            assert_eq!(spec.node_name, None, "the scheduler binds daemon pods");
            assert_eq!(pod.metadata.generate_name.as_deref(), Some("agent-"));
            let l = pod.metadata.labels.as_ref().unwrap();
            assert_eq!(l.get(CONTROLLER_REVISION_HASH_LABEL), Some(&hash));
            assert_eq!(l.get("app").map(String::as_str), Some("agent"));
            assert_eq!(spec.tolerations.as_ref().unwrap().len(), 6);
            let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!(owner.kind, "DaemonSet");
            assert_eq!(owner.uid, "ds-uid-agent");
        }
        assert_eq!(
            h.controller
                .expectations()
                .get("default/agent")
                .unwrap()
                .add,
            2
        );

        // The watch lags: a second sync must not create again.
        h.sync().await.unwrap();
        assert_eq!(h.pod_writes.created.lock().len(), 2);

        h.deliver_created();
        assert!(h.controller.expectations().satisfied("default/agent"));
        h.sync().await.unwrap();
        assert_eq!(h.pod_writes.created.lock().len(), 2, "steady state");
        let status = h.ds_client.status_writes.lock().last().cloned().unwrap();
        assert_eq!(status.desired_number_scheduled, 2);
        assert_eq!(status.current_number_scheduled, 2);
        assert_eq!(status.number_ready, 0);
        assert_eq!(status.observed_generation, Some(1));

        // A third node gets its pod.
        h.add_node(node("n3", &[], vec![]));
        h.sync().await.unwrap();
        let created = h.pod_writes.created.lock().clone();
        assert_eq!(created.len(), 3);
        assert_eq!(target_node_name(&created[2]), Some("n3"));
    }

    #[tokio::test]
    async fn deletions_are_expected_by_uid() {
        let h = Harness::new();
        h.add_node(node("n1", &[], vec![]));
        let ds = daemon_set("agent");
        h.daemon_sets.upsert(&key_of(&ds), Arc::new(ds.clone()));
        let hash = revision_hash(&ds);
        let keep = daemon_pod(&ds, "keep", "n1", 100, &hash);
        let extra = daemon_pod(&ds, "extra", "n1", 10, &hash);
        for p in [&keep, &extra] {
            h.pods.upsert(&key_of(p), Arc::new(p.clone()));
        }
        h.sync().await.unwrap();
        assert_eq!(*h.pod_writes.deleted.lock(), vec!["extra"]);
        let e = h.controller.expectations();
        assert!(!e.satisfied("default/agent"));
        // The deletion of a pod we did not choose does not count.
        h.controller.delete_pod(&keep);
        assert!(!e.satisfied("default/agent"));
        // The graceful-delete update, then the DELETE event: counted once.
        let mut terminating = extra.clone();
        terminating.metadata.deletion_timestamp = Some(util::now());
        terminating.metadata.resource_version = Some("2".into());
        h.controller.update_pod(&extra, &terminating);
        h.controller.delete_pod(&terminating);
        assert!(e.satisfied("default/agent"));
        assert_eq!(e.get("default/agent").unwrap().del, 0);
    }

    #[tokio::test]
    async fn node_heartbeats_wake_nobody_but_label_changes_do() {
        let h = Harness::new();
        let mut ds = daemon_set("agent");
        template_spec(&mut ds).node_selector = Some(labels(&[("role", "worker")]));
        h.daemon_sets.upsert(&key_of(&ds), Arc::new(ds.clone()));
        let old = node("n1", &[], vec![]);
        let mut heartbeat = old.clone();
        heartbeat.metadata.resource_version = Some("2".into());
        h.controller.update_node(&old, &heartbeat);
        assert_eq!(h.controller.queue().len(), 0);
        let mut labelled = heartbeat.clone();
        labelled.metadata.labels = Some(labels(&[("role", "worker")]));
        h.controller.update_node(&heartbeat, &labelled);
        assert_eq!(h.controller.queue().len(), 1);
    }
}
