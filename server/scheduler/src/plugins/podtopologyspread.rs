//! PodTopologySpread (Kubernetes 1.32 `framework/plugins/podtopologyspread`): spreads pods
//! that match a selector evenly over topology domains (zones, nodes, ...).
//!
//! - **Hard constraints** (`whenUnsatisfiable: DoNotSchedule`) are a Filter. PreFilter counts
//!   the matching pods per domain over every eligible node, and keeps per constraint the two
//!   smallest counts (the "critical paths") so Filter finds the global minimum in O(1):
//!   a node passes when `matching pods in its domain + (1 if the pod matches itself) −
//!   global minimum ≤ maxSkew`. With fewer eligible domains than `minDomains` the global
//!   minimum is taken as 0. Reasons: "node(s) didn't match pod topology spread constraints"
//!   and, for a node without the topology label, the same with " (missing required label)".
//! - **Eligible nodes** follow `nodeAffinityPolicy` (default `Honor`: only nodes matching the
//!   pod's nodeSelector / required node affinity count) and `nodeTaintsPolicy` (default
//!   `Ignore`; `Honor` drops nodes with a NoSchedule/NoExecute taint the pod does not
//!   tolerate), and must carry every constraint's topology key.
//! - `matchLabelKeys`: the values of those keys in the pod's labels are ANDed into the
//!   selector (as the 1.32 scheduler does), e.g. `pod-template-hash` to spread one rollout
//!   revision at a time.
//! - **Soft constraints** (`ScheduleAnyway`) are a Score: per node the sum over constraints
//!   of `count × ln(domains + 2) + maxSkew − 1`, then reversed and normalized so the
//!   emptiest domain scores 100. Hostname constraints are counted in Score from the node's
//!   own pods instead of a map — Kubernetes' own small hostname fast path (which, like
//!   Kubernetes, assumes hostname values are unique per node).
//! - **System default constraints** when the pod has none: hostname maxSkew 3 and zone
//!   maxSkew 5, both ScheduleAnyway (so they only score). Kubernetes selects the "group"
//!   with the selectors of the Services, ReplicationControllers, ReplicaSets and
//!   StatefulSets matching the pod. skerry simplifies (documented, deliberate): the defaults
//!   apply to a pod whose controller owner is a ReplicaSet, StatefulSet or
//!   ReplicationController, and the group is the pods sharing its labels minus the per-pod
//!   ones ([`PER_POD_LABELS`]); Services are not consulted.
//! - `add_pod` / `remove_pod` keep the counts and critical paths right for preemption. As in
//!   Kubernetes (its "CAVEAT"), two critical paths suffice only because a preemption state
//!   clone is only changed on the one node it then filters.
//!
//! Counts are kept per constraint (as Kubernetes ≥ 1.33 does), not per topology key: two
//! constraints on the same key with different selectors do not share counts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, TopologySpreadConstraint};
use skerry_api::pod::nodeaffinity::RequiredNodeAffinity;
use skerry_api::pod::taints::{
    find_matching_untolerated_taint, is_do_not_schedule_taint, taints_of, tolerations_of,
};
use skerry_api::selector::{LabelOp, LabelSelector};

use super::POD_TOPOLOGY_SPREAD_WEIGHT;
use super::helper;
use crate::framework::{
    Code, CycleState, FilterPlugin, MAX_NODE_SCORE, NodeInfo, NodeScore, Plugin, PodInfo,
    PreFilterPlugin, PreScorePlugin, ScorePlugin, Selector, Snapshot, Status,
};

/// The plugin's name, as `kubectl describe pod` shows it.
pub const NAME: &str = "PodTopologySpread";

/// Kubernetes' `ErrReasonConstraintsNotMatch`.
pub const REASON_CONSTRAINTS_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints";
/// Kubernetes' `ErrReasonNodeLabelNotMatch`: the node lacks a constraint's topology key.
pub const REASON_NODE_LABEL_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";

/// `v1.LabelHostname`.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// `v1.LabelTopologyZone`.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// `whenUnsatisfiable` of a hard constraint.
pub const DO_NOT_SCHEDULE: &str = "DoNotSchedule";
/// `whenUnsatisfiable` of a soft constraint.
pub const SCHEDULE_ANYWAY: &str = "ScheduleAnyway";

/// maxSkew of the system default hostname constraint (Kubernetes'
/// `systemDefaultConstraints`): loose, because a node is a small domain and replicas of a
/// small workload would otherwise be pushed around by every single placement.
pub const SYSTEM_DEFAULT_HOSTNAME_MAX_SKEW: i32 = 3;
/// maxSkew of the system default zone constraint: looser still, zones hold many nodes.
pub const SYSTEM_DEFAULT_ZONE_MAX_SKEW: i32 = 5;

/// `minDomains` when unset: Kubernetes treats nil as 1 (the minimum is then the real one).
const DEFAULT_MIN_DOMAINS: i32 = 1;

/// Controller kinds whose pods get the system default constraints (Kubernetes'
/// `DefaultSelector` also uses Services; see the module docs).
pub const DEFAULT_SPREAD_OWNER_KINDS: &[&str] =
    &["ReplicaSet", "StatefulSet", "ReplicationController"];

/// Labels that differ between pods of one controller and so must not be part of the
/// default group selector: StatefulSet's per-pod name and ordinal, and the revision hash
/// (pods of two revisions are one group while a StatefulSet rolls).
pub const PER_POD_LABELS: &[&str] = &[
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "controller-revision-hash",
];

const PRE_FILTER_STATE_KEY: &str = "PreFilterPodTopologySpread";
const PRE_SCORE_STATE_KEY: &str = "PreScorePodTopologySpread";

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// `nodeAffinityPolicy` / `nodeTaintsPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeInclusionPolicy {
    /// Only nodes passing the check are counted.
    Honor,
    /// Every node is counted.
    Ignore,
}

impl NodeInclusionPolicy {
    fn parse(value: Option<&str>, default: NodeInclusionPolicy) -> NodeInclusionPolicy {
        match value {
            Some("Honor") => NodeInclusionPolicy::Honor,
            Some("Ignore") => NodeInclusionPolicy::Ignore,
            // Validation rejects other values; an absent one takes the default.
            _ => default,
        }
    }
}

/// A constraint with its selector parsed (Kubernetes' `topologySpreadConstraint`).
#[derive(Clone, Debug)]
struct SpreadConstraint {
    max_skew: i32,
    topology_key: String,
    selector: Selector,
    min_domains: i32,
    node_affinity_policy: NodeInclusionPolicy,
    node_taints_policy: NodeInclusionPolicy,
}

impl SpreadConstraint {
    /// Kubernetes' `matchNodeInclusionPolicies`: whether `node` counts for this constraint.
    fn includes_node(&self, pod: &Pod, node: &Node, required: &RequiredNodeAffinity) -> bool {
        if self.node_affinity_policy == NodeInclusionPolicy::Honor && !required.matches(node) {
            return false;
        }
        let untolerated = || {
            find_matching_untolerated_taint(
                taints_of(node),
                tolerations_of(pod),
                is_do_not_schedule_taint,
            )
            .is_some()
        };
        !(self.node_taints_policy == NodeInclusionPolicy::Honor && untolerated())
    }
}

fn labels_of_pod(pod: &Pod) -> &BTreeMap<String, String> {
    pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

fn labels_of_node(node: &Node) -> &BTreeMap<String, String> {
    node.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

fn namespace_of(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

/// Kubernetes' `nodeLabelsMatchSpreadConstraints`: the node has every topology key.
fn node_has_all_keys(labels: &BTreeMap<String, String>, constraints: &[SpreadConstraint]) -> bool {
    constraints
        .iter()
        .all(|c| labels.contains_key(&c.topology_key))
}

/// Kubernetes' `countPodsMatchSelector`: same namespace, not terminating, labels match.
fn count_pods_match_selector(pods: &[Arc<PodInfo>], selector: &Selector, namespace: &str) -> i64 {
    pods.iter()
        .filter(|p| {
            p.pod.metadata.deletion_timestamp.is_none()
                && namespace_of(&p.pod) == namespace
                && selector.0.matches(labels_of_pod(&p.pod))
        })
        .count() as i64
}

/// Kubernetes' `criticalPaths`: the two domains with the fewest matching pods; `[0]` always
/// holds the minimum, `[1]` is ≥ it but not necessarily the second minimum.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CriticalPaths([(String, i64); 2]);

impl CriticalPaths {
    fn new() -> CriticalPaths {
        // Kubernetes starts both at MaxInt32: "no domain yet".
        CriticalPaths([
            (String::new(), i64::from(i32::MAX)),
            (String::new(), i64::from(i32::MAX)),
        ])
    }

    fn update(&mut self, value: &str, count: i64) {
        let p = &mut self.0;
        let existing = if value == p[0].0 {
            Some(0)
        } else if value == p[1].0 {
            Some(1)
        } else {
            None
        };
        match existing {
            Some(i) => {
                p[i].1 = count;
                if p[0].1 > p[1].1 {
                    p.swap(0, 1);
                }
            }
            None => {
                if count < p[0].1 {
                    p[1] = p[0].clone();
                    p[0] = (value.to_string(), count);
                } else if count < p[1].1 {
                    p[1] = (value.to_string(), count);
                }
            }
        }
    }
}

/// PreFilter's result (Kubernetes' `preFilterState`), cloned copy-on-write by preemption.
#[derive(Clone, Debug)]
struct PreFilterState {
    constraints: Arc<Vec<SpreadConstraint>>,
    /// The incoming pod's required node affinity (for inclusion policies in add/remove).
    required: Arc<RequiredNodeAffinity>,
    critical_paths: Vec<CriticalPaths>,
    /// Per constraint: domain value → matching pods.
    tp_value_to_match_num: Vec<HashMap<String, i64>>,
}

impl PreFilterState {
    /// The global minimum for the skew of constraint `i`, honouring `minDomains`.
    fn min_match_num(&self, i: usize, min_domains: i32) -> i64 {
        let domains = self.tp_value_to_match_num[i].len();
        if (domains as i64) < i64::from(min_domains) {
            // Fewer eligible domains than asked for: the missing ones count as empty.
            return 0;
        }
        self.critical_paths[i].0[0].1
    }

    /// Kubernetes' `updateWithPod` (preemption's add/remove).
    fn update_with_pod(&mut self, updated: &Pod, preemptor: &Pod, node: &Node, delta: i64) {
        if namespace_of(updated) != namespace_of(preemptor) {
            return;
        }
        let node_labels = labels_of_node(node);
        if !node_has_all_keys(node_labels, &self.constraints) {
            return;
        }
        let pod_labels = labels_of_pod(updated);
        for (i, c) in self.constraints.iter().enumerate() {
            if !c.selector.0.matches(pod_labels)
                || !c.includes_node(preemptor, node, &self.required)
            {
                continue;
            }
            let Some(value) = node_labels.get(&c.topology_key) else {
                continue;
            };
            let count = self.tp_value_to_match_num[i]
                .entry(value.clone())
                .or_insert(0);
            *count += delta;
            let count = *count;
            self.critical_paths[i].update(value, count);
        }
    }
}

/// The PodTopologySpread plugin.
#[derive(Clone, Debug)]
pub struct PodTopologySpread {
    /// Constraints for pods without their own (`PodTopologySpreadArgs.defaultConstraints`).
    default_constraints: Vec<TopologySpreadConstraint>,
    /// Whether those are the system defaults (then nodes need not carry every key to be
    /// scored: a cluster without zone labels still gets hostname spreading).
    system_defaulted: bool,
}

impl Default for PodTopologySpread {
    /// Kubernetes' default: `defaultingType: System`.
    fn default() -> Self {
        let soft = |key: &str, max_skew: i32| TopologySpreadConstraint {
            topology_key: key.into(),
            when_unsatisfiable: SCHEDULE_ANYWAY.into(),
            max_skew,
            ..Default::default()
        };
        PodTopologySpread {
            default_constraints: vec![
                soft(HOSTNAME_LABEL, SYSTEM_DEFAULT_HOSTNAME_MAX_SKEW),
                soft(ZONE_LABEL, SYSTEM_DEFAULT_ZONE_MAX_SKEW),
            ],
            system_defaulted: true,
        }
    }
}

impl PodTopologySpread {
    /// `defaultingType: List` with these constraints (empty: no defaults at all).
    pub fn with_default_constraints(constraints: Vec<TopologySpreadConstraint>) -> Self {
        PodTopologySpread {
            default_constraints: constraints,
            system_defaulted: false,
        }
    }

    /// Kubernetes' `filterTopologySpreadConstraints`: the constraints with this
    /// `whenUnsatisfiable`, selectors parsed, `matchLabelKeys` merged, defaults applied.
    fn filter_constraints(
        constraints: &[TopologySpreadConstraint],
        pod_labels: &BTreeMap<String, String>,
        action: &str,
    ) -> Result<Vec<SpreadConstraint>, String> {
        let mut result = Vec::new();
        for c in constraints
            .iter()
            .filter(|c| c.when_unsatisfiable == action)
        {
            let base = c
                .label_selector
                .as_ref()
                .map(LabelSelector::from_api)
                .transpose()
                .map_err(|e| format!("invalid labelSelector: {e:?}"))?;
            let match_labels: Vec<(String, LabelOp)> = c
                .match_label_keys
                .iter()
                .flatten()
                .filter_map(|key| {
                    pod_labels
                        .get(key)
                        .map(|v| (key.clone(), LabelOp::Equals(v.clone())))
                })
                .collect();
            let selector = match (base, match_labels.is_empty()) {
                (base, false) => {
                    // Kubernetes' `mergeLabelSetWithSelector`: the key values first, then
                    // the selector's requirements (a nil selector contributes none).
                    let mut requirements = match_labels;
                    requirements.extend(base.into_iter().flat_map(|b| b.requirements));
                    Selector(LabelSelector { requirements })
                }
                (Some(base), true) => Selector(base),
                (None, true) => Selector::nothing(),
            };
            result.push(SpreadConstraint {
                max_skew: c.max_skew,
                topology_key: c.topology_key.clone(),
                selector,
                min_domains: c.min_domains.unwrap_or(DEFAULT_MIN_DOMAINS),
                node_affinity_policy: NodeInclusionPolicy::parse(
                    c.node_affinity_policy.as_deref(),
                    NodeInclusionPolicy::Honor,
                ),
                node_taints_policy: NodeInclusionPolicy::parse(
                    c.node_taints_policy.as_deref(),
                    NodeInclusionPolicy::Ignore,
                ),
            });
        }
        Ok(result)
    }

    /// The constraints of `pod` for `action`: its own if it has any, else the defaults.
    fn constraints(&self, pod: &Pod, action: &str) -> Result<Vec<SpreadConstraint>, String> {
        let own = pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_deref())
            .unwrap_or_default();
        if !own.is_empty() {
            return Self::filter_constraints(own, labels_of_pod(pod), action);
        }
        self.default_constraints_for(pod, action)
    }

    /// Kubernetes' `buildDefaultConstraints`, with skerry's owner-based selector.
    fn default_constraints_for(
        &self,
        pod: &Pod,
        action: &str,
    ) -> Result<Vec<SpreadConstraint>, String> {
        let mut constraints =
            Self::filter_constraints(&self.default_constraints, labels_of_pod(pod), action)?;
        if constraints.is_empty() {
            return Ok(constraints);
        }
        let Some(selector) = default_selector(pod) else {
            return Ok(Vec::new());
        };
        for c in &mut constraints {
            c.selector = selector.clone();
        }
        Ok(constraints)
    }
}

/// The group a controller-owned pod is spread with: its labels minus the per-pod ones, for
/// a pod whose controller is one of [`DEFAULT_SPREAD_OWNER_KINDS`]; `None` otherwise or
/// when nothing is left to select by.
fn default_selector(pod: &Pod) -> Option<Selector> {
    let owned = pod.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && DEFAULT_SPREAD_OWNER_KINDS.contains(&o.kind.as_str())
    });
    if !owned {
        return None;
    }
    let requirements: Vec<(String, LabelOp)> = labels_of_pod(pod)
        .iter()
        .filter(|(k, _)| !PER_POD_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), LabelOp::Equals(v.clone())))
        .collect();
    (!requirements.is_empty()).then_some(Selector(LabelSelector { requirements }))
}

fn skip() -> Status {
    helper::skip(NAME)
}

fn error(reason: impl Into<String>) -> Status {
    Status::new(Code::Error, NAME, reason)
}

impl Plugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for PodTopologySpread {
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot) -> Status {
        let constraints = match self.constraints(&pod.pod, DO_NOT_SCHEDULE) {
            Ok(c) => c,
            Err(e) => {
                return error(format!(
                    "obtaining pod's hard topology spread constraints: {e}"
                ));
            }
        };
        if constraints.is_empty() {
            return skip();
        }
        let required = RequiredNodeAffinity::from_pod(&pod.pod);
        let namespace = namespace_of(&pod.pod);
        let mut tp_value_to_match_num: Vec<HashMap<String, i64>> =
            vec![HashMap::new(); constraints.len()];
        for node_info in &snapshot.node_info_list {
            let Some(node) = node_info.node.as_deref() else {
                continue;
            };
            let node_labels = labels_of_node(node);
            if !node_has_all_keys(node_labels, &constraints) {
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if !c.includes_node(&pod.pod, node, &required) {
                    continue;
                }
                let Some(value) = node_labels.get(&c.topology_key) else {
                    continue;
                };
                let count = count_pods_match_selector(&node_info.pods, &c.selector, namespace);
                *tp_value_to_match_num[i].entry(value.clone()).or_insert(0) += count;
            }
        }
        let critical_paths = tp_value_to_match_num
            .iter()
            .map(|counts| {
                let mut paths = CriticalPaths::new();
                for (value, count) in counts {
                    paths.update(value, *count);
                }
                paths
            })
            .collect();
        state.write(
            PRE_FILTER_STATE_KEY,
            PreFilterState {
                constraints: Arc::new(constraints),
                required: Arc::new(required),
                critical_paths,
                tp_value_to_match_num,
            },
        );
        Status::success()
    }

    fn add_pod(
        &self,
        state: &mut CycleState,
        pod_to_schedule: &PodInfo,
        pod_to_add: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status {
        // No state: PreFilter skipped (no hard constraints), nothing to update.
        let (Some(s), Some(node)) = (
            state.read_mut::<PreFilterState>(PRE_FILTER_STATE_KEY),
            node.node.as_deref(),
        ) else {
            return Status::success();
        };
        s.update_with_pod(&pod_to_add.pod, &pod_to_schedule.pod, node, 1);
        Status::success()
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod_to_schedule: &PodInfo,
        pod_to_remove: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status {
        let (Some(s), Some(node)) = (
            state.read_mut::<PreFilterState>(PRE_FILTER_STATE_KEY),
            node.node.as_deref(),
        ) else {
            return Status::success();
        };
        s.update_with_pod(&pod_to_remove.pod, &pod_to_schedule.pod, node, -1);
        Status::success()
    }
}

impl FilterPlugin for PodTopologySpread {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node_info: &NodeInfo) -> Status {
        let Some(node) = node_info.node.as_deref() else {
            return error("node not found");
        };
        let Some(s) = state.read::<PreFilterState>(PRE_FILTER_STATE_KEY) else {
            // PreFilter skipped: no hard constraints.
            return Status::success();
        };
        let node_labels = labels_of_node(node);
        let pod_labels = labels_of_pod(&pod.pod);
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = node_labels.get(&c.topology_key) else {
                return Status::new(
                    Code::UnschedulableAndUnresolvable,
                    NAME,
                    REASON_NODE_LABEL_NOT_MATCH,
                );
            };
            // 'existing matching num' + 'if self-match (1 or 0)' - 'global minimum' <= 'maxSkew'
            let min_match_num = s.min_match_num(i, c.min_domains);
            let self_match_num = i64::from(c.selector.0.matches(pod_labels));
            let match_num = s.tp_value_to_match_num[i].get(value).copied().unwrap_or(0);
            let skew = match_num + self_match_num - min_match_num;
            if skew > i64::from(c.max_skew) {
                return Status::new(Code::Unschedulable, NAME, REASON_CONSTRAINTS_NOT_MATCH);
            }
        }
        Status::success()
    }
}

/// PreScore's result (Kubernetes' `preScoreState`).
#[derive(Clone, Debug)]
struct PreScoreState {
    constraints: Vec<SpreadConstraint>,
    /// Feasible nodes missing a topology key: scored 0.
    ignored_nodes: HashSet<String>,
    /// Per constraint: domain value → matching pods (hostname constraints are counted in
    /// Score from the node's own pods instead).
    topology_value_to_pod_counts: Vec<HashMap<String, i64>>,
    /// Per constraint: ln(domains + 2), so counts in many small domains are not drowned by
    /// few big ones.
    topology_normalizing_weight: Vec<f64>,
}

/// Kubernetes' `topologyNormalizingWeight`: ln(size + 2), in [1.09, 8.52] for 1..5,000
/// domains.
fn topology_normalizing_weight(size: usize) -> f64 {
    (size as f64 + 2.0).ln()
}

/// Kubernetes' `scoreForCount`: `maxSkew − 1` is added so differences between domains are
/// watered down as the tolerated skew grows.
fn score_for_count(count: i64, max_skew: i32, weight: f64) -> f64 {
    count as f64 * weight + f64::from(max_skew - 1)
}

impl PreScorePlugin for PodTopologySpread {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status {
        if snapshot.node_info_list.is_empty() {
            return skip();
        }
        let has_own = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .is_some_and(|c| !c.is_empty());
        // Only non-system-default spreading requires every key on a node, so a cluster
        // without zone labels still gets hostname spreading from the defaults.
        let require_all_topologies = has_own || !self.system_defaulted;
        let constraints = match self.constraints(&pod.pod, SCHEDULE_ANYWAY) {
            Ok(c) => c,
            Err(e) => {
                return error(format!(
                    "obtaining pod's soft topology spread constraints: {e}"
                ));
            }
        };
        if constraints.is_empty() {
            return skip();
        }

        // initPreScoreState: the domains of the feasible nodes.
        let mut ignored_nodes = HashSet::new();
        let mut counts: Vec<HashMap<String, i64>> = vec![HashMap::new(); constraints.len()];
        let mut domains = vec![0usize; constraints.len()];
        for node_info in nodes {
            let Some(node) = node_info.node.as_deref() else {
                continue;
            };
            let node_labels = labels_of_node(node);
            if require_all_topologies && !node_has_all_keys(node_labels, &constraints) {
                ignored_nodes.insert(node_info.name().to_string());
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if c.topology_key == HOSTNAME_LABEL {
                    continue;
                }
                // As Kubernetes: a missing key reads as the empty value.
                let value = node_labels
                    .get(&c.topology_key)
                    .cloned()
                    .unwrap_or_default();
                if let std::collections::hash_map::Entry::Vacant(e) = counts[i].entry(value) {
                    e.insert(0);
                    domains[i] += 1;
                }
            }
        }
        let topology_normalizing_weight = constraints
            .iter()
            .zip(&domains)
            .map(|(c, &size)| {
                let size = if c.topology_key == HOSTNAME_LABEL {
                    nodes.len().saturating_sub(ignored_nodes.len())
                } else {
                    size
                };
                topology_normalizing_weight(size)
            })
            .collect();

        // Count matching pods over all nodes, only in domains a feasible node is in.
        let required = RequiredNodeAffinity::from_pod(&pod.pod);
        let namespace = namespace_of(&pod.pod);
        for node_info in &snapshot.node_info_list {
            let Some(node) = node_info.node.as_deref() else {
                continue;
            };
            let node_labels = labels_of_node(node);
            if require_all_topologies && !node_has_all_keys(node_labels, &constraints) {
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if !c.includes_node(&pod.pod, node, &required) {
                    continue;
                }
                let value = node_labels
                    .get(&c.topology_key)
                    .map(String::as_str)
                    .unwrap_or_default();
                let Some(total) = counts[i].get_mut(value) else {
                    continue;
                };
                *total += count_pods_match_selector(&node_info.pods, &c.selector, namespace);
            }
        }
        state.write(
            PRE_SCORE_STATE_KEY,
            PreScoreState {
                constraints,
                ignored_nodes,
                topology_value_to_pod_counts: counts,
                topology_normalizing_weight,
            },
        );
        Status::success()
    }
}

impl ScorePlugin for PodTopologySpread {
    fn score(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node_info: &NodeInfo,
    ) -> Result<i64, Status> {
        let Some(node) = node_info.node.as_deref() else {
            return Err(error("node not found"));
        };
        // No state: PreScore skipped, every node scores the same.
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Ok(0);
        };
        if s.ignored_nodes.contains(node_info.name()) {
            return Ok(0);
        }
        let node_labels = labels_of_node(node);
        let namespace = namespace_of(&pod.pod);
        let mut score = 0.0;
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = node_labels.get(&c.topology_key) else {
                continue;
            };
            let count = if c.topology_key == HOSTNAME_LABEL {
                count_pods_match_selector(&node_info.pods, &c.selector, namespace)
            } else {
                s.topology_value_to_pod_counts[i]
                    .get(value)
                    .copied()
                    .unwrap_or(0)
            };
            score += score_for_count(count, c.max_skew, s.topology_normalizing_weight[i]);
        }
        Ok(score.round() as i64)
    }

    /// Kubernetes' NormalizeScore: fewer matching pods is better, so the score is reversed
    /// within [min, max]; ignored nodes get 0; all-zero raw scores give everyone 100.
    fn normalize(&self, state: &CycleState, _pod: &PodInfo, scores: &mut [NodeScore]) -> Status {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Status::success();
        };
        let counted = || scores.iter().filter(|n| !s.ignored_nodes.contains(&n.name));
        let min_score = counted().map(|n| n.score).min().unwrap_or(i64::MAX);
        let max_score = counted().map(|n| n.score).max().unwrap_or(0).max(0);
        for n in scores.iter_mut() {
            n.score = if s.ignored_nodes.contains(&n.name) {
                0
            } else if max_score == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max_score + min_score - n.score) / max_score
            };
        }
        Status::success()
    }

    fn weight(&self) -> i64 {
        POD_TOPOLOGY_SPREAD_WEIGHT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, PodSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector as ApiSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
    };

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn node(name: &str, extra: &[(&str, &str)]) -> Node {
        let mut l = labels(extra);
        l.insert(HOSTNAME_LABEL.into(), name.into());
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(l),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn zoned(name: &str, zone: &str) -> Node {
        node(name, &[("zone", zone)])
    }

    fn pod(name: &str, pod_labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(labels(pod_labels)),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            ..Default::default()
        }
    }

    fn exists(key: &str) -> Option<ApiSelector> {
        Some(ApiSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: "Exists".into(),
                values: None,
            }]),
            match_labels: None,
        })
    }

    fn constraint(
        max_skew: i32,
        key: &str,
        action: &str,
        selector_key: &str,
    ) -> TopologySpreadConstraint {
        TopologySpreadConstraint {
            max_skew,
            topology_key: key.into(),
            when_unsatisfiable: action.into(),
            label_selector: exists(selector_key),
            ..Default::default()
        }
    }

    fn with_constraints(mut p: Pod, constraints: Vec<TopologySpreadConstraint>) -> Pod {
        p.spec.get_or_insert_default().topology_spread_constraints = Some(constraints);
        p
    }

    fn info(p: Pod) -> PodInfo {
        PodInfo {
            pod: Arc::new(p),
            ..Default::default()
        }
    }

    /// Nodes with `n` pods labelled `foo` each (named after the node).
    fn cluster(nodes: Vec<(Node, usize)>) -> Snapshot {
        let list: Vec<Arc<NodeInfo>> = nodes
            .into_iter()
            .map(|(node, n)| {
                let name = node.metadata.name.clone().unwrap_or_default();
                Arc::new(NodeInfo {
                    node: Some(Arc::new(node)),
                    pods: (0..n)
                        .map(|i| Arc::new(info(pod(&format!("{name}-{i}"), &[("foo", "")]))))
                        .collect(),
                    ..Default::default()
                })
            })
            .collect();
        Snapshot {
            node_info_map: list
                .iter()
                .map(|n| (n.name().to_string(), n.clone()))
                .collect(),
            node_info_list: list,
            ..Default::default()
        }
    }

    fn filter_all(plugin: &PodTopologySpread, p: &PodInfo, snap: &Snapshot) -> Vec<Status> {
        let mut state = CycleState::default();
        let pre = plugin.pre_filter(&mut state, p, snap);
        assert!(pre.is_success(), "{pre:?}");
        snap.node_info_list
            .iter()
            .map(|n| plugin.filter(&state, p, n))
            .collect()
    }

    fn passes(statuses: &[Status]) -> Vec<bool> {
        statuses.iter().map(Status::is_success).collect()
    }

    #[test]
    fn max_skew_counts_matching_pods_per_domain() {
        // zone1: 2 + 1 matching pods, zone2: 1. maxSkew 1.
        let snap = cluster(vec![
            (zoned("a", "zone1"), 2),
            (zoned("b", "zone1"), 1),
            (zoned("x", "zone2"), 1),
            (zoned("y", "zone2"), 0),
        ]);
        let p = info(with_constraints(
            pod("p", &[("foo", "")]),
            vec![constraint(1, "zone", DO_NOT_SCHEDULE, "foo")],
        ));
        let statuses = filter_all(&PodTopologySpread::default(), &p, &snap);
        // zone1: 3 + 1 - 1 = 3 > 1; zone2: 1 + 1 - 1 = 1.
        assert_eq!(passes(&statuses), vec![false, false, true, true]);
        assert_eq!(statuses[0].code, Code::Unschedulable);
        assert_eq!(statuses[0].reasons, vec![REASON_CONSTRAINTS_NOT_MATCH]);

        // A pod that doesn't match its own selector adds no skew: 3 - 1 = 2 > 1 still,
        // but with maxSkew 2 zone1 is fine.
        let p = info(with_constraints(
            pod("p", &[]),
            vec![constraint(2, "zone", DO_NOT_SCHEDULE, "foo")],
        ));
        let statuses = filter_all(&PodTopologySpread::default(), &p, &snap);
        assert_eq!(passes(&statuses), vec![true, true, true, true]);
    }

    #[test]
    fn missing_topology_label_is_unresolvable() {
        let snap = cluster(vec![(zoned("a", "zone1"), 0), (node("b", &[]), 0)]);
        let p = info(with_constraints(
            pod("p", &[("foo", "")]),
            vec![constraint(1, "zone", DO_NOT_SCHEDULE, "foo")],
        ));
        let statuses = filter_all(&PodTopologySpread::default(), &p, &snap);
        assert!(statuses[0].is_success());
        assert_eq!(statuses[1].code, Code::UnschedulableAndUnresolvable);
        assert_eq!(statuses[1].reasons, vec![REASON_NODE_LABEL_NOT_MATCH]);
    }

    #[test]
    fn min_domains_treats_missing_domains_as_empty() {
        // Only one zone exists and it has 1 pod: global minimum is 1 → skew 1 passes; with
        // minDomains 2 the minimum is 0 → skew 2 fails.
        let snap = cluster(vec![(zoned("a", "zone1"), 1)]);
        let mut c = constraint(1, "zone", DO_NOT_SCHEDULE, "foo");
        let p = info(with_constraints(pod("p", &[("foo", "")]), vec![c.clone()]));
        assert!(filter_all(&PodTopologySpread::default(), &p, &snap)[0].is_success());
        c.min_domains = Some(2);
        let p = info(with_constraints(pod("p", &[("foo", "")]), vec![c]));
        assert!(!filter_all(&PodTopologySpread::default(), &p, &snap)[0].is_success());
    }

    #[test]
    fn node_affinity_policy_honor_and_ignore() {
        // zone2's only node is excluded by the pod's nodeSelector: with Honor it is not a
        // domain (minimum is zone1's 2), with Ignore it is (minimum 0).
        let snap = cluster(vec![
            (node("a", &[("zone", "zone1"), ("disk", "ssd")]), 2),
            (node("x", &[("zone", "zone2")]), 0),
        ]);
        let mut p = with_constraints(
            pod("p", &[("foo", "")]),
            vec![constraint(1, "zone", DO_NOT_SCHEDULE, "foo")],
        );
        p.spec.get_or_insert_default().node_selector = Some(labels(&[("disk", "ssd")]));
        let honor = info(p.clone());
        assert!(filter_all(&PodTopologySpread::default(), &honor, &snap)[0].is_success());
        if let Some(c) = p
            .spec
            .as_mut()
            .and_then(|s| s.topology_spread_constraints.as_mut())
        {
            c[0].node_affinity_policy = Some("Ignore".into());
        }
        let ignore = info(p);
        assert!(!filter_all(&PodTopologySpread::default(), &ignore, &snap)[0].is_success());
    }

    #[test]
    fn node_taints_policy_honor_drops_tainted_domains() {
        let mut tainted = zoned("x", "zone2");
        tainted.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "dedicated".into(),
                value: Some("gpu".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        });
        let snap = cluster(vec![(zoned("a", "zone1"), 2), (tainted, 0)]);
        let mut c = constraint(1, "zone", DO_NOT_SCHEDULE, "foo");
        // Default Ignore: the tainted empty zone is the minimum (0) → zone1 fails.
        let p = info(with_constraints(pod("p", &[("foo", "")]), vec![c.clone()]));
        assert!(!filter_all(&PodTopologySpread::default(), &p, &snap)[0].is_success());
        c.node_taints_policy = Some("Honor".into());
        let p = info(with_constraints(pod("p", &[("foo", "")]), vec![c]));
        assert!(filter_all(&PodTopologySpread::default(), &p, &snap)[0].is_success());
    }

    #[test]
    fn match_label_keys_narrow_the_selector() {
        // Two revisions: only pods with the incoming pod's hash count.
        let mut snap = cluster(vec![(zoned("a", "zone1"), 0), (zoned("x", "zone2"), 0)]);
        let old: Vec<Arc<PodInfo>> = (0..3)
            .map(|i| {
                Arc::new(info(pod(
                    &format!("old-{i}"),
                    &[("foo", ""), ("pod-template-hash", "v1")],
                )))
            })
            .collect();
        let a = Arc::new(NodeInfo {
            pods: old,
            ..(*snap.node_info_list[0]).clone()
        });
        snap.node_info_list[0] = a;
        let mut c = constraint(1, "zone", DO_NOT_SCHEDULE, "foo");
        let p = info(with_constraints(
            pod("p", &[("foo", ""), ("pod-template-hash", "v2")]),
            vec![c.clone()],
        ));
        assert_eq!(
            passes(&filter_all(&PodTopologySpread::default(), &p, &snap)),
            vec![false, true]
        );
        c.match_label_keys = Some(vec!["pod-template-hash".into()]);
        let p = info(with_constraints(
            pod("p", &[("foo", ""), ("pod-template-hash", "v2")]),
            vec![c],
        ));
        assert_eq!(
            passes(&filter_all(&PodTopologySpread::default(), &p, &snap)),
            vec![true, true]
        );
    }

    #[test]
    fn add_and_remove_pod_for_preemption() {
        let snap = cluster(vec![(zoned("a", "zone1"), 2), (zoned("x", "zone2"), 1)]);
        let plugin = PodTopologySpread::default();
        let p = info(with_constraints(
            pod("p", &[("foo", "")]),
            vec![constraint(1, "zone", DO_NOT_SCHEDULE, "foo")],
        ));
        let mut state = CycleState::default();
        assert!(plugin.pre_filter(&mut state, &p, &snap).is_success());
        let a = &snap.node_info_list[0];
        // 2 + 1 - 1 = 2 > 1.
        assert!(!plugin.filter(&state, &p, a).is_success());
        // Preemption removes one matching pod from a: 1 + 1 - 1 = 1.
        let mut hypothetical = state.clone();
        let victim = a.pods[0].clone();
        assert!(
            plugin
                .remove_pod(&mut hypothetical, &p, &victim, a)
                .is_success()
        );
        assert!(plugin.filter(&hypothetical, &p, a).is_success());
        // Adding it back restores the verdict; the original state never changed.
        assert!(
            plugin
                .add_pod(&mut hypothetical, &p, &victim, a)
                .is_success()
        );
        assert!(!plugin.filter(&hypothetical, &p, a).is_success());
        assert!(!plugin.filter(&state, &p, a).is_success());
    }

    #[test]
    fn critical_paths_track_two_minimums() {
        let mut paths = CriticalPaths::new();
        for (value, count) in [("a", 3), ("b", 1), ("c", 2)] {
            paths.update(value, count);
        }
        assert_eq!(paths.0[0], ("b".to_string(), 1));
        assert_eq!(paths.0[1], ("c".to_string(), 2));
        // b grows past c: they swap.
        paths.update("b", 5);
        assert_eq!(paths.0[0], ("c".to_string(), 2));
    }

    fn scores(
        plugin: &PodTopologySpread,
        p: &PodInfo,
        snap: &Snapshot,
        feasible: &[&str],
    ) -> Vec<i64> {
        let nodes: Vec<Arc<NodeInfo>> = snap
            .node_info_list
            .iter()
            .filter(|n| feasible.contains(&n.name()))
            .cloned()
            .collect();
        let mut state = CycleState::default();
        let pre = plugin.pre_score(&mut state, p, &nodes, snap);
        assert!(pre.is_success(), "{pre:?}");
        let mut list: Vec<NodeScore> = nodes
            .iter()
            .map(|n| NodeScore {
                name: n.name().to_string(),
                score: plugin.score(&state, p, n).unwrap_or(-1),
            })
            .collect();
        assert!(plugin.normalize(&state, p, &mut list).is_success());
        list.into_iter().map(|s| s.score).collect()
    }

    // Reference: Kubernetes podtopologyspread/scoring_test.go, TestPodTopologySpreadScore.
    #[test]
    fn soft_constraint_scores_match_kubernetes() {
        let plugin = PodTopologySpread::default();
        let soft = |max_skew, key| {
            info(with_constraints(
                pod("p", &[("foo", "")]),
                vec![constraint(max_skew, key, SCHEDULE_ANYWAY, "foo")],
            ))
        };
        // "one constraint on node, all 4 nodes are candidates, maxSkew=2": 2/1/0/3.
        let snap = cluster(vec![
            (node("node-a", &[]), 2),
            (node("node-b", &[]), 1),
            (node("node-c", &[]), 0),
            (node("node-d", &[]), 3),
        ]);
        let all = ["node-a", "node-b", "node-c", "node-d"];
        assert_eq!(
            scores(&plugin, &soft(2, HOSTNAME_LABEL), &snap, &all),
            vec![33, 66, 100, 16]
        );
        // "one constraint on node, 3 out of 4 nodes are candidates": 4/2/1/~3~.
        let snap = cluster(vec![
            (node("node-a", &[]), 4),
            (node("node-b", &[]), 2),
            (node("node-x", &[]), 1),
            (node("node-y", &[]), 3),
        ]);
        assert_eq!(
            scores(
                &plugin,
                &soft(1, HOSTNAME_LABEL),
                &snap,
                &["node-a", "node-b", "node-x"]
            ),
            vec![33, 83, 100]
        );
        // "one constraint on zone, 3 out of 4 nodes are candidates".
        let snap = cluster(vec![
            (zoned("node-a", "zone1"), 4),
            (zoned("node-b", "zone1"), 2),
            (zoned("node-x", "zone2"), 1),
            (zoned("node-y", "zone2"), 3),
        ]);
        assert_eq!(
            scores(
                &plugin,
                &soft(1, "zone"),
                &snap,
                &["node-a", "node-b", "node-x"]
            ),
            vec![75, 75, 100]
        );
    }

    // Reference: "two Constraints on zone and node, with different labelSelectors".
    #[test]
    fn two_soft_constraints_with_different_selectors() {
        let mk = |name: &str, zone: &str, pods: Vec<Pod>| {
            Arc::new(NodeInfo {
                node: Some(Arc::new(zoned(name, zone))),
                pods: pods.into_iter().map(|p| Arc::new(info(p))).collect(),
                ..Default::default()
            })
        };
        let list = vec![
            mk("node-a", "zone1", vec![pod("p-a1", &[("foo", "")])]),
            mk(
                "node-b",
                "zone1",
                vec![pod("p-b1", &[("foo", ""), ("bar", "")])],
            ),
            mk("node-x", "zone2", vec![]),
            mk(
                "node-y",
                "zone2",
                vec![pod("p-y1", &[("foo", "")]), pod("p-y2", &[("bar", "")])],
            ),
        ];
        let snap = Snapshot {
            node_info_list: list,
            ..Default::default()
        };
        let p = info(with_constraints(
            pod("p", &[("foo", ""), ("bar", "")]),
            vec![
                constraint(1, "zone", SCHEDULE_ANYWAY, "foo"),
                constraint(1, HOSTNAME_LABEL, SCHEDULE_ANYWAY, "bar"),
            ],
        ));
        assert_eq!(
            scores(
                &PodTopologySpread::default(),
                &p,
                &snap,
                &["node-a", "node-b", "node-x", "node-y"]
            ),
            vec![60, 20, 100, 60]
        );
    }

    #[test]
    fn system_defaults_apply_to_controller_owned_pods_only() {
        let plugin = PodTopologySpread::default();
        let snap = cluster(vec![(node("a", &[]), 2), (node("b", &[]), 0)]);
        let both = ["a", "b"];
        // No owner: no default constraints, PreScore skips.
        let loose = info(pod("p", &[("foo", "")]));
        let mut state = CycleState::default();
        assert!(
            plugin
                .pre_score(&mut state, &loose, &snap.node_info_list, &snap)
                .is_skip()
        );
        // Owned by a ReplicaSet: hostname spreading (maxSkew 3) applies even though the
        // nodes have no zone label; the emptier node wins.
        let mut owned = pod("p", &[("foo", "")]);
        owned.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "web-abc".into(),
            uid: "rs-uid".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        let owned = info(owned);
        let s = scores(&plugin, &owned, &snap, &both);
        assert!(s[1] > s[0], "{s:?}");
        assert_eq!(s[1], MAX_NODE_SCORE);
        // Defaults are soft: PreFilter has nothing to enforce.
        let mut state = CycleState::default();
        assert!(plugin.pre_filter(&mut state, &owned, &snap).is_skip());
    }

    #[test]
    fn default_selector_drops_per_pod_labels() {
        let mut p = pod(
            "web-0",
            &[
                ("app", "web"),
                ("statefulset.kubernetes.io/pod-name", "web-0"),
            ],
        );
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: "StatefulSet".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        let selector = default_selector(&p).map(|s| s.0.requirements);
        assert_eq!(
            selector,
            Some(vec![("app".to_string(), LabelOp::Equals("web".into()))])
        );
    }

    #[test]
    fn terminating_and_other_namespace_pods_do_not_count() {
        let mut gone = pod("gone", &[("foo", "")]);
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let mut elsewhere = pod("elsewhere", &[("foo", "")]);
        elsewhere.metadata.namespace = Some("other".into());
        let pods = vec![Arc::new(info(gone)), Arc::new(info(elsewhere))];
        let selector = Selector(LabelSelector::default());
        assert_eq!(count_pods_match_selector(&pods, &selector, "default"), 0);
        assert_eq!(count_pods_match_selector(&pods, &selector, "other"), 1);
    }
}
