//! The memory manager (upstream `pkg/kubelet/cm/memorymanager/`: `memory_manager.go`,
//! `policy_none.go`, `policy_static.go`), for the `memory` resource.
//!
//! `--memory-manager-policy=None` (the default) does nothing. `Static` keeps, per NUMA node,
//! a table of the memory it has (`total`), what `--reserved-memory` keeps for the system,
//! what is `allocatable`, `reserved` by containers and `free`; a Guaranteed pod's container
//! gets a block of its memory request on the NUMA nodes the topology manager merged, and its
//! `cpuset.mems` is those nodes (CRI `cpuset_mems` at create). Nodes used together form a
//! group (`cells`): a node already in a multi-node group is not offered alone, and a node
//! holding single-node blocks is not offered in a group, so blocks never straddle groups.
//!
//! As a hint provider it offers every node mask whose allocatable memory covers the request
//! and whose free memory still does, preferred when as narrow as the allocatable memory
//! allows (`calculateHints`). The state is the `memory_manager_state` checkpoint, restored
//! and checked at start (the machine state must be what the assignments imply,
//! `validateState`), stored after every change.
//!
//! Not built: hugepages, the reuse of init containers' memory by app containers
//! (`getPodReusableMemory`), and the pod-scope hints (`GetPodTopologyHints` is no
//! preference here).

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::{info, warn};

use crate::checkpoint::CheckpointManager;
use crate::checkpoint::cpu_manager::Restored;
use crate::checkpoint::memory_manager::{
    self as state, Block, MemoryManagerState, MemoryTable, NumaNodeState,
};
use crate::cm::topology::bitmask::{BitMask, iterate_bitmasks};
use crate::cm::topology::machine::Machine;
use crate::cm::topology::{HintMap, HintProvider, TopologyHint};

/// The policy names as the flag and the checkpoint spell them (`policyTypeNone`,
/// `policyTypeStatic`).
pub const POLICY_NONE: &str = "None";
/// See [`POLICY_NONE`].
pub const POLICY_STATIC: &str = "Static";
/// The one resource managed here.
const RESOURCE_MEMORY: &str = "memory";

/// The memory manager.
pub struct MemoryManager {
    nodes: Vec<u32>,
    static_policy: bool,
    checkpoints: CheckpointManager,
    state: Mutex<MemoryManagerState>,
}

/// `--reserved-memory` (`0:memory=1Gi;1:memory=512Mi`, also `,`-separated pairs per node):
/// NUMA node -> bytes of memory.
pub fn parse_reserved_memory(text: &str) -> Result<BTreeMap<u32, u64>, String> {
    let mut out = BTreeMap::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (node, list) = entry
            .split_once(':')
            .ok_or_else(|| format!("the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got {entry}"))?;
        let node: u32 = node
            .trim()
            .parse()
            .map_err(|_| format!("failed to parse NUMA node ID {node:?}"))?;
        for pair in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').ok_or_else(|| {
                format!(
                    "the reserved limit has incorrect value, expected type=quantity, got {pair}"
                )
            })?;
            if name.trim() != RESOURCE_MEMORY {
                return Err(format!(
                    "unsupported reserved memory type {:?} (only memory)",
                    name.trim()
                ));
            }
            let q = skerry_api::validation::quantity::Quantity::parse(value.trim())
                .filter(|q| !q.is_negative())
                .ok_or_else(|| format!("failed to parse memory quantity {value:?}"))?;
            let bytes = u64::try_from(q.0 / 1_000_000_000).map_err(|e| e.to_string())?;
            *out.entry(node).or_default() += bytes;
        }
    }
    Ok(out)
}

/// The machine state before any assignment (`initializeMachineState`).
fn initial_state(machine: &Machine, reserved: &BTreeMap<u32, u64>) -> BTreeMap<i64, NumaNodeState> {
    machine
        .numa_memory
        .iter()
        .map(|(&node, &total)| {
            let system_reserved = reserved.get(&node).copied().unwrap_or(0);
            let allocatable = total.saturating_sub(system_reserved);
            (
                i64::from(node),
                NumaNodeState {
                    number_of_assignments: 0,
                    memory_map: BTreeMap::from([(
                        RESOURCE_MEMORY.to_string(),
                        MemoryTable {
                            total_mem_size: total,
                            system_reserved,
                            allocatable,
                            reserved: 0,
                            free: allocatable,
                        },
                    )]),
                    cells: Some(vec![i64::from(node)]),
                },
            )
        })
        .collect()
}

/// `updateMachineState`: the nodes of `affinity` become one group and take `size` bytes,
/// the first node's free memory first.
fn take(
    machine: &mut BTreeMap<i64, NumaNodeState>,
    affinity: &[i64],
    resource: &str,
    mut size: u64,
) {
    for n in affinity {
        let Some(node) = machine.get_mut(n) else {
            continue;
        };
        node.number_of_assignments += 1;
        node.cells = Some(affinity.to_vec());
        let Some(t) = node.memory_map.get_mut(resource) else {
            continue;
        };
        let now = size.min(t.free);
        t.free -= now;
        t.reserved += now;
        size -= now;
    }
}

/// The inverse of [`take`] (`RemoveContainer`'s loop).
fn give_back(machine: &mut BTreeMap<i64, NumaNodeState>, b: &Block) {
    let mut size = b.size;
    for n in b.numa_affinity.iter().flatten() {
        let Some(node) = machine.get_mut(n) else {
            continue;
        };
        node.number_of_assignments -= 1;
        if node.number_of_assignments == 0 {
            node.cells = Some(vec![*n]);
        }
        let Some(t) = node.memory_map.get_mut(&b.resource) else {
            continue;
        };
        let now = size.min(t.reserved);
        t.reserved -= now;
        t.free += now;
        size -= now;
    }
}

/// The memory request of a Guaranteed pod's container (0 otherwise).
fn guaranteed_memory(pod: &Pod, c: &Container) -> u64 {
    if crate::kubelet::sandbox::qos_class(pod) != "Guaranteed" {
        return 0;
    }
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(RESOURCE_MEMORY))
        .and_then(|q| skerry_api::validation::quantity::Quantity::parse(&q.0))
        .and_then(|q| u64::try_from((q.0 + 999_999_999) / 1_000_000_000).ok())
        .unwrap_or(0)
}

fn mask_of(bits: &[i64]) -> BitMask {
    bits.iter().fold(BitMask::EMPTY, |m, &b| {
        m.with(u32::try_from(b).unwrap_or(u32::MAX))
    })
}

impl MemoryManager {
    /// The manager for `policy` (`None` or `Static`), `reserved` per NUMA node; the sum of
    /// `reserved` must be `node_reserved` (kube + system reserved + the hard eviction
    /// threshold's memory), as upstream checks at start.
    pub fn new(
        policy: &str,
        machine: &Machine,
        reserved: &BTreeMap<u32, u64>,
        node_reserved: u64,
        checkpoints: CheckpointManager,
    ) -> Result<MemoryManager, String> {
        let static_policy = match policy {
            POLICY_NONE => false,
            POLICY_STATIC => true,
            other => return Err(format!("unknown policy: \"{other}\"")),
        };
        if static_policy {
            let total: u64 = reserved.values().sum();
            if total != node_reserved {
                return Err(format!(
                    "the total amount \"{total}\" of type \"memory\" is not equal to the value \"{node_reserved}\" determined by Node Allocatable feature"
                ));
            }
            if let Some(n) = reserved
                .keys()
                .find(|n| !machine.numa_memory.contains_key(n))
            {
                return Err(format!(
                    "the reserved memory configuration names NUMA node {n}, which this machine does not have"
                ));
            }
        }
        let restored = state::restore(&checkpoints, policy).map_err(|e| e.to_string())?;
        let mut st = match restored {
            Restored::Absent(s) | Restored::Checkpoint(s) => s,
        };
        if static_policy {
            // `validateState`: the stored machine state must be the fresh one with the
            // stored assignments taken from it.
            let mut expected = initial_state(machine, reserved);
            for blocks in st.assignments.values().flat_map(|c| c.values()) {
                for b in blocks.iter().flatten() {
                    take(
                        &mut expected,
                        b.numa_affinity.as_deref().unwrap_or_default(),
                        &b.resource,
                        b.size,
                    );
                }
            }
            if st.machine_state.is_empty() && st.assignments.is_empty() {
                st.machine_state = expected;
            } else if st.machine_state != expected {
                return Err(
                    "[memorymanager] the expected machine state is different from the real one"
                        .into(),
                );
            }
        }
        let m = MemoryManager {
            nodes: machine.numa_nodes(),
            static_policy,
            checkpoints,
            state: Mutex::new(st),
        };
        m.store(&m.lock());
        Ok(m)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryManagerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn store(&self, st: &MemoryManagerState) {
        let name = if self.static_policy {
            POLICY_STATIC
        } else {
            POLICY_NONE
        };
        if let Err(e) = state::store(&self.checkpoints, name, st) {
            warn!(error = %e, "memory manager: storing the state checkpoint failed");
        }
    }

    /// Whether the static policy runs.
    pub fn is_static(&self) -> bool {
        self.static_policy
    }

    /// The NUMA nodes of a container's memory (`GetMemoryNUMANodes`), for `cpuset.mems`.
    pub fn numa_nodes_for(&self, uid: &str, container: &str) -> Option<Vec<u32>> {
        let st = self.lock();
        let blocks = st.assignments.get(uid)?.get(container)?.as_ref()?;
        let mut nodes: Vec<u32> = blocks
            .iter()
            .flat_map(|b| b.numa_affinity.iter().flatten())
            .filter_map(|&n| u32::try_from(n).ok())
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        Some(nodes).filter(|n| !n.is_empty())
    }

    /// The machine state (for tests and the checkpoint).
    pub fn machine_state(&self) -> BTreeMap<i64, NumaNodeState> {
        self.lock().machine_state.clone()
    }

    /// `calculateHints` for `request` bytes of memory.
    fn calculate_hints(&self, st: &MemoryManagerState, request: u64) -> Vec<TopologyHint> {
        let mut min_affinity = self.nodes.len() as u32;
        let mut hints = Vec::new();
        let table = |n: u32| {
            st.machine_state
                .get(&i64::from(n))
                .and_then(|s| s.memory_map.get(RESOURCE_MEMORY).map(|t| (s, t.clone())))
        };
        iterate_bitmasks(&self.nodes, |mask| {
            let bits = mask.bits();
            let (mut free, mut allocatable) = (0u64, 0u64);
            for &n in &bits {
                if let Some((_, t)) = table(n) {
                    free += t.free;
                    allocatable += t.allocatable;
                }
            }
            if allocatable < request {
                return;
            }
            min_affinity = min_affinity.min(mask.count());
            let single = bits.len() == 1;
            for &n in &bits {
                let Some((s, _)) = table(n) else { return };
                let cells = s.cells.clone().unwrap_or_default();
                if single && cells.len() > 1 {
                    return;
                }
                if !single && s.number_of_assignments > 0 {
                    if cells.len() == 1 {
                        return;
                    }
                    let mut group: Vec<i64> = cells;
                    group.sort_unstable();
                    if group != bits.iter().map(|&b| i64::from(b)).collect::<Vec<_>>() {
                        return;
                    }
                }
            }
            if free < request {
                return;
            }
            hints.push(TopologyHint {
                affinity: Some(mask),
                preferred: false,
            });
        });
        for h in &mut hints {
            h.preferred = h.affinity.is_some_and(|a| a.count() == min_affinity);
        }
        hints
    }

    /// Frees the blocks of pod `uid` (`RemoveContainer` for each container).
    fn release(&self, uid: &str) {
        let mut st = self.lock();
        let Some(containers) = st.assignments.remove(uid) else {
            return;
        };
        for b in containers.values().flatten().flatten() {
            give_back(&mut st.machine_state, b);
        }
        self.store(&st);
    }
}

impl HintProvider for MemoryManager {
    fn container_hints(&self, pod: &Pod, c: &Container) -> HintMap {
        let request = guaranteed_memory(pod, c);
        if !self.static_policy || request == 0 {
            return HintMap::new();
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let st = self.lock();
        if let Some(blocks) = st.assignments.get(&uid).and_then(|a| a.get(&c.name)) {
            // Regenerated from what the container has (`regenerateHints`).
            let hints = blocks
                .iter()
                .flatten()
                .filter(|b| b.resource == RESOURCE_MEMORY)
                .map(|b| TopologyHint {
                    affinity: Some(mask_of(b.numa_affinity.as_deref().unwrap_or_default())),
                    preferred: true,
                })
                .collect();
            return HintMap::from([(RESOURCE_MEMORY.to_string(), Some(hints))]);
        }
        let hints = self.calculate_hints(&st, request);
        if hints.is_empty() {
            // Upstream leaves the resource out of the map when no mask fits.
            return HintMap::new();
        }
        HintMap::from([(RESOURCE_MEMORY.to_string(), Some(hints))])
    }

    fn pod_hints(&self, _pod: &Pod) -> HintMap {
        HintMap::new()
    }

    fn allocate(&self, pod: &Pod, c: &Container, hint: TopologyHint) -> Result<(), String> {
        let request = guaranteed_memory(pod, c);
        if !self.static_policy || request == 0 {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut st = self.lock();
        if st
            .assignments
            .get(&uid)
            .is_some_and(|a| a.contains_key(&c.name))
        {
            return Ok(());
        }
        let hints = self.calculate_hints(&st, request);
        // The merged mask, or the narrowest preferred one of our own (`getDefaultHint`), made
        // wide enough to hold the request (`extendTopologyManagerHint`: the narrowest of
        // our hints containing it).
        let satisfies = |m: BitMask| {
            let free: u64 = m
                .bits()
                .iter()
                .filter_map(|n| st.machine_state.get(&i64::from(*n)))
                .filter_map(|s| s.memory_map.get(RESOURCE_MEMORY))
                .map(|t| t.free)
                .sum();
            free >= request
        };
        let pick = |within: Option<BitMask>| {
            hints
                .iter()
                .filter(|h| within.is_none_or(|w| h.affinity.is_some_and(|a| a.and(w) == w)))
                .filter_map(|h| h.affinity.map(|a| (h.preferred, a)))
                .min_by(|(pa, a), (pb, b)| {
                    pb.cmp(pa).then(if a.is_narrower_than(*b) {
                        std::cmp::Ordering::Less
                    } else {
                        std::cmp::Ordering::Greater
                    })
                })
                .map(|(_, a)| a)
        };
        let mask = match hint.affinity {
            Some(m) if satisfies(m) => m,
            Some(m) => pick(Some(m)).ok_or("[memorymanager] failed to find NUMA nodes to extend the current topology hint")?,
            None => pick(None).ok_or("[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available")?,
        };
        let bits: Vec<i64> = mask.bits().into_iter().map(i64::from).collect();
        take(&mut st.machine_state, &bits, RESOURCE_MEMORY, request);
        st.assignments.entry(uid.clone()).or_default().insert(
            c.name.clone(),
            Some(vec![Block {
                numa_affinity: Some(bits),
                resource: RESOURCE_MEMORY.to_string(),
                size: request,
            }]),
        );
        info!(pod = %uid, container = %c.name, numa = %mask, bytes = request, "memory manager: memory allocated");
        self.store(&st);
        Ok(())
    }

    fn release_pod(&self, uid: &str) {
        self.release(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::topology::{
        ERROR_TOPOLOGY_AFFINITY, Policy, Scope, TopologyManager, UNEXPECTED_ADMISSION_ERROR,
    };
    use std::sync::Arc;

    const GI: u64 = 1 << 30;

    fn machine() -> Machine {
        // Two nodes of 4 GiB, two CPUs each.
        Machine::from_table(
            &[(0, 0, 0, 0), (1, 1, 0, 0), (2, 2, 1, 1), (3, 3, 1, 1)],
            4 * GI,
        )
    }

    fn pod(uid: &str, memory: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"cpu": "1", "memory": memory}, "limits": {"cpu": "1", "memory": memory}}}]}
        }))
        .expect("pod")
    }

    fn manager(dir: &std::path::Path) -> MemoryManager {
        let reserved = parse_reserved_memory("0:memory=512Mi;1:memory=512Mi").expect("flag");
        MemoryManager::new(
            POLICY_STATIC,
            &machine(),
            &reserved,
            GI,
            CheckpointManager::new(dir).expect("cp"),
        )
        .expect("static")
    }

    fn masks(h: &HintMap) -> Vec<(Vec<u32>, bool)> {
        h.get("memory")
            .cloned()
            .flatten()
            .unwrap_or_default()
            .iter()
            .map(|h| {
                (
                    h.affinity.map(|a| a.bits()).unwrap_or_default(),
                    h.preferred,
                )
            })
            .collect()
    }

    #[test]
    fn reserved_memory_must_add_up() {
        let dir = tempfile::tempdir().expect("tmp");
        let reserved = parse_reserved_memory("0:memory=100Mi").expect("flag");
        let e = MemoryManager::new(
            POLICY_STATIC,
            &machine(),
            &reserved,
            200 << 20,
            CheckpointManager::new(dir.path()).expect("cp"),
        )
        .err()
        .expect("refused");
        assert_eq!(
            e,
            "the total amount \"104857600\" of type \"memory\" is not equal to the value \"209715200\" determined by Node Allocatable feature"
        );
        assert!(parse_reserved_memory("0:cpu=1").is_err());
        assert!(parse_reserved_memory("x:memory=1Gi").is_err());
    }

    #[test]
    fn hints_groups_and_cpuset_mems() {
        let dir = tempfile::tempdir().expect("tmp");
        let m = Arc::new(manager(dir.path()));
        let small = pod("small", "1Gi");
        let c = &small.spec.as_ref().expect("spec").containers[0];
        assert_eq!(
            masks(&m.container_hints(&small, c)),
            vec![(vec![0], true), (vec![1], true), (vec![0, 1], false)]
        );
        // 5 GiB does not fit a node's 3.5 GiB allocatable: both nodes, preferred.
        let big = pod("big", "5Gi");
        let cb = &big.spec.as_ref().expect("spec").containers[0];
        assert_eq!(
            masks(&m.container_hints(&big, cb)),
            vec![(vec![0, 1], true)]
        );
        let provider: Arc<dyn HintProvider> = m.clone();
        let tm = TopologyManager::new(
            Policy::Restricted,
            Scope::Container,
            vec![0, 1],
            vec![provider],
        )
        .expect("tm");
        tm.admit(&small).expect("admitted");
        assert_eq!(m.numa_nodes_for("small", "c"), Some(vec![0]));
        // Node 0 holds a single-node block now: it cannot join a group, so 5 GiB has no
        // place. Upstream then gives no hint at all (no preference), and with no merged
        // mask (policy none) the allocation finds no default either.
        assert_eq!(masks(&m.container_hints(&big, cb)), vec![]);
        let provider: Arc<dyn HintProvider> = m.clone();
        let none = TopologyManager::new(Policy::None, Scope::Container, vec![0, 1], vec![provider])
            .expect("tm");
        let e = none.admit(&big).expect_err("refused");
        assert_eq!(e.reason, UNEXPECTED_ADMISSION_ERROR);
        assert_eq!(
            e.message,
            "Allocate failed due to [memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available, which is unexpected"
        );
        // A second 1 GiB container where restricted must keep it on one node.
        tm.admit(&pod("small2", "2Gi")).expect("admitted");
        assert_eq!(m.numa_nodes_for("small2", "c"), Some(vec![0]));
        // single-numa-node: 5 GiB needs both nodes, refused before anything is taken.
        let fresh = tempfile::tempdir().expect("tmp");
        let f = Arc::new(manager(fresh.path()));
        let provider: Arc<dyn HintProvider> = f.clone();
        let single = TopologyManager::new(
            Policy::SingleNumaNode,
            Scope::Container,
            vec![0, 1],
            vec![provider],
        )
        .expect("tm");
        let e = single.admit(&big).expect_err("refused");
        assert_eq!(e.reason, ERROR_TOPOLOGY_AFFINITY);
        assert_eq!(f.machine_state()[&1].memory_map["memory"].free, 7 * GI / 2);
        // The state survives a restart, and frees on release.
        drop(tm);
        let again = manager(dir.path());
        assert_eq!(again.numa_nodes_for("small", "c"), Some(vec![0]));
        let free = |m: &MemoryManager| m.machine_state()[&0].memory_map["memory"].free;
        assert_eq!(free(&again), GI / 2, "3.5 GiB allocatable less 1 and 2 GiB");
        again.release_pod("small");
        assert_eq!(free(&again), 3 * GI / 2);
        again.release_pod("small2");
        assert_eq!(free(&again), 7 * GI / 2);
        assert_eq!(again.machine_state()[&0].cells, Some(vec![0]));
    }
}
