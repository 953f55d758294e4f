//! A container's CRI configuration (`kuberuntime_container.go` `generateContainerConfig`,
//! `kuberuntime_container_linux.go` `generateLinuxContainerConfig`,
//! `pkg/kubelet/qos/policy.go` `GetContainerOOMScoreAdjust`,
//! `pkg/kubelet/cm/helpers_linux.go` `MilliCPUToShares` / `MilliCPUToQuota`): everything
//! here is computed from the spec and facts handed in (environment, mounts, the image's
//! id), so it is tested without a runtime.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use skerry_api::validation::quantity::Quantity;

use super::runtime::{
    ANNOTATION_HASH, ANNOTATION_PRE_STOP, ANNOTATION_RESTART_COUNT, ANNOTATION_TERMINATION_GRACE,
    ANNOTATION_TERMINATION_MESSAGE_PATH, ANNOTATION_TERMINATION_MESSAGE_POLICY,
    LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};
use crate::cri::api;
use crate::volume::ContainerMount;

/// The CFS period the kubelet sets (`QuotaPeriod`, 100 ms in µs).
pub const QUOTA_PERIOD: i64 = crate::cgroups::QUOTA_PERIOD as i64;
/// `oom_score_adj` of Guaranteed containers (`guaranteedOOMScoreAdj`).
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// `oom_score_adj` of BestEffort containers (`besteffortOOMScoreAdj`).
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// The default termination message path (`v1.TerminationMessagePathDefault`).
pub const TERMINATION_MESSAGE_PATH_DEFAULT: &str = "/dev/termination-log";
/// `terminationGracePeriodSeconds` when unset (`v1.DefaultTerminationGracePeriodSeconds`).
pub const DEFAULT_GRACE_SECONDS: i64 = 30;

fn quantity(c: &Container, bag: &str, resource: &str) -> Option<Quantity> {
    let r = c.resources.as_ref()?;
    let list = match bag {
        "limits" => r.limits.as_ref(),
        _ => r.requests.as_ref(),
    }?;
    Quantity::parse(list.get(resource)?.0.trim()).filter(|q| q.0 > 0)
}

/// Milli-units of a quantity, rounded up (as `resource.Quantity.MilliValue`).
fn milli(q: Quantity) -> i64 {
    let nano = q.0;
    i64::try_from((nano + 999_999) / 1_000_000).unwrap_or(i64::MAX)
}

/// Whole units, rounded up (as `resource.Quantity.Value`).
fn units(q: Quantity) -> i64 {
    let nano = q.0;
    i64::try_from((nano + 999_999_999) / 1_000_000_000).unwrap_or(i64::MAX)
}

/// `MilliCPUToShares` (capped at the kernel's maximum, [`crate::cgroups::MAX_SHARES`]).
pub fn milli_cpu_to_shares(milli_cpu: i64) -> i64 {
    crate::cgroups::milli_cpu_to_shares(milli_cpu) as i64
}

/// `MilliCPUToQuota` with the default period: 0 (no limit) for no CPU limit.
pub fn milli_cpu_to_quota(milli_cpu: i64) -> i64 {
    crate::cgroups::milli_cpu_to_quota(milli_cpu, QUOTA_PERIOD as u64)
}

/// The priority from which a pod is critical (`scheduling.SystemCriticalPriority`, 2·10⁹).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The priority class of pods the node cannot run without (`scheduling.SystemNodeCritical`).
pub const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";

/// `types.IsNodeCriticalPod`: a critical pod (static, mirror, or of a priority at least
/// [`SYSTEM_CRITICAL_PRIORITY`]) in the `system-node-critical` class.
pub fn is_node_critical(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |k: &str| annotations.and_then(|a| a.get(k));
    let is_static = annotation(super::static_pods::SOURCE_ANNOTATION)
        .is_some_and(|s| s != super::static_pods::SOURCE_API);
    let is_mirror = annotation(super::static_pods::MIRROR_ANNOTATION).is_some();
    let spec = pod.spec.as_ref();
    let critical = is_static
        || is_mirror
        || spec
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY);
    critical && spec.and_then(|s| s.priority_class_name.as_deref()) == Some(SYSTEM_NODE_CRITICAL)
}

/// `isSidecarContainer`: `restartPolicy: Always` on a container the pod lists among its init
/// containers.
pub fn is_sidecar(pod: &Pod, c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
        && pod
            .spec
            .as_ref()
            .is_some_and(|s| s.init_containers.iter().flatten().any(|i| i.name == c.name))
}

/// The memory request in bytes, rounded up (`Requests.Memory().Value()`); 0 when unset.
fn memory_request(c: &Container) -> i64 {
    quantity(c, "requests", "memory").map_or(0, units)
}

/// `GetContainerOOMScoreAdjust` (`pkg/kubelet/qos/policy.go`, 1.32 with its default gates:
/// `SidecarContainers` on, `PodLevelResources` off): -997 for a node-critical pod and for
/// Guaranteed, 1000 for BestEffort; Burstable gets `1000 - 1000 * request / capacity`, so the
/// share of the node a container asked for protects it and a container using more than it
/// asked is the likelier kill. A sidecar's score is lowered to the score of the regular
/// container with the smallest request (the highest regular score) when its own is higher,
/// so the OOM killer never takes the sidecar before the containers it serves. The result is
/// clamped to 3..=999: above Guaranteed, below BestEffort.
pub fn oom_score_adj(pod: &Pod, qos: &str, c: &Container, memory_capacity: i64) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos {
        "Guaranteed" => return GUARANTEED_OOM_SCORE_ADJ,
        "BestEffort" => return BESTEFFORT_OOM_SCORE_ADJ,
        _ => {}
    }
    if memory_capacity <= 0 {
        // Upstream divides by the capacity; a node that reports none gets the lowest
        // Burstable protection rather than a division by zero.
        return BESTEFFORT_OOM_SCORE_ADJ - 1;
    }
    let score =
        |request: i64| 1000 - (1000 * i128::from(request) / i128::from(memory_capacity)) as i64;
    let mut adj = score(memory_request(c));
    if is_sidecar(pod, c) {
        // `minRegularContainerMemory`: the smallest request among `spec.containers`.
        let min_regular = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().map(memory_request).min());
        if let Some(min_regular) = min_regular {
            adj = adj.min(score(min_regular));
        }
    }
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if adj == BESTEFFORT_OOM_SCORE_ADJ {
        adj - 1
    } else {
        adj
    }
}

/// What the container's resources depend on in the host's cgroups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupHost {
    /// The unified hierarchy (v2).
    pub v2: bool,
    /// The kernel accounts swap (v1 `memory.memsw.*`, v2 `memory.swap.max`).
    pub swap_controller: bool,
}

/// `memory.oom.group` (v2): the kernel kills the whole container on an OOM, the kubelet's
/// default on v2 since 1.32 (`singleProcessOOMKill` false there).
pub const MEMORY_OOM_GROUP: &str = "memory.oom.group";
/// `memory.swap.max` (v2): no swap for the container (`ConfigureNoSwap`, `NoSwap` the
/// default swap behaviour).
pub const MEMORY_SWAP_MAX: &str = "memory.swap.max";

/// The Linux resources of a container (`generateLinuxContainerResources`,
/// `calculateLinuxResources`): shares from the CPU request (the limit when only that is
/// set), quota from the CPU limit with the period always given (CFS quota enforced), the
/// memory limit; no swap (`ConfigureNoSwap`: v1 the swap limit equal to the memory limit,
/// v2 `memory.swap.max` 0, when the kernel accounts swap), and on v2 the whole container
/// killed on an OOM.
pub fn linux_resources(
    pod: &Pod,
    qos: &str,
    c: &Container,
    memory_capacity: i64,
    host: CgroupHost,
) -> api::LinuxContainerResources {
    let cpu_request = quantity(c, "requests", "cpu");
    let cpu_limit = quantity(c, "limits", "cpu");
    let shares = match (cpu_request, cpu_limit) {
        (None, Some(limit)) => milli_cpu_to_shares(milli(limit)),
        (request, _) => milli_cpu_to_shares(request.map_or(0, milli)),
    };
    let quota = cpu_limit.map_or(0, |l| milli_cpu_to_quota(milli(l)));
    let memory_limit = quantity(c, "limits", "memory").map_or(0, units);
    let mut r = api::LinuxContainerResources {
        cpu_shares: shares,
        cpu_quota: quota,
        cpu_period: QUOTA_PERIOD,
        memory_limit_in_bytes: memory_limit,
        oom_score_adj: oom_score_adj(pod, qos, c, memory_capacity),
        ..Default::default()
    };
    r.hugepage_limits = hugepage_limits(c, crate::cgroups::hugepage_sizes());
    if host.v2 {
        r.unified
            .insert(MEMORY_OOM_GROUP.to_string(), "1".to_string());
        if host.swap_controller {
            r.unified
                .insert(MEMORY_SWAP_MAX.to_string(), "0".to_string());
        }
    } else if host.swap_controller {
        r.memory_swap_limit_in_bytes = memory_limit;
    }
    r
}

/// `GetHugepageLimitsFromResources` (`kuberuntime_container_linux.go`): every page size the
/// host has, in its order, limited to 0 unless the container's limits ask for that size.
pub fn hugepage_limits(c: &Container, host_sizes: &[String]) -> Vec<api::HugepageLimit> {
    let limits = c
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .map(|l| {
            l.iter()
                .filter_map(|(name, q)| {
                    let size = crate::cgroups::pod::hugepage_size(name)?;
                    let bytes = u64::try_from(units(Quantity::parse(&q.0)?)).ok()?;
                    Some((size, bytes))
                })
                .collect::<HashMap<String, u64>>()
        })
        .unwrap_or_default();
    host_sizes
        .iter()
        .map(|size| api::HugepageLimit {
            page_size: size.clone(),
            limit: limits.get(size).copied().unwrap_or(0),
        })
        .collect()
}

/// The container's security context as CRI takes it (pod-level values where the container
/// sets none).
pub fn security_context(pod: &Pod, c: &Container) -> api::LinuxContainerSecurityContext {
    let psc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let caps = sc.capabilities.clone().unwrap_or_default();
    let cap = |list: Option<Vec<String>>| -> Vec<String> {
        list.unwrap_or_default()
            .into_iter()
            .map(|c| {
                if c == "ALL" || c.starts_with("CAP_") {
                    c
                } else {
                    format!("CAP_{c}")
                }
            })
            .collect()
    };
    api::LinuxContainerSecurityContext {
        capabilities: Some(api::Capability {
            add_capabilities: cap(caps.add),
            drop_capabilities: cap(caps.drop),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(super::sandbox::namespace_options(pod)),
        run_as_user: sc
            .run_as_user
            .or(psc.run_as_user)
            .map(|value| api::Int64Value { value }),
        run_as_group: sc
            .run_as_group
            .or(psc.run_as_group)
            .map(|value| api::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: psc.supplemental_groups.clone().unwrap_or_default(),
        // `allowPrivilegeEscalation: false` is `no_new_privs`; privileged never sets it.
        no_new_privs: !privileged && sc.allow_privilege_escalation == Some(false),
        seccomp: Some(api::SecurityProfile {
            profile_type: api::security_profile::ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        }),
        ..Default::default()
    }
}

/// What [`container_config`] needs besides the spec.
#[derive(Clone, Debug)]
pub struct ContainerInput<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The container.
    pub container: &'a Container,
    /// Its restart count (the CRI attempt).
    pub restart_count: i32,
    /// The image id to run.
    pub image_ref: &'a str,
    /// Command and args, expanded.
    pub command: Vec<String>,
    /// See `command`.
    pub args: Vec<String>,
    /// The environment.
    pub env: Vec<(String, String)>,
    /// Volume mounts, `/etc/hosts` and the termination-message file.
    pub mounts: Vec<ContainerMount>,
    /// The QoS class.
    pub qos: &'a str,
    /// The node's memory, bytes (for `oom_score_adj`).
    pub memory_capacity: i64,
    /// The host's cgroups.
    pub cgroup_host: CgroupHost,
    /// The spec hash.
    pub hash: String,
    /// What the device plugins' `Allocate` gave the container: envs and mounts before the
    /// container's own (upstream appends these after the device manager's), device nodes,
    /// annotations.
    pub devices: Option<crate::cm::device_manager::RunOptions>,
}

/// The log path of a container, relative to the sandbox's log directory:
/// `<container>/<restartCount>.log` (upstream `BuildContainerLogsPath`).
pub fn log_path(name: &str, restart_count: i32) -> String {
    format!("{name}/{restart_count}.log")
}

/// The container's configuration.
pub fn container_config(input: &ContainerInput<'_>) -> api::ContainerConfig {
    let c = input.container;
    let m = &input.pod.metadata;
    let labels = HashMap::from([
        (
            LABEL_POD_NAME.to_string(),
            m.name.clone().unwrap_or_default(),
        ),
        (
            LABEL_POD_NAMESPACE.to_string(),
            m.namespace.clone().unwrap_or_default(),
        ),
        (LABEL_POD_UID.to_string(), m.uid.clone().unwrap_or_default()),
        (LABEL_CONTAINER_NAME.to_string(), c.name.clone()),
    ]);
    let grace = input
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    let mut annotations = HashMap::from([
        (ANNOTATION_HASH.to_string(), input.hash.clone()),
        (
            ANNOTATION_RESTART_COUNT.to_string(),
            input.restart_count.to_string(),
        ),
        (
            ANNOTATION_TERMINATION_MESSAGE_PATH.to_string(),
            c.termination_message_path
                .clone()
                .unwrap_or_else(|| TERMINATION_MESSAGE_PATH_DEFAULT.to_string()),
        ),
        (
            ANNOTATION_TERMINATION_MESSAGE_POLICY.to_string(),
            c.termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".to_string()),
        ),
        (ANNOTATION_TERMINATION_GRACE.to_string(), grace.to_string()),
    ]);
    let devices = input.devices.clone().unwrap_or_default();
    for (k, v) in &devices.annotations {
        annotations.insert(k.clone(), v.clone());
    }
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        annotations.insert(
            ANNOTATION_PRE_STOP.to_string(),
            serde_json::to_string(pre_stop).expect("a handler serializes"),
        );
    }
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: c.name.clone(),
            attempt: u32::try_from(input.restart_count).unwrap_or(0),
        }),
        image: Some(api::ImageSpec {
            image: input.image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: input.command.clone(),
        args: input.args.clone(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: devices
            .envs
            .iter()
            .chain(input.env.iter())
            .map(|(key, value)| api::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts: devices
            .mounts
            .iter()
            .map(|m| api::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.read_only,
                ..Default::default()
            })
            .chain(input.mounts.iter().map(|m| api::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.display().to_string(),
                readonly: m.read_only,
                ..Default::default()
            }))
            .collect(),
        devices: devices
            .devices
            .iter()
            .map(|d| api::Device {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        labels,
        annotations,
        log_path: log_path(&c.name, input.restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(linux_resources(
                input.pod,
                input.qos,
                c,
                input.memory_capacity,
                input.cgroup_host,
            )),
            security_context: Some(security_context(input.pod, c)),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(v: serde_json::Value) -> Container {
        serde_json::from_value(v).expect("container")
    }

    #[test]
    fn cpu_and_memory_as_upstream_converts_them() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(250), 256);
        assert_eq!(milli_cpu_to_shares(2000), 2048);
        assert_eq!(milli_cpu_to_quota(0), 0);
        assert_eq!(milli_cpu_to_quota(5), 1000, "at least 1 ms");
        assert_eq!(milli_cpu_to_quota(500), 50_000);
        let c = container(serde_json::json!({"name": "a",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                          "limits": {"cpu": "1500m", "memory": "128Mi"}}}));
        let r = linux_resources(
            &Pod::default(),
            "Burstable",
            &c,
            1 << 30,
            CgroupHost::default(),
        );
        assert_eq!(r.cpu_shares, 102);
        assert_eq!(r.cpu_quota, 150_000);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
        // 64 MiB of 1 GiB: 1000 - 62 = 938.
        assert_eq!(r.oom_score_adj, 938);
        let only_limit =
            container(serde_json::json!({"name": "a", "resources": {"limits": {"cpu": "1"}}}));
        assert_eq!(
            linux_resources(
                &Pod::default(),
                "Burstable",
                &only_limit,
                1 << 30,
                CgroupHost::default()
            )
            .cpu_shares,
            1024
        );
        let none = container(serde_json::json!({"name": "a"}));
        let r = linux_resources(
            &Pod::default(),
            "BestEffort",
            &none,
            1 << 30,
            CgroupHost::default(),
        );
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_quota,
                r.memory_limit_in_bytes,
                r.oom_score_adj
            ),
            (2, 0, 0, 1000)
        );
    }

    #[test]
    fn period_swap_and_oom_group_as_upstream() {
        let c = container(serde_json::json!({"name": "a",
            "resources": {"limits": {"memory": "64Mi"}}}));
        let v1 = CgroupHost {
            v2: false,
            swap_controller: true,
        };
        let r = linux_resources(&Pod::default(), "Burstable", &c, 1 << 30, v1);
        assert_eq!(
            (r.cpu_quota, r.cpu_period),
            (0, 100_000),
            "the period always"
        );
        assert_eq!(r.memory_swap_limit_in_bytes, 64 << 20, "no swap on v1");
        assert!(r.unified.is_empty());
        let v2 = CgroupHost {
            v2: true,
            swap_controller: true,
        };
        let r = linux_resources(&Pod::default(), "Burstable", &c, 1 << 30, v2);
        assert_eq!(r.memory_swap_limit_in_bytes, 0);
        assert_eq!(
            r.unified.get(MEMORY_SWAP_MAX).map(String::as_str),
            Some("0")
        );
        assert_eq!(
            r.unified.get(MEMORY_OOM_GROUP).map(String::as_str),
            Some("1")
        );
        let r = linux_resources(
            &Pod::default(),
            "Burstable",
            &c,
            1 << 30,
            CgroupHost::default(),
        );
        assert_eq!(
            r.memory_swap_limit_in_bytes, 0,
            "no swap accounting: nothing"
        );
        // Shares capped at the kernel's maximum (`MaxShares`).
        let huge = container(serde_json::json!({"name": "a",
            "resources": {"requests": {"cpu": "300"}}}));
        assert_eq!(
            linux_resources(&Pod::default(), "Burstable", &huge, 1 << 30, v1).cpu_shares,
            262_144
        );
    }

    #[test]
    fn oom_score_adj_stays_between_guaranteed_and_besteffort() {
        let big = container(
            serde_json::json!({"name": "a", "resources": {"requests": {"memory": "1Gi"}}}),
        );
        assert_eq!(
            oom_score_adj(&Pod::default(), "Burstable", &big, 1 << 30),
            3
        );
        let tiny =
            container(serde_json::json!({"name": "a", "resources": {"requests": {"memory": "1"}}}));
        assert_eq!(
            oom_score_adj(&Pod::default(), "Burstable", &tiny, 1 << 30),
            999
        );
        assert_eq!(
            oom_score_adj(&Pod::default(), "Guaranteed", &tiny, 1 << 30),
            -997
        );
    }

    #[test]
    fn sidecars_score_no_higher_than_the_regular_container_with_the_smallest_request() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "initContainers": [
                    {"name": "side", "restartPolicy": "Always"},
                    {"name": "big-side", "restartPolicy": "Always",
                     "resources": {"requests": {"memory": "512Mi"}}},
                    {"name": "init"}],
                "containers": [
                    {"name": "a", "resources": {"requests": {"memory": "128Mi"}}},
                    {"name": "b", "resources": {"requests": {"memory": "256Mi"}}}]}}))
        .expect("pod");
        let spec = pod.spec.as_ref().expect("spec");
        let init = spec.init_containers.as_ref().expect("init");
        let gib = 1 << 30;
        // Regular: 1000 - 1000 * 128Mi / 1Gi = 875, and 750 for 256Mi.
        assert_eq!(
            oom_score_adj(&pod, "Burstable", &spec.containers[0], gib),
            875
        );
        assert_eq!(
            oom_score_adj(&pod, "Burstable", &spec.containers[1], gib),
            750
        );
        // A sidecar without a request would get 999; it gets 875, the smallest request's.
        assert!(is_sidecar(&pod, &init[0]));
        assert_eq!(oom_score_adj(&pod, "Burstable", &init[0], gib), 875);
        // A sidecar whose own score is lower keeps it (500 < 875).
        assert_eq!(oom_score_adj(&pod, "Burstable", &init[1], gib), 500);
        // A plain init container is not a sidecar: its own score.
        assert!(!is_sidecar(&pod, &init[2]));
        assert_eq!(oom_score_adj(&pod, "Burstable", &init[2], gib), 999);
        // A regular container with `restartPolicy` is no sidecar (only init containers are).
        let mut odd = spec.containers[0].clone();
        odd.restart_policy = Some("Always".into());
        assert!(!is_sidecar(&pod, &odd));
    }

    #[test]
    fn node_critical_pods_score_as_guaranteed() {
        let pod = |priority: i32, class: &str, annotations: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"annotations": annotations},
                "spec": {"priority": priority, "priorityClassName": class,
                    "containers": [{"name": "a"}]}}))
            .expect("pod")
        };
        let c = container(serde_json::json!({"name": "a"}));
        let critical = pod(2_000_001_000, "system-node-critical", serde_json::json!({}));
        assert_eq!(oom_score_adj(&critical, "BestEffort", &c, 1 << 30), -997);
        let static_pod = pod(
            0,
            "system-node-critical",
            serde_json::json!({"kubernetes.io/config.source": "file"}),
        );
        assert_eq!(oom_score_adj(&static_pod, "BestEffort", &c, 1 << 30), -997);
        // Critical by priority but cluster-critical: its QoS decides.
        let cluster = pod(
            2_000_000_000,
            "system-cluster-critical",
            serde_json::json!({}),
        );
        assert_eq!(oom_score_adj(&cluster, "BestEffort", &c, 1 << 30), 1000);
        // The class name alone, from an API pod of low priority: not critical.
        let named = pod(
            0,
            "system-node-critical",
            serde_json::json!({"kubernetes.io/config.source": "api"}),
        );
        assert_eq!(oom_score_adj(&named, "BestEffort", &c, 1 << 30), 1000);
    }

    #[test]
    fn config_carries_labels_annotations_log_path_and_security() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"terminationGracePeriodSeconds": 5, "securityContext": {"runAsUser": 1000},
                "containers": [{"name": "app", "image": "busybox",
                    "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}},
                    "securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
                        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true}}]}}))
        .expect("pod");
        let c = &pod.spec.as_ref().expect("spec").containers[0];
        let config = container_config(&ContainerInput {
            pod: &pod,
            container: c,
            restart_count: 3,
            image_ref: "sha256:abc",
            command: vec!["sh".into()],
            args: vec![],
            env: vec![("A".into(), "1".into())],
            mounts: vec![],
            qos: "BestEffort",
            memory_capacity: 1 << 30,
            cgroup_host: CgroupHost::default(),
            hash: "h".into(),
            devices: None,
        });
        assert!(config.devices.is_empty());
        // A container holding a device plugin's device: the plugin's envs (before the
        // container's), mounts, device nodes and annotations.
        use crate::deviceplugin::v1beta1 as dp;
        let with_device = container_config(&ContainerInput {
            pod: &pod,
            container: c,
            restart_count: 0,
            image_ref: "sha256:abc",
            command: vec![],
            args: vec![],
            env: vec![("A".into(), "1".into())],
            mounts: vec![],
            qos: "BestEffort",
            memory_capacity: 1 << 30,
            cgroup_host: CgroupHost::default(),
            hash: "h".into(),
            devices: Some(crate::cm::device_manager::RunOptions {
                envs: vec![("WIDGET".into(), "w0".into())],
                mounts: vec![dp::Mount {
                    container_path: "/opt/widget".into(),
                    host_path: "/var/lib/widget".into(),
                    read_only: true,
                }],
                devices: vec![dp::DeviceSpec {
                    container_path: "/dev/widget0".into(),
                    host_path: "/dev/null".into(),
                    permissions: "rw".into(),
                }],
                annotations: vec![("widget.skerry.test/id".into(), "w0".into())],
            }),
        });
        let envs: Vec<(&str, &str)> = with_device
            .envs
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(envs, [("WIDGET", "w0"), ("A", "1")]);
        assert_eq!(
            (
                with_device.mounts[0].container_path.as_str(),
                with_device.mounts[0].host_path.as_str(),
                with_device.mounts[0].readonly
            ),
            ("/opt/widget", "/var/lib/widget", true)
        );
        assert_eq!(
            with_device.devices,
            [api::Device {
                container_path: "/dev/widget0".into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }]
        );
        assert_eq!(with_device.annotations["widget.skerry.test/id"], "w0");
        assert_eq!(config.log_path, "app/3.log");
        assert_eq!(config.metadata.as_ref().map(|m| m.attempt), Some(3));
        assert_eq!(config.labels["io.kubernetes.container.name"], "app");
        assert_eq!(config.labels["io.kubernetes.pod.uid"], "u");
        assert_eq!(
            config.annotations["io.kubernetes.container.restartCount"],
            "3"
        );
        assert_eq!(
            config.annotations["io.kubernetes.pod.terminationGracePeriod"],
            "5"
        );
        assert_eq!(
            config.annotations["io.kubernetes.container.terminationMessagePath"],
            "/dev/termination-log"
        );
        assert!(config.annotations["io.kubernetes.container.preStopHandler"].contains("sleep"));
        let image = config.image.expect("image");
        assert_eq!(
            (image.image.as_str(), image.user_specified_image.as_str()),
            ("sha256:abc", "busybox")
        );
        let sc = config.linux.and_then(|l| l.security_context).expect("sc");
        assert_eq!(sc.run_as_user.map(|u| u.value), Some(1000));
        assert!(sc.readonly_rootfs && sc.no_new_privs && !sc.privileged);
        let ns = sc.namespace_options.expect("namespaces");
        assert_eq!(
            ns.pid,
            api::NamespaceMode::Container as i32,
            "its own PID namespace"
        );
        assert_eq!(ns.network, api::NamespaceMode::Pod as i32);
        let caps = sc.capabilities.expect("caps");
        assert_eq!(caps.add_capabilities, ["CAP_NET_ADMIN"]);
        assert_eq!(caps.drop_capabilities, ["ALL"]);
    }

    #[test]
    fn hugepage_limits_list_every_host_size_zero_unless_asked() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "resources": {"limits": {"hugepages-2Mi": "6Mi", "hugepages-64Ki": "1Mi"}}
        }))
        .unwrap();
        let sizes = ["2MB".to_string(), "1GB".to_string()];
        let got: Vec<(String, u64)> = hugepage_limits(&c, &sizes)
            .into_iter()
            .map(|l| (l.page_size, l.limit))
            .collect();
        // The size the host lacks is dropped, as upstream's loop over the host's sizes.
        assert_eq!(got, [("2MB".to_string(), 6 << 20), ("1GB".to_string(), 0)]);
        let none: Container = serde_json::from_value(serde_json::json!({"name": "c"})).unwrap();
        assert!(hugepage_limits(&none, &sizes).iter().all(|l| l.limit == 0));
        assert!(hugepage_limits(&none, &[]).is_empty());
    }
}
