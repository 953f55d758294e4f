//! The CPU manager (upstream `pkg/kubelet/cm/cpumanager/`: `cpu_manager.go`,
//! `policy_none.go`, `policy_static.go`).
//!
//! `--cpu-manager-policy=none` (the default) leaves every container on every CPU. `static`
//! gives each container of a Guaranteed pod whose CPU request is a whole number that many
//! CPUs of its own; every other container runs on the shared pool (`defaultCpuSet`): all
//! CPUs minus the exclusive ones. The reserved CPUs (`--reserved-cpus`, or as many CPUs as
//! `--kube-reserved` + `--system-reserved` cpu rounded up, picked by topology) stay in the
//! shared pool and are never handed out exclusively, so the shared pool is never empty.
//!
//! The state is the `cpu_manager_state` checkpoint (`crate::checkpoint::cpu_manager`):
//! restored at start (a corrupt file, another policy's file or one that does not fit this
//! machine refuses the start), stored after every change. A container gets its cpuset at
//! creation (`LinuxContainerResources.cpuset_cpus`), and [`CpuManager::reconcile`] (every
//! `--cpu-manager-reconcile-period`, 10 s) frees the CPUs of containers whose pods are gone
//! and writes each running container's current set through CRI `UpdateContainerResources`,
//! which is how the shared pool's containers grow and shrink as exclusive CPUs come and go.
//!
//! As a topology hint provider it proposes the NUMA masks with enough free CPUs, preferred
//! when as narrow as the machine allows (`generateCPUTopologyHints`), and allocates inside
//! the merged mask first (`allocateCPUs`).

pub mod assignment;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::{info, warn};

use crate::checkpoint::CheckpointManager;
use crate::checkpoint::cpu_manager::{
    self as state, CpuManagerState, CpuSet, RestoreError, format_cpuset,
};
use crate::cm::topology::bitmask::iterate_bitmasks;
use crate::cm::topology::machine::Machine;
use crate::cm::topology::{HintMap, HintProvider, TopologyHint};
use crate::cri::{Cri, api};

pub use assignment::take_by_topology;

/// Upstream's default `--cpu-manager-reconcile-period` (`KubeletConfiguration`
/// `cpuManagerReconcilePeriod`, the node status update frequency, 10 s): how long a shared
/// container may still run on CPUs just given away exclusively, or miss CPUs just freed.
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(10);

/// The policy names as the flag and the checkpoint spell them.
pub const POLICY_NONE: &str = "none";
/// See [`POLICY_NONE`].
pub const POLICY_STATIC: &str = "static";

/// The resource name of the hints.
const RESOURCE_CPU: &str = "cpu";

/// What the static policy is configured with.
#[derive(Clone, Debug)]
pub struct StaticConfig {
    /// `--reserved-cpus`, when given.
    pub reserved_cpus: Option<CpuSet>,
    /// `--kube-reserved` + `--system-reserved` cpu, in millicores.
    pub reserved_milli: i64,
}

/// The static policy's fixed parts.
#[derive(Clone, Debug)]
struct StaticPolicy {
    reserved: CpuSet,
}

struct Inner {
    state: CpuManagerState,
    /// Pod UID -> CPUs of its init containers that its app containers may take again
    /// (`cpusToReuse`).
    reusable: HashMap<String, CpuSet>,
    /// Container ID -> the cpuset last written through CRI (`lastUpdateState`).
    last_update: HashMap<String, CpuSet>,
}

/// The CPU manager.
pub struct CpuManager {
    machine: Machine,
    policy: Option<StaticPolicy>,
    checkpoints: CheckpointManager,
    inner: Mutex<Inner>,
}

/// The Guaranteed CPU count of a container: its CPU request when the pod is Guaranteed and
/// the request a whole number, else 0 (`guaranteedCPUs`).
pub fn guaranteed_cpus(qos: &str, c: &Container) -> usize {
    if qos != "Guaranteed" {
        return 0;
    }
    let Some(q) = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(RESOURCE_CPU))
        .and_then(|q| skerry_api::validation::quantity::Quantity::parse(&q.0))
    else {
        return 0;
    };
    const NANO: i128 = 1_000_000_000;
    if q.0 <= 0 || q.0 % NANO != 0 {
        return 0;
    }
    usize::try_from(q.0 / NANO).unwrap_or(0)
}

fn qos(pod: &Pod) -> String {
    crate::kubelet::sandbox::qos_class(pod)
}

fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

impl CpuManager {
    /// The manager for `policy` (`none` or `static`) on `machine`, its state restored from
    /// `checkpoints` (`NewManager` + `Start`): refuses on a bad checkpoint or reservation.
    pub fn new(
        policy_name: &str,
        static_config: Option<StaticConfig>,
        machine: Machine,
        checkpoints: CheckpointManager,
    ) -> Result<CpuManager, String> {
        let policy = match (policy_name, static_config) {
            (POLICY_NONE, _) => None,
            (POLICY_STATIC, Some(cfg)) => Some(StaticPolicy {
                reserved: reserved_cpus(&machine, &cfg)?,
            }),
            (POLICY_STATIC, None) => {
                return Err(
                    "[cpumanager] unable to determine reserved CPU resources for static policy"
                        .into(),
                );
            }
            (other, _) => return Err(format!("unknown policy: \"{other}\"")),
        };
        let restored = state::restore(&checkpoints, policy_name, &HashMap::new())
            .map_err(|e: RestoreError| e.to_string())?;
        let mut st = match restored {
            state::Restored::Absent(s) | state::Restored::Checkpoint(s) => s,
        };
        if let Some(p) = &policy {
            validate_state(&machine, &p.reserved, &mut st)
                .map_err(|e| format!("start cpu manager error: {e}"))?;
            info!(reserved = %format_cpuset(&p.reserved), shared = %format_cpuset(&st.default_cpu_set), "cpu manager: static policy");
        }
        let m = CpuManager {
            machine,
            policy,
            checkpoints,
            inner: Mutex::new(Inner {
                state: st,
                reusable: HashMap::new(),
                last_update: HashMap::new(),
            }),
        };
        m.store(&m.lock().state);
        Ok(m)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn policy_name(&self) -> &'static str {
        if self.policy.is_some() {
            POLICY_STATIC
        } else {
            POLICY_NONE
        }
    }

    fn store(&self, st: &CpuManagerState) {
        if let Err(e) = state::store(&self.checkpoints, self.policy_name(), st) {
            warn!(error = %e, "cpu manager: storing the state checkpoint failed");
        }
    }

    /// Whether the static policy runs.
    pub fn is_static(&self) -> bool {
        self.policy.is_some()
    }

    /// The shared pool (`GetDefaultCPUSet`).
    pub fn shared_pool(&self) -> CpuSet {
        self.lock().state.default_cpu_set.clone()
    }

    /// The exclusive CPUs of a container, if it has some.
    pub fn exclusive(&self, uid: &str, container: &str) -> Option<CpuSet> {
        self.lock()
            .state
            .assignments
            .get(uid)?
            .get(container)
            .cloned()
    }

    /// The CPUs the container may run on (`GetCPUSetOrDefault`), `None` under `none` (the
    /// container's cpuset is left alone).
    pub fn cpuset_for(&self, uid: &str, container: &str) -> Option<CpuSet> {
        self.policy.as_ref()?;
        let inner = self.lock();
        let set = inner
            .state
            .assignments
            .get(uid)
            .and_then(|c| c.get(container))
            .unwrap_or(&inner.state.default_cpu_set);
        Some(set.clone())
    }

    /// The CPUs free for exclusive use (`GetAvailableCPUs`): the shared pool minus the
    /// reserved ones.
    fn available(&self, inner: &Inner, p: &StaticPolicy) -> CpuSet {
        inner
            .state
            .default_cpu_set
            .difference(&p.reserved)
            .copied()
            .collect()
    }

    /// `generateCPUTopologyHints`.
    fn generate_hints(
        &self,
        available: &CpuSet,
        reusable: &CpuSet,
        request: usize,
    ) -> Vec<TopologyHint> {
        let nodes = self.machine.numa_nodes();
        let mut min_affinity = nodes.len() as u32;
        let mut hints = Vec::new();
        iterate_bitmasks(&nodes, |mask| {
            let in_mask = self.machine.cpus_in_numa(&mask.bits()).len();
            if in_mask >= request && mask.count() < min_affinity {
                min_affinity = mask.count();
            }
            let numa = |c: &u32| self.machine.cpu(*c).map_or(0, |i| i.numa);
            if reusable.iter().any(|c| !mask.is_set(numa(c))) {
                return;
            }
            let matching =
                reusable.len() + available.iter().filter(|c| mask.is_set(numa(c))).count();
            if matching >= request {
                hints.push(TopologyHint {
                    affinity: Some(mask),
                    preferred: false,
                });
            }
        });
        for h in &mut hints {
            h.preferred = h.affinity.is_some_and(|a| a.count() == min_affinity);
        }
        hints
    }

    /// Takes `n` CPUs, inside `hint`'s NUMA nodes first (`allocateCPUs`), out of the shared
    /// pool.
    fn allocate_cpus(
        &self,
        inner: &mut Inner,
        p: &StaticPolicy,
        n: usize,
        hint: TopologyHint,
        reusable: &CpuSet,
    ) -> Result<CpuSet, String> {
        let allocatable: CpuSet = self.available(inner, p).union(reusable).copied().collect();
        let mut result = CpuSet::new();
        if let Some(mask) = hint.affinity {
            let aligned: CpuSet = self
                .machine
                .cpus_in_numa(&mask.bits())
                .intersection(&allocatable)
                .copied()
                .collect();
            let k = n.min(aligned.len());
            result = take_by_topology(&self.machine, &aligned, k)?;
        }
        let rest: CpuSet = allocatable.difference(&result).copied().collect();
        result.extend(take_by_topology(&self.machine, &rest, n - result.len())?);
        inner.state.default_cpu_set = inner
            .state
            .default_cpu_set
            .difference(&result)
            .copied()
            .collect();
        Ok(result)
    }

    /// `updateCPUsToReuse`: an init container's CPUs may be taken again by the pod's app
    /// containers (it has finished by then); an app container's are not.
    fn update_reuse(inner: &mut Inner, pod: &Pod, c: &Container, cpus: &CpuSet) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        inner.reusable.retain(|u, _| *u == uid);
        let reuse = inner.reusable.entry(uid).or_default();
        let init = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .and_then(|i| i.iter().find(|i| i.name == c.name));
        match init {
            Some(i) if !is_restartable_init(i) => reuse.extend(cpus.iter().copied()),
            Some(_) => {}
            None => reuse.retain(|x| !cpus.contains(x)),
        }
    }

    /// Frees a container's exclusive CPUs (`RemoveContainer`): back to the shared pool,
    /// but for those a sibling still holds (an app container reusing an init container's).
    fn remove_container(inner: &mut Inner, uid: &str, name: &str) {
        let Some(pod) = inner.state.assignments.get_mut(uid) else {
            return;
        };
        let Some(cpus) = pod.remove(name) else {
            return;
        };
        let in_use: CpuSet = pod.values().flatten().copied().collect();
        if pod.is_empty() {
            inner.state.assignments.remove(uid);
        }
        inner
            .state
            .default_cpu_set
            .extend(cpus.difference(&in_use).copied());
    }

    /// Frees the exclusive CPUs of every container no active pod has (`removeStaleState`);
    /// `active` is (pod UID, container name) of every container of the active pods.
    pub fn remove_stale_state(&self, active: &HashSet<(String, String)>) {
        let mut inner = self.lock();
        let stale: Vec<(String, String)> = inner
            .state
            .assignments
            .iter()
            .flat_map(|(uid, c)| c.keys().map(move |n| (uid.clone(), n.clone())))
            .filter(|k| !active.contains(k))
            .collect();
        if stale.is_empty() {
            return;
        }
        for (uid, name) in &stale {
            info!(pod = %uid, container = %name, "cpu manager: freeing the CPUs of a container no active pod has");
            Self::remove_container(&mut inner, uid, name);
        }
        self.store(&inner.state);
    }

    /// One reconcile pass (`reconcileState`): stale state freed, then every running
    /// container of the active pods given its current CPUs through CRI
    /// `UpdateContainerResources` when they changed since the last write. Returns how many
    /// containers were updated.
    pub async fn reconcile(&self, cri: &Cri, active: &[Arc<Pod>]) -> usize {
        if self.policy.is_none() {
            return 0;
        }
        let mut keys = HashSet::new();
        let mut uids = HashSet::new();
        for p in active {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if let Some(s) = &p.spec {
                for c in s
                    .init_containers
                    .iter()
                    .flatten()
                    .chain(s.containers.iter())
                {
                    keys.insert((uid.clone(), c.name.clone()));
                }
            }
            uids.insert(uid);
        }
        self.remove_stale_state(&keys);
        let containers = match cri.list_containers(None).await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "cpu manager: listing containers to reconcile failed");
                return 0;
            }
        };
        use crate::kubelet::runtime::{LABEL_CONTAINER_NAME, LABEL_POD_UID};
        let running = api::ContainerState::ContainerRunning as i32;
        let mut updated = 0;
        let mut seen = HashSet::new();
        for c in containers {
            let (Some(uid), Some(name)) = (
                c.labels.get(LABEL_POD_UID),
                c.labels.get(LABEL_CONTAINER_NAME),
            ) else {
                continue;
            };
            if c.state != running || !uids.contains(uid) {
                continue;
            }
            seen.insert(c.id.clone());
            let Some(cpus) = self.cpuset_for(uid, name).filter(|s| !s.is_empty()) else {
                continue;
            };
            if self.lock().last_update.get(&c.id) == Some(&cpus) {
                continue;
            }
            let resources = api::LinuxContainerResources {
                cpuset_cpus: format_cpuset(&cpus),
                ..Default::default()
            };
            match cri.update_container_resources(&c.id, resources).await {
                Ok(()) => {
                    info!(pod = %uid, container = %name, cpuset = %format_cpuset(&cpus), "cpu manager: container cpuset updated");
                    self.lock().last_update.insert(c.id.clone(), cpus);
                    updated += 1;
                }
                Err(e) => {
                    warn!(pod = %uid, container = %name, error = %e, "cpu manager: updating the container's cpuset failed");
                }
            }
        }
        self.lock().last_update.retain(|id, _| seen.contains(id));
        updated
    }

    /// Notes that the container `id` was created with `cpus` (no update needed until they
    /// change).
    pub fn created(&self, id: &str, cpus: &CpuSet) {
        self.lock().last_update.insert(id.to_string(), cpus.clone());
    }
}

impl HintProvider for CpuManager {
    fn container_hints(&self, pod: &Pod, c: &Container) -> HintMap {
        let Some(p) = &self.policy else {
            return HintMap::new();
        };
        let requested = guaranteed_cpus(&qos(pod), c);
        if requested == 0 {
            return HintMap::new();
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let inner = self.lock();
        let hints = match inner
            .state
            .assignments
            .get(&uid)
            .and_then(|a| a.get(&c.name))
        {
            Some(allocated) if allocated.len() != requested => vec![],
            Some(allocated) => self.generate_hints(allocated, &CpuSet::new(), requested),
            None => {
                let reusable = inner.reusable.get(&uid).cloned().unwrap_or_default();
                self.generate_hints(&self.available(&inner, p), &reusable, requested)
            }
        };
        HintMap::from([(RESOURCE_CPU.to_string(), Some(hints))])
    }

    fn pod_hints(&self, pod: &Pod) -> HintMap {
        let Some(p) = &self.policy else {
            return HintMap::new();
        };
        let Some(spec) = pod.spec.as_ref() else {
            return HintMap::new();
        };
        // `podGuaranteedCPUs`: the app containers' sum (with restartable init containers),
        // at least the largest init container.
        let q = qos(pod);
        let mut sum = 0;
        let mut init_max = 0;
        for i in spec.init_containers.iter().flatten() {
            if is_restartable_init(i) {
                sum += guaranteed_cpus(&q, i);
            } else {
                init_max = init_max.max(sum + guaranteed_cpus(&q, i));
            }
        }
        sum += spec
            .containers
            .iter()
            .map(|c| guaranteed_cpus(&q, c))
            .sum::<usize>();
        let requested = sum.max(init_max);
        if requested == 0 {
            return HintMap::new();
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let inner = self.lock();
        let assigned: CpuSet = inner
            .state
            .assignments
            .get(&uid)
            .map(|a| a.values().flatten().copied().collect())
            .unwrap_or_default();
        let hints = if !assigned.is_empty() {
            if assigned.len() != requested {
                vec![]
            } else {
                self.generate_hints(&assigned, &CpuSet::new(), requested)
            }
        } else {
            let reusable = inner.reusable.get(&uid).cloned().unwrap_or_default();
            self.generate_hints(&self.available(&inner, p), &reusable, requested)
        };
        HintMap::from([(RESOURCE_CPU.to_string(), Some(hints))])
    }

    fn allocate(&self, pod: &Pod, c: &Container, hint: TopologyHint) -> Result<(), String> {
        let Some(p) = &self.policy else {
            return Ok(());
        };
        let n = guaranteed_cpus(&qos(pod), c);
        if n == 0 {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut inner = self.lock();
        if let Some(cpus) = inner
            .state
            .assignments
            .get(&uid)
            .and_then(|a| a.get(&c.name))
            .cloned()
        {
            Self::update_reuse(&mut inner, pod, c, &cpus);
            return Ok(());
        }
        let reusable = inner.reusable.get(&uid).cloned().unwrap_or_default();
        let cpus = self.allocate_cpus(&mut inner, p, n, hint, &reusable)?;
        info!(pod = %uid, container = %c.name, cpuset = %format_cpuset(&cpus), "cpu manager: exclusive CPUs allocated");
        inner
            .state
            .assignments
            .entry(uid)
            .or_default()
            .insert(c.name.clone(), cpus.clone());
        Self::update_reuse(&mut inner, pod, c, &cpus);
        self.store(&inner.state);
        Ok(())
    }

    fn release_pod(&self, uid: &str) {
        let mut inner = self.lock();
        let names: Vec<String> = inner
            .state
            .assignments
            .get(uid)
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default();
        if names.is_empty() {
            return;
        }
        for n in names {
            Self::remove_container(&mut inner, uid, &n);
        }
        inner.reusable.remove(uid);
        self.store(&inner.state);
    }
}

/// The reserved CPUs (`NewStaticPolicy`): `--reserved-cpus` as given, else as many CPUs as
/// the CPU reservation rounded up, picked by topology; the static policy refuses a zero
/// reservation (the shared pool could then be taken whole).
fn reserved_cpus(machine: &Machine, cfg: &StaticConfig) -> Result<CpuSet, String> {
    if cfg.reserved_milli <= 0 && cfg.reserved_cpus.as_ref().is_none_or(|s| s.is_empty()) {
        return Err("[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero".into());
    }
    let all = machine.all_cpus();
    let reserved = match &cfg.reserved_cpus {
        Some(set) if !set.is_empty() => {
            if !set.is_subset(&all) {
                return Err(format!(
                    "[cpumanager] unable to reserve the required amount of CPUs (not all of {} are on this machine: {})",
                    format_cpuset(set),
                    format_cpuset(&all)
                ));
            }
            set.clone()
        }
        _ => {
            const MILLI: i64 = 1000;
            let n = usize::try_from((cfg.reserved_milli + MILLI - 1) / MILLI).unwrap_or(usize::MAX);
            take_by_topology(machine, &all, n).map_err(|e| {
                format!("[cpumanager] unable to reserve the required amount of CPUs: {e}")
            })?
        }
    };
    Ok(reserved)
}

/// `validateState`: a fresh state gets every CPU as the shared pool; a restored one must
/// keep the reserved CPUs shared, no exclusive CPU shared, and cover exactly this machine.
fn validate_state(
    machine: &Machine,
    reserved: &CpuSet,
    st: &mut CpuManagerState,
) -> Result<(), String> {
    let all = machine.all_cpus();
    if st.default_cpu_set.is_empty() {
        if !st.assignments.is_empty() {
            return Err("default cpuset cannot be empty".into());
        }
        st.default_cpu_set = all;
        return Ok(());
    }
    if !reserved.is_subset(&st.default_cpu_set) {
        return Err(format!(
            "not all reserved cpus: \"{}\" are present in defaultCpuSet: \"{}\"",
            format_cpuset(reserved),
            format_cpuset(&st.default_cpu_set)
        ));
    }
    let mut known = st.default_cpu_set.clone();
    for (pod, containers) in &st.assignments {
        for (name, cpus) in containers {
            if !cpus.is_disjoint(&st.default_cpu_set) {
                return Err(format!(
                    "pod: {pod}, container: {name} cpuset: \"{}\" overlaps with default cpuset \"{}\"",
                    format_cpuset(cpus),
                    format_cpuset(&st.default_cpu_set)
                ));
            }
            known.extend(cpus.iter().copied());
        }
    }
    if known != all {
        return Err(format!(
            "current set of available CPUs \"{}\" doesn't match with CPUs in state \"{}\"",
            format_cpuset(&all),
            format_cpuset(&known)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
