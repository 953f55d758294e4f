//! Methods on the framework's data types (Kubernetes' `framework/types.go`): resource
//! arithmetic, pod requests as the scheduler rounds them (the requests themselves are
//! `component-helpers/resource`'s `PodRequests`, [`skerry_api::pod::resources`], shared with
//! the kubelet's admission), parsed [`PodInfo`]s, and the bookkeeping that keeps a
//! [`NodeInfo`]'s aggregates
//! (`requested`, `non_zero_requested`, `used_ports`, the affinity sublists) equal to the
//! sum over its pods.
//!
//! This is the data half of `docs/tricks.md` #1 (copy-on-write NodeInfo snapshots):
//! a NodeInfo carries everything a plugin needs, pre-aggregated, so the cache can hand a
//! scheduling cycle immutable `Arc<NodeInfo>`s and clone only the ones that changed
//! (see [`crate::cache`]).
//!
//! Invariant: for every NodeInfo, `requested` (and `non_zero_requested`, `used_ports`) is
//! exactly the sum of [`Resource::from_pod_requests`] (and [`Resource::non_zero_requests`],
//! [`host_ports`]) over `pods`, and `pods_with_affinity` / `pods_with_required_anti_affinity`
//! are exactly the pods of `pods` with pod (anti-)affinity / required anti-affinity. Each
//! pod appears once, keyed by UID. Debug builds check this after every change.
//!
//! `generation` is not touched here: the cache stamps it (one counter for all NodeInfos).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::core::v1::{Node, Pod, PodAffinityTerm, WeightedPodAffinityTerm};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiLabelSelector;
use skerry_api::pod::resources::{
    PodResourcesOptions, RESOURCE_CPU, RESOURCE_MEMORY, ResourceList, SIDECAR_RESTART_POLICY,
    pod_requests, resource_list,
};
use skerry_api::selector::LabelSelector;
use skerry_api::validation::quantity::Quantity;

use super::types::{
    AffinityTerm, HostPort, ImageStateSummary, NodeInfo, PodInfo, Resource, Selector,
    WeightedAffinityTerm,
};

/// CPU, in millicores, counted for a container that requests no CPU when *scoring*
/// (`non_zero_requested`). Kubernetes' `schedutil.DefaultMilliCPURequest`: without it,
/// least-allocated scoring would see best-effort pods as free and pile them on one node.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;

/// Memory, in bytes, counted for a container that requests no memory when scoring
/// (Kubernetes' `schedutil.DefaultMemoryRequest`, 200 MiB; same reason as the CPU default).
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// The host IP a host port binds when the pod does not name one (Kubernetes'
/// `DefaultBindAllHostIP`): it conflicts with the same protocol/port on every IP.
pub const DEFAULT_BIND_ALL_HOST_IP: &str = "0.0.0.0";

/// The protocol of a container port that names none (the API default).
pub const DEFAULT_PORT_PROTOCOL: &str = "TCP";

/// Nano-units per milli-unit and per unit ([`Quantity`] holds nano-units).
const NANO_PER_MILLI: i128 = 1_000_000;
const NANO_PER_UNIT: i128 = 1_000_000_000;

// ---------------------------------------------------------------------------------------
// Quantities.

/// Parses a Kubernetes quantity (`"500m"`, `"2"`, `"1Gi"`, `"128974848"`, `"1e3"`) into
/// nano-units; `None` if it is not a quantity.
pub fn parse_quantity(quantity: &ApiQuantity) -> Option<Quantity> {
    Quantity::parse(quantity.0.trim())
}

/// A quantity in milli-units rounded up, as Kubernetes' `Quantity.MilliValue` (CPU).
/// `None` if it does not parse; saturates at the `i64` range.
pub fn quantity_milli_value(quantity: &ApiQuantity) -> Option<i64> {
    parse_quantity(quantity).map(|q| saturate(div_ceil(q.0, NANO_PER_MILLI)))
}

/// A quantity in units rounded up, as Kubernetes' `Quantity.Value` (bytes, counts).
/// `None` if it does not parse; saturates at the `i64` range.
pub fn quantity_value(quantity: &ApiQuantity) -> Option<i64> {
    parse_quantity(quantity).map(|q| saturate(div_ceil(q.0, NANO_PER_UNIT)))
}

fn div_ceil(numerator: i128, denominator: i128) -> i128 {
    let quotient = numerator / denominator;
    if numerator % denominator > 0 {
        quotient + 1
    } else {
        quotient
    }
}

fn saturate(value: i128) -> i64 {
    i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX })
}

/// What [`Resource::non_zero_requests`] counts for a container that requests no CPU or no
/// memory at all: [`DEFAULT_MILLI_CPU_REQUEST`] and [`DEFAULT_MEMORY_REQUEST`] (Kubernetes'
/// `NonMissingContainerRequests` for scoring). Built once.
static NON_ZERO_DEFAULTS: LazyLock<ResourceList> = LazyLock::new(|| {
    [
        (
            RESOURCE_CPU.to_string(),
            Quantity(i128::from(DEFAULT_MILLI_CPU_REQUEST) * NANO_PER_MILLI),
        ),
        (
            RESOURCE_MEMORY.to_string(),
            Quantity(i128::from(DEFAULT_MEMORY_REQUEST) * NANO_PER_UNIT),
        ),
    ]
    .into()
});

// ---------------------------------------------------------------------------------------
// Resource.

/// Whether a resource name is counted in [`Resource::scalar`] (Kubernetes'
/// `IsScalarResourceName`): extended resources (`example.com/gpu`), prefixed native ones
/// (`kubernetes.io/...`), hugepages and attachable volumes. Anything else unknown without a
/// `/` is not a resource the scheduler counts.
pub fn is_scalar_resource_name(name: &str) -> bool {
    name.contains('/') || name.starts_with("hugepages-") || name.starts_with("attachable-volumes-")
}

impl Resource {
    /// Builds a Resource from an API resource list (`requests`, `allocatable`): CPU in
    /// millicores, everything else in units, each rounded up as Kubernetes' `Resource.Add`.
    pub fn from_resource_list(list: &BTreeMap<String, ApiQuantity>) -> Resource {
        Resource::from_nano_list(&resource_list(Some(list)))
    }

    fn from_nano_list(list: &ResourceList) -> Resource {
        let mut resource = Resource::default();
        for (name, Quantity(nano)) in list {
            let value = saturate(div_ceil(*nano, NANO_PER_UNIT));
            match name.as_str() {
                "cpu" => resource.milli_cpu = saturate(div_ceil(*nano, NANO_PER_MILLI)),
                "memory" => resource.memory = value,
                "ephemeral-storage" => resource.ephemeral_storage = value,
                "pods" => resource.allowed_pod_number = value,
                other if is_scalar_resource_name(other) => {
                    resource.scalar.insert(other.to_string(), value);
                }
                _ => {}
            }
        }
        resource
    }

    /// A node's `status.allocatable` (Kubernetes' `NewResource(node.Status.Allocatable)`).
    pub fn from_node_allocatable(node: &Node) -> Resource {
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        Resource::from_nano_list(&resource_list(allocatable))
    }

    /// What a pod requests of a node (Kubernetes' `computePodResourceRequest` over
    /// `resourcehelper.PodRequests`, [`skerry_api::pod::resources::pod_requests`]): the
    /// larger, per resource, of the app containers' sum (sidecars included) and the peak of
    /// the init phase, plus `spec.overhead`, each rounded up into the Resource's units.
    pub fn from_pod_requests(pod: &Pod) -> Resource {
        Resource::from_nano_list(&pod_requests(pod, &PodResourcesOptions::default()))
    }

    /// [`Resource::from_pod_requests`] with [`DEFAULT_MILLI_CPU_REQUEST`] and
    /// [`DEFAULT_MEMORY_REQUEST`] for each container that does not request CPU / memory at
    /// all (an explicit `0` stays 0), as Kubernetes computes for scoring. Only `milli_cpu`
    /// and `memory` are set.
    pub fn non_zero_requests(pod: &Pod) -> Resource {
        let options = PodResourcesOptions {
            non_missing_container_requests: Some(&NON_ZERO_DEFAULTS),
            ..PodResourcesOptions::default()
        };
        let all = Resource::from_nano_list(&pod_requests(pod, &options));
        Resource {
            milli_cpu: all.milli_cpu,
            memory: all.memory,
            ..Resource::default()
        }
    }

    /// Adds `other` to `self`, field by field (scalars by name).
    pub fn add(&mut self, other: &Resource) {
        self.milli_cpu = self.milli_cpu.saturating_add(other.milli_cpu);
        self.memory = self.memory.saturating_add(other.memory);
        self.ephemeral_storage = self
            .ephemeral_storage
            .saturating_add(other.ephemeral_storage);
        self.allowed_pod_number = self
            .allowed_pod_number
            .saturating_add(other.allowed_pod_number);
        for (name, value) in &other.scalar {
            let entry = self.scalar.entry(name.clone()).or_insert(0);
            *entry = entry.saturating_add(*value);
        }
    }

    /// Subtracts `other` from `self`, field by field. Scalars that reach zero are dropped so
    /// that adding and then subtracting a pod restores an equal Resource.
    pub fn sub(&mut self, other: &Resource) {
        self.milli_cpu = self.milli_cpu.saturating_sub(other.milli_cpu);
        self.memory = self.memory.saturating_sub(other.memory);
        self.ephemeral_storage = self
            .ephemeral_storage
            .saturating_sub(other.ephemeral_storage);
        self.allowed_pod_number = self
            .allowed_pod_number
            .saturating_sub(other.allowed_pod_number);
        for (name, value) in &other.scalar {
            let entry = self.scalar.entry(name.clone()).or_insert(0);
            *entry = entry.saturating_sub(*value);
            if *entry == 0 {
                self.scalar.remove(name);
            }
        }
    }

    /// Raises each field of `self` to at least `other`'s (Kubernetes' `SetMaxResource`).
    pub fn set_max(&mut self, other: &Resource) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        self.allowed_pod_number = self.allowed_pod_number.max(other.allowed_pod_number);
        for (name, value) in &other.scalar {
            let entry = self.scalar.entry(name.clone()).or_insert(*value);
            *entry = (*entry).max(*value);
        }
    }

    /// Whether every field of `self` is at most `capacity`'s (a scalar `capacity` lacks
    /// counts as 0). `request.fits(&free)` is the resources check without reasons; the
    /// NodeResourcesFit plugin reports which resource is short.
    pub fn fits(&self, capacity: &Resource) -> bool {
        self.milli_cpu <= capacity.milli_cpu
            && self.memory <= capacity.memory
            && self.ephemeral_storage <= capacity.ephemeral_storage
            && self.allowed_pod_number <= capacity.allowed_pod_number
            && self
                .scalar
                .iter()
                .all(|(name, value)| *value <= capacity.scalar.get(name).copied().unwrap_or(0))
    }

    /// Whether every field is zero.
    pub fn is_zero(&self) -> bool {
        self.milli_cpu == 0
            && self.memory == 0
            && self.ephemeral_storage == 0
            && self.allowed_pod_number == 0
            && self.scalar.values().all(|v| *v == 0)
    }
}

// ---------------------------------------------------------------------------------------
// Host ports.

/// The host ports a pod holds, normalized (empty IP → [`DEFAULT_BIND_ALL_HOST_IP`], empty
/// protocol → [`DEFAULT_PORT_PROTOCOL`]): ports with `hostPort > 0` of the app containers
/// and of sidecar init containers (which run for the pod's whole life; Kubernetes 1.32
/// `schedutil.GetHostPorts`). Plain init containers hold no port once the pod runs.
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY));
    sidecars
        .chain(spec.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|port| port > 0))
        .map(|p| {
            normalize_host_port(
                p.host_ip.as_deref().unwrap_or_default(),
                p.protocol.as_deref().unwrap_or_default(),
                p.host_port.unwrap_or_default(),
            )
        })
        .collect()
}

/// A host port with Kubernetes' defaults applied (`HostPortInfo.sanitize`).
pub fn normalize_host_port(ip: &str, protocol: &str, port: i32) -> HostPort {
    let ip = if ip.is_empty() {
        DEFAULT_BIND_ALL_HOST_IP
    } else {
        ip
    };
    let protocol = if protocol.is_empty() {
        DEFAULT_PORT_PROTOCOL
    } else {
        protocol
    };
    (ip.to_string(), protocol.to_string(), port)
}

/// Whether `wanted` conflicts with a port in `used` (Kubernetes' `HostPortInfo.CheckConflict`):
/// same protocol and port, and the same IP or either side binding every IP (`0.0.0.0`).
pub fn host_port_conflicts(used: &HashSet<HostPort>, wanted: &HostPort) -> bool {
    let (ip, protocol, port) = wanted;
    if *port <= 0 {
        return false;
    }
    if ip == DEFAULT_BIND_ALL_HOST_IP {
        return used.iter().any(|(_, p, n)| p == protocol && n == port);
    }
    used.contains(wanted)
        || used.contains(&(
            DEFAULT_BIND_ALL_HOST_IP.to_string(),
            protocol.clone(),
            *port,
        ))
}

// ---------------------------------------------------------------------------------------
// Selectors and affinity terms.

/// A `metav1.LabelSelector` in a pod affinity term that does not convert (an unknown
/// operator, values where none belong…): the message Kubernetes' `labels.NewRequirement`
/// would give. The apiserver's validation rejects such pods, so this means a corrupt object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSelector(pub String);

impl Selector {
    /// A selector that matches nothing (Kubernetes' `labels.Nothing()`, what a *nil*
    /// `metav1.LabelSelector` becomes). Represented as `In` over an empty set, which no
    /// label value satisfies.
    pub fn nothing() -> Selector {
        Selector(LabelSelector::nothing())
    }

    /// Kubernetes' `LabelSelectorAsSelector`: `None` (nil) matches nothing, an empty
    /// selector matches everything.
    pub fn from_api(selector: Option<&ApiLabelSelector>) -> Result<Selector, InvalidSelector> {
        LabelSelector::from_api_opt(selector)
            .map(Selector)
            .map_err(|e| InvalidSelector(e.message))
    }

    /// Whether `labels` (a pod's or namespace's `metadata.labels`) match.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.0.matches_opt(labels)
    }
}

impl AffinityTerm {
    /// Parses one `PodAffinityTerm` of `pod` (Kubernetes' `newAffinityTerm`): with neither
    /// `namespaces` nor a `namespaceSelector` the term means the pod's own namespace.
    pub fn from_api(pod: &Pod, term: &PodAffinityTerm) -> Result<AffinityTerm, InvalidSelector> {
        let selector = Selector::from_api(term.label_selector.as_ref())?;
        let namespace_selector = term
            .namespace_selector
            .as_ref()
            .map(|s| Selector::from_api(Some(s)))
            .transpose()?;
        let namespaces: HashSet<String> = match term.namespaces.as_deref() {
            Some(names) if !names.is_empty() => names.iter().cloned().collect(),
            _ if namespace_selector.is_none() => {
                [pod.metadata.namespace.clone().unwrap_or_default()].into()
            }
            _ => HashSet::new(),
        };
        Ok(AffinityTerm {
            namespaces,
            selector,
            topology_key: term.topology_key.clone(),
            namespace_selector,
        })
    }

    /// Whether this term selects `pod`, whose namespace has `namespace_labels` (Kubernetes'
    /// `AffinityTerm.Matches`): the namespace is listed or matched by the namespace
    /// selector, and the pod's labels match the selector.
    pub fn matches(&self, pod: &Pod, namespace_labels: Option<&BTreeMap<String, String>>) -> bool {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let in_namespace = self.namespaces.contains(namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| s.matches(namespace_labels));
        in_namespace && self.selector.matches(pod.metadata.labels.as_ref())
    }
}

fn parse_terms(
    pod: &Pod,
    terms: Option<&Vec<PodAffinityTerm>>,
) -> Result<Vec<AffinityTerm>, InvalidSelector> {
    terms
        .into_iter()
        .flatten()
        .map(|t| AffinityTerm::from_api(pod, t))
        .collect()
}

fn parse_weighted_terms(
    pod: &Pod,
    terms: Option<&Vec<WeightedPodAffinityTerm>>,
) -> Result<Vec<WeightedAffinityTerm>, InvalidSelector> {
    terms
        .into_iter()
        .flatten()
        .map(|t| {
            Ok(WeightedAffinityTerm {
                term: AffinityTerm::from_api(pod, &t.pod_affinity_term)?,
                weight: t.weight,
            })
        })
        .collect()
}

/// Whether the pod has any pod affinity or anti-affinity (Kubernetes' `podWithAffinity`).
pub fn pod_has_affinity(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some())
}

/// Whether the pod has required pod anti-affinity (Kubernetes' `podWithRequiredAntiAffinity`).
pub fn pod_has_required_anti_affinity(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|terms| !terms.is_empty())
}

/// A pod's identity in the scheduler (Kubernetes' `GetPodKey`): its UID. `None` for a pod
/// without one (a pod that never came from the apiserver).
pub fn pod_key(pod: &Pod) -> Option<&str> {
    pod.metadata.uid.as_deref().filter(|uid| !uid.is_empty())
}

impl PodInfo {
    /// Parses the pod's four affinity term lists once (Kubernetes' `NewPodInfo`).
    ///
    /// A term whose selector does not convert (which the apiserver's validation prevents)
    /// gets a selector that matches nothing and is logged: the pod still schedules, and a
    /// broken term never widens what the pod selects. Use [`PodInfo::try_new`] to see the
    /// error instead.
    pub fn new(pod: Arc<Pod>) -> PodInfo {
        match PodInfo::try_new(pod.clone()) {
            Ok(info) => info,
            Err(error) => {
                tracing::warn!(
                    pod = %pod.metadata.name.as_deref().unwrap_or_default(),
                    error = %error,
                    "pod affinity term has an invalid selector; treating it as matching nothing"
                );
                PodInfo::parse_lossy(pod)
            }
        }
    }

    /// [`PodInfo::new`], failing on the first term whose selector does not convert
    /// (Kubernetes collects this as `PodInfo.ParseError`).
    pub fn try_new(pod: Arc<Pod>) -> Result<PodInfo, InvalidSelector> {
        let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let anti_affinity = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        Ok(PodInfo {
            required_affinity_terms: parse_terms(
                &pod,
                pod_affinity.and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
            )?,
            required_anti_affinity_terms: parse_terms(
                &pod,
                anti_affinity.and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
            )?,
            preferred_affinity_terms: parse_weighted_terms(
                &pod,
                pod_affinity.and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
            )?,
            preferred_anti_affinity_terms: parse_weighted_terms(
                &pod,
                anti_affinity.and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
            )?,
            pod,
        })
    }

    /// Term by term, replacing each unparsable selector with [`Selector::nothing`].
    fn parse_lossy(pod: Arc<Pod>) -> PodInfo {
        let lossy = |term: &PodAffinityTerm| {
            AffinityTerm::from_api(&pod, term).unwrap_or_else(|_| {
                let valid = PodAffinityTerm {
                    label_selector: None,
                    namespace_selector: None,
                    ..term.clone()
                };
                let mut parsed = AffinityTerm::from_api(&pod, &valid).unwrap_or_default();
                parsed.selector = Selector::nothing();
                parsed
            })
        };
        let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let anti_affinity = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let required = |terms: Option<&Vec<PodAffinityTerm>>| -> Vec<AffinityTerm> {
            terms.into_iter().flatten().map(lossy).collect()
        };
        let preferred =
            |terms: Option<&Vec<WeightedPodAffinityTerm>>| -> Vec<WeightedAffinityTerm> {
                terms
                    .into_iter()
                    .flatten()
                    .map(|t| WeightedAffinityTerm {
                        term: lossy(&t.pod_affinity_term),
                        weight: t.weight,
                    })
                    .collect()
            };
        PodInfo {
            required_affinity_terms: required(pod_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            required_anti_affinity_terms: required(anti_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_affinity_terms: preferred(pod_affinity.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_anti_affinity_terms: preferred(anti_affinity.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            pod: pod.clone(),
        }
    }

    /// The pod's UID (see [`pod_key`]).
    pub fn key(&self) -> Option<&str> {
        pod_key(&self.pod)
    }
}

// ---------------------------------------------------------------------------------------
// NodeInfo.

/// The images on a node as a standalone NodeInfo knows them: each name with its size and
/// `num_nodes: 1` (this node). The cache replaces `num_nodes` with the cluster-wide count.
pub fn node_image_states(node: &Node) -> HashMap<String, ImageStateSummary> {
    let mut states = HashMap::new();
    for image in node.status.iter().flat_map(|s| s.images.iter().flatten()) {
        for name in image.names.iter().flatten() {
            states.entry(name.clone()).or_insert(ImageStateSummary {
                size: image.size_bytes.unwrap_or(0),
                num_nodes: 1,
            });
        }
    }
    states
}

impl NodeInfo {
    /// A NodeInfo for `node` with no pods.
    pub fn new(node: Arc<Node>) -> NodeInfo {
        let mut info = NodeInfo::default();
        info.set_node(node);
        info
    }

    /// Sets (or replaces) the node object: allocatable and image states follow it; the pods
    /// and their aggregates are kept (Kubernetes' `SetNode`).
    pub fn set_node(&mut self, node: Arc<Node>) {
        self.allocatable = Resource::from_node_allocatable(&node);
        self.image_states = node_image_states(&node);
        self.node = Some(node);
    }

    /// Forgets the node object but keeps its pods (Kubernetes' `RemoveNode`): the cache
    /// keeps such a "ghost" until its pods' deletions arrive, and never snapshots it.
    pub fn remove_node(&mut self) {
        self.node = None;
        self.allocatable = Resource::default();
        self.image_states.clear();
    }

    /// The node object, if known.
    pub fn node(&self) -> Option<&Node> {
        self.node.as_deref()
    }

    /// Adds a pod and its requests, ports and affinity (Kubernetes' `AddPodInfo`). The pod
    /// must not already be on this NodeInfo (the cache keys pods by UID and checks).
    pub fn add_pod(&mut self, pod_info: Arc<PodInfo>) {
        let pod = &pod_info.pod;
        self.requested.add(&Resource::from_pod_requests(pod));
        self.non_zero_requested
            .add(&Resource::non_zero_requests(pod));
        self.used_ports.extend(host_ports(pod));
        if pod_has_affinity(pod) {
            self.pods_with_affinity.push(pod_info.clone());
        }
        if pod_has_required_anti_affinity(pod) {
            self.pods_with_required_anti_affinity.push(pod_info.clone());
        }
        self.pods.push(pod_info);
        #[cfg(debug_assertions)]
        self.debug_check_consistency();
    }

    /// Removes the pod with `pod`'s UID, subtracting what the *stored* copy added; returns
    /// whether it was there (Kubernetes' `RemovePod`). Order of `pods` is not kept.
    pub fn remove_pod(&mut self, pod: &Pod) -> bool {
        let Some(key) = pod_key(pod) else {
            return false;
        };
        let Some(index) = self.pods.iter().position(|p| p.key() == Some(key)) else {
            return false;
        };
        let removed = self.pods.swap_remove(index);
        self.pods_with_affinity.retain(|p| p.key() != Some(key));
        self.pods_with_required_anti_affinity
            .retain(|p| p.key() != Some(key));
        self.requested
            .sub(&Resource::from_pod_requests(&removed.pod));
        self.non_zero_requested
            .sub(&Resource::non_zero_requests(&removed.pod));
        for port in host_ports(&removed.pod) {
            self.used_ports.remove(&port);
        }
        #[cfg(debug_assertions)]
        self.debug_check_consistency();
        true
    }

    /// Whether `port` conflicts with a host port in use on this node.
    pub fn host_port_conflicts(&self, port: &HostPort) -> bool {
        host_port_conflicts(&self.used_ports, port)
    }

    /// Recomputes every aggregate from `pods` and asserts it matches (the module invariant).
    /// Linear in the pods; debug builds only.
    ///
    /// # Panics
    /// If an aggregate drifted from its pods: a bug in this module.
    #[cfg(debug_assertions)]
    fn debug_check_consistency(&self) {
        let mut requested = Resource::default();
        let mut non_zero = Resource::default();
        for p in &self.pods {
            requested.add(&Resource::from_pod_requests(&p.pod));
            non_zero.add(&Resource::non_zero_requests(&p.pod));
        }
        assert_eq!(requested, self.requested, "requested drifted from pods");
        assert_eq!(
            non_zero, self.non_zero_requested,
            "non-zero requested drifted"
        );
        let affinity = self
            .pods
            .iter()
            .filter(|p| pod_has_affinity(&p.pod))
            .count();
        assert_eq!(
            affinity,
            self.pods_with_affinity.len(),
            "pods_with_affinity drifted"
        );
        let anti = self
            .pods
            .iter()
            .filter(|p| pod_has_required_anti_affinity(&p.pod))
            .count();
        assert_eq!(
            anti,
            self.pods_with_required_anti_affinity.len(),
            "pods_with_required_anti_affinity drifted"
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, Container, ContainerImage, ContainerPort, NodeStatus, PodAffinity,
        PodAntiAffinity, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};

    fn q(s: &str) -> ApiQuantity {
        ApiQuantity(s.to_string())
    }

    fn list(pairs: &[(&str, &str)]) -> BTreeMap<String, ApiQuantity> {
        pairs.iter().map(|(k, v)| (k.to_string(), q(v))).collect()
    }

    fn container(requests: &[(&str, &str)]) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: (!requests.is_empty()).then(|| list(requests)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod_with(uid: &str, spec: PodSpec) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(uid.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(spec),
            ..Default::default()
        }
    }

    fn node(allocatable: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                allocatable: Some(list(allocatable)),
                images: Some(vec![ContainerImage {
                    names: Some(vec!["nginx:1.27".into(), "library/nginx:1.27".into()]),
                    size_bytes: Some(70_000_000),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn quantities_parse_to_kubernetes_values() {
        assert_eq!(quantity_milli_value(&q("500m")), Some(500));
        assert_eq!(quantity_milli_value(&q("2")), Some(2000));
        assert_eq!(quantity_milli_value(&q("0.1")), Some(100));
        assert_eq!(quantity_milli_value(&q("1u")), Some(1), "milli rounds up");
        assert_eq!(quantity_value(&q("1Gi")), Some(1 << 30));
        assert_eq!(quantity_value(&q("128974848")), Some(128_974_848));
        assert_eq!(quantity_value(&q("1e3")), Some(1000));
        assert_eq!(quantity_value(&q("129M")), Some(129_000_000));
        assert_eq!(quantity_value(&q("500m")), Some(1), "value rounds up");
        assert_eq!(quantity_value(&q("1Ei")), Some(1 << 60));
        assert_eq!(quantity_value(&q("100E")), Some(i64::MAX), "saturates");
        assert_eq!(quantity_value(&q("1Gb")), None);
    }

    #[test]
    fn allocatable_counts_native_and_scalar_resources() {
        let n = node(&[
            ("cpu", "3500m"),
            ("memory", "8Gi"),
            ("pods", "110"),
            ("ephemeral-storage", "10G"),
            ("nvidia.com/gpu", "2"),
            ("hugepages-2Mi", "1Gi"),
            ("bogus", "5"),
        ]);
        let r = Resource::from_node_allocatable(&n);
        assert_eq!(r.milli_cpu, 3500);
        assert_eq!(r.memory, 8 << 30);
        assert_eq!(r.allowed_pod_number, 110);
        assert_eq!(r.ephemeral_storage, 10_000_000_000);
        assert_eq!(r.scalar.get("nvidia.com/gpu"), Some(&2));
        assert_eq!(r.scalar.get("hugepages-2Mi"), Some(&(1 << 30)));
        assert!(
            !r.scalar.contains_key("bogus"),
            "unknown unprefixed names are not counted"
        );
    }

    #[test]
    fn resource_arithmetic_round_trips() {
        let mut a = Resource {
            milli_cpu: 1000,
            memory: 100,
            scalar: [("x/y".to_string(), 2)].into(),
            ..Default::default()
        };
        let b = Resource {
            milli_cpu: 250,
            memory: 50,
            scalar: [("x/y".to_string(), 2), ("a/b".to_string(), 1)].into(),
            ..Default::default()
        };
        let original = a.clone();
        a.add(&b);
        assert_eq!(a.milli_cpu, 1250);
        assert_eq!(a.scalar.get("a/b"), Some(&1));
        a.sub(&b);
        assert_eq!(a, original, "add then sub restores the same Resource");
        assert!(b.fits(&Resource {
            milli_cpu: 250,
            memory: 50,
            scalar: b.scalar.clone(),
            ..Default::default()
        }));
        assert!(!b.fits(&Resource {
            milli_cpu: 249,
            memory: 50,
            scalar: b.scalar.clone(),
            ..Default::default()
        }));
        assert!(
            !b.fits(&Resource {
                milli_cpu: 250,
                memory: 50,
                ..Default::default()
            }),
            "missing scalar is 0"
        );
        let mut m = Resource {
            milli_cpu: 5,
            memory: 100,
            ..Default::default()
        };
        m.set_max(&b);
        assert_eq!((m.milli_cpu, m.memory), (250, 100));
    }

    #[test]
    fn pod_requests_take_max_of_containers_and_init_plus_overhead() {
        // Reference: the example in Kubernetes' computePodResourceRequest doc comment:
        // init containers 2 CPU/1G and 2 CPU/3G, containers 2 CPU/1G and 1 CPU/1G
        // → 3 CPU (containers' sum), 3G (the bigger init container).
        let mut spec = PodSpec {
            containers: vec![
                container(&[("cpu", "2"), ("memory", "1G")]),
                container(&[("cpu", "1"), ("memory", "1G")]),
            ],
            init_containers: Some(vec![
                container(&[("cpu", "2"), ("memory", "1G")]),
                container(&[("cpu", "2"), ("memory", "3G")]),
            ]),
            ..Default::default()
        };
        let r = Resource::from_pod_requests(&pod_with("p", spec.clone()));
        assert_eq!((r.milli_cpu, r.memory), (3000, 3_000_000_000));
        spec.overhead = Some(list(&[("cpu", "250m"), ("memory", "120Mi")]));
        let r = Resource::from_pod_requests(&pod_with("p", spec));
        assert_eq!(r.milli_cpu, 3250, "overhead adds on top");
        assert_eq!(r.memory, 3_000_000_000 + 120 * 1024 * 1024);
    }

    #[test]
    fn sidecars_add_to_containers_and_to_later_init_containers() {
        // Reference: KEP-753 "exposing pod resource requirements".
        let mut sidecar = container(&[("cpu", "500m")]);
        sidecar.restart_policy = Some("Always".into());
        let spec = PodSpec {
            containers: vec![container(&[("cpu", "1")])],
            init_containers: Some(vec![
                sidecar,
                // Runs beside the sidecar: 2 + 0.5 = 2.5 CPU during init.
                container(&[("cpu", "2")]),
            ]),
            ..Default::default()
        };
        let r = Resource::from_pod_requests(&pod_with("p", spec.clone()));
        assert_eq!(
            r.milli_cpu, 2500,
            "init peak (2 + sidecar 0.5) beats 1 + 0.5"
        );
        let mut small_init = spec;
        small_init.init_containers.as_mut().unwrap()[1] = container(&[("cpu", "100m")]);
        let r = Resource::from_pod_requests(&pod_with("p", small_init));
        assert_eq!(r.milli_cpu, 1500, "app containers plus the running sidecar");
    }

    #[test]
    fn non_zero_defaults_apply_only_to_missing_requests() {
        let spec = PodSpec {
            containers: vec![
                container(&[]),
                container(&[("cpu", "0"), ("memory", "1Mi")]),
            ],
            ..Default::default()
        };
        let pod = pod_with("p", spec);
        let r = Resource::non_zero_requests(&pod);
        assert_eq!(r.milli_cpu, DEFAULT_MILLI_CPU_REQUEST, "explicit 0 stays 0");
        assert_eq!(r.memory, DEFAULT_MEMORY_REQUEST + (1 << 20));
        assert_eq!(Resource::from_pod_requests(&pod).milli_cpu, 0);
    }

    fn ports_pod(uid: &str, ports: &[(&str, &str, i32)]) -> Pod {
        let mut c = container(&[]);
        c.ports = Some(
            ports
                .iter()
                .map(|(ip, protocol, port)| ContainerPort {
                    container_port: 80,
                    host_ip: (!ip.is_empty()).then(|| ip.to_string()),
                    protocol: (!protocol.is_empty()).then(|| protocol.to_string()),
                    host_port: Some(*port),
                    ..Default::default()
                })
                .collect(),
        );
        pod_with(
            uid,
            PodSpec {
                containers: vec![c],
                ..Default::default()
            },
        )
    }

    #[test]
    fn host_ports_are_normalized_tracked_and_conflict_checked() {
        let pod = ports_pod("a", &[("", "", 8080), ("10.0.0.1", "UDP", 53), ("", "", 0)]);
        assert_eq!(
            host_ports(&pod),
            vec![
                ("0.0.0.0".to_string(), "TCP".to_string(), 8080),
                ("10.0.0.1".to_string(), "UDP".to_string(), 53)
            ],
            "port 0 means no host port"
        );
        let mut info = NodeInfo::new(Arc::new(node(&[("cpu", "1")])));
        info.add_pod(Arc::new(PodInfo::new(Arc::new(pod.clone()))));
        let conflict = |ip: &str, protocol: &str, port| {
            info.host_port_conflicts(&normalize_host_port(ip, protocol, port))
        };
        assert!(
            conflict("10.0.0.2", "TCP", 8080),
            "0.0.0.0 in use blocks every IP"
        );
        assert!(
            conflict("", "UDP", 53),
            "0.0.0.0 wanted conflicts with any IP"
        );
        assert!(conflict("10.0.0.1", "UDP", 53));
        assert!(!conflict("10.0.0.2", "UDP", 53));
        assert!(!conflict("", "UDP", 8080), "protocols differ");
        assert!(info.remove_pod(&pod));
        assert!(info.used_ports.is_empty());
    }

    fn term(key: &str, values: &[&str], topology: &str) -> PodAffinityTerm {
        PodAffinityTerm {
            label_selector: Some(ApiLabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: key.into(),
                    operator: "In".into(),
                    values: Some(values.iter().map(|v| v.to_string()).collect()),
                }]),
                match_labels: None,
            }),
            topology_key: topology.into(),
            ..Default::default()
        }
    }

    fn affinity_pod(uid: &str, affinity: Affinity) -> Pod {
        pod_with(
            uid,
            PodSpec {
                containers: vec![container(&[("cpu", "100m")])],
                affinity: Some(affinity),
                ..Default::default()
            },
        )
    }

    #[test]
    fn pod_info_parses_the_four_affinity_lists() {
        let mut other_namespaces = term("app", &["db"], "zone");
        other_namespaces.namespaces = Some(vec!["a".into(), "b".into()]);
        let mut by_namespace_selector = term("app", &["cache"], "kubernetes.io/hostname");
        by_namespace_selector.namespace_selector = Some(ApiLabelSelector::default());
        let affinity = Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![
                    term("app", &["web"], "kubernetes.io/hostname"),
                    other_namespaces,
                ]),
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    WeightedPodAffinityTerm {
                        weight: 7,
                        pod_affinity_term: term("app", &["x"], "zone"),
                    },
                ]),
            }),
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![
                    by_namespace_selector,
                ]),
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    WeightedPodAffinityTerm {
                        weight: 3,
                        pod_affinity_term: PodAffinityTerm {
                            label_selector: None,
                            topology_key: "zone".into(),
                            ..Default::default()
                        },
                    },
                ]),
            }),
            ..Default::default()
        };
        let info = PodInfo::try_new(Arc::new(affinity_pod("p", affinity))).unwrap();
        assert_eq!(info.required_affinity_terms.len(), 2);
        let own = &info.required_affinity_terms[0];
        assert_eq!(
            own.namespaces,
            HashSet::from(["ns".to_string()]),
            "defaults to the pod's namespace"
        );
        assert_eq!(own.topology_key, "kubernetes.io/hostname");
        assert!(own.namespace_selector.is_none());
        assert_eq!(info.required_affinity_terms[1].namespaces.len(), 2);
        let anti = &info.required_anti_affinity_terms[0];
        assert!(
            anti.namespaces.is_empty(),
            "a namespace selector replaces the default"
        );
        assert!(
            anti.namespace_selector.as_ref().unwrap().0.is_empty(),
            "{{}} selects all namespaces"
        );
        assert_eq!(info.preferred_affinity_terms[0].weight, 7);
        let nil_selector = &info.preferred_anti_affinity_terms[0];
        assert_eq!(nil_selector.weight, 3);

        let labelled = |ns: &str, app: &str| Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(own.matches(&labelled("ns", "web"), None));
        assert!(
            !own.matches(&labelled("other", "web"), None),
            "wrong namespace"
        );
        assert!(!own.matches(&labelled("ns", "db"), None), "wrong labels");
        assert!(
            anti.matches(&labelled("anywhere", "cache"), None),
            "namespace selector {{}} matches all"
        );
        assert!(
            !nil_selector.term.matches(&labelled("ns", "web"), None),
            "nil label selector matches nothing"
        );
    }

    #[test]
    fn bad_selectors_fail_try_new_and_match_nothing_in_new() {
        let mut bad = term("app", &["web"], "zone");
        if let Some(s) = bad.label_selector.as_mut() {
            s.match_expressions.as_mut().unwrap()[0].operator = "Near".into();
        }
        let affinity = Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![bad]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = Arc::new(affinity_pod("p", affinity));
        assert!(PodInfo::try_new(pod.clone()).is_err());
        let info = PodInfo::new(pod.clone());
        assert_eq!(info.required_anti_affinity_terms.len(), 1);
        assert_eq!(info.required_anti_affinity_terms[0].topology_key, "zone");
        assert!(!info.required_anti_affinity_terms[0].matches(&pod, None));
    }

    #[test]
    fn node_info_tracks_pods_resources_and_affinity_sublists() {
        let mut info = NodeInfo::new(Arc::new(node(&[
            ("cpu", "4"),
            ("memory", "8Gi"),
            ("pods", "110"),
        ])));
        assert_eq!(info.name(), "n1");
        assert_eq!(info.allocatable.milli_cpu, 4000);
        assert_eq!(
            info.image_states.get("nginx:1.27"),
            Some(&ImageStateSummary {
                size: 70_000_000,
                num_nodes: 1
            })
        );
        assert_eq!(info.image_states.len(), 2, "every name of an image");

        let plain = Arc::new(pod_with(
            "plain",
            PodSpec {
                containers: vec![container(&[("cpu", "1"), ("memory", "1Gi")])],
                ..Default::default()
            },
        ));
        let anti = Arc::new(affinity_pod(
            "anti",
            Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    required_during_scheduling_ignored_during_execution: Some(vec![term(
                        "app",
                        &["x"],
                        "zone",
                    )]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ));
        let preferred_only = Arc::new(affinity_pod(
            "pref",
            Affinity {
                pod_affinity: Some(PodAffinity::default()),
                ..Default::default()
            },
        ));
        for p in [&plain, &anti, &preferred_only] {
            info.add_pod(Arc::new(PodInfo::new(p.clone())));
        }
        assert_eq!(info.pods.len(), 3);
        assert_eq!(info.requested.milli_cpu, 1200);
        assert_eq!(info.requested.memory, 1 << 30);
        assert_eq!(
            info.non_zero_requested.memory,
            (1 << 30) + 2 * DEFAULT_MEMORY_REQUEST
        );
        assert_eq!(info.pods_with_affinity.len(), 2);
        assert_eq!(info.pods_with_required_anti_affinity.len(), 1);

        assert!(info.remove_pod(&anti));
        assert!(!info.remove_pod(&anti), "already gone");
        assert_eq!(info.pods_with_required_anti_affinity.len(), 0);
        assert_eq!(info.pods_with_affinity.len(), 1);
        assert_eq!(info.requested.milli_cpu, 1100);
        // Removal is by UID: a changed copy of the pod removes the stored one's requests.
        let mut changed = (*plain).clone();
        changed.spec = None;
        assert!(info.remove_pod(&changed));
        assert_eq!(info.requested.milli_cpu, 100);
        assert_eq!(info.requested.memory, 0);

        let mut ghost = info.clone();
        ghost.remove_node();
        assert!(ghost.node().is_none());
        assert_eq!(ghost.pods.len(), 1, "pods outlive the node object");
    }
}
