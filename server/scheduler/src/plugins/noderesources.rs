//! NodeResourcesFit and NodeResourcesBalancedAllocation (Kubernetes'
//! `plugins/noderesources`): whether a node has the CPU, memory, ephemeral storage,
//! extended resources and pod slots a pod requests, and how full each feasible node would
//! be afterwards.
//!
//! - **Filter** compares the pod's requests ([`Resource::from_pod_requests`], computed once
//!   in PreFilter) with `allocatable - requested` on the node, reporting every short
//!   resource ("Insufficient cpu", "Too many pods", ...). It uses the real requests: a pod
//!   that requests nothing fits anywhere a pod slot is free.
//! - **Score** uses *non-zero* requests for CPU and memory (100m / 200 MiB per container
//!   that requests none, on both the pod and the node's pods: [`NodeInfo::non_zero_requested`]),
//!   so best-effort pods still spread instead of all landing on the first node. Strategies:
//!   [`ScoringStrategy::LeastAllocated`] (the default: prefer emptier nodes),
//!   [`ScoringStrategy::MostAllocated`] (bin packing) and
//!   [`ScoringStrategy::RequestedToCapacityRatio`] (a piecewise-linear shape).
//! - **BalancedAllocation** scores `(1 - std deviation of the requested/allocatable
//!   fractions) * 100`: a node whose CPU and memory would be equally full beats one that
//!   would run out of one while the other idles.
//!
//! Extended (scalar) resources count in a score only when the pod requests them and the
//! node has them, as in Kubernetes, so GPU nodes are not penalized for CPU-only pods.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::{BALANCED_ALLOCATION_WEIGHT, FIT_WEIGHT};
use crate::framework::{
    Code, CycleState, FilterPlugin, MAX_NODE_SCORE, NodeInfo, Plugin, PodInfo, PreFilterPlugin,
    PreScorePlugin, Resource, ScorePlugin, Snapshot, Status, is_scalar_resource_name,
};

/// NodeResourcesFit's name.
pub const FIT_NAME: &str = "NodeResourcesFit";
/// NodeResourcesBalancedAllocation's name.
pub const BALANCED_ALLOCATION_NAME: &str = "NodeResourcesBalancedAllocation";

/// Resource names as the API spells them.
pub const RESOURCE_CPU: &str = "cpu";
/// Memory.
pub const RESOURCE_MEMORY: &str = "memory";
/// Ephemeral (local) storage.
pub const RESOURCE_EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// Pod slots (`status.allocatable.pods`).
pub const RESOURCE_PODS: &str = "pods";

/// Kubernetes' "Too many pods" reason: the node's `allocatable.pods` slots are all taken.
pub const REASON_TOO_MANY_PODS: &str = "Too many pods";

/// The weight of CPU and of memory in the default scoring resources (Kubernetes'
/// `defaultResourceSpec`: cpu 1, memory 1 — neither dominates).
pub const DEFAULT_RESOURCE_WEIGHT: i64 = 1;
/// The largest weight a scoring resource may have (Kubernetes' validation: 1..=100).
pub const RESOURCE_WEIGHT_MAX: i64 = 100;
/// The top of a RequestedToCapacityRatio shape's score scale (Kubernetes'
/// `MaxCustomPriorityScore`); shape scores are multiplied by
/// `MAX_NODE_SCORE / MAX_CUSTOM_PRIORITY_SCORE`.
pub const MAX_CUSTOM_PRIORITY_SCORE: i64 = 10;
/// Utilization is expressed in percent (Kubernetes' `maxUtilization`).
pub const MAX_UTILIZATION: i64 = 100;

const _: () = assert!(MAX_NODE_SCORE % MAX_CUSTOM_PRIORITY_SCORE == 0);

/// CycleState keys.
const PRE_FILTER_STATE_KEY: &str = "PreFilterNodeResourcesFit";
const PRE_SCORE_STATE_KEY: &str = "PreScoreNodeResourcesFit";
const BALANCED_PRE_SCORE_STATE_KEY: &str = "PreScoreNodeResourcesBalancedAllocation";

/// A resource counted in a score, with its weight (Kubernetes' `config.ResourceSpec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceSpec {
    /// `cpu`, `memory`, `ephemeral-storage` or an extended resource name.
    pub name: String,
    /// 1..=[`RESOURCE_WEIGHT_MAX`].
    pub weight: i64,
}

/// CPU and memory, weight 1 each (Kubernetes' default for both plugins).
pub fn default_resources() -> Vec<ResourceSpec> {
    vec![
        ResourceSpec {
            name: RESOURCE_CPU.to_string(),
            weight: DEFAULT_RESOURCE_WEIGHT,
        },
        ResourceSpec {
            name: RESOURCE_MEMORY.to_string(),
            weight: DEFAULT_RESOURCE_WEIGHT,
        },
    ]
}

/// One point of a RequestedToCapacityRatio shape: at `utilization` percent, `score`
/// (0..=[`MAX_CUSTOM_PRIORITY_SCORE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UtilizationShapePoint {
    /// Percent, 0..=100, strictly increasing along the shape.
    pub utilization: i64,
    /// 0..=10.
    pub score: i64,
}

/// How NodeResourcesFit scores a feasible node (Kubernetes' `ScoringStrategyType`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ScoringStrategy {
    /// Prefer nodes with the most free capacity after placing the pod (spreads load).
    #[default]
    LeastAllocated,
    /// Prefer the fullest nodes (bin packing, frees whole nodes for scale-down).
    MostAllocated,
    /// Score by a piecewise-linear function of utilization.
    RequestedToCapacityRatio(Vec<UtilizationShapePoint>),
}

/// Invalid plugin arguments (Kubernetes' `ValidateNodeResourcesFitArgs`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgsError {
    /// A scoring resource's weight is outside 1..=100.
    #[error(
        "scoringStrategy.resources[{index}].weight: Invalid value: {weight}: must be in the range [1, {RESOURCE_WEIGHT_MAX}]"
    )]
    Weight {
        /// Position in the resource list.
        index: usize,
        /// The weight given.
        weight: i64,
    },
    /// The RequestedToCapacityRatio shape is empty, unordered or out of range.
    #[error("scoringStrategy.requestedToCapacityRatio.shape: {0}")]
    Shape(&'static str),
}

fn validate_resources(resources: &[ResourceSpec]) -> Result<(), ArgsError> {
    for (index, resource) in resources.iter().enumerate() {
        if !(1..=RESOURCE_WEIGHT_MAX).contains(&resource.weight) {
            return Err(ArgsError::Weight {
                index,
                weight: resource.weight,
            });
        }
    }
    Ok(())
}

fn validate_shape(shape: &[UtilizationShapePoint]) -> Result<(), ArgsError> {
    if shape.is_empty() {
        return Err(ArgsError::Shape("at least one point must be specified"));
    }
    for point in shape {
        if !(0..=MAX_UTILIZATION).contains(&point.utilization) {
            return Err(ArgsError::Shape(
                "utilization must be in the range [0, 100]",
            ));
        }
        if !(0..=MAX_CUSTOM_PRIORITY_SCORE).contains(&point.score) {
            return Err(ArgsError::Shape("score must be in the range [0, 10]"));
        }
    }
    if shape
        .windows(2)
        .any(|w| w[0].utilization >= w[1].utilization)
    {
        return Err(ArgsError::Shape(
            "utilization values must be sorted in increasing order",
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Filter.

/// One resource the node is short of (Kubernetes' `InsufficientResource`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InsufficientResource {
    /// `cpu`, `memory`, `pods`, ...
    pub resource_name: String,
    /// The FailedScheduling reason, e.g. `Insufficient cpu`.
    pub reason: String,
    /// What the pod asks for (1 for pods).
    pub requested: i64,
    /// What the node's pods already request.
    pub used: i64,
    /// The node's allocatable.
    pub capacity: i64,
}

impl InsufficientResource {
    fn new(name: &str, requested: i64, used: i64, capacity: i64) -> InsufficientResource {
        InsufficientResource {
            resource_name: name.to_string(),
            reason: format!("Insufficient {name}"),
            requested,
            used,
            capacity,
        }
    }
}

/// Which extended resources Filter does not check (Kubernetes' `ignoredResources` and
/// `ignoredResourceGroups`): for resources another component (e.g. a device plugin
/// admission webhook) accounts for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IgnoredResources {
    /// Exact extended resource names.
    pub names: BTreeSet<String>,
    /// Prefixes before the `/` (`example.com` ignores `example.com/*`).
    pub groups: BTreeSet<String>,
}

impl IgnoredResources {
    fn ignores(&self, name: &str) -> bool {
        // Only extended resources (with a domain) can be ignored; `hugepages-*` cannot.
        if !name.contains('/') || name.starts_with("kubernetes.io/") {
            return false;
        }
        let group = name.split('/').next().unwrap_or_default();
        self.names.contains(name) || self.groups.contains(group)
    }
}

/// Every resource `pod_request` does not fit into on `node` (Kubernetes' `fitsRequest`), in
/// Kubernetes' order: pods, cpu, memory, ephemeral-storage, then extended resources (by
/// name). Empty means it fits.
pub fn fits_request(
    pod_request: &Resource,
    node: &NodeInfo,
    ignored: &IgnoredResources,
) -> Vec<InsufficientResource> {
    let mut insufficient = Vec::new();
    let pods_used = i64::try_from(node.pods.len()).unwrap_or(i64::MAX);
    if pods_used.saturating_add(1) > node.allocatable.allowed_pod_number {
        insufficient.push(InsufficientResource {
            resource_name: RESOURCE_PODS.to_string(),
            reason: REASON_TOO_MANY_PODS.to_string(),
            requested: 1,
            used: pods_used,
            capacity: node.allocatable.allowed_pod_number,
        });
    }
    if pod_request.milli_cpu == 0
        && pod_request.memory == 0
        && pod_request.ephemeral_storage == 0
        && pod_request.scalar.is_empty()
    {
        return insufficient;
    }
    let (allocatable, requested) = (&node.allocatable, &node.requested);
    if pod_request.milli_cpu > 0
        && pod_request.milli_cpu > allocatable.milli_cpu - requested.milli_cpu
    {
        insufficient.push(InsufficientResource::new(
            RESOURCE_CPU,
            pod_request.milli_cpu,
            requested.milli_cpu,
            allocatable.milli_cpu,
        ));
    }
    if pod_request.memory > 0 && pod_request.memory > allocatable.memory - requested.memory {
        insufficient.push(InsufficientResource::new(
            RESOURCE_MEMORY,
            pod_request.memory,
            requested.memory,
            allocatable.memory,
        ));
    }
    if pod_request.ephemeral_storage > 0
        && pod_request.ephemeral_storage
            > allocatable.ephemeral_storage - requested.ephemeral_storage
    {
        insufficient.push(InsufficientResource::new(
            RESOURCE_EPHEMERAL_STORAGE,
            pod_request.ephemeral_storage,
            requested.ephemeral_storage,
            allocatable.ephemeral_storage,
        ));
    }
    for (name, &quantity) in &pod_request.scalar {
        if quantity == 0 || ignored.ignores(name) {
            continue;
        }
        let capacity = allocatable.scalar.get(name).copied().unwrap_or(0);
        let used = requested.scalar.get(name).copied().unwrap_or(0);
        if quantity > capacity - used {
            insufficient.push(InsufficientResource::new(name, quantity, used, capacity));
        }
    }
    insufficient
}

/// Whether `pod` fits `node`'s free resources (no CycleState needed; for preemption and
/// queueing hints). Empty means it fits.
pub fn fits(pod: &Pod, node: &NodeInfo) -> Vec<InsufficientResource> {
    fits_request(
        &Resource::from_pod_requests(pod),
        node,
        &IgnoredResources::default(),
    )
}

// ---------------------------------------------------------------------------------------
// Scoring shared by both plugins (Kubernetes' `resourceAllocationScorer`).

/// The pod's request of each scoring resource, in `resources` order: non-zero CPU and
/// memory, real requests for the rest.
fn pod_request_list(pod: &Pod, resources: &[ResourceSpec]) -> Vec<i64> {
    let non_zero = Resource::non_zero_requests(pod);
    let requests = Resource::from_pod_requests(pod);
    resources
        .iter()
        .map(|r| match r.name.as_str() {
            RESOURCE_CPU => non_zero.milli_cpu,
            RESOURCE_MEMORY => non_zero.memory,
            RESOURCE_EPHEMERAL_STORAGE => requests.ephemeral_storage,
            other => requests.scalar.get(other).copied().unwrap_or(0),
        })
        .collect()
}

/// (allocatable, requested-after-placing-the-pod) of one resource on `node`; (0, 0) means
/// "leave this resource out of the score" (Kubernetes' `calculateResourceAllocatableRequest`).
fn allocatable_and_requested(node: &NodeInfo, resource: &str, pod_request: i64) -> (i64, i64) {
    // An extended resource the pod does not request says nothing about this pod's fit.
    if pod_request == 0 && is_scalar_resource_name(resource) {
        return (0, 0);
    }
    let (allocatable, non_zero, requested) =
        (&node.allocatable, &node.non_zero_requested, &node.requested);
    match resource {
        RESOURCE_CPU => (allocatable.milli_cpu, non_zero.milli_cpu + pod_request),
        RESOURCE_MEMORY => (allocatable.memory, non_zero.memory + pod_request),
        RESOURCE_EPHEMERAL_STORAGE => (
            allocatable.ephemeral_storage,
            requested.ephemeral_storage + pod_request,
        ),
        other => match allocatable.scalar.get(other) {
            Some(&capacity) => (
                capacity,
                requested.scalar.get(other).copied().unwrap_or(0) + pod_request,
            ),
            None => (0, 0),
        },
    }
}

/// The per-resource (requested, allocatable) vectors for `node`, zeros where a resource is
/// left out.
fn requested_and_allocatable(
    node: &NodeInfo,
    resources: &[ResourceSpec],
    pod_requests: &[i64],
) -> (Vec<i64>, Vec<i64>) {
    let mut requested = vec![0; resources.len()];
    let mut allocatable = vec![0; resources.len()];
    for (i, (resource, &pod_request)) in resources.iter().zip(pod_requests).enumerate() {
        let (alloc, req) = allocatable_and_requested(node, &resource.name, pod_request);
        if alloc == 0 {
            continue;
        }
        allocatable[i] = alloc;
        requested[i] = req;
    }
    (requested, allocatable)
}

/// `(capacity - requested) * 100 / capacity`, 0 when over capacity.
fn least_requested_score(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

/// `requested * 100 / capacity`, capped at 100 (over-committed nodes still score as full).
fn most_requested_score(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 {
        return 0;
    }
    requested.min(capacity) * MAX_NODE_SCORE / capacity
}

/// Weighted average of per-resource scores over the resources that count.
fn weighted_score(
    resources: &[ResourceSpec],
    requested: &[i64],
    allocatable: &[i64],
    per_resource: impl Fn(i64, i64) -> i64,
) -> i64 {
    let (mut node_score, mut weight_sum) = (0i64, 0i64);
    for ((resource, &req), &alloc) in resources.iter().zip(requested).zip(allocatable) {
        if alloc == 0 {
            continue;
        }
        node_score += per_resource(req, alloc) * resource.weight;
        weight_sum += resource.weight;
    }
    if weight_sum == 0 {
        return 0;
    }
    node_score / weight_sum
}

/// Kubernetes' `BuildBrokenLinearFunction`: linear interpolation between shape points,
/// flat before the first and after the last. Shape scores are already on the 0..=100 scale.
fn broken_linear(shape: &[UtilizationShapePoint], utilization: i64) -> i64 {
    for (i, point) in shape.iter().enumerate() {
        if utilization <= point.utilization {
            if i == 0 {
                return point.score;
            }
            let previous = shape[i - 1];
            return previous.score
                + (point.score - previous.score) * (utilization - previous.utilization)
                    / (point.utilization - previous.utilization);
        }
    }
    shape.last().map_or(0, |p| p.score)
}

fn requested_to_capacity_ratio_score(
    shape: &[UtilizationShapePoint],
    resources: &[ResourceSpec],
    requested: &[i64],
    allocatable: &[i64],
) -> i64 {
    let scaled: Vec<UtilizationShapePoint> = shape
        .iter()
        .map(|p| UtilizationShapePoint {
            utilization: p.utilization,
            score: p.score * (MAX_NODE_SCORE / MAX_CUSTOM_PRIORITY_SCORE),
        })
        .collect();
    let resource_score = |req: i64, capacity: i64| {
        if capacity == 0 || req > capacity {
            broken_linear(&scaled, MAX_UTILIZATION)
        } else {
            broken_linear(&scaled, req * MAX_UTILIZATION / capacity)
        }
    };
    let (mut node_score, mut weight_sum) = (0i64, 0i64);
    for ((resource, &req), &alloc) in resources.iter().zip(requested).zip(allocatable) {
        if alloc == 0 {
            continue;
        }
        let score = resource_score(req, alloc);
        // Kubernetes counts only resources with a positive score in the average.
        if score > 0 {
            node_score += score * resource.weight;
            weight_sum += resource.weight;
        }
    }
    if weight_sum == 0 {
        return 0;
    }
    (node_score as f64 / weight_sum as f64).round() as i64
}

/// `(1 - std deviation of the fractions) * 100` (Kubernetes' `balancedResourceScorer`).
fn balanced_resource_score(requested: &[i64], allocatable: &[i64]) -> i64 {
    let fractions: Vec<f64> = requested
        .iter()
        .zip(allocatable)
        .filter(|&(_, &alloc)| alloc != 0)
        .map(|(&req, &alloc)| (req as f64 / alloc as f64).min(1.0))
        .collect();
    let std = match fractions.as_slice() {
        // The common cpu+memory case: the std of two values is half their distance.
        [a, b] => ((a - b) / 2.0).abs(),
        [] | [_] => 0.0,
        many => {
            let mean = many.iter().sum::<f64>() / many.len() as f64;
            let variance =
                many.iter().map(|f| (f - mean) * (f - mean)).sum::<f64>() / many.len() as f64;
            variance.sqrt()
        }
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

/// The pod's scoring requests, computed once per cycle in PreScore.
#[derive(Clone, Debug)]
struct PodRequests(Vec<i64>);

fn pod_requests_from_state<'a>(
    state: &'a CycleState,
    key: &'static str,
    pod: &Pod,
    resources: &[ResourceSpec],
) -> Cow<'a, [i64]> {
    match state.read::<PodRequests>(key) {
        Some(PodRequests(requests)) if requests.len() == resources.len() => Cow::Borrowed(requests),
        // PreScore did not run (e.g. a dry run): compute here.
        _ => Cow::Owned(pod_request_list(pod, resources)),
    }
}

// ---------------------------------------------------------------------------------------
// NodeResourcesFit.

/// NodeResourcesFit: the resources filter and the allocation score.
#[derive(Clone, Debug)]
pub struct Fit {
    ignored: IgnoredResources,
    strategy: ScoringStrategy,
    resources: Vec<ResourceSpec>,
    weight: i64,
}

impl Default for Fit {
    /// LeastAllocated over cpu and memory, weight [`FIT_WEIGHT`] (Kubernetes' defaults).
    fn default() -> Self {
        Fit {
            ignored: IgnoredResources::default(),
            strategy: ScoringStrategy::LeastAllocated,
            resources: default_resources(),
            weight: FIT_WEIGHT,
        }
    }
}

impl Fit {
    /// A Fit with the given scoring strategy and resources.
    pub fn new(strategy: ScoringStrategy, resources: Vec<ResourceSpec>) -> Result<Fit, ArgsError> {
        validate_resources(&resources)?;
        if let ScoringStrategy::RequestedToCapacityRatio(shape) = &strategy {
            validate_shape(shape)?;
        }
        Ok(Fit {
            strategy,
            resources,
            ..Fit::default()
        })
    }

    /// Sets the extended resources Filter ignores.
    pub fn with_ignored_resources(mut self, ignored: IgnoredResources) -> Fit {
        self.ignored = ignored;
        self
    }

    /// Sets the score's weight in the profile.
    pub fn with_weight(mut self, weight: i64) -> Fit {
        self.weight = weight;
        self
    }

    fn node_score(&self, node: &NodeInfo, pod_requests: &[i64]) -> i64 {
        let (requested, allocatable) =
            requested_and_allocatable(node, &self.resources, pod_requests);
        match &self.strategy {
            ScoringStrategy::LeastAllocated => weighted_score(
                &self.resources,
                &requested,
                &allocatable,
                least_requested_score,
            ),
            ScoringStrategy::MostAllocated => weighted_score(
                &self.resources,
                &requested,
                &allocatable,
                most_requested_score,
            ),
            ScoringStrategy::RequestedToCapacityRatio(shape) => {
                requested_to_capacity_ratio_score(shape, &self.resources, &requested, &allocatable)
            }
        }
    }
}

/// The pod's Filter request, computed once per cycle in PreFilter.
#[derive(Clone, Debug)]
struct PreFilterState(Resource);

impl Plugin for Fit {
    fn name(&self) -> &'static str {
        FIT_NAME
    }
}

impl PreFilterPlugin for Fit {
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, _snapshot: &Snapshot) -> Status {
        state.write(
            PRE_FILTER_STATE_KEY,
            PreFilterState(Resource::from_pod_requests(&pod.pod)),
        );
        Status::success()
    }
}

impl FilterPlugin for Fit {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let insufficient = match state.read::<PreFilterState>(PRE_FILTER_STATE_KEY) {
            Some(PreFilterState(request)) => fits_request(request, node, &self.ignored),
            // PreFilter did not run: compute here rather than fail.
            None => fits_request(&Resource::from_pod_requests(&pod.pod), node, &self.ignored),
        };
        if insufficient.is_empty() {
            return Status::success();
        }
        // Resolvable (Kubernetes 1.32): evicting pods may free enough.
        Status {
            code: Code::Unschedulable,
            reasons: insufficient.into_iter().map(|r| r.reason).collect(),
            plugin: FIT_NAME,
        }
    }
}

impl PreScorePlugin for Fit {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        state.write(
            PRE_SCORE_STATE_KEY,
            PodRequests(pod_request_list(&pod.pod, &self.resources)),
        );
        Status::success()
    }
}

impl ScorePlugin for Fit {
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        if self.resources.is_empty() {
            return Err(Status::new(Code::Error, FIT_NAME, "resources not found"));
        }
        let requests =
            pod_requests_from_state(state, PRE_SCORE_STATE_KEY, &pod.pod, &self.resources);
        Ok(self.node_score(node, &requests))
    }

    fn weight(&self) -> i64 {
        self.weight
    }
}

// ---------------------------------------------------------------------------------------
// NodeResourcesBalancedAllocation.

/// NodeResourcesBalancedAllocation: prefer nodes whose resources would be equally used.
#[derive(Clone, Debug)]
pub struct BalancedAllocation {
    resources: Vec<ResourceSpec>,
    weight: i64,
}

impl Default for BalancedAllocation {
    /// cpu and memory, weight [`BALANCED_ALLOCATION_WEIGHT`].
    fn default() -> Self {
        BalancedAllocation {
            resources: default_resources(),
            weight: BALANCED_ALLOCATION_WEIGHT,
        }
    }
}

impl BalancedAllocation {
    /// A BalancedAllocation over `resources` (weights are validated but, as in Kubernetes,
    /// do not enter the standard deviation).
    pub fn new(resources: Vec<ResourceSpec>) -> Result<BalancedAllocation, ArgsError> {
        validate_resources(&resources)?;
        Ok(BalancedAllocation {
            resources,
            ..BalancedAllocation::default()
        })
    }

    /// Sets the score's weight in the profile.
    pub fn with_weight(mut self, weight: i64) -> BalancedAllocation {
        self.weight = weight;
        self
    }
}

impl Plugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        BALANCED_ALLOCATION_NAME
    }
}

impl PreScorePlugin for BalancedAllocation {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        state.write(
            BALANCED_PRE_SCORE_STATE_KEY,
            PodRequests(pod_request_list(&pod.pod, &self.resources)),
        );
        Status::success()
    }
}

impl ScorePlugin for BalancedAllocation {
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        if self.resources.is_empty() {
            return Err(Status::new(
                Code::Error,
                BALANCED_ALLOCATION_NAME,
                "resources not found",
            ));
        }
        let requests = pod_requests_from_state(
            state,
            BALANCED_PRE_SCORE_STATE_KEY,
            &pod.pod,
            &self.resources,
        );
        let (requested, allocatable) = requested_and_allocatable(node, &self.resources, &requests);
        Ok(balanced_resource_score(&requested, &allocatable))
    }

    fn weight(&self) -> i64 {
        self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{expected_scores, node_info, pod_info, score_nodes, snapshot};
    use serde_json::{Value, json};

    /// A container with the given requests (Kubernetes' `st.MakePod().Req(...)`).
    fn container(requests: &[(&str, &str)]) -> Value {
        let requests: serde_json::Map<String, Value> = requests
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        json!({"name": "c", "resources": {"requests": requests}})
    }

    fn pod_json(containers: Vec<Value>) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": containers}})
    }

    /// A node with allocatable cpu (millicores), memory (bytes), pods and extras.
    fn node_json(name: &str, milli_cpu: i64, memory: i64, extra: &[(&str, &str)]) -> Value {
        let mut allocatable = serde_json::Map::new();
        allocatable.insert("cpu".into(), json!(format!("{milli_cpu}m")));
        allocatable.insert("memory".into(), json!(memory.to_string()));
        allocatable.insert("pods".into(), json!("110"));
        for (k, v) in extra {
            allocatable.insert(k.to_string(), json!(v));
        }
        json!({"metadata": {"name": name}, "status": {"allocatable": allocatable}})
    }

    fn filter(incoming: &PodInfo, node: &NodeInfo) -> Status {
        let fit = Fit::default();
        let mut state = CycleState::default();
        assert!(
            fit.pre_filter(&mut state, incoming, &snapshot(vec![]))
                .is_success()
        );
        fit.filter(&state, incoming, node)
    }

    // Reference: Kubernetes noderesources/fit_test.go TestEnoughRequests.
    #[test]
    fn filter_reports_each_insufficient_resource() {
        // Node: 10 cpu (millis here), 20 memory, 32 pods; one pod using 5/19 on it.
        let node = node_info(
            json!({"metadata": {"name": "n"}, "status": {"allocatable": {
                "cpu": "10m", "memory": "20", "pods": "32", "example.com/foo": "5"}}}),
            &[pod_json(vec![container(&[
                ("cpu", "5m"),
                ("memory", "19"),
            ])])],
        );
        let run = |containers: Vec<Value>| filter(&pod_info(pod_json(containers)), &node);

        assert!(
            run(vec![]).is_success(),
            "no resources requested always fits"
        );
        assert!(run(vec![container(&[("cpu", "5m"), ("memory", "1")])]).is_success());

        let status = run(vec![container(&[("cpu", "8m"), ("memory", "1")])]);
        assert_eq!(status.code, Code::Unschedulable);
        assert_eq!(status.reasons, vec!["Insufficient cpu"]);
        assert_eq!(status.plugin, FIT_NAME);

        let status = run(vec![container(&[("cpu", "6m"), ("memory", "2")])]);
        assert_eq!(
            status.reasons,
            vec!["Insufficient cpu", "Insufficient memory"]
        );

        let status = run(vec![container(&[("example.com/foo", "6")])]);
        assert_eq!(status.reasons, vec!["Insufficient example.com/foo"]);
        let ignoring = Fit::default().with_ignored_resources(IgnoredResources {
            groups: ["example.com".to_string()].into(),
            ..IgnoredResources::default()
        });
        let p = pod_info(pod_json(vec![container(&[("example.com/foo", "6")])]));
        let mut state = CycleState::default();
        assert!(
            ignoring
                .pre_filter(&mut state, &p, &snapshot(vec![]))
                .is_success()
        );
        assert!(ignoring.filter(&state, &p, &node).is_success());

        // Init containers: the max of the app sum and any one init container.
        let p = pod_json(vec![container(&[("cpu", "1m")])]);
        let mut p = p;
        p["spec"]["initContainers"] = json!([container(&[("cpu", "6m")])]);
        let status = filter(&pod_info(p), &node);
        assert_eq!(status.reasons, vec!["Insufficient cpu"]);

        let status = run(vec![container(&[("ephemeral-storage", "1")])]);
        assert_eq!(status.reasons, vec!["Insufficient ephemeral-storage"]);
    }

    // Reference: Kubernetes TestEnoughRequests "even without specified resources, predicate
    // fails when there's no space for additional pod".
    #[test]
    fn filter_too_many_pods_even_without_requests() {
        let node = node_info(
            json!({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "10", "memory": "20", "pods": "1"}}}),
            &[pod_json(vec![])],
        );
        let status = filter(&pod_info(pod_json(vec![])), &node);
        assert_eq!(status.reasons, vec![REASON_TOO_MANY_PODS]);
        // Both: too many pods and cpu, in Kubernetes' order.
        let status = filter(
            &pod_info(pod_json(vec![container(&[("cpu", "11")])])),
            &node,
        );
        assert_eq!(
            status.reasons,
            vec![REASON_TOO_MANY_PODS, "Insufficient cpu"]
        );
    }

    fn score_fit(
        fit: &Fit,
        incoming: Value,
        nodes: Vec<(Value, Vec<Value>)>,
    ) -> Vec<(String, i64)> {
        let nodes = nodes
            .into_iter()
            .map(|(n, pods)| node_info(n, &pods))
            .collect();
        score_nodes(fit, &pod_info(incoming), nodes)
    }

    // Reference: Kubernetes least_allocated_test.go TestLeastAllocatedScoringStrategy.
    // Pods there have no containers unless they request something, so the non-zero
    // defaults (which apply per container) do not enter these numbers.
    #[test]
    fn least_allocated_scores() {
        let two_containers = pod_json(vec![
            container(&[("cpu", "1000m"), ("memory", "2000")]),
            container(&[("cpu", "2000m"), ("memory", "3000")]),
        ]);
        // "nothing scheduled, resources requested, differently sized nodes":
        // node1 cpu (4000-3000)/4000 = 25, mem 50 → 37; node2 cpu 50, mem 50 → 50.
        let scores = score_fit(
            &Fit::default(),
            two_containers.clone(),
            vec![
                (node_json("node1", 4000, 10000, &[]), vec![]),
                (node_json("node2", 6000, 10000, &[]), vec![]),
            ],
        );
        assert_eq!(scores, expected_scores(&[("node1", 37), ("node2", 50)]));

        // "resources requested, pods scheduled with resources":
        // node1 cpu 40, mem 75 → 57; node2 cpu 40, mem 50 → 45.
        let scores = score_fit(
            &Fit::default(),
            two_containers.clone(),
            vec![
                (
                    node_json("node1", 10000, 20000, &[]),
                    vec![pod_json(vec![container(&[
                        ("cpu", "3000m"),
                        ("memory", "0"),
                    ])])],
                ),
                (
                    node_json("node2", 10000, 20000, &[]),
                    vec![pod_json(vec![container(&[
                        ("cpu", "3000m"),
                        ("memory", "5000"),
                    ])])],
                ),
            ],
        );
        assert_eq!(scores, expected_scores(&[("node1", 57), ("node2", 45)]));

        // "requested resources exceed node capacity": cpu scores 0.
        let scores = score_fit(
            &Fit::default(),
            pod_json(vec![container(&[("cpu", "3000m"), ("memory", "0")])]),
            vec![
                (
                    node_json("node1", 4000, 10000, &[]),
                    vec![pod_json(vec![container(&[
                        ("cpu", "3000m"),
                        ("memory", "0"),
                    ])])],
                ),
                (
                    node_json("node2", 4000, 10000, &[]),
                    vec![pod_json(vec![container(&[
                        ("cpu", "3000m"),
                        ("memory", "5000"),
                    ])])],
                ),
            ],
        );
        assert_eq!(scores, expected_scores(&[("node1", 50), ("node2", 25)]));

        // Weighted: memory 2, cpu 1 → node1 (25 + 2*50)/3 = 41, node2 50.
        let weighted = Fit::new(
            ScoringStrategy::LeastAllocated,
            vec![
                ResourceSpec {
                    name: "memory".into(),
                    weight: 2,
                },
                ResourceSpec {
                    name: "cpu".into(),
                    weight: 1,
                },
            ],
        )
        .expect("valid args");
        let scores = score_fit(
            &weighted,
            two_containers.clone(),
            vec![
                (node_json("node1", 4000, 10000, &[]), vec![]),
                (node_json("node2", 6000, 10000, &[]), vec![]),
            ],
        );
        assert_eq!(scores, expected_scores(&[("node1", 41), ("node2", 50)]));
    }

    #[test]
    fn extended_resources_count_only_when_requested() {
        let resources = vec![
            ResourceSpec {
                name: "cpu".into(),
                weight: 1,
            },
            ResourceSpec {
                name: "memory".into(),
                weight: 1,
            },
            ResourceSpec {
                name: "example.com/gpu".into(),
                weight: 1,
            },
        ];
        let fit = Fit::new(ScoringStrategy::LeastAllocated, resources).expect("valid args");
        let nodes = || {
            vec![
                (
                    node_json("node1", 6000, 10000, &[("example.com/gpu", "4")]),
                    vec![],
                ),
                (
                    node_json("node2", 6000, 10000, &[("example.com/gpu", "10")]),
                    vec![],
                ),
            ]
        };
        // "bypass extended resource if the pod does not request": 50 and 50.
        let cpu_mem = pod_json(vec![
            container(&[("cpu", "1000m"), ("memory", "2000")]),
            container(&[("cpu", "2000m"), ("memory", "3000")]),
        ]);
        assert_eq!(
            score_fit(&fit, cpu_mem, nodes()),
            expected_scores(&[("node1", 50), ("node2", 50)])
        );
        // "honor extended resource if the pod requests": gpu 2 → node1 50, node2 80.
        let with_gpu = pod_json(vec![
            container(&[("cpu", "1000m"), ("memory", "2000")]),
            container(&[
                ("cpu", "2000m"),
                ("memory", "3000"),
                ("example.com/gpu", "2"),
            ]),
        ]);
        assert_eq!(
            score_fit(&fit, with_gpu, nodes()),
            expected_scores(&[("node1", 50), ("node2", 60)])
        );
    }

    #[test]
    fn non_zero_defaults_spread_best_effort_pods() {
        // A best-effort pod (one container, no requests) counts as 100m / 200 MiB, and so do
        // best-effort pods already on the node: the emptier node wins.
        let best_effort = || pod_json(vec![json!({"name": "c"})]);
        let gib = 1024 * 1024 * 1024;
        let scores = score_fit(
            &Fit::default(),
            best_effort(),
            vec![
                (
                    node_json("busy", 1000, 2 * gib, &[]),
                    vec![best_effort(), best_effort()],
                ),
                (node_json("idle", 1000, 2 * gib, &[]), vec![]),
            ],
        );
        // busy: cpu (1000-300)/1000 = 70, mem (2048-600)/2048 = 70.7 → 70 → 70.
        // idle: cpu 90, mem (2048-200)/2048 = 90.2 → 90 → 90.
        assert_eq!(scores, expected_scores(&[("busy", 70), ("idle", 90)]));
    }

    // MostAllocated: requested * 100 / capacity per resource, averaged (Kubernetes'
    // most_allocated.go).
    #[test]
    fn most_allocated_scores() {
        let fit =
            Fit::new(ScoringStrategy::MostAllocated, default_resources()).expect("valid args");
        let scores = score_fit(
            &fit,
            pod_json(vec![
                container(&[("cpu", "1000m"), ("memory", "2000")]),
                container(&[("cpu", "2000m"), ("memory", "3000")]),
            ]),
            vec![
                (
                    node_json("node1", 10000, 20000, &[]),
                    vec![
                        pod_json(vec![container(&[("cpu", "3000m"), ("memory", "0")])]),
                        pod_json(vec![container(&[("cpu", "3000m"), ("memory", "0")])]),
                    ],
                ),
                (
                    node_json("node2", 10000, 20000, &[]),
                    vec![pod_json(vec![container(&[
                        ("cpu", "3000m"),
                        ("memory", "5000"),
                    ])])],
                ),
            ],
        );
        // node1: cpu 9000/10000 = 90, mem 5000/20000 = 25 → 57; node2: cpu 60, mem 50 → 55.
        assert_eq!(scores, expected_scores(&[("node1", 57), ("node2", 55)]));
    }

    #[test]
    fn requested_to_capacity_ratio_follows_the_shape() {
        // Bin packing shape: 0% → 0, 100% → 10.
        let shape = vec![
            UtilizationShapePoint {
                utilization: 0,
                score: 0,
            },
            UtilizationShapePoint {
                utilization: 100,
                score: 10,
            },
        ];
        let fit = Fit::new(
            ScoringStrategy::RequestedToCapacityRatio(shape),
            default_resources(),
        )
        .expect("valid args");
        let scores = score_fit(
            &fit,
            pod_json(vec![container(&[("cpu", "3000m"), ("memory", "5000")])]),
            vec![
                (node_json("node1", 4000, 10000, &[]), vec![]),
                (node_json("node2", 6000, 10000, &[]), vec![]),
            ],
        );
        // node1: cpu 75, mem 50 → 62.5 → 63 (rounded); node2: cpu 50, mem 50 → 50.
        assert_eq!(scores, expected_scores(&[("node1", 63), ("node2", 50)]));
        assert_eq!(
            broken_linear(
                &[UtilizationShapePoint {
                    utilization: 30,
                    score: 20
                }],
                10
            ),
            20
        );
    }

    #[test]
    fn args_are_validated() {
        let bad = Fit::new(
            ScoringStrategy::LeastAllocated,
            vec![ResourceSpec {
                name: "cpu".into(),
                weight: 0,
            }],
        );
        assert_eq!(
            bad.err(),
            Some(ArgsError::Weight {
                index: 0,
                weight: 0
            })
        );
        let unordered = vec![
            UtilizationShapePoint {
                utilization: 50,
                score: 1,
            },
            UtilizationShapePoint {
                utilization: 10,
                score: 2,
            },
        ];
        assert!(
            Fit::new(
                ScoringStrategy::RequestedToCapacityRatio(unordered),
                default_resources()
            )
            .is_err()
        );
        assert!(
            Fit::new(
                ScoringStrategy::RequestedToCapacityRatio(vec![]),
                default_resources()
            )
            .is_err()
        );
    }

    /// Kubernetes balanced_allocation_test.go's pods: node-bound pods with two containers.
    fn cpu_only() -> Value {
        pod_json(vec![
            container(&[("cpu", "1000m"), ("memory", "0")]),
            container(&[("cpu", "2000m"), ("memory", "0")]),
        ])
    }

    fn cpu_and_memory() -> Value {
        pod_json(vec![
            container(&[("cpu", "1000m"), ("memory", "2000")]),
            container(&[("cpu", "2000m"), ("memory", "3000")]),
        ])
    }

    fn score_balanced(
        plugin: &BalancedAllocation,
        incoming: Value,
        nodes: Vec<(Value, Vec<Value>)>,
    ) -> Vec<(String, i64)> {
        let nodes = nodes
            .into_iter()
            .map(|(n, pods)| node_info(n, &pods))
            .collect();
        score_nodes(plugin, &pod_info(incoming), nodes)
    }

    // Reference: Kubernetes balanced_allocation_test.go TestNodeResourcesBalancedAllocation.
    #[test]
    fn balanced_allocation_scores() {
        let ba = BalancedAllocation::default();
        // "nothing scheduled, resources requested, differently sized nodes": 87, 100.
        let scores = score_balanced(
            &ba,
            cpu_and_memory(),
            vec![
                (node_json("node1", 4000, 10000, &[]), vec![]),
                (node_json("node2", 6000, 10000, &[]), vec![]),
            ],
        );
        assert_eq!(scores, expected_scores(&[("node1", 87), ("node2", 100)]));

        // "resources requested, pods scheduled with resources": 82, 95.
        let scores = score_balanced(
            &ba,
            cpu_and_memory(),
            vec![
                (node_json("node1", 10000, 20000, &[]), vec![cpu_only()]),
                (
                    node_json("node2", 10000, 20000, &[]),
                    vec![cpu_and_memory()],
                ),
            ],
        );
        assert_eq!(scores, expected_scores(&[("node1", 82), ("node2", 95)]));

        // "requested resources at node capacity": 50, 75.
        let scores = score_balanced(
            &ba,
            cpu_only(),
            vec![
                (node_json("node1", 6000, 10000, &[]), vec![cpu_only()]),
                (node_json("node2", 6000, 10000, &[]), vec![cpu_and_memory()]),
            ],
        );
        assert_eq!(scores, expected_scores(&[("node1", 50), ("node2", 75)]));
    }

    // Reference: the same test, "include scalar resource on a node for balanced resource
    // allocation" (three fractions: the general standard deviation) → 70, 65. The incoming
    // pod requests cpu 0 explicitly here so the fractions are exactly the table's.
    //   node1: cpu 3000/3500, mem 5000/40000, gpu (3+1)/8 → std 0.2989 → 70
    //   node2: cpu 3000/3500, mem 5000/40000, gpu (0+1)/8 → std 0.3451 → 65
    #[test]
    fn balanced_allocation_with_three_resources() {
        let ba = BalancedAllocation::new(vec![
            ResourceSpec {
                name: "cpu".into(),
                weight: 1,
            },
            ResourceSpec {
                name: "memory".into(),
                weight: 1,
            },
            ResourceSpec {
                name: "nvidia.com/gpu".into(),
                weight: 1,
            },
        ])
        .expect("valid args");
        let with_gpu = pod_json(vec![
            container(&[("cpu", "1000m"), ("memory", "2000")]),
            container(&[
                ("cpu", "2000m"),
                ("memory", "3000"),
                ("nvidia.com/gpu", "3"),
            ]),
        ]);
        let incoming = pod_json(vec![container(&[
            ("cpu", "0"),
            ("memory", "0"),
            ("nvidia.com/gpu", "1"),
        ])]);
        let scores = score_balanced(
            &ba,
            incoming,
            vec![
                (
                    node_json("node1", 3500, 40000, &[("nvidia.com/gpu", "8")]),
                    vec![with_gpu],
                ),
                (
                    node_json("node2", 3500, 40000, &[("nvidia.com/gpu", "8")]),
                    vec![cpu_and_memory()],
                ),
            ],
        );
        assert_eq!(scores, expected_scores(&[("node1", 70), ("node2", 65)]));

        // A node without the extended resource leaves it out: two fractions again.
        let scores = score_balanced(
            &ba,
            cpu_and_memory(),
            vec![
                (
                    node_json("node1", 3500, 40000, &[("nvidia.com/gpu", "8")]),
                    vec![],
                ),
                (node_json("node2", 3500, 40000, &[]), vec![]),
            ],
        );
        // Both: cpu 3000/3500, mem 5000/40000 → std 0.366 → 63.
        assert_eq!(scores, expected_scores(&[("node1", 63), ("node2", 63)]));
    }
}
