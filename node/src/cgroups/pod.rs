//! What the kubelet puts in its cgroups (upstream `pkg/kubelet/cm`): the node-allocatable
//! cgroup `kubepods` capped at allocatable (`node_container_manager_linux.go`
//! `enforceNodeAllocatableCgroups`, `getCgroupConfig`), the QoS cgroups `burstable` and
//! `besteffort` below it (`qos_container_manager_linux.go` `Start`, `UpdateCgroups`,
//! `setCPUCgroupConfig`), and one cgroup per pod under its QoS cgroup
//! (`pod_container_manager_linux.go` `EnsureExists`, `Destroy`; `helpers_linux.go`
//! `ResourceConfigForPod`). Guaranteed pods sit directly in `kubepods`.
//!
//! The QoS cgroups get CPU shares only: `besteffort` the minimum, so best-effort pods run
//! on what others leave; `burstable` the shares of its pods' summed CPU requests, rewritten
//! as pods come and go. Memory QoS (`memory.min` / `memory.high` reservations) is off, as
//! upstream's default.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, Pod};
use skerry_api::pod::resources::{
    PodResourcesOptions, RESOURCE_CPU, RESOURCE_MEMORY, ResourceList, aggregate_containers,
    pod_requests, resource_list,
};
use skerry_api::validation::quantity::Quantity;

use super::{
    CgroupError, CgroupManager, MIN_SHARES, QUOTA_PERIOD, ResourceConfig, milli_cpu_to_quota,
    milli_cpu_to_shares,
};

/// The QoS class names (`v1.PodQOSGuaranteed`...).
pub const GUARANTEED: &str = "Guaranteed";
/// See [`GUARANTEED`].
pub const BURSTABLE: &str = "Burstable";
/// See [`GUARANTEED`].
pub const BEST_EFFORT: &str = "BestEffort";
/// The QoS cgroups' names under `kubepods` (`qos_container_manager_linux.go`).
pub const BURSTABLE_CGROUP: &str = "burstable";
/// See [`BURSTABLE_CGROUP`].
pub const BEST_EFFORT_CGROUP: &str = "besteffort";
/// The `--enforce-node-allocatable` value that caps `kubepods` at allocatable
/// (`kubetypes.NodeAllocatableEnforcementKey`).
pub const ENFORCE_PODS: &str = "pods";
/// The pid resource of the node's internal capacity (`pidlimit.PIDs`).
pub const RESOURCE_PID: &str = "pid";

/// Milli-units, rounded up (`Quantity.MilliValue`).
fn milli(q: Quantity) -> i64 {
    i64::try_from((q.0 + 999_999).div_euclid(1_000_000)).unwrap_or(i64::MAX)
}

/// Whole units, rounded up (`Quantity.Value`).
fn units(q: Quantity) -> i64 {
    i64::try_from((q.0 + 999_999_999).div_euclid(1_000_000_000)).unwrap_or(i64::MAX)
}

fn limits_of(c: &Container) -> ResourceList {
    resource_list(c.resources.as_ref().and_then(|r| r.limits.as_ref()))
}

/// `resource.PodLimits` (component-helpers, 1.32): the app containers' limits add up, each
/// init container's counts with the sidecars started before it and the pod needs the
/// largest, sidecars add to the app containers; `spec.overhead` is added to the resources
/// that have a limit. `declared(limits)` sees each container's effective limits, as
/// upstream's `ContainerFn`.
pub fn pod_limits(pod: &Pod, declared: impl FnMut(&ResourceList)) -> ResourceList {
    let Some(spec) = pod.spec.as_ref() else {
        return ResourceList::new();
    };
    let mut limits = aggregate_containers(spec, limits_of, declared);
    for (name, q) in resource_list(spec.overhead.as_ref()) {
        if let Some(l) = limits.get_mut(&name) {
            l.0 = l.0.saturating_add(q.0);
        }
    }
    limits
}

/// `ResourceConfigForPod` (CFS quota enforced, the default period, no memory QoS) plus the
/// pod's pids limit: shares from the CPU requests for every class (2 for BestEffort); a
/// Guaranteed pod also gets its CPU quota and memory limit; a Burstable pod gets the quota
/// only when every container declares a CPU limit and the memory limit only when every
/// container declares one. `pod_pids_limit` > 0 caps the pod's processes
/// (`--pod-max-pids`).
pub fn resource_config_for_pod(pod: &Pod, qos: &str, pod_pids_limit: i64) -> ResourceConfig {
    let requests = pod_requests(pod, &PodResourcesOptions::default());
    let mut cpu_declared = true;
    let mut memory_declared = true;
    let limits = pod_limits(pod, |l| {
        cpu_declared &= l.get(RESOURCE_CPU).is_some_and(|q| q.0 != 0);
        memory_declared &= l.get(RESOURCE_MEMORY).is_some_and(|q| q.0 != 0);
    });
    let cpu_requests = requests.get(RESOURCE_CPU).map_or(0, |q| milli(*q));
    let cpu_limits = limits.get(RESOURCE_CPU).map_or(0, |q| milli(*q));
    let memory_limits = limits.get(RESOURCE_MEMORY).map_or(0, |q| units(*q));
    let shares = milli_cpu_to_shares(cpu_requests);
    let quota = milli_cpu_to_quota(cpu_limits, QUOTA_PERIOD);
    let mut config = ResourceConfig::default();
    match qos {
        GUARANTEED => {
            config.cpu_shares = Some(shares);
            config.cpu_quota = Some(quota);
            config.cpu_period = Some(QUOTA_PERIOD);
            config.memory = Some(memory_limits);
        }
        BURSTABLE => {
            config.cpu_shares = Some(shares);
            if cpu_declared {
                config.cpu_quota = Some(quota);
                config.cpu_period = Some(QUOTA_PERIOD);
            }
            if memory_declared {
                config.memory = Some(memory_limits);
            }
        }
        _ => config.cpu_shares = Some(MIN_SHARES),
    }
    if pod_pids_limit > 0 {
        config.pids_limit = Some(pod_pids_limit);
    }
    config.hugepage_limits = Some(hugepage_limits(&requests, super::hugepage_sizes()));
    config
}

/// The hugepage limits of a resource list in bytes by page size (`HugePageLimits` of the pod's
/// requests, which validation makes equal to its limits), and 0 for every other size the host
/// has (`cgroup_manager_linux.go` `toResources`: "for each page size omitted, limit to 0").
pub fn hugepage_limits(list: &ResourceList, host_sizes: &[String]) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = host_sizes.iter().map(|s| (s.clone(), 0)).collect();
    for (name, amount) in list {
        let Some(size) = hugepage_size(name) else {
            continue;
        };
        let bytes = u64::try_from(units(*amount)).unwrap_or(0);
        let total = out.entry(size).or_insert(0);
        *total = total.saturating_add(bytes);
    }
    out
}

/// The page size of a `hugepages-<size>` resource as the kernel names it (`2MB`); `None` for
/// another resource (`v1helper.HugePageSizeFromResourceName`, `HugePageUnitSizeFromByteSize`).
pub fn hugepage_size(resource: &str) -> Option<String> {
    let size = Quantity::parse(resource.strip_prefix("hugepages-")?)?;
    super::hugepage_unit_size(u64::try_from(units(size)).ok()?)
}

/// `getCgroupConfig` of the node-allocatable cgroup: memory in bytes, CPU as shares, pids
/// (nothing for a resource the list lacks), and the hugepage limits: each pool's allocatable
/// bytes, 0 for a page size the host has and the list lacks (`HugePageLimits`, then
/// `toResources`), so the pods together never take the hugepages kept for the system.
pub fn node_allocatable_config(allocatable: &ResourceList) -> ResourceConfig {
    ResourceConfig {
        cpu_shares: allocatable
            .get(RESOURCE_CPU)
            .map(|q| milli_cpu_to_shares(milli(*q))),
        memory: allocatable.get(RESOURCE_MEMORY).map(|q| units(*q)),
        pids_limit: allocatable.get(RESOURCE_PID).map(|q| units(*q)),
        hugepage_limits: Some(hugepage_limits(allocatable, super::hugepage_sizes())),
        ..ResourceConfig::default()
    }
}

/// What `kubepods` is capped at (`getNodeAllocatableInternalAbsolute` when `pods` is
/// enforced, else the capacity): the internal capacity (the node's plus `pid`, the
/// kernel's `pid_max`) minus the kube and system reservations (not the eviction
/// thresholds: eviction keeps those free), never below zero, memory also minus the
/// hugepage pools.
pub fn node_allocatable_limits(
    capacity: &ResourceList,
    pid_max: Option<u64>,
    kube_reserved: &ResourceList,
    system_reserved: &ResourceList,
    enforce_pods: bool,
) -> ResourceList {
    let mut capacity = capacity.clone();
    if let Some(pids) = pid_max {
        capacity.insert(
            RESOURCE_PID.to_string(),
            Quantity(i128::from(pids) * 1_000_000_000),
        );
    }
    if !enforce_pods {
        return capacity;
    }
    let mut out: ResourceList = capacity
        .iter()
        .map(|(name, q)| {
            let reserved: i128 = [kube_reserved, system_reserved]
                .iter()
                .filter_map(|l| l.get(name))
                .map(|r| r.0)
                .sum();
            (name.clone(), Quantity((q.0 - reserved).max(0)))
        })
        .collect();
    let hugepages: i128 = out
        .iter()
        .filter(|(name, _)| name.starts_with("hugepages-"))
        .map(|(_, q)| q.0)
        .sum();
    if let Some(m) = out.get_mut(RESOURCE_MEMORY) {
        m.0 = (m.0 - hugepages).max(0);
    }
    out
}

/// The kubelet's cgroups: `kubepods` under `--cgroup-root`, the QoS cgroups, the pods'.
#[derive(Debug)]
pub struct ContainerManager {
    cgroups: CgroupManager,
    /// `<cgroup-root>/kubepods`.
    root: String,
    /// What `kubepods` is capped at.
    allocatable: ResourceConfig,
    /// `--pod-max-pids` (-1: none).
    pod_pids_limit: i64,
    /// The burstable shares last written (a rewrite only on a change).
    burstable_shares: Mutex<Option<u64>>,
    /// Whether `kubepods` still needs its limits (a failed update is retried).
    allocatable_pending: Mutex<bool>,
}

impl ContainerManager {
    /// A manager of `root` (`<cgroup-root>/kubepods`) on `cgroups`.
    pub fn new(
        cgroups: CgroupManager,
        root: &str,
        allocatable: ResourceConfig,
        pod_pids_limit: i64,
    ) -> ContainerManager {
        ContainerManager {
            cgroups,
            root: format!("/{}", root.trim_matches('/')),
            allocatable,
            pod_pids_limit,
            burstable_shares: Mutex::new(None),
            allocatable_pending: Mutex::new(true),
        }
    }

    /// The cgroup manager.
    pub fn cgroups(&self) -> &CgroupManager {
        &self.cgroups
    }

    /// What containers' resources depend on in these cgroups: the layout and whether the
    /// kernel accounts swap (`swapControllerAvailable`: v1 `memory.memsw.limit_in_bytes`
    /// at the memory hierarchy's root, v2 `memory.swap.max` in `kubepods`).
    pub fn host(&self) -> crate::kubelet::container::CgroupHost {
        let file = if self.cgroups.is_v2() {
            self.cgroups
                .path("memory", &self.root)
                .map(|d| d.join("memory.swap.max"))
        } else {
            self.cgroups
                .path("memory", "/")
                .map(|d| d.join("memory.memsw.limit_in_bytes"))
        };
        crate::kubelet::container::CgroupHost {
            v2: self.cgroups.is_v2(),
            swap_controller: file.is_some_and(|f| f.exists()),
        }
    }

    /// `<cgroup-root>/kubepods`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The QoS cgroup of a class.
    pub fn qos_cgroup(&self, qos: &str) -> String {
        match qos {
            GUARANTEED => self.root.clone(),
            BURSTABLE => format!("{}/{BURSTABLE_CGROUP}", self.root),
            _ => format!("{}/{BEST_EFFORT_CGROUP}", self.root),
        }
    }

    /// A pod's cgroup (`GetPodContainerName`): `pod<uid>` under its QoS cgroup.
    pub fn pod_cgroup(&self, qos: &str, uid: &str) -> String {
        format!("{}/pod{uid}", self.qos_cgroup(qos))
    }

    /// Creates `kubepods` (with its limits) and the QoS cgroups (`createNodeAllocatableCgroups`
    /// then the QoS manager's `Start`). A creation failure is the caller's to report (the
    /// kubelet does not start); limits that cannot be set yet (memory in use above the new
    /// limit) are retried by [`ContainerManager::enforce_allocatable`].
    pub fn start(&self) -> Result<(), CgroupError> {
        if !self.cgroups.exists(&self.root) {
            self.cgroups
                .create(&self.root, &ResourceConfig::default())?;
        }
        let _ = self.enforce_allocatable();
        let besteffort = ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            ..ResourceConfig::default()
        };
        self.cgroups
            .create(&self.qos_cgroup(BEST_EFFORT), &besteffort)?;
        self.cgroups
            .create(&self.qos_cgroup(BURSTABLE), &ResourceConfig::default())?;
        Ok(())
    }

    /// Sets `kubepods`' limits if not done yet; `Ok(true)` when this call set them.
    pub fn enforce_allocatable(&self) -> Result<bool, CgroupError> {
        let mut pending = self
            .allocatable_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !*pending {
            return Ok(false);
        }
        self.cgroups.update(&self.root, &self.allocatable)?;
        *pending = false;
        Ok(true)
    }

    /// `UpdateCgroups`: besteffort at the minimum shares, burstable at the shares of its
    /// active pods' summed CPU requests (each pod's in millicores, rounded up as upstream).
    /// Written only when the value changed since the last write.
    pub fn update_qos<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Result<(), CgroupError> {
        let milli_cpu: i64 = pods
            .into_iter()
            .filter(|p| crate::kubelet::sandbox::qos_class(p) == BURSTABLE)
            .map(|p| {
                pod_requests(p, &PodResourcesOptions::default())
                    .get(RESOURCE_CPU)
                    .map_or(0, |q| milli(*q))
            })
            .fold(0i64, i64::saturating_add);
        let shares = milli_cpu_to_shares(milli_cpu);
        let mut last = self
            .burstable_shares
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *last == Some(shares) {
            return Ok(());
        }
        let besteffort = ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            ..ResourceConfig::default()
        };
        self.cgroups
            .update(&self.qos_cgroup(BEST_EFFORT), &besteffort)?;
        let burstable = ResourceConfig {
            cpu_shares: Some(shares),
            ..ResourceConfig::default()
        };
        self.cgroups
            .update(&self.qos_cgroup(BURSTABLE), &burstable)?;
        *last = Some(shares);
        Ok(())
    }

    /// `EnsureExists`: creates the pod's cgroup with its limits unless it exists; returns
    /// whether it was created.
    pub fn ensure_pod(&self, pod: &Pod) -> Result<bool, CgroupError> {
        let qos = crate::kubelet::sandbox::qos_class(pod);
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let name = self.pod_cgroup(&qos, uid);
        if self.cgroups.exists(&name) {
            return Ok(false);
        }
        self.cgroups.create(
            &name,
            &resource_config_for_pod(pod, &qos, self.pod_pids_limit),
        )?;
        Ok(true)
    }

    /// The pod cgroups present (`GetAllPodsFromCgroups`): (QoS class, pod UID) of every
    /// `pod<uid>` directory under the three QoS cgroups, in any hierarchy.
    pub fn pod_cgroups(&self) -> Vec<(String, String)> {
        let mut found = std::collections::BTreeSet::new();
        for qos in [GUARANTEED, BURSTABLE, BEST_EFFORT] {
            let name = self.qos_cgroup(qos);
            for dir in self.cgroups.dirs(&name) {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    let file_name = e.file_name();
                    let Some(uid) = file_name.to_str().and_then(|n| n.strip_prefix("pod")) else {
                        continue;
                    };
                    if !uid.is_empty() && e.file_type().is_ok_and(|t| t.is_dir()) {
                        found.insert((qos.to_string(), uid.to_string()));
                    }
                }
            }
        }
        found.into_iter().collect()
    }

    /// Removes a pod's cgroup, killing what is left in it (`Destroy`).
    pub async fn destroy_pod(&self, qos: &str, uid: &str) -> Result<(), CgroupError> {
        self.cgroups.destroy(&self.pod_cgroup(qos, uid)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
    }

    fn container(
        name: &str,
        requests: serde_json::Value,
        limits: serde_json::Value,
    ) -> serde_json::Value {
        serde_json::json!({"name": name, "resources": {"requests": requests, "limits": limits}})
    }

    #[test]
    fn guaranteed_pod_gets_shares_quota_and_memory() {
        let p = pod(serde_json::json!({"spec": {"containers": [
            container("a", serde_json::json!({"cpu": "100m", "memory": "100Mi"}), serde_json::json!({"cpu": "100m", "memory": "100Mi"})),
            container("b", serde_json::json!({"cpu": "200m", "memory": "50Mi"}), serde_json::json!({"cpu": "200m", "memory": "50Mi"})),
        ]}}));
        let c = resource_config_for_pod(&p, GUARANTEED, -1);
        // helpers_linux_test.go `TestResourceConfigForPod` "guaranteed": 300m → 307 shares,
        // quota 30000 of 100000, memory 150Mi.
        assert_eq!(c.cpu_shares, Some(307));
        assert_eq!(c.cpu_quota, Some(30_000));
        assert_eq!(c.cpu_period, Some(100_000));
        assert_eq!(c.memory, Some(150 * 1024 * 1024));
        assert_eq!(c.pids_limit, None);
    }

    #[test]
    fn burstable_pod_limits_only_when_every_container_declares_them() {
        let p = pod(serde_json::json!({"spec": {"containers": [
            container("a", serde_json::json!({"cpu": "100m"}), serde_json::json!({"cpu": "200m", "memory": "100Mi"})),
            container("b", serde_json::json!({"cpu": "100m"}), serde_json::json!({})),
        ]}}));
        let c = resource_config_for_pod(&p, BURSTABLE, 1024);
        assert_eq!(c.cpu_shares, Some(204));
        assert_eq!(c.cpu_quota, None, "b declares no CPU limit");
        assert_eq!(c.memory, None, "b declares no memory limit");
        assert_eq!(c.pids_limit, Some(1024));

        let p = pod(serde_json::json!({"spec": {"containers": [
            container("a", serde_json::json!({"cpu": "100m"}), serde_json::json!({"cpu": "200m", "memory": "100Mi"})),
            container("b", serde_json::json!({}), serde_json::json!({"cpu": "300m", "memory": "28Mi"})),
        ]}}));
        let c = resource_config_for_pod(&p, BURSTABLE, -1);
        assert_eq!(c.cpu_quota, Some(50_000));
        assert_eq!(c.memory, Some(128 * 1024 * 1024));
    }

    #[test]
    fn besteffort_pod_gets_minimum_shares() {
        let p = pod(serde_json::json!({"spec": {"containers": [{"name": "a"}]}}));
        let c = resource_config_for_pod(&p, BEST_EFFORT, -1);
        assert_eq!(
            c,
            ResourceConfig {
                cpu_shares: Some(2),
                hugepage_limits: Some(hugepage_limits(
                    &ResourceList::new(),
                    crate::cgroups::hugepage_sizes()
                )),
                ..Default::default()
            }
        );
    }

    #[test]
    fn hugepages_requested_are_the_pod_s_limits_and_other_sizes_are_zero() {
        let p = pod(serde_json::json!({"spec": {"containers": [
            {"name": "a", "resources": {
                "requests": {"hugepages-2Mi": "4Mi", "memory": "10Mi", "cpu": "1"},
                "limits": {"hugepages-2Mi": "4Mi", "memory": "10Mi", "cpu": "1"}}},
            {"name": "b", "resources": {
                "requests": {"hugepages-2Mi": "2Mi", "memory": "10Mi", "cpu": "1"},
                "limits": {"hugepages-2Mi": "2Mi", "memory": "10Mi", "cpu": "1"}}}
        ]}}));
        let requests = pod_requests(&p, &PodResourcesOptions::default());
        let sizes = ["2MB".to_string(), "1GB".to_string()];
        assert_eq!(
            hugepage_limits(&requests, &sizes),
            [("1GB".to_string(), 0), ("2MB".to_string(), 6 << 20)].into()
        );
        assert_eq!(hugepage_size("hugepages-1Gi").as_deref(), Some("1GB"));
        assert_eq!(hugepage_size("hugepages-2Mi").as_deref(), Some("2MB"));
        assert_eq!(hugepage_size("memory"), None);
    }

    #[test]
    fn init_containers_and_overhead_count_as_upstream() {
        // The init container's 1 CPU limit is above the app containers' sum: the pod's
        // limit is the larger; the overhead adds to both requests and limits.
        let p = pod(serde_json::json!({"spec": {
            "initContainers": [container("i", serde_json::json!({"cpu": "1", "memory": "1Gi"}), serde_json::json!({"cpu": "1", "memory": "1Gi"}))],
            "containers": [container("a", serde_json::json!({"cpu": "500m", "memory": "256Mi"}), serde_json::json!({"cpu": "500m", "memory": "256Mi"}))],
            "overhead": {"cpu": "250m", "memory": "120Mi"}
        }}));
        let c = resource_config_for_pod(&p, GUARANTEED, -1);
        assert_eq!(c.cpu_shares, Some(1280), "1250m requested");
        assert_eq!(c.cpu_quota, Some(125_000));
        assert_eq!(c.memory, Some((1024 + 120) * 1024 * 1024));
        // A sidecar keeps running: its limit adds to the app containers'.
        let p = pod(serde_json::json!({"spec": {
            "initContainers": [{"name": "s", "restartPolicy": "Always", "resources": {"limits": {"cpu": "100m", "memory": "10Mi"}}}],
            "containers": [container("a", serde_json::json!({}), serde_json::json!({"cpu": "200m", "memory": "20Mi"}))]
        }}));
        let c = resource_config_for_pod(&p, BURSTABLE, -1);
        assert_eq!(c.cpu_quota, Some(30_000));
        assert_eq!(c.memory, Some(30 * 1024 * 1024));
    }

    #[test]
    fn pod_cgroups_lists_each_qos_cgroups_pods() {
        let root = tempfile::tempdir().expect("tempdir");
        let m = ContainerManager::new(
            CgroupManager::v2(root.path().to_path_buf()),
            "/r/kubepods",
            ResourceConfig::default(),
            -1,
        );
        for d in [
            "r/kubepods/poda",
            "r/kubepods/burstable/podb",
            "r/kubepods/besteffort/podc",
            "r/kubepods/besteffort/notapod",
        ] {
            std::fs::create_dir_all(root.path().join(d)).expect("mkdir");
        }
        let found = m.pod_cgroups();
        let want: Vec<(String, String)> = [(BEST_EFFORT, "c"), (BURSTABLE, "b"), (GUARANTEED, "a")]
            .iter()
            .map(|(q, u)| (q.to_string(), u.to_string()))
            .collect();
        assert_eq!(
            found, want,
            "burstable and besteffort are not pods of kubepods"
        );
    }

    #[test]
    fn allocatable_subtracts_reservations_not_eviction() {
        let q = |n: i128| Quantity(n * 1_000_000_000);
        let capacity: ResourceList = [
            ("cpu".to_string(), q(2)),
            ("memory".to_string(), q(8 << 30)),
            ("hugepages-2Mi".to_string(), q(1 << 30)),
        ]
        .into_iter()
        .collect();
        let kube: ResourceList = [
            ("cpu".to_string(), Quantity(100_000_000)),
            ("memory".to_string(), q(256 << 20)),
        ]
        .into_iter()
        .collect();
        let system: ResourceList = [
            ("pid".to_string(), q(1000)),
            ("hugepages-2Mi".to_string(), q(256 << 20)),
        ]
        .into_iter()
        .collect();
        let limits = node_allocatable_limits(&capacity, Some(4_194_304), &kube, &system, true);
        let c = node_allocatable_config(&limits);
        // The pods' hugepages: the pool less what the system keeps, every other size the
        // host has at 0.
        let mut want: BTreeMap<String, u64> = crate::cgroups::hugepage_sizes()
            .iter()
            .map(|s| (s.clone(), 0))
            .collect();
        want.insert("2MB".to_string(), 768 << 20);
        assert_eq!(c.hugepage_limits, Some(want));
        assert_eq!(c.cpu_shares, Some(1945), "1900m");
        assert_eq!(c.memory, Some((8 << 30) - (256 << 20) - (768 << 20)));
        assert_eq!(c.pids_limit, Some(4_194_304 - 1000));
        let c = node_allocatable_config(&node_allocatable_limits(
            &capacity, None, &kube, &system, false,
        ));
        assert_eq!(c.memory, Some(8 << 30), "not enforced: the capacity");
    }
}
