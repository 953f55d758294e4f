//! The topology manager (upstream `pkg/kubelet/cm/topologymanager/`): a pod admit handler
//! that asks every hint provider where each container could go on the machine's NUMA nodes,
//! merges the answers with the configured [`Policy`] ([`policy`]: bitwise AND over the cross
//! product, a provider without preference is no signal), refuses the pod with upstream's
//! `TopologyAffinityError` when the policy says so, and otherwise records the merged
//! affinity and has every provider allocate against it.
//!
//! Scopes (`--topology-manager-scope`): `container` merges and allocates per container
//! (init containers first, `scope_container.go`); `pod` merges once over the providers'
//! whole-pod hints and gives every container that one affinity (`scope_pod.go`).
//! The machine's topology is [`machine::Machine`], read from /sys or given as data.

pub mod bitmask;
pub mod machine;
pub mod policy;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, Pod};

pub use policy::{HintMap, Policy, TopologyHint};

/// `TopologyAffinityError`'s type, the rejected pod's reason (`topologymanager.ErrorTopologyAffinity`).
pub const ERROR_TOPOLOGY_AFFINITY: &str = "TopologyAffinityError";
/// `TopologyAffinityError.Error()`.
pub const TOPOLOGY_AFFINITY_MESSAGE: &str = "Resources cannot be allocated with Topology locality";
/// The reason of an allocation that failed after the merge admitted the pod
/// (`admission.unexpectedAdmissionError`).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";
/// Upstream refuses NUMA-aware policies on machines with more nodes than this
/// (`defaultMaxAllowableNUMANodes`): the cross product of hints grows as 2^nodes per provider.
pub const MAX_ALLOWABLE_NUMA_NODES: usize = 8;

/// `--topology-manager-scope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Container,
    Pod,
}

impl Scope {
    /// Parses the flag (`container`, `pod`), with upstream's error.
    pub fn parse(s: &str) -> Result<Scope, String> {
        match s {
            "container" => Ok(Scope::Container),
            "pod" => Ok(Scope::Pod),
            _ => Err(format!("unknown scope: \"{s}\"")),
        }
    }
}

/// A resource manager that places containers (`HintProvider`).
pub trait HintProvider: Send + Sync {
    /// The NUMA hints for one container (`GetTopologyHints`); an empty map: no preference.
    fn container_hints(&self, pod: &Pod, container: &Container) -> HintMap;
    /// The hints for the whole pod (`GetPodTopologyHints`).
    fn pod_hints(&self, pod: &Pod) -> HintMap;
    /// Allocates for the container within `hint` (`Allocate`).
    fn allocate(&self, pod: &Pod, container: &Container, hint: TopologyHint) -> Result<(), String>;
    /// Frees everything of pod `uid` (a rejected pod's partial allocations).
    fn release_pod(&self, uid: &str);
}

/// Why a pod is refused (`lifecycle.PodAdmitResult`'s reason and message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmitError {
    pub reason: String,
    pub message: String,
}

/// The topology manager.
pub struct TopologyManager {
    policy: Policy,
    scope: Scope,
    numa_nodes: Vec<u32>,
    providers: Vec<Arc<dyn HintProvider>>,
    /// (pod UID, container name) -> the merged hint (`podTopologyHints`).
    affinity: Mutex<HashMap<(String, String), TopologyHint>>,
}

impl TopologyManager {
    /// A manager over the machine's NUMA nodes; refuses a NUMA-aware policy on a machine
    /// with more than [`MAX_ALLOWABLE_NUMA_NODES`] (`NewManager`).
    pub fn new(
        policy: Policy,
        scope: Scope,
        numa_nodes: Vec<u32>,
        providers: Vec<Arc<dyn HintProvider>>,
    ) -> Result<TopologyManager, String> {
        if policy != Policy::None && numa_nodes.len() > MAX_ALLOWABLE_NUMA_NODES {
            return Err(format!(
                "unsupported on machines with more than {MAX_ALLOWABLE_NUMA_NODES} NUMA Nodes"
            ));
        }
        Ok(TopologyManager {
            policy,
            scope,
            numa_nodes,
            providers,
            affinity: Mutex::new(HashMap::new()),
        })
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The affinity recorded for a container (`GetAffinity`).
    pub fn affinity(&self, uid: &str, container: &str) -> Option<TopologyHint> {
        self.lock()
            .get(&(uid.to_string(), container.to_string()))
            .copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), TopologyHint>> {
        self.affinity.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits `pod` (`Admit`): per scope, merge, check, record, allocate. On a refusal
    /// nothing of the pod stays allocated.
    pub fn admit(&self, pod: &Pod) -> Result<(), AdmitError> {
        let result = self.admit_inner(pod);
        if result.is_err() {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            self.remove_pod(&uid);
            for p in &self.providers {
                p.release_pod(&uid);
            }
        }
        result
    }

    fn admit_inner(&self, pod: &Pod) -> Result<(), AdmitError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let containers: Vec<&Container> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .collect();
        let refused = || AdmitError {
            reason: ERROR_TOPOLOGY_AFFINITY.to_string(),
            message: TOPOLOGY_AFFINITY_MESSAGE.to_string(),
        };
        let pod_hint = match (self.policy, self.scope) {
            (Policy::None, _) | (_, Scope::Container) => None,
            (_, Scope::Pod) => {
                let hints: Vec<HintMap> = self.providers.iter().map(|p| p.pod_hints(pod)).collect();
                let (best, admit) = self.policy.merge(&self.numa_nodes, &hints);
                if !admit {
                    return Err(refused());
                }
                Some(best)
            }
        };
        for c in containers {
            let hint = match (self.policy, pod_hint) {
                (_, Some(h)) => h,
                (Policy::None, None) => TopologyHint {
                    affinity: None,
                    preferred: false,
                },
                (_, None) => {
                    let hints: Vec<HintMap> = self
                        .providers
                        .iter()
                        .map(|p| p.container_hints(pod, c))
                        .collect();
                    let (best, admit) = self.policy.merge(&self.numa_nodes, &hints);
                    if !admit {
                        return Err(refused());
                    }
                    best
                }
            };
            self.lock().insert((uid.clone(), c.name.clone()), hint);
            for p in &self.providers {
                p.allocate(pod, c, hint).map_err(|e| AdmitError {
                    reason: UNEXPECTED_ADMISSION_ERROR.to_string(),
                    message: format!("Allocate failed due to {e}, which is unexpected"),
                })?;
            }
        }
        Ok(())
    }

    /// Forgets the affinities of pod `uid` (`RemoveContainer` for each of its containers).
    pub fn remove_pod(&self, uid: &str) {
        self.lock().retain(|(u, _), _| u != uid);
    }
}
