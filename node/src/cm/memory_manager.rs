//! The memory manager (upstream `pkg/kubelet/cm/memorymanager/`: `memory_manager.go`,
//! `policy_none.go`, `policy_static.go`), for `memory` and the hugepage resources
//! (`hugepages-2Mi`, `hugepages-1Gi`).
//!
//! `--memory-manager-policy=None` (the default) does nothing. `Static` keeps, per NUMA node
//! and per resource, a table of what the node has (`total`: its `MemTotal`, or its pool's
//! pages times the page size), what `--reserved-memory` keeps for the system, what is
//! `allocatable` (for `memory` also less the node's hugepages, which the kernel took out of
//! it), `reserved` by containers and `free`. A Guaranteed pod's container gets one block per
//! resource it requests, all on the NUMA nodes the topology manager merged, and its
//! `cpuset.mems` is those nodes (CRI `cpuset_mems` at create). Nodes used together form a
//! group (`cells`): a node already in a multi-node group is not offered alone, and a node
//! holding single-node blocks is not offered in a group, so blocks never straddle groups.
//!
//! As a hint provider it offers every node mask whose allocatable amounts cover every
//! requested resource and whose free amounts still do, preferred when as narrow as the
//! allocatable amounts allow (`calculateHints`), the same masks for every resource. In `pod`
//! scope the hints are those of the pod's summed requests (`GetPodTopologyHints`,
//! `getPodRequestedResources`: the app containers and sidecars together, or the largest
//! init container with the sidecars started before it, whichever is more).
//!
//! Init containers run before the app containers and are done when those start, so what an
//! init container got can be taken again by the app containers on the same nodes
//! (`initContainersReusableMemory`, `updateInitContainersMemoryBlocks`): the app
//! container's block is recorded whole, the machine state is charged only for what exceeds
//! the reusable amount, and the init container's block shrinks by what was reused, so the
//! pod's blocks always add up to what the machine state holds for it. A sidecar (a
//! restartable init container) keeps running: its memory is never reused.
//!
//! The state is the `memory_manager_state` checkpoint, restored and checked at start (the
//! machine state must be what the assignments imply, `validateState`), stored after every
//! change.

use std::collections::{BTreeMap, HashMap};
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
/// The memory resource (`v1.ResourceMemory`).
const RESOURCE_MEMORY: &str = "memory";
/// The prefix of the hugepage resources (`v1.ResourceHugePagesPrefix`).
const HUGEPAGES_PREFIX: &str = "hugepages-";
/// A byte in a quantity's nano-units.
const NANO: i128 = 1_000_000_000;

/// Bytes by resource name (`memory`, `hugepages-2Mi`...).
pub type Requests = BTreeMap<String, u64>;

/// `--reserved-memory`, parsed: NUMA node -> resource -> bytes.
pub type ReservedMemory = BTreeMap<u32, Requests>;

/// Pod UID -> the mask of an init container's block -> resource -> bytes its app containers
/// may still take again (`reusableMemory`).
type Reusable = HashMap<String, HashMap<BitMask, Requests>>;

struct Inner {
    state: MemoryManagerState,
    /// `initContainersReusableMemory`: kept for the pod being admitted only.
    reusable: Reusable,
}

/// The memory manager.
pub struct MemoryManager {
    nodes: Vec<u32>,
    static_policy: bool,
    checkpoints: CheckpointManager,
    inner: Mutex<Inner>,
}

/// Whether `name` is a resource the memory manager handles (`memory` or `hugepages-<size>`,
/// `corehelper.IsHugePageResourceName`).
pub fn is_memory_resource(name: &str) -> bool {
    name == RESOURCE_MEMORY
        || name
            .strip_prefix(HUGEPAGES_PREFIX)
            .and_then(skerry_api::validation::quantity::Quantity::parse)
            .is_some_and(|q| q.0 > 0)
}

/// `--reserved-memory` (`0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=512Mi`): NUMA node ->
/// resource -> bytes, with the kubelet's checks (`validateReservedMemoryConfiguration`):
/// only `memory` and `hugepages-<size>`, no zero, no resource twice on a node.
pub fn parse_reserved_memory(text: &str) -> Result<ReservedMemory, String> {
    let mut out = ReservedMemory::new();
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
            let name = name.trim();
            if !is_memory_resource(name) {
                return Err(format!(
                    "invalid configuration: the limit type {name:?} for NUMA node {node} is not supported, only [memory hugepages-<HugePageSize>] is accepted"
                ));
            }
            let q = skerry_api::validation::quantity::Quantity::parse(value.trim())
                .filter(|q| !q.is_negative())
                .ok_or_else(|| format!("failed to parse memory quantity {value:?}"))?;
            if q.0 == 0 {
                return Err(format!(
                    "invalid configuration: reserved memory may not be zero for NUMA node {node} and resource {name:?}"
                ));
            }
            let bytes = u64::try_from(q.0 / NANO).map_err(|e| e.to_string())?;
            if out
                .entry(node)
                .or_default()
                .insert(name.to_string(), bytes)
                .is_some()
            {
                return Err(format!(
                    "invalid configuration: the reserved memory has a duplicate value for NUMA node {node} and resource {name:?}"
                ));
            }
        }
    }
    Ok(out)
}

/// The machine state before any assignment (`getDefaultMachineState`): per node a table for
/// each hugepage pool and one for memory, whose allocatable part excludes the node's pools.
fn initial_state(machine: &Machine, reserved: &ReservedMemory) -> BTreeMap<i64, NumaNodeState> {
    let reserved_of = |node: u32, resource: &str| {
        reserved
            .get(&node)
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    };
    let table = |total: u64, system_reserved: u64, allocatable: u64| MemoryTable {
        total_mem_size: total,
        system_reserved,
        allocatable,
        reserved: 0,
        free: allocatable,
    };
    machine
        .numa_memory
        .iter()
        .map(|(&node, &total)| {
            let mut memory_map = BTreeMap::new();
            let mut hugepages = 0u64;
            for pool in machine.numa_hugepages.get(&node).into_iter().flatten() {
                let name = pool.resource_name();
                let size = pool.page_size.saturating_mul(pool.count);
                let system_reserved = reserved_of(node, &name);
                memory_map.insert(
                    name,
                    table(size, system_reserved, size.saturating_sub(system_reserved)),
                );
                hugepages = hugepages.saturating_add(size);
            }
            let system_reserved = reserved_of(node, RESOURCE_MEMORY);
            let allocatable = total
                .saturating_sub(system_reserved)
                .saturating_sub(hugepages);
            memory_map.insert(
                RESOURCE_MEMORY.to_string(),
                table(total, system_reserved, allocatable),
            );
            (
                i64::from(node),
                NumaNodeState {
                    number_of_assignments: 0,
                    memory_map,
                    cells: Some(vec![i64::from(node)]),
                },
            )
        })
        .collect()
}

/// `updateMachineState`: the nodes of `affinity` become one group and take `size` bytes of
/// `resource`, the first node's free memory first (a block of 0 bytes still counts as an
/// assignment of each node).
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

fn is_guaranteed(pod: &Pod) -> bool {
    crate::kubelet::sandbox::qos_class(pod) == "Guaranteed"
}

fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The memory and hugepage requests of a container in bytes, rounded up
/// (`getRequestedResources`).
pub fn container_requests(c: &Container) -> Requests {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .into_iter()
        .flatten()
        .filter(|(name, _)| is_memory_resource(name))
        .filter_map(|(name, q)| {
            let q = skerry_api::validation::quantity::Quantity::parse(&q.0)?;
            let bytes = u64::try_from((q.0 + NANO - 1) / NANO).ok()?;
            Some((name.clone(), bytes))
        })
        .collect()
}

/// The pod's requests for the pod scope (`getPodRequestedResources`): per resource the app
/// containers and the sidecars together, or, when more, the largest need of an init
/// container counted with the sidecars started before it. Only resources the app
/// containers request are kept, as upstream's loop over them.
pub fn pod_requests(pod: &Pod) -> Requests {
    let Some(spec) = pod.spec.as_ref() else {
        return Requests::new();
    };
    let mut init_max = Requests::new();
    let mut sidecars = Requests::new();
    for c in spec.init_containers.iter().flatten() {
        for (name, size) in container_requests(c) {
            let running = sidecars.get(&name).copied().unwrap_or(0);
            let max = init_max.entry(name.clone()).or_insert(0);
            if is_restartable_init(c) {
                sidecars.insert(name, running.saturating_add(size));
            } else if running.saturating_add(size) > *max {
                *max = running.saturating_add(size);
            }
        }
    }
    let mut apps = Requests::new();
    for c in &spec.containers {
        for (name, size) in container_requests(c) {
            let total = apps.entry(name).or_insert(0);
            *total = total.saturating_add(size);
        }
    }
    apps.into_iter()
        .map(|(name, size)| {
            let long_running = size.saturating_add(sidecars.get(&name).copied().unwrap_or(0));
            let need = long_running.max(init_max.get(&name).copied().unwrap_or(0));
            (name, need)
        })
        .collect()
}

fn mask_of(bits: &[i64]) -> BitMask {
    bits.iter().fold(BitMask::EMPTY, |m, &b| {
        m.with(u32::try_from(b).unwrap_or(u32::MAX))
    })
}

/// `regenerateHints`: the hints of what a container already holds, one preferred hint per
/// block; `None` (no preference) when the blocks do not match the requests.
fn regenerate_hints(blocks: &[Block], requests: &Requests) -> Option<HintMap> {
    if blocks.len() != requests.len() {
        return None;
    }
    let mut hints: BTreeMap<String, Vec<TopologyHint>> = requests
        .keys()
        .map(|name| (name.clone(), Vec::new()))
        .collect();
    for b in blocks {
        if requests.get(&b.resource) != Some(&b.size) {
            return None;
        }
        hints
            .entry(b.resource.clone())
            .or_default()
            .push(TopologyHint {
                affinity: Some(mask_of(b.numa_affinity.as_deref().unwrap_or_default())),
                preferred: true,
            });
    }
    Some(hints.into_iter().map(|(k, v)| (k, Some(v))).collect())
}

/// `findBestHint`: preferred over not, then the narrowest.
fn find_best_hint(hints: &[TopologyHint]) -> Option<TopologyHint> {
    let mut best: Option<TopologyHint> = None;
    for h in hints {
        best = match best {
            None => Some(*h),
            Some(b) if h.preferred && !b.preferred => Some(*h),
            Some(b)
                if h.preferred == b.preferred
                    && h.affinity
                        .unwrap_or(BitMask::EMPTY)
                        .is_narrower_than(b.affinity.unwrap_or(BitMask::EMPTY)) =>
            {
                Some(*h)
            }
            keep => keep,
        };
    }
    best
}

/// The hints of the regular memory (all resources get the same masks), or of the first
/// resource when no memory is requested.
fn memory_hints(hints: &HintMap) -> Vec<TopologyHint> {
    hints
        .get(RESOURCE_MEMORY)
        .or_else(|| hints.values().next())
        .cloned()
        .flatten()
        .unwrap_or_default()
}

impl MemoryManager {
    /// The manager for `policy` (`None` or `Static`), `reserved` per NUMA node and resource;
    /// for each of `memory` and the hugepage resources the sum over the nodes must be
    /// `node_reserved`'s (kube + system reserved, and for memory the hard eviction
    /// threshold's), as upstream checks at start (`validateReservedMemory`).
    pub fn new(
        policy: &str,
        machine: &Machine,
        reserved: &ReservedMemory,
        node_reserved: &Requests,
        checkpoints: CheckpointManager,
    ) -> Result<MemoryManager, String> {
        let static_policy = match policy {
            POLICY_NONE => false,
            POLICY_STATIC => true,
            other => return Err(format!("unknown policy: \"{other}\"")),
        };
        if static_policy {
            if let Some(n) = reserved
                .keys()
                .find(|n| !machine.numa_memory.contains_key(n))
            {
                return Err(format!(
                    "the reserved memory configuration references a NUMA node {n} that does not exist on this machine"
                ));
            }
            let mut totals = Requests::new();
            for (name, size) in reserved.values().flatten() {
                let t = totals.entry(name.clone()).or_insert(0);
                *t = t.saturating_add(*size);
            }
            let mut names: Vec<&String> = totals
                .keys()
                .chain(node_reserved.keys().filter(|n| is_memory_resource(n)))
                .collect();
            names.sort();
            names.dedup();
            for name in names {
                let total = totals.get(name).copied().unwrap_or(0);
                let want = node_reserved.get(name).copied().unwrap_or(0);
                if total != want {
                    return Err(format!(
                        "the total amount \"{total}\" of type \"{name}\" is not equal to the value \"{want}\" determined by Node Allocatable feature"
                    ));
                }
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
            for (pod, containers) in &st.assignments {
                for (name, blocks) in containers {
                    for b in blocks.iter().flatten() {
                        let affinity = b.numa_affinity.as_deref().unwrap_or_default();
                        for n in affinity {
                            let Some(node) = expected.get(n) else {
                                return Err(format!(
                                    "[memorymanager] (pod: {pod}, container: {name}) the memory assignment uses the NUMA that does not exist"
                                ));
                            };
                            if !node.memory_map.contains_key(&b.resource) {
                                return Err(format!(
                                    "[memorymanager] (pod: {pod}, container: {name}) the memory assignment uses memory resource that does not exist"
                                ));
                            }
                        }
                        take(&mut expected, affinity, &b.resource, b.size);
                    }
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
            inner: Mutex::new(Inner {
                state: st,
                reusable: Reusable::new(),
            }),
        };
        m.store(&m.lock().state);
        Ok(m)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
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

    /// The NUMA nodes of a container's memory and hugepages (`GetMemoryNUMANodes`), for
    /// `cpuset.mems`.
    pub fn numa_nodes_for(&self, uid: &str, container: &str) -> Option<Vec<u32>> {
        let inner = self.lock();
        let blocks = inner.state.assignments.get(uid)?.get(container)?.as_ref()?;
        let mut nodes: Vec<u32> = blocks
            .iter()
            .flat_map(|b| b.numa_affinity.iter().flatten())
            .filter_map(|&n| u32::try_from(n).ok())
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        Some(nodes).filter(|n| !n.is_empty())
    }

    /// The blocks of a container (`GetMemory`).
    pub fn blocks(&self, uid: &str, container: &str) -> Option<Vec<Block>> {
        self.lock()
            .state
            .assignments
            .get(uid)?
            .get(container)?
            .clone()
    }

    /// The machine state (for tests and the checkpoint).
    pub fn machine_state(&self) -> BTreeMap<i64, NumaNodeState> {
        self.lock().state.machine_state.clone()
    }

    /// `getPodReusableMemory`: what the pod's init containers hold on exactly `mask` that
    /// its app containers may take again.
    fn reusable(inner: &Inner, uid: &str, mask: BitMask, resource: &str) -> u64 {
        inner
            .reusable
            .get(uid)
            .and_then(|p| p.get(&mask))
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// `calculateHints` for `requests` of pod `uid`: the same masks for every resource.
    fn calculate_hints(&self, inner: &Inner, uid: &str, requests: &Requests) -> HintMap {
        let machine = &inner.state.machine_state;
        let mut min_affinity = self.nodes.len() as u32;
        let mut masks = Vec::new();
        let table = |n: u32, resource: &str| {
            machine
                .get(&i64::from(n))
                .and_then(|s| s.memory_map.get(resource))
        };
        iterate_bitmasks(&self.nodes, |mask| {
            let bits = mask.bits();
            let sum = |resource: &str, f: fn(&MemoryTable) -> u64| {
                bits.iter()
                    .filter_map(|&n| table(n, resource))
                    .map(f)
                    .fold(0u64, u64::saturating_add)
            };
            if requests
                .iter()
                .any(|(name, &size)| sum(name, |t| t.allocatable) < size)
            {
                return;
            }
            min_affinity = min_affinity.min(mask.count());
            let single = bits.len() == 1;
            for &n in &bits {
                let Some(s) = machine.get(&i64::from(n)) else {
                    return;
                };
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
            if requests.iter().any(|(name, &size)| {
                sum(name, |t| t.free).saturating_add(Self::reusable(inner, uid, mask, name)) < size
            }) {
                return;
            }
            masks.push(mask);
        });
        if masks.is_empty() {
            // Upstream leaves every resource out of the map when no mask fits.
            return HintMap::new();
        }
        let hints: Vec<TopologyHint> = masks
            .into_iter()
            .map(|mask| TopologyHint {
                affinity: Some(mask),
                preferred: mask.count() == min_affinity,
            })
            .collect();
        requests
            .keys()
            .map(|name| (name.clone(), Some(hints.clone())))
            .collect()
    }

    /// `updatePodReusableMemory`: a regular init container's blocks become reusable by the
    /// pod's app containers (the largest per mask and resource); an app container's blocks
    /// use them up. Other pods' entries are dropped (one pod is admitted at a time).
    fn update_reusable(inner: &mut Inner, pod: &Pod, c: &Container, blocks: &[Block]) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        inner.reusable.retain(|u, _| *u == uid);
        let init = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .and_then(|i| i.iter().find(|i| i.name == c.name));
        match init {
            Some(i) if !is_restartable_init(i) => {
                let pod_reusable = inner.reusable.entry(uid).or_default();
                for b in blocks {
                    let mask = mask_of(b.numa_affinity.as_deref().unwrap_or_default());
                    let r = pod_reusable
                        .entry(mask)
                        .or_default()
                        .entry(b.resource.clone())
                        .or_insert(0);
                    *r = (*r).max(b.size);
                }
            }
            Some(_) => {}
            None => {
                for b in blocks {
                    let mask = mask_of(b.numa_affinity.as_deref().unwrap_or_default());
                    if let Some(r) = inner
                        .reusable
                        .get_mut(&uid)
                        .and_then(|p| p.get_mut(&mask))
                        .and_then(|m| m.get_mut(&b.resource))
                    {
                        *r = r.saturating_sub(b.size);
                    }
                }
            }
        }
    }

    /// `updateInitContainersMemoryBlocks`: the regular init containers before `c` whose
    /// blocks (same resource, same nodes) `c` reused give up as much of their size, so the
    /// pod's blocks add up to what the machine state holds for it.
    fn shrink_init_blocks(inner: &mut Inner, pod: &Pod, c: &Container, blocks: &[Block]) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(inits) = pod.spec.as_ref().and_then(|s| s.init_containers.as_ref()) else {
            return;
        };
        for block in blocks {
            let mut size = block.size;
            for init in inits {
                if init.name == c.name || size == 0 {
                    break;
                }
                if is_restartable_init(init) {
                    continue;
                }
                let Some(Some(init_blocks)) = inner
                    .state
                    .assignments
                    .get_mut(&uid)
                    .and_then(|a| a.get_mut(&init.name))
                else {
                    continue;
                };
                for ib in init_blocks.iter_mut() {
                    if ib.size == 0
                        || ib.resource != block.resource
                        || mask_of(ib.numa_affinity.as_deref().unwrap_or_default())
                            != mask_of(block.numa_affinity.as_deref().unwrap_or_default())
                    {
                        continue;
                    }
                    let now = ib.size.min(size);
                    ib.size -= now;
                    size -= now;
                }
            }
        }
    }

    /// Frees the blocks of pod `uid` (`RemoveContainer` for each container).
    fn release(&self, uid: &str) {
        let mut inner = self.lock();
        inner.reusable.remove(uid);
        let Some(containers) = inner.state.assignments.remove(uid) else {
            return;
        };
        for b in containers.values().flatten().flatten() {
            give_back(&mut inner.state.machine_state, b);
        }
        self.store(&inner.state);
    }
}

impl HintProvider for MemoryManager {
    fn container_hints(&self, pod: &Pod, c: &Container) -> HintMap {
        if !self.static_policy || !is_guaranteed(pod) {
            return HintMap::new();
        }
        let requests = container_requests(c);
        if requests.is_empty() {
            return HintMap::new();
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let inner = self.lock();
        if let Some(blocks) = inner
            .state
            .assignments
            .get(&uid)
            .and_then(|a| a.get(&c.name))
        {
            // Regenerated from what the container has (`regenerateHints`).
            return regenerate_hints(blocks.as_deref().unwrap_or_default(), &requests)
                .unwrap_or_default();
        }
        self.calculate_hints(&inner, &uid, &requests)
    }

    fn pod_hints(&self, pod: &Pod) -> HintMap {
        if !self.static_policy || !is_guaranteed(pod) {
            return HintMap::new();
        }
        let requests = pod_requests(pod);
        if requests.is_empty() {
            return HintMap::new();
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let inner = self.lock();
        let containers = pod.spec.iter().flat_map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
        });
        for c in containers {
            if let Some(blocks) = inner
                .state
                .assignments
                .get(&uid)
                .and_then(|a| a.get(&c.name))
            {
                // Upstream compares the first allocated container's blocks with the pod's
                // requests: after a restart a multi-container pod has no preference.
                return regenerate_hints(blocks.as_deref().unwrap_or_default(), &requests)
                    .unwrap_or_default();
            }
        }
        self.calculate_hints(&inner, &uid, &requests)
    }

    fn allocate(&self, pod: &Pod, c: &Container, hint: TopologyHint) -> Result<(), String> {
        if !self.static_policy || !is_guaranteed(pod) {
            return Ok(());
        }
        let requests = container_requests(c);
        if requests.is_empty() {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut inner = self.lock();
        if let Some(blocks) = inner
            .state
            .assignments
            .get(&uid)
            .and_then(|a| a.get(&c.name))
            .cloned()
        {
            Self::update_reusable(&mut inner, pod, c, blocks.as_deref().unwrap_or_default());
            return Ok(());
        }
        let machine = &inner.state.machine_state;
        let satisfies = |m: BitMask| {
            requests.iter().all(|(name, &size)| {
                m.bits()
                    .iter()
                    .filter_map(|n| machine.get(&i64::from(*n)))
                    .filter_map(|s| s.memory_map.get(name))
                    .map(|t| t.free)
                    .fold(0u64, u64::saturating_add)
                    >= size
            })
        };
        // The merged hint, or the best of our own (`getDefaultHint`), made wide enough to
        // hold the requests (`extendTopologyManagerHint`: the best of our hints containing
        // it).
        let mut best = hint;
        if hint.affinity.is_none() {
            let default = find_best_hint(&memory_hints(&self.calculate_hints(
                &inner, &uid, &requests,
            )))
            .ok_or("[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available")?;
            if !default.preferred && hint.preferred {
                return Err("[memorymanager] failed to find the default preferred hint".into());
            }
            best = default;
        }
        let mask = best.affinity.unwrap_or(BitMask::EMPTY);
        if !satisfies(mask) {
            let containing: Vec<TopologyHint> =
                memory_hints(&self.calculate_hints(&inner, &uid, &requests))
                    .into_iter()
                    .filter(|h| h.affinity.is_some_and(|a| a.and(mask) == mask))
                    .collect();
            let extended = find_best_hint(&containing).ok_or(
                "[memorymanager] failed to find NUMA nodes to extend the current topology hint",
            )?;
            if !extended.preferred && best.preferred {
                return Err("[memorymanager] failed to find the extended preferred hint".into());
            }
            best = extended;
        }
        let mask = best.affinity.unwrap_or(BitMask::EMPTY);
        let bits: Vec<i64> = mask.bits().into_iter().map(i64::from).collect();
        // `isAffinityViolatingNUMAAllocations`: no node in both a single-node and a
        // multi-node allocation, nor in two groups.
        if bits.len() > 1 {
            let mut sorted = bits.clone();
            sorted.sort_unstable();
            for n in &bits {
                let Some(s) = inner.state.machine_state.get(n) else {
                    continue;
                };
                let mut cells = s.cells.clone().unwrap_or_default();
                cells.sort_unstable();
                if s.number_of_assignments > 0 && (cells.len() == 1 || cells != sorted) {
                    return Err(
                        "[memorymanager] preferred hint violates NUMA node allocation".into(),
                    );
                }
            }
        }
        let mut blocks = Vec::new();
        for (name, &size) in &requests {
            blocks.push(Block {
                numa_affinity: Some(bits.clone()),
                resource: name.clone(),
                size,
            });
            let reuse = Self::reusable(&inner, &uid, mask, name);
            take(
                &mut inner.state.machine_state,
                &bits,
                name,
                size.saturating_sub(reuse),
            );
        }
        Self::update_reusable(&mut inner, pod, c, &blocks);
        inner
            .state
            .assignments
            .entry(uid.clone())
            .or_default()
            .insert(c.name.clone(), Some(blocks.clone()));
        Self::shrink_init_blocks(&mut inner, pod, c, &blocks);
        info!(pod = %uid, container = %c.name, numa = %mask, ?requests, "memory manager: memory allocated");
        self.store(&inner.state);
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
            &Requests::from([("memory".to_string(), GI)]),
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
            &Requests::from([("memory".to_string(), 200 << 20)]),
            CheckpointManager::new(dir.path()).expect("cp"),
        )
        .err()
        .expect("refused");
        assert_eq!(
            e,
            "the total amount \"104857600\" of type \"memory\" is not equal to the value \"209715200\" determined by Node Allocatable feature"
        );
        assert_eq!(
            parse_reserved_memory("0:cpu=1"),
            Err("invalid configuration: the limit type \"cpu\" for NUMA node 0 is not supported, only [memory hugepages-<HugePageSize>] is accepted".to_string())
        );
        assert!(parse_reserved_memory("x:memory=1Gi").is_err());
        assert!(parse_reserved_memory("0:memory=0").is_err(), "zero");
        assert!(
            parse_reserved_memory("0:memory=1Gi;0:memory=1Gi").is_err(),
            "a resource twice on a node"
        );
        assert_eq!(
            parse_reserved_memory("0:memory=1Gi,hugepages-2Mi=4Mi;1:hugepages-1Gi=1Gi"),
            Ok(ReservedMemory::from([
                (
                    0,
                    Requests::from([
                        ("hugepages-2Mi".to_string(), 4 << 20),
                        ("memory".to_string(), GI)
                    ])
                ),
                (1, Requests::from([("hugepages-1Gi".to_string(), GI)])),
            ]))
        );
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

    const MI: u64 = 1 << 20;

    fn guaranteed(name: &str, memory: &str, hugepages_2mi: Option<&str>) -> serde_json::Value {
        let mut r = serde_json::json!({"cpu": "1", "memory": memory});
        if let Some(h) = hugepages_2mi {
            r["hugepages-2Mi"] = serde_json::json!(h);
        }
        serde_json::json!({"name": name, "resources": {"requests": r, "limits": r}})
    }

    fn pod_of(uid: &str, init: Vec<serde_json::Value>, apps: Vec<serde_json::Value>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"initContainers": init, "containers": apps}
        }))
        .expect("pod")
    }

    /// Two nodes of 4 GiB; node 0 has 512 pages of 2 MiB (1 GiB), node 1 has 128 (256 MiB),
    /// both one 1 GiB page.
    fn hugepage_machine() -> Machine {
        let mut m = machine();
        for (node, count) in [(0, 512), (1, 128)] {
            m.numa_hugepages.insert(
                node,
                vec![
                    crate::machine::HugePages {
                        page_size: 2 * MI,
                        count,
                    },
                    crate::machine::HugePages {
                        page_size: GI,
                        count: 1,
                    },
                ],
            );
        }
        m
    }

    fn topology(m: &Arc<MemoryManager>, policy: Policy, scope: Scope) -> TopologyManager {
        let provider: Arc<dyn HintProvider> = m.clone();
        TopologyManager::new(policy, scope, vec![0, 1], vec![provider]).expect("tm")
    }

    #[test]
    fn hugepages_are_tables_blocks_and_hints_beside_memory() {
        let dir = tempfile::tempdir().expect("tmp");
        let reserved = parse_reserved_memory("0:memory=512Mi,hugepages-2Mi=128Mi;1:memory=512Mi")
            .expect("flag");
        let node_reserved = Requests::from([
            ("memory".to_string(), GI),
            ("hugepages-2Mi".to_string(), 128 * MI),
        ]);
        let new = |dir: &std::path::Path| {
            MemoryManager::new(
                POLICY_STATIC,
                &hugepage_machine(),
                &reserved,
                &node_reserved,
                CheckpointManager::new(dir).expect("cp"),
            )
        };
        // The hugepages reserved per node must add up to the node's hugepage reservation
        // too.
        let e = MemoryManager::new(
            POLICY_STATIC,
            &hugepage_machine(),
            &reserved,
            &Requests::from([("memory".to_string(), GI)]),
            CheckpointManager::new(dir.path()).expect("cp"),
        )
        .err()
        .expect("refused");
        assert_eq!(
            e,
            "the total amount \"134217728\" of type \"hugepages-2Mi\" is not equal to the value \"0\" determined by Node Allocatable feature"
        );
        let m = Arc::new(new(dir.path()).expect("static"));
        let st = m.machine_state();
        let t = |n: i64, r: &str| st[&n].memory_map[r].clone();
        assert_eq!(
            t(0, "hugepages-2Mi"),
            MemoryTable {
                total_mem_size: GI,
                system_reserved: 128 * MI,
                allocatable: 896 * MI,
                reserved: 0,
                free: 896 * MI
            }
        );
        assert_eq!(t(1, "hugepages-1Gi").allocatable, GI);
        // Memory's allocatable leaves out the node's pools: 4 GiB - 512 MiB - 1 GiB - 1 GiB.
        assert_eq!(t(0, "memory").allocatable, 4 * GI - 512 * MI - 2 * GI);
        assert_eq!(
            t(1, "memory").allocatable,
            4 * GI - 512 * MI - 256 * MI - GI
        );

        // 512 MiB of 2 MiB pages fit node 0 only: the same masks for both resources.
        let p = pod_of("huge", vec![], vec![guaranteed("c", "1Gi", Some("512Mi"))]);
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let hints = m.container_hints(&p, c);
        assert_eq!(masks(&hints), vec![(vec![0], true), (vec![0, 1], false)]);
        assert_eq!(hints["hugepages-2Mi"], hints["memory"]);
        let tm = topology(&m, Policy::SingleNumaNode, Scope::Container);
        tm.admit(&p).expect("admitted");
        assert_eq!(
            m.blocks("huge", "c"),
            Some(vec![
                Block {
                    numa_affinity: Some(vec![0]),
                    resource: "hugepages-2Mi".into(),
                    size: 512 * MI
                },
                Block {
                    numa_affinity: Some(vec![0]),
                    resource: "memory".into(),
                    size: GI
                },
            ])
        );
        assert_eq!(m.numa_nodes_for("huge", "c"), Some(vec![0]));
        assert_eq!(
            m.machine_state()[&0].memory_map["hugepages-2Mi"].free,
            384 * MI
        );
        assert_eq!(
            m.machine_state()[&0].number_of_assignments,
            2,
            "one per block"
        );
        // What node 0 has left (384 MiB) and node 1's 256 MiB are no single node's 512 MiB,
        // and node 0 cannot join a group: no hint at all, which the merge reads as no
        // preference; the allocation then finds no place (upstream's sequence).
        let again = pod_of("again", vec![], vec![guaranteed("c", "1Gi", Some("512Mi"))]);
        assert_eq!(masks(&m.container_hints(&again, c)), vec![]);
        let e = tm.admit(&again).expect_err("refused");
        assert_eq!(e.reason, UNEXPECTED_ADMISSION_ERROR);
        assert!(m.blocks("again", "c").is_none());
        // The checkpoint keeps the hugepage blocks and tables: a restart restores them and
        // validates the machine state against them.
        let restored = new(dir.path()).expect("restored");
        assert_eq!(restored.machine_state(), m.machine_state());
        let file = std::fs::read_to_string(dir.path().join(state::MEMORY_MANAGER_STATE_FILE))
            .expect("checkpoint");
        assert!(
            file.contains(r#"{"numaAffinity":[0],"type":"hugepages-2Mi","size":536870912}"#),
            "{file}"
        );
        restored.release_pod("huge");
        assert_eq!(
            restored.machine_state()[&0].memory_map["hugepages-2Mi"].free,
            896 * MI
        );
        assert_eq!(
            restored.machine_state(),
            initial_state(&hugepage_machine(), &reserved)
        );
    }

    #[test]
    fn app_containers_reuse_init_containers_memory_but_not_a_sidecar_s() {
        // 3.5 GiB allocatable per node. The init container takes 2 GiB of node 0; the app
        // container's 2 GiB reuses it there: node 0 keeps 1.5 GiB free, node 1 all.
        let dir = tempfile::tempdir().expect("tmp");
        let m = Arc::new(manager(dir.path()));
        let tm = topology(&m, Policy::Restricted, Scope::Container);
        let p = pod_of(
            "reuse",
            vec![guaranteed("init", "2Gi", None)],
            vec![guaranteed("app", "2Gi", None)],
        );
        tm.admit(&p).expect("admitted");
        let free = |m: &MemoryManager, n: i64| m.machine_state()[&n].memory_map["memory"].free;
        assert_eq!(m.numa_nodes_for("reuse", "app"), Some(vec![0]));
        assert_eq!((free(&m, 0), free(&m, 1)), (3 * GI / 2, 7 * GI / 2));
        // The init container's block gave up what was reused: the blocks add up to the
        // 2 GiB the machine state holds.
        assert_eq!(
            m.blocks("reuse", "init").map(|b| b[0].size),
            Some(0),
            "{:?}",
            m.blocks("reuse", "init")
        );
        assert_eq!(m.blocks("reuse", "app").map(|b| b[0].size), Some(2 * GI));
        // A restart validates that state.
        drop(tm);
        let restored = manager(dir.path());
        assert_eq!(free(&restored, 0), 3 * GI / 2);
        restored.release_pod("reuse");
        assert_eq!(free(&restored, 0), 7 * GI / 2);

        // A sidecar keeps running: the app container cannot have its memory, so it goes to
        // node 1.
        let dir = tempfile::tempdir().expect("tmp");
        let m = Arc::new(manager(dir.path()));
        let tm = topology(&m, Policy::Restricted, Scope::Container);
        let mut sidecar = guaranteed("sidecar", "2Gi", None);
        sidecar["restartPolicy"] = serde_json::json!("Always");
        let p = pod_of(
            "sidecar",
            vec![sidecar],
            vec![guaranteed("app", "2Gi", None)],
        );
        tm.admit(&p).expect("admitted");
        assert_eq!(m.numa_nodes_for("sidecar", "sidecar"), Some(vec![0]));
        assert_eq!(m.numa_nodes_for("sidecar", "app"), Some(vec![1]));
        assert_eq!((free(&m, 0), free(&m, 1)), (3 * GI / 2, 3 * GI / 2));
        assert_eq!(
            m.blocks("sidecar", "sidecar").map(|b| b[0].size),
            Some(2 * GI)
        );
    }

    #[test]
    fn pod_scope_hints_keep_the_pod_s_containers_on_one_node() {
        let requests = pod_requests(&pod_of(
            "sum",
            vec![
                guaranteed("side", "1Gi", None)
                    .as_object()
                    .cloned()
                    .map(|mut o| {
                        o.insert("restartPolicy".into(), serde_json::json!("Always"));
                        serde_json::Value::Object(o)
                    })
                    .expect("object"),
                guaranteed("big-init", "3Gi", None),
            ],
            vec![guaranteed("a", "1Gi", None), guaranteed("b", "512Mi", None)],
        ));
        // The largest init container with the sidecar before it (4 GiB) beats the app
        // containers with the sidecar (2.5 GiB).
        assert_eq!(requests, Requests::from([("memory".to_string(), 4 * GI)]));

        // 1 GiB already on node 0 (2.5 GiB free there, 3.5 GiB on node 1). A pod of two
        // 1.5 GiB containers: per container the first lands on node 0 and the second no
        // longer fits there; per pod the 3 GiB go to node 1 together.
        for (scope, want) in [
            (Scope::Container, [Some(vec![0]), Some(vec![1])]),
            (Scope::Pod, [Some(vec![1]), Some(vec![1])]),
        ] {
            let dir = tempfile::tempdir().expect("tmp");
            let m = Arc::new(manager(dir.path()));
            let tm = topology(&m, Policy::Restricted, scope);
            tm.admit(&pod("first", "1Gi")).expect("admitted");
            let p = pod_of(
                "pair",
                vec![],
                vec![
                    guaranteed("a", "1536Mi", None),
                    guaranteed("b", "1536Mi", None),
                ],
            );
            if scope == Scope::Pod {
                assert_eq!(
                    masks(&m.pod_hints(&p)),
                    vec![(vec![1], true)],
                    "node 0 lacks 3 GiB, and holds a single-node block"
                );
            }
            tm.admit(&p).expect("admitted");
            assert_eq!(
                [m.numa_nodes_for("pair", "a"), m.numa_nodes_for("pair", "b")],
                want,
                "{scope:?}"
            );
        }
    }
}
