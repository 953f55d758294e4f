//! The kubelet's Summary API and resource metrics (upstream `pkg/kubelet/stats`: the CRI
//! stats provider `cri_stats_provider.go` with cAdvisor's cgroup readings, assembled by
//! `pkg/kubelet/server/stats/summary.go`), served by `crate::server::stats`.
//!
//! Where each figure comes from:
//! - containers' CPU time, memory and writable layer: CRI `ListContainerStats` (containerd
//!   reads the container's cgroup and snapshot); their logs: a bounded `du` of the
//!   container's log directory;
//! - pods' and the node's CPU and memory: the kubelet's own pod cgroups (`pod<uid>` under
//!   the QoS cgroups) and the root cgroup, read by [`cgroup`] on v1 or v2; the pods'
//!   process count from their cgroups' `cgroup.procs`;
//! - file systems: `statvfs` of the kubelet's root dir (node) and of CRI `ImageFsInfo`'s
//!   mount point (runtime), volumes by a bounded `du` of their directories ([`host`]);
//! - a pod's network: `/proc/<pid>/net/dev` of its sandbox's process (the pid from verbose
//!   `PodSandboxStatus`), which reads that network namespace's counters without entering it.
//!
//! The trick it carries: `usageNanoCores` is a rate, and rates need a previous sample.
//! [`Rates`] keeps one per cgroup and per container, and a housekeeping pass every
//! [`HOUSEKEEPING_INTERVAL`] samples everything, as cAdvisor's housekeeping does, so the
//! first scrape after a quiet spell already has a rate.

pub mod cgroup;
pub mod host;
pub mod rate;
pub mod resource;
pub mod types;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use crate::cgroups::pod::ContainerManager;
use crate::cri::{Cri, CriError, api};
use crate::kubelet::runtime::LABEL_POD_UID;

pub use rate::{Rates, Sample};
use types::{
    ContainerStats, CpuStats, FsStats, MemoryStats, NetworkStats, PodReference, PodStats,
    ProcessStats, RuntimeStats, Summary, VolumeStats, time,
};

/// How often every cgroup and container is sampled for its CPU rate (cAdvisor's
/// `--housekeeping_interval` default as the kubelet runs it, 10 s).
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);

/// Whether a volume is of one plugin.
type IsPlugin = fn(&k8s_openapi::api::core::v1::Volume) -> bool;

/// The volume plugins whose directories hold the volume's data on this node's disk (or
/// tmpfs), measured with `du` (upstream's `MetricsDu` / `MetricsStatFS` providers).
const MEASURED_VOLUMES: &[(&str, IsPlugin)] = &[
    (crate::volume::PLUGIN_EMPTY_DIR, |v| v.empty_dir.is_some()),
    (crate::volume::PLUGIN_CONFIG_MAP, |v| v.config_map.is_some()),
    (crate::volume::PLUGIN_SECRET, |v| v.secret.is_some()),
    (crate::volume::PLUGIN_PROJECTED, |v| v.projected.is_some()),
    (crate::volume::PLUGIN_DOWNWARD_API, |v| {
        v.downward_api.is_some()
    }),
];

/// What the provider reads.
pub struct StatsProvider {
    node_name: String,
    root_dir: PathBuf,
    logs_root: PathBuf,
    cri: Cri,
    cgroups: Arc<ContainerManager>,
    memory_capacity: u64,
    rates: Rates,
}

impl StatsProvider {
    /// A provider for `node_name`'s kubelet (root dir, pod logs root, runtime, cgroups,
    /// the machine's memory).
    pub fn new(
        node_name: &str,
        root_dir: PathBuf,
        logs_root: PathBuf,
        cri: Cri,
        cgroups: Arc<ContainerManager>,
        memory_capacity: u64,
    ) -> StatsProvider {
        StatsProvider {
            node_name: node_name.to_string(),
            root_dir,
            logs_root,
            cri,
            cgroups,
            memory_capacity,
            rates: Rates::default(),
        }
    }

    /// Samples everything every [`HOUSEKEEPING_INTERVAL`] until `stop`, so rates are ready.
    pub async fn housekeeping(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let _ = self.summary(true, &[]).await;
            self.rates.sweep();
            tokio::select! {
                () = tokio::time::sleep(HOUSEKEEPING_INTERVAL) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    fn cpu(&self, key: &str, at: u64, usage: Option<u64>) -> Option<CpuStats> {
        let usage = usage?;
        let rate = self.rates.observe(
            key,
            Sample {
                at_ns: at,
                usage_ns: usage,
            },
        );
        Some(CpuStats {
            time: time(at),
            usage_nano_cores: rate,
            usage_core_nano_seconds: Some(usage),
        })
    }

    /// CPU and memory of cgroup `name` (`availableBytes` against its limit, else against
    /// `capacity` when given, as the kubelet's `cadvisorInfoToCPUandMemoryStats`).
    fn cgroup_stats(
        &self,
        name: &str,
        at: u64,
        capacity: Option<u64>,
    ) -> (Option<CpuStats>, Option<MemoryStats>) {
        let (cpu, memory) = cgroup::sample(self.cgroups.cgroups(), name);
        let cpu = self.cpu(&format!("cgroup:{name}"), at, cpu);
        let memory = memory.map(|m| MemoryStats {
            time: time(at),
            available_bytes: m
                .limit
                .or(capacity)
                .map(|l| l.saturating_sub(m.working_set)),
            usage_bytes: Some(m.usage),
            working_set_bytes: Some(m.working_set),
            rss_bytes: Some(m.rss),
            page_faults: Some(m.page_faults),
            major_page_faults: Some(m.major_page_faults),
        });
        (cpu, memory)
    }

    /// The Summary (`Get`), or only CPU and memory (`GetCPUAndMemoryStats`). `pods` are the
    /// pods this kubelet runs, for their volumes.
    pub async fn summary(
        &self,
        only_cpu_and_memory: bool,
        pods: &[Arc<Pod>],
    ) -> Result<Summary, CriError> {
        let full = !only_cpu_and_memory;
        let at = types::now_ns();
        let sandboxes = self.cri.list_pod_sandbox(None).await?;
        let containers = self.cri.list_containers(None).await?;
        let stats: HashMap<String, api::ContainerStats> = self
            .cri
            .list_container_stats(None)
            .await?
            .into_iter()
            .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
            .collect();
        let image_fs = if full { self.image_fs(at).await } else { None };

        // The node: the root cgroup, the pods' cgroup, this process's cgroup.
        let start = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| host::boot_time_ns(&t))
            .unwrap_or(0);
        let (cpu, memory) = self.cgroup_stats("/", at, Some(self.memory_capacity));
        let mut node = types::NodeStats {
            node_name: self.node_name.clone(),
            start_time: time(start),
            cpu,
            memory,
            ..types::NodeStats::default()
        };
        let mut system = vec![(
            types::SYSTEM_CONTAINER_PODS,
            self.cgroups.root().to_string(),
        )];
        let v2 = self.cgroups.cgroups().is_v2();
        if let Some(own) = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|t| cgroup::process_cgroup(&t, "memory", v2))
            .filter(|c| !c.trim_matches('/').is_empty())
        {
            system.push((types::SYSTEM_CONTAINER_KUBELET, own));
        }
        for (name, cgroup) in system {
            let (cpu, memory) = self.cgroup_stats(&cgroup, at, Some(self.memory_capacity));
            node.system_containers.push(ContainerStats {
                name: name.to_string(),
                start_time: time(start),
                cpu,
                memory,
                ..ContainerStats::default()
            });
        }
        if full {
            node.fs = host::statvfs(&self.root_dir, at);
            node.rlimit = Some(host::rlimit(
                &std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap_or_default(),
                &std::fs::read_to_string("/proc/sys/kernel/threads-max").unwrap_or_default(),
                &std::fs::read_to_string("/proc/loadavg").unwrap_or_default(),
                at,
            ));
            node.network = std::fs::read_to_string("/proc/self/net/dev")
                .ok()
                .map(|t| network(&t, at));
            node.runtime = image_fs.clone().map(|fs| RuntimeStats {
                image_fs: Some(fs.clone()),
                container_fs: Some(fs),
            });
        }

        // The pods: the newest ready sandbox of each.
        let mut latest: HashMap<String, &api::PodSandbox> = HashMap::new();
        for s in sandboxes
            .iter()
            .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        {
            let Some(uid) = s.labels.get(LABEL_POD_UID) else {
                continue;
            };
            let newer = latest.get(uid).is_none_or(|o| o.created_at < s.created_at);
            if newer {
                latest.insert(uid.clone(), s);
            }
        }
        let pod_cgroups: HashMap<String, String> = self
            .cgroups
            .pod_cgroups()
            .into_iter()
            .map(|(qos, uid)| (uid.clone(), self.cgroups.pod_cgroup(&qos, &uid)))
            .collect();
        let mut out = Vec::new();
        let mut uids: Vec<&String> = latest.keys().collect();
        uids.sort();
        for uid in uids {
            let s = latest[uid];
            let meta = s.metadata.clone().unwrap_or_default();
            let reference = PodReference {
                name: meta.name,
                namespace: meta.namespace,
                uid: uid.clone(),
            };
            let logs_dir = self.logs_root.join(format!(
                "{}_{}_{}",
                reference.namespace, reference.name, reference.uid
            ));
            let mut pod = PodStats {
                pod_ref: reference,
                start_time: time(u64::try_from(s.created_at).unwrap_or(0)),
                ..PodStats::default()
            };
            let mut running: Vec<&api::Container> = containers
                .iter()
                .filter(|c| {
                    c.pod_sandbox_id == s.id
                        && c.state == api::ContainerState::ContainerRunning as i32
                })
                .collect();
            running.sort_by(|a, b| {
                let name = |c: &api::Container| c.metadata.as_ref().map(|m| m.name.clone());
                name(a).cmp(&name(b))
            });
            for c in running {
                let name = c
                    .metadata
                    .as_ref()
                    .map(|m| m.name.clone())
                    .unwrap_or_default();
                let mut cs = ContainerStats {
                    name: name.clone(),
                    start_time: time(u64::try_from(c.created_at).unwrap_or(0)),
                    ..ContainerStats::default()
                };
                if let Some(st) = stats.get(&c.id) {
                    self.container_stats(&mut cs, &c.id, st, full.then_some(&image_fs), at);
                }
                if full {
                    cs.logs = host::du(&logs_dir.join(&name)).map(|(used, inodes)| FsStats {
                        used_bytes: Some(used),
                        inodes_used: Some(inodes),
                        ..host::statvfs(&self.logs_root, at).unwrap_or_default()
                    });
                }
                pod.containers.push(cs);
            }
            if let Some(cgroup) = pod_cgroups.get(uid) {
                let (cpu, memory) = self.cgroup_stats(cgroup, at, None);
                pod.cpu = cpu;
                pod.memory = memory;
                if full {
                    let count = self.cgroups.cgroups().pids(cgroup).len() as u64;
                    pod.process_stats = Some(ProcessStats {
                        process_count: Some(count),
                    });
                }
            }
            if full {
                pod.network = self.sandbox_network(&s.id, at).await;
                if let Some(spec) = pods
                    .iter()
                    .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
                {
                    pod.volume_stats = self.volumes(spec, uid, at);
                }
                pod.ephemeral_storage = Some(self.ephemeral(&pod, at));
            }
            out.push(pod);
        }
        Ok(Summary { node, pods: out })
    }

    fn container_stats(
        &self,
        cs: &mut ContainerStats,
        id: &str,
        st: &api::ContainerStats,
        image_fs: Option<&Option<FsStats>>,
        at: u64,
    ) {
        let v = |x: &Option<api::UInt64Value>| x.as_ref().map(|v| v.value);
        if let Some(cpu) = &st.cpu {
            let t = u64::try_from(cpu.timestamp)
                .ok()
                .filter(|t| *t > 0)
                .unwrap_or(at);
            cs.cpu = self.cpu(
                &format!("container:{id}"),
                t,
                v(&cpu.usage_core_nano_seconds),
            );
        }
        if let Some(m) = &st.memory {
            let t = u64::try_from(m.timestamp)
                .ok()
                .filter(|t| *t > 0)
                .unwrap_or(at);
            cs.memory = Some(MemoryStats {
                time: time(t),
                available_bytes: v(&m.available_bytes),
                usage_bytes: v(&m.usage_bytes),
                working_set_bytes: v(&m.working_set_bytes),
                rss_bytes: v(&m.rss_bytes),
                page_faults: v(&m.page_faults),
                major_page_faults: v(&m.major_page_faults),
            });
        }
        if let (Some(fs), Some(layer)) = (image_fs, &st.writable_layer) {
            let base = fs.clone().unwrap_or_default();
            cs.rootfs = Some(FsStats {
                time: time(at),
                used_bytes: v(&layer.used_bytes),
                inodes_used: v(&layer.inodes_used),
                ..base
            });
        }
    }

    /// CRI `ImageFsInfo`'s usage with `statvfs` of its mount point.
    async fn image_fs(&self, at: u64) -> Option<FsStats> {
        let info = self.cri.image_fs_info().await.ok()?;
        let fs = info.image_filesystems.first()?;
        let mount = fs.fs_id.as_ref().map(|i| i.mountpoint.clone())?;
        let base = host::statvfs(std::path::Path::new(&mount), at).unwrap_or_default();
        Some(FsStats {
            time: time(at),
            used_bytes: fs.used_bytes.as_ref().map(|v| v.value),
            inodes_used: fs.inodes_used.as_ref().map(|v| v.value),
            ..base
        })
    }

    /// The sandbox's network namespace counters, through its process's `/proc/<pid>/net/dev`.
    async fn sandbox_network(&self, id: &str, at: u64) -> Option<NetworkStats> {
        let status = self.cri.pod_sandbox_status(id, true).await.ok()?;
        let info = status.info.get("info")?;
        let pid = serde_json::from_str::<serde_json::Value>(info)
            .ok()?
            .get("pid")?
            .as_u64()
            .filter(|p| *p > 0)?;
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
        Some(network(&text, at))
    }

    fn volumes(&self, pod: &Pod, uid: &str, at: u64) -> Vec<VolumeStats> {
        let mut out = Vec::new();
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Some((plugin, _)) = MEASURED_VOLUMES.iter().find(|(_, is)| is(v)) else {
                continue;
            };
            let dir = self
                .root_dir
                .join(crate::volume::PODS_DIR)
                .join(uid)
                .join(crate::volume::VOLUMES_DIR)
                .join(plugin)
                .join(&v.name);
            let Some((used, inodes)) = host::du(&dir) else {
                continue;
            };
            let base = host::statvfs(&dir, at).unwrap_or_default();
            out.push(VolumeStats {
                fs: FsStats {
                    time: time(at),
                    used_bytes: Some(used),
                    inodes_used: Some(inodes),
                    ..base
                },
                name: v.name.clone(),
            });
        }
        out
    }

    /// `calcEphemeralStorage`: the containers' writable layers and logs plus the pod's
    /// volumes, on the root file system's capacity.
    fn ephemeral(&self, pod: &PodStats, at: u64) -> FsStats {
        let mut used = 0u64;
        let mut inodes = 0u64;
        for c in &pod.containers {
            for fs in [&c.rootfs, &c.logs].into_iter().flatten() {
                used = used.saturating_add(fs.used_bytes.unwrap_or(0));
                inodes = inodes.saturating_add(fs.inodes_used.unwrap_or(0));
            }
        }
        for v in &pod.volume_stats {
            used = used.saturating_add(v.fs.used_bytes.unwrap_or(0));
            inodes = inodes.saturating_add(v.fs.inodes_used.unwrap_or(0));
        }
        let base = host::statvfs(&self.root_dir, at).unwrap_or_default();
        FsStats {
            time: time(at),
            used_bytes: Some(used),
            inodes_used: Some(inodes),
            ..base
        }
    }
}

/// A `net/dev` text as NetworkStats: [`host::DEFAULT_INTERFACE`] inline when present.
fn network(text: &str, at: u64) -> NetworkStats {
    let interfaces = host::parse_net_dev(text);
    let default = interfaces
        .iter()
        .find(|i| i.name == host::DEFAULT_INTERFACE)
        .cloned()
        .unwrap_or_default();
    NetworkStats {
        time: time(at),
        default,
        interfaces,
    }
}
