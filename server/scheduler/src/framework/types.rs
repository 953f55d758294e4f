//! NodeInfo, PodInfo, Resource and Snapshot (Kubernetes' `framework/types.go`,
//! `internal/cache/snapshot.go`). SKELETON: fields fixed, methods to be written by the
//! cache's author.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};

/// Resources as the scheduler counts them (requests, allocatable).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resource {
    /// CPU in millicores.
    pub milli_cpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage: i64,
    /// Pods (allocatable only).
    pub allowed_pod_number: i64,
    /// Extended resources (`nvidia.com/gpu`, hugepages...).
    pub scalar: BTreeMap<String, i64>,
}

/// A label selector parsed once (a `metav1.LabelSelector` after validation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector(pub skerry_api::selector::LabelSelector);

/// One pod (anti-)affinity term, parsed once per pod (Kubernetes' `AffinityTerm`).
#[derive(Clone, Debug, Default)]
pub struct AffinityTerm {
    /// Namespaces the term selects pods in (the pod's own when none given).
    pub namespaces: HashSet<String>,
    /// Selects the pods.
    pub selector: Selector,
    /// The node label defining the topology domain (`kubernetes.io/hostname`, a zone...).
    pub topology_key: String,
    /// A namespace selector (matched against Namespace labels), if the term has one.
    pub namespace_selector: Option<Selector>,
}

/// A weighted (preferred) affinity term.
#[derive(Clone, Debug, Default)]
pub struct WeightedAffinityTerm {
    /// The term.
    pub term: AffinityTerm,
    /// Its weight, 1..=100.
    pub weight: i32,
}

/// A pod with what the plugins need parsed once (Kubernetes' `PodInfo`).
#[derive(Clone, Debug, Default)]
pub struct PodInfo {
    /// The pod.
    pub pod: Arc<Pod>,
    /// requiredDuringScheduling pod affinity.
    pub required_affinity_terms: Vec<AffinityTerm>,
    /// requiredDuringScheduling pod anti-affinity.
    pub required_anti_affinity_terms: Vec<AffinityTerm>,
    /// preferredDuringScheduling pod affinity.
    pub preferred_affinity_terms: Vec<WeightedAffinityTerm>,
    /// preferredDuringScheduling pod anti-affinity.
    pub preferred_anti_affinity_terms: Vec<WeightedAffinityTerm>,
}

/// A host port in use: (ip, protocol, port).
pub type HostPort = (String, String, i32);

/// Per image on a node: size and how many nodes have it (image locality).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageStateSummary {
    /// Bytes.
    pub size: i64,
    /// Nodes that have the image.
    pub num_nodes: usize,
}

/// Everything the scheduler knows about one node (Kubernetes' `NodeInfo`).
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    /// The node (`None` for a node the cache only knows from its pods).
    pub node: Option<Arc<Node>>,
    /// Pods on (or assumed to) the node.
    pub pods: Vec<Arc<PodInfo>>,
    /// The subset of `pods` with any pod affinity or anti-affinity.
    pub pods_with_affinity: Vec<Arc<PodInfo>>,
    /// The subset of `pods` with required anti-affinity.
    pub pods_with_required_anti_affinity: Vec<Arc<PodInfo>>,
    /// Host ports in use.
    pub used_ports: HashSet<HostPort>,
    /// Sum of the pods' requests.
    pub requested: Resource,
    /// Sum of the pods' requests with Kubernetes' non-zero defaults (100m CPU, 200 MiB)
    /// for containers that request nothing (used by scoring).
    pub non_zero_requested: Resource,
    /// The node's allocatable.
    pub allocatable: Resource,
    /// Images on the node by name.
    pub image_states: HashMap<String, ImageStateSummary>,
    /// The cache's generation when this NodeInfo last changed.
    pub generation: i64,
}

impl NodeInfo {
    /// The node's name ("" if unknown).
    pub fn name(&self) -> &str {
        self.node
            .as_ref()
            .and_then(|n| n.metadata.name.as_deref())
            .unwrap_or_default()
    }
}

/// What one scheduling cycle sees: an immutable view of the cache (Kubernetes'
/// `internal/cache.Snapshot`). NodeInfos are shared with the cache's previous snapshots by
/// `Arc`; only the ones whose generation moved are new.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// NodeInfos by node name.
    pub node_info_map: HashMap<String, Arc<NodeInfo>>,
    /// NodeInfos in the order the scheduler iterates (zone-interleaved, as Kubernetes'
    /// node tree), the order `percentageOfNodesToScore` sampling walks.
    pub node_info_list: Vec<Arc<NodeInfo>>,
    /// NodeInfos with at least one pod with affinity.
    pub have_pods_with_affinity_list: Vec<Arc<NodeInfo>>,
    /// NodeInfos with at least one pod with required anti-affinity.
    pub have_pods_with_required_anti_affinity_list: Vec<Arc<NodeInfo>>,
    /// The cache generation this snapshot reflects.
    pub generation: i64,
}

impl Snapshot {
    /// The NodeInfo of `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.node_info_map.get(name)
    }
    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.node_info_list.len()
    }
}
