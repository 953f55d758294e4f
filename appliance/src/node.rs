//! Wiring of the node agent into `skerry server`: every member is also a node, as k3s's
//! server is. With no flags, skerry starts its own supervised containerd under the data dir,
//! imports the pause image it builds from catatonit, watches the images folder, and runs the
//! kubelet (`skerry_node::kubelet`) as `system:node:<name>` in `system:nodes`, with a client
//! certificate the cluster CA issues in memory; what it may do is the apiserver's Node
//! authorizer's and NodeRestriction's to decide, with no RBAC binding of its own
//! (`server/apiserver/src/node_authz.rs`). `--container-runtime-endpoint` names any CRI
//! runtime instead.
//!
//! A machine that cannot run containers still serves the control plane. Without root the node
//! agent stays off; without the packages a node needs (`skerry_node::packages`) one line says
//! what to install, and the Node registers NotReady with that reason and keeps its Lease, so
//! the cluster sees a box that is there but runs no pods.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use k8s_openapi::api::core::v1::Taint;
use skerry_apiserver::auth::bootstrap::KUBE_PROXY_USER;
use skerry_client::Client;
use skerry_node::cgroups::CgroupManager;
use skerry_node::cgroups::pod::{
    ContainerManager, ENFORCE_PODS, node_allocatable_config, node_allocatable_limits,
};
use skerry_node::checkpoint::CheckpointManager;
use skerry_node::checkpoint::cpu_manager::{CpuSet, parse_cpuset};
use skerry_node::cm::ResourceManagers;
use skerry_node::cm::cpu_manager::{self, CpuManager, StaticConfig};
use skerry_node::cm::device_manager::{DeviceManager, plugin as device_plugin};
use skerry_node::cm::memory_manager::{self, MemoryManager, parse_reserved_memory};
use skerry_node::cm::topology::machine::Machine;
use skerry_node::cm::topology::{HintProvider, Policy as TopologyPolicy, Scope, TopologyManager};
use skerry_node::cni::{self, CniConfig};
use skerry_node::containerd::config::cni_bin_dir;
use skerry_node::containerd::{Containerd, ContainerdConfig};
use skerry_node::cri::Cri;
use skerry_node::eviction::EvictionManager;
use skerry_node::eviction::notifier::{self, MemoryThresholdNotifier};
use skerry_node::eviction::thresholds::{self, EvictionConfig};
use skerry_node::images::{self, build};
use skerry_node::kubelet::log_rotation::LogPolicy;
use skerry_node::kubelet::{Kubelet, KubeletConfig};
use skerry_node::machine::{self, Reservations};
use skerry_node::nodestatus::address;
use skerry_node::nodestatus::readiness::Readiness;
use skerry_node::nodestatus::runtime::{self, MissingRuntime};
use skerry_node::nodestatus::{NodeStatusConfig, NodeStatusManager, RuntimeInfo, flags};
use skerry_node::packages;
use skerry_node::registries::{self, Registries};
use skerry_node::server::KubeletServer;
use skerry_node::server::auth::Auth;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::pki::{LEAF_VALIDITY, Pki};

/// The node agent's flags (the kubelet's names).
#[derive(Args, Clone, Debug)]
pub struct NodeArgs {
    /// Run no node agent on this member: the control plane only (k3s's flag).
    #[arg(long)]
    pub disable_agent: bool,
    /// A CRI runtime's socket (unix:///path or a path) to use instead of starting skerry's
    /// own containerd.
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// The image of every pod's sandbox (its "pause" container); skerry builds and imports
    /// skerry.local/pause:1 itself.
    #[arg(long, default_value = build::PAUSE_IMAGE)]
    pub pod_infra_container_image: String,
    /// The node's IP address [default: the address of the default route's interface].
    #[arg(long)]
    pub node_ip: Option<IpAddr>,
    /// The node's name [default: the host name].
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The kubelet's directory (pods' volumes and logs) [default: <data-dir>/agent/kubelet].
    #[arg(long)]
    pub root_dir: Option<PathBuf>,
    /// DNS servers of pods with dnsPolicy ClusterFirst, comma-separated [default: none: such
    /// pods get the node's resolver configuration].
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Vec<IpAddr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The resolver configuration pods with `dnsPolicy: Default` inherit and cluster DNS
    /// forwards other names to (the kubelet's `--resolv-conf`; on a host whose resolv.conf
    /// names only a local stub such as systemd-resolved's, give the file behind the stub;
    /// empty: none).
    #[arg(long, default_value = skerry_net::dns::DEFAULT_RESOLV_CONF)]
    pub resolv_conf: PathBuf,
    /// The pods' addresses, cluster-wide (kube-controller-manager's and kube-proxy's flag;
    /// k3s's default): an IPv4 and an IPv6 range, comma-separated, for dual stack. Traffic
    /// from them to outside them is masqueraded.
    #[arg(long, default_value = skerry_controllers::nodeipam::CLUSTER_CIDR_DEFAULT)]
    pub cluster_cidr: String,
    /// Leave the node's network off: no pod routes, service proxy or cluster DNS on this
    /// node (for a box whose network another program runs).
    #[arg(long)]
    pub disable_network: bool,
    /// Where the service proxy serves its metrics (kube-proxy's `--metrics-bind-address`).
    #[arg(long, default_value = crate::network::PROXY_METRICS_DEFAULT)]
    pub proxy_metrics_bind_address: Option<std::net::SocketAddr>,
    /// Most pods this node runs (the kubelet's default).
    #[arg(long, default_value_t = 110)]
    pub max_pods: u32,
    /// The cgroup under which the pods' `kubepods` hierarchy goes (the kubelet's flag).
    #[arg(long, default_value = "/")]
    pub cgroup_root: String,
    /// Labels of the Node at registration, `key=value,...` (the kubelet's rules for the
    /// kubernetes.io and k8s.io prefixes).
    #[arg(long, value_parser = parse_node_labels, default_value = "")]
    pub node_labels: BTreeMap<String, String>,
    /// Taints of the Node at registration, `key=value:Effect,...`.
    #[arg(long, value_parser = parse_taints, default_value = "")]
    pub register_with_taints: Taints,
    /// What is kept for the kubelet and the runtime, `cpu=100m,memory=256Mi,...`.
    #[arg(long, default_value = "")]
    pub kube_reserved: String,
    /// What is kept for the system's own daemons, `cpu=100m,memory=256Mi,...`.
    #[arg(long, default_value = "")]
    pub system_reserved: String,
    /// The hard eviction thresholds, subtracted from allocatable (the kubelet's default).
    #[arg(long, default_value = machine::EVICTION_HARD_DEFAULT)]
    pub eviction_hard: String,
    /// Soft eviction thresholds, `memory.available<1.5Gi,...`: acted on once met for their
    /// grace period.
    #[arg(long, default_value = "")]
    pub eviction_soft: String,
    /// The grace period of each soft eviction threshold, `memory.available=1m30s,...`.
    #[arg(long, default_value = "")]
    pub eviction_soft_grace_period: String,
    /// What must be free beyond a threshold before its pressure ends,
    /// `memory.available=0Mi,nodefs.available=500Mi,imagefs.available=2Gi`.
    #[arg(long, default_value = "")]
    pub eviction_minimum_reclaim: String,
    /// How long a pressure condition stays after its threshold was last met.
    #[arg(long, default_value = "5m", value_parser = parse_transition_period)]
    pub eviction_pressure_transition_period: Duration,
    /// The minimum age of an unused image before it is garbage collected: an image first
    /// seen less than this long ago stays even under disk pressure (the kubelet's flag and
    /// default; a Go duration, 0 for none).
    #[arg(long, default_value = MINIMUM_IMAGE_TTL_DEFAULT, value_parser = parse_transition_period)]
    pub minimum_image_ttl_duration: Duration,
    /// The most seconds a pod evicted for a soft threshold gets to stop.
    #[arg(long, default_value_t = 0)]
    pub eviction_max_pod_grace_period: i64,
    /// The CPU manager's policy: `none` (every container on every CPU) or `static`
    /// (exclusive CPUs for the integer CPU requests of Guaranteed pods; needs a CPU
    /// reservation).
    #[arg(long, default_value = cpu_manager::POLICY_NONE, value_parser = [cpu_manager::POLICY_NONE, cpu_manager::POLICY_STATIC])]
    pub cpu_manager_policy: String,
    /// How often the CPU manager writes the containers' cpusets through CRI (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    pub cpu_manager_reconcile_period: Duration,
    /// The CPUs kept for the system and the kubelet (`0-1,4`); replaces the cpu of
    /// --kube-reserved and --system-reserved (as many CPUs are reserved).
    #[arg(long, default_value = "")]
    pub reserved_cpus: String,
    /// The memory manager's policy: `None` or `Static` (a Guaranteed container's memory on
    /// the topology manager's NUMA nodes; needs --reserved-memory).
    #[arg(long, default_value = memory_manager::POLICY_NONE, value_parser = [memory_manager::POLICY_NONE, memory_manager::POLICY_STATIC])]
    pub memory_manager_policy: String,
    /// The memory and hugepages kept per NUMA node for the system,
    /// `0:memory=1Gi,hugepages-2Mi=64Mi;1:memory=512Mi`; per resource the sum must be
    /// --kube-reserved + --system-reserved (+ --eviction-hard's memory.available for memory).
    #[arg(long, default_value = "")]
    pub reserved_memory: String,
    /// The topology manager's policy: none, best-effort, restricted, single-numa-node.
    #[arg(long, default_value = "none", value_parser = ["none", "best-effort", "restricted", "single-numa-node"])]
    pub topology_manager_policy: String,
    /// The topology manager's scope: container or pod.
    #[arg(long, default_value = "container", value_parser = ["container", "pod"])]
    pub topology_manager_scope: String,
    /// Requests a second the kubelet sends to the apiserver (the kubelet's `kubeAPIQPS`; 0:
    /// no limit).
    #[arg(long, default_value_t = KUBE_API_QPS, value_parser = parse_qps)]
    pub kube_api_qps: f64,
    /// Requests the kubelet may send at once before the QPS applies (`kubeAPIBurst`).
    #[arg(long, default_value_t = KUBE_API_BURST)]
    pub kube_api_burst: u32,
    /// How often a running pod's configMap, secret, downwardAPI and projected volumes are
    /// brought up to date with their objects (the kubelet's flag and default), e.g. 1m, 10s.
    #[arg(long, default_value = "1m", value_parser = parse_sync_frequency)]
    pub sync_frequency: Duration,
    /// Which reservations the pods' cgroup enforces: `pods` caps `kubepods` at allocatable
    /// (capacity minus --kube-reserved and --system-reserved); `none` leaves it at the
    /// capacity. (The kubelet's `kube-reserved` and `system-reserved` levels need cgroups of
    /// their own, which skerry does not manage.)
    #[arg(long, value_delimiter = ',', default_value = ENFORCE_PODS, value_parser = ["pods", "none"])]
    pub enforce_node_allocatable: Vec<String>,
    /// Most processes in one pod (the kubelet's `podPidsLimit`; -1: no limit).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub pod_max_pids: i64,
    /// The port of the kubelet's HTTPS API (logs for `kubectl logs`); 0 serves none.
    #[arg(long, default_value_t = skerry_node::server::DEFAULT_PORT)]
    pub kubelet_port: u16,
    /// The registries file (k3s's format: mirrors, credentials, TLS) [default:
    /// <data-dir>/agent/registries.yaml]; re-read when it changes.
    #[arg(long)]
    pub private_registry: Option<PathBuf>,
    /// A container's log is rotated once it is this big (a quantity: 10Mi).
    #[arg(long, default_value = "10Mi")]
    pub container_log_max_size: String,
    /// The most log files kept per container, the current one included (at least 2).
    #[arg(long, default_value_t = skerry_node::kubelet::log_rotation::DEFAULT_MAX_FILES)]
    pub container_log_max_files: usize,
    /// The folder of static pod manifests, created at start [default:
    /// <data-dir>/agent/pod-manifests, k3s's]; an empty value runs no static pods.
    #[arg(long)]
    pub pod_manifest_path: Option<PathBuf>,
    /// How often the manifest folder is read again without an inotify event.
    #[arg(long, default_value = "20s", value_parser = crate::parse_duration)]
    pub file_check_frequency: Duration,
    /// How long an exec, attach or port-forward session may go without traffic either way
    /// before it is closed (the kubelet's flag and default); 0 never closes one.
    #[arg(long, default_value = "4h", value_parser = parse_idle_timeout)]
    pub streaming_connection_idle_timeout: Duration,
}

/// The kubelet's own client limits, not client-go's 5/10: every pod start writes its status
/// and several events, so 30 pods starting at once would queue ~6 s behind a QPS of 5 (seen
/// in the pod start-up benchmark). Upstream raised the kubelet's defaults to 50/100 in 1.27
/// (`KubeletConfiguration` `kubeAPIQPS`, `kubeAPIBurst`, kubernetes/kubernetes#116121).
const KUBE_API_QPS: f64 = 50.0;
/// See [`KUBE_API_QPS`].
const KUBE_API_BURST: u32 = 100;

/// `--minimum-image-ttl-duration`'s default as the flag spells it: the kubelet's 2 minutes
/// (`skerry_node::images::gc::DEFAULT_MIN_AGE`, `ImageMinimumGCAge`).
const MINIMUM_IMAGE_TTL_DEFAULT: &str = "2m";

/// `--register-with-taints`, parsed.
#[derive(Clone, Debug, Default)]
pub struct Taints(pub Vec<Taint>);

/// `--kube-api-qps`: a finite number, not negative (the kubelet's `ValidateKubeletConfiguration`).
fn parse_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps >= 0.0 => Ok(qps),
        Ok(qps) if qps.is_finite() => Err("must not be a negative number".to_string()),
        Ok(_) => Err("must be a finite number".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// `--sync-frequency`: a Go-style duration, at least a second.
fn parse_sync_frequency(text: &str) -> Result<Duration, String> {
    let d = crate::parse_duration(text)?;
    if d < Duration::from_secs(1) {
        return Err("must be at least 1s".to_string());
    }
    Ok(d)
}

/// `--streaming-connection-idle-timeout`: a Go-style duration, or `0` (Go's `0` and `0s`)
/// for none.
fn parse_idle_timeout(text: &str) -> Result<Duration, String> {
    if text.trim_end_matches(['s', 'm', 'h']).trim_end_matches('m') == "0" {
        return Ok(Duration::ZERO);
    }
    crate::parse_duration(text)
}

/// `--eviction-pressure-transition-period`: a Go duration, not negative.
fn parse_transition_period(text: &str) -> Result<Duration, String> {
    skerry_node::eviction::thresholds::parse_go_duration(text).map_err(|e| e.0)
}

fn parse_node_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    flags::parse_node_labels(text).map_err(|e| e.0)
}

fn parse_taints(text: &str) -> Result<Taints, String> {
    flags::parse_taints(text).map(Taints).map_err(|e| e.0)
}

impl NodeArgs {
    /// The reservations of `--kube-reserved`, `--system-reserved` and `--eviction-hard`; an
    /// error names its flag.
    pub fn reservations(&self) -> Result<Reservations, String> {
        let mut r = Reservations::parse(
            &self.kube_reserved,
            &self.system_reserved,
            &self.eviction_hard,
        )
        .map_err(|e| e.0)?;
        // `--reserved-cpus` overwrites the cpu of both reservations
        // (`cmd/kubelet/app/server.go`): the system gets as many CPUs as it lists.
        let cpus = self.reserved_cpus()?;
        if !cpus.is_empty() {
            r.kube_reserved.remove("cpu");
            let count = machine::parse_reserved(&format!("cpu={}", cpus.len())).map_err(|e| e.0)?;
            r.system_reserved.extend(count);
        }
        Ok(r)
    }

    /// `--reserved-cpus`, parsed (`cpuset.Parse`).
    pub fn reserved_cpus(&self) -> Result<CpuSet, String> {
        parse_cpuset(self.reserved_cpus.trim()).map_err(|e| {
            format!(
                "--reserved-cpus: unable to parse {:?}: {e}",
                self.reserved_cpus
            )
        })
    }

    /// The eviction manager's thresholds and timings (`ParseThresholdConfig`), an error
    /// naming the flags.
    pub fn eviction_config(&self) -> Result<EvictionConfig, String> {
        let enforce = self
            .enforce_node_allocatable
            .iter()
            .any(|e| e == ENFORCE_PODS);
        let thresholds = thresholds::parse_threshold_config(
            enforce,
            &self.eviction_hard,
            &self.eviction_soft,
            &self.eviction_soft_grace_period,
            &self.eviction_minimum_reclaim,
        )
        .map_err(|e| format!("--eviction-hard/--eviction-soft: {}", e.0))?;
        Ok(EvictionConfig {
            thresholds,
            pressure_transition_period: self.eviction_pressure_transition_period,
            max_pod_grace_period: Duration::from_secs(
                u64::try_from(self.eviction_max_pod_grace_period).unwrap_or(0),
            ),
        })
    }

    /// The flags that need more than clap's parsing, checked before anything starts, as the
    /// kubelet refuses a bad configuration at start-up: the reservations and the log policy.
    pub fn validate(&self) -> Result<(), String> {
        self.reservations()?;
        self.eviction_config()?;
        parse_reserved_memory(&self.reserved_memory)
            .map_err(|e| format!("--reserved-memory: {e}"))?;
        LogPolicy::new(&self.container_log_max_size, self.container_log_max_files)
            .map_err(|e| e.to_string())?;
        // An empty --resolv-conf means none (as upstream's kubelet); a file named must exist.
        if !self.resolv_conf.as_os_str().is_empty() {
            std::fs::metadata(&self.resolv_conf)
                .map_err(|e| format!("--resolv-conf {}: {e}", self.resolv_conf.display()))?;
        }
        Ok(())
    }
}

/// The CPU and topology managers (`pkg/kubelet/cm/container_manager_linux.go` builds them
/// in `NewContainerManager`): the machine's topology from /sys, the CPU manager's state from
/// `<root-dir>/cpu_manager_state`, and the device manager as the third hint provider. When
/// the topology cannot be read and no policy needs it, a warning and managers that place
/// nothing but devices; an error (no node agent, as upstream's kubelet does not
/// start) when the static policy or a NUMA-aware topology policy cannot run.
fn resource_managers(
    args: &NodeArgs,
    root_dir: &Path,
    capacity: &machine::ResourceList,
    devices: &Arc<DeviceManager>,
) -> Result<Option<Arc<ResourceManagers>>, String> {
    let needed = args.cpu_manager_policy != cpu_manager::POLICY_NONE
        || args.memory_manager_policy != memory_manager::POLICY_NONE
        || args.topology_manager_policy != "none";
    let machine = match Machine::host() {
        Ok(m) => m,
        Err(e) if !needed => {
            tracing::warn!(error = %e, "no CPU manager: the machine's topology cannot be read");
            // The device manager runs all the same (upstream always runs it), under a
            // topology manager without NUMA nodes and a CPU manager that sets nothing.
            let checkpoints = CheckpointManager::new(root_dir).map_err(|e| e.to_string())?;
            let cpu = Arc::new(CpuManager::new(
                cpu_manager::POLICY_NONE,
                None,
                Machine::from_table(&[], 0),
                checkpoints,
            )?);
            let providers: Vec<Arc<dyn HintProvider>> = vec![cpu.clone(), devices.clone()];
            let topology = TopologyManager::new(
                TopologyPolicy::None,
                Scope::parse(&args.topology_manager_scope)?,
                Vec::new(),
                providers,
            )?;
            return Ok(Some(Arc::new(ResourceManagers {
                memory: None,
                cpu,
                devices: devices.clone(),
                topology,
                reconcile_period: args.cpu_manager_reconcile_period,
            })));
        }
        Err(e) => return Err(format!("the machine's topology: {e}")),
    };
    let reservations = args.reservations()?;
    let milli = |list: &machine::ResourceList| {
        list.get("cpu").map_or(0, |q| {
            i64::try_from((q.0 + NANO_PER_MILLI - 1) / NANO_PER_MILLI).unwrap_or(i64::MAX)
        })
    };
    let static_config = StaticConfig {
        reserved_cpus: Some(args.reserved_cpus()?).filter(|s| !s.is_empty()),
        reserved_milli: milli(&reservations.kube_reserved) + milli(&reservations.system_reserved),
    };
    let checkpoints = CheckpointManager::new(root_dir).map_err(|e| e.to_string())?;
    let numa_nodes = machine.numa_nodes();
    let reserved_memory = parse_reserved_memory(&args.reserved_memory)
        .map_err(|e| format!("--reserved-memory: {e}"))?;
    // Memory and the hugepage resources the node keeps (`nodeAllocatableReservation`),
    // which --reserved-memory must split across the NUMA nodes.
    let node_reserved: memory_manager::Requests = reservations
        .reservation(capacity)
        .iter()
        .filter(|(name, _)| memory_manager::is_memory_resource(name))
        .map(|(name, q)| {
            (
                name.clone(),
                u64::try_from(q.0 / NANO_PER_UNIT).unwrap_or(0),
            )
        })
        .collect();
    let memory = MemoryManager::new(
        &args.memory_manager_policy,
        &machine,
        &reserved_memory,
        &node_reserved,
        checkpoints.clone(),
    )
    .map_err(|e| format!("the memory manager: {e}"))?;
    let memory = memory.is_static().then(|| Arc::new(memory));
    let cpu = Arc::new(CpuManager::new(
        &args.cpu_manager_policy,
        Some(static_config),
        machine,
        checkpoints,
    )?);
    let mut providers: Vec<Arc<dyn HintProvider>> = vec![cpu.clone()];
    if let Some(m) = &memory {
        providers.push(m.clone());
    }
    // The device manager is upstream's third hint provider.
    providers.push(devices.clone());
    let topology = TopologyManager::new(
        TopologyPolicy::parse(&args.topology_manager_policy)?,
        Scope::parse(&args.topology_manager_scope)?,
        numa_nodes,
        providers,
    )?;
    Ok(Some(Arc::new(ResourceManagers {
        memory,
        cpu,
        devices: devices.clone(),
        topology,
        reconcile_period: args.cpu_manager_reconcile_period,
    })))
}

/// A millicore in a quantity's nano-units.
const NANO_PER_MILLI: i128 = 1_000_000;
/// A byte in a quantity's nano-units.
const NANO_PER_UNIT: i128 = 1_000_000_000;

/// The kubelet's own directory under the agent's.
const KUBELET_DIR: &str = "agent/kubelet";
/// The static pod manifests' folder under the data dir (k3s's `agent/pod-manifests`).
const POD_MANIFESTS_DIR: &str = "agent/pod-manifests";
/// The cgroup of every pod, under `--cgroup-root` (the kubelet's `defaultNodeAllocatableCgroupName`).
const KUBEPODS: &str = "kubepods";
/// The pause image's source binary.
const CATATONIT: &str = build::CATATONIT;

/// The node agent, running.
pub struct NodeAgent {
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
    containerd: Option<Containerd>,
}

impl NodeAgent {
    /// Stops the kubelet, then the supervised containerd (containers keep running, as when
    /// the upstream kubelet and containerd stop).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        if let Some(containerd) = self.containerd {
            containerd.stop().await;
        }
    }
}

/// Starts the slow-disk alarm (`crate::diskalarm`): its Events are about the Node this box
/// registers (or would, with `--disable-agent`), written as that node. A box without a name
/// says so in one line and records none (the store still counts and logs slow syncs).
pub fn start_disk_alarm(
    args: &NodeArgs,
    identity: &Identity,
    api_url: &str,
    log: crate::diskalarm::Log,
    stop: watch::Receiver<bool>,
) {
    let started = address::hostname(args.hostname_override.as_deref())
        .map_err(anyhow::Error::msg)
        .and_then(|name| {
            let client = identity.node_client(api_url, &name, args)?;
            crate::diskalarm::start(client, &name, log, stop);
            Ok(())
        });
    if let Err(e) = started {
        eprintln!("skerry: the slow-disk alarm records no events: {e:#}");
    }
}

/// Starts the node agent, or says in one line why it cannot run and returns `None`.
pub async fn start(
    args: &NodeArgs,
    data_dir: &Path,
    identity: Identity,
    api_url: &str,
    mut stop_rx: watch::Receiver<bool>,
) -> Option<NodeAgent> {
    if args.disable_agent {
        return None;
    }
    // The runtime: the CRI endpoint named, else skerry's own containerd; `missing` when this
    // box lacks the packages for one (the Node then registers NotReady and says why).
    let mut missing = None;
    let (cri, containerd) = match &args.container_runtime_endpoint {
        Some(endpoint) => match Cri::new(endpoint) {
            Ok(cri) => (Some(cri), None),
            Err(e) => {
                eprintln!("skerry: no node agent: --container-runtime-endpoint: {e}");
                return None;
            }
        },
        None => {
            if !rustix::process::geteuid().is_root() {
                eprintln!(
                    "skerry: no node agent: running containers needs root (the control plane serves; start as root to run pods)"
                );
                return None;
            }
            let absent = packages::missing();
            if !absent.is_empty() {
                let message = packages::message(&absent);
                eprintln!("skerry: {message}");
                missing = Some(message);
                (None, None)
            } else {
                match Containerd::start(ContainerdConfig {
                    data_dir: data_dir.to_path_buf(),
                    sandbox_image: args.pod_infra_container_image.clone(),
                    binary: None,
                })
                .await
                {
                    Ok(c) => (Some(c.cri().clone()), Some(c)),
                    Err(e) => {
                        eprintln!("skerry: no node agent: {e}");
                        return None;
                    }
                }
            }
        }
    };
    let stop = CancellationToken::new();
    if let Some(c) = &containerd {
        let api = images::k8s_api(&c.layout().socket);
        let spool = c.layout().images_dir.clone();
        if args.pod_infra_container_image == build::PAUSE_IMAGE {
            match images::import_pause_image(&api, Path::new(CATATONIT), &spool).await {
                Ok(_) => info!(image = build::PAUSE_IMAGE, "pause image imported"),
                Err(e) => eprintln!(
                    "skerry: the pause image cannot be built ({e}): install the Debian package catatonit"
                ),
            }
        }
        let (folder_stop_tx, folder_stop) = watch::channel(false);
        let token = stop.clone();
        tokio::spawn(async move {
            token.cancelled().await;
            let _ = folder_stop_tx.send(true);
        });
        tokio::spawn(images::watch::watch_folder(api, spool, folder_stop, None));
    }

    let node_name = match address::hostname(args.hostname_override.as_deref()) {
        Ok(name) => name,
        Err(e) => {
            eprintln!("skerry: no node agent: {e}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    let root_dir = args
        .root_dir
        .clone()
        .unwrap_or_else(|| data_dir.join(KUBELET_DIR));
    let client = match identity.node_client(api_url, &node_name, args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skerry: no node agent: {e:#}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };

    // The Node in the API: registration, status and Lease (`skerry_node::nodestatus`), and
    // the pod network written from the podCIDR the IPAM controller gives the node, into
    // the conf dir the runtime reads.
    if let Err(e) = std::fs::create_dir_all(&root_dir) {
        eprintln!(
            "skerry: no node agent: cannot create --root-dir {}: {e}",
            root_dir.display()
        );
        if let Some(c) = containerd {
            c.stop().await;
        }
        return None;
    }
    // The address the Node publishes (the status loop computes it the same way), for the
    // pods' hostIP and the kubelet's serving certificate; loopback when there is none, which
    // the Node's status then reports as an error.
    let node_ip = address::internal_ip(&node_name, args.node_ip, &node_name, Path::new("/proc"))
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no node address; pods get the loopback as hostIP");
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        });
    // The kubelet's API: bound now, so the Node publishes the port actually served.
    let kubelet_api =
        match kubelet_listener(args.kubelet_port, &identity, &node_name, node_ip).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("skerry: no node agent: the kubelet's API: {e:#}");
                if let Some(c) = containerd {
                    c.stop().await;
                }
                return None;
            }
        };
    let mut status_config = NodeStatusConfig::new(&node_name, root_dir.clone());
    status_config.kubelet_port = kubelet_api.as_ref().map_or(0, |(l, _)| {
        l.local_addr().map_or(0, |a| i32::from(a.port()))
    });
    status_config.node_ip = args.node_ip;
    status_config.max_pods = args.max_pods;
    status_config.node_labels = args.node_labels.clone();
    status_config.register_with_taints = args.register_with_taints.0.clone();
    status_config.reservations = match args.reservations() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skerry: no node agent: {e}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    let eviction_config = match args.eviction_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skerry: no node agent: {e}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    // The eviction manager's node conditions: written by it, read by the node status loop
    // and the kubelet's admission.
    let (pressure_tx, pressure_rx) = watch::channel(machine::Pressure::default());
    let readiness = Readiness::new();
    let mut cni_config = CniConfig::under(&root_dir);
    cni_config.plugin_dir = cni_bin_dir();
    if let Some(c) = &containerd {
        cni_config.conf_dir = c.layout().cni_conf_dir.clone();
    }
    let runtime: Arc<dyn RuntimeInfo> = match (&cri, &missing) {
        (Some(cri), _) => Arc::new(cri.clone()),
        (None, message) => Arc::new(MissingRuntime(message.clone().unwrap_or_default())),
    };
    // The device manager (always, as upstream's kubelet): its checkpoint read now, its
    // registration socket served with the kubelet, its resources in the Node's status.
    let devices = match DeviceManager::new(&root_dir) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("skerry: no node agent: the device manager: {e}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    let status =
        match NodeStatusManager::new(client.clone(), status_config, runtime, readiness.clone()) {
            Ok(m) => {
                let m = m
                    .with_pod_cidr_handler(cni::pod_cidr_handler(cni_config, readiness.clone()))
                    .with_device_counts(devices.subscribe());
                // Without a runtime no eviction manager runs: the thresholds are read by the
                // status loop itself.
                Arc::new(if cri.is_some() {
                    m.with_pressure(pressure_rx.clone())
                } else {
                    m
                })
            }
            Err(e) => {
                eprintln!("skerry: no node agent: reading the machine: {e}");
                if let Some(c) = containerd {
                    c.stop().await;
                }
                return None;
            }
        };
    // A runtime that answered at start is up; the watcher follows it from there (a dead
    // containerd turns the node NotReady after the kubelet's 30 s, a revived one Ready).
    match &missing {
        Some(message) => readiness.set_runtime_down(Some(&format!(
            "{}: {message}",
            skerry_node::nodestatus::readiness::RUNTIME_DOWN
        ))),
        None => readiness.set_runtime_up(),
    }

    let log_policy =
        match LogPolicy::new(&args.container_log_max_size, args.container_log_max_files) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("skerry: no node agent: {e}");
                if let Some(c) = containerd {
                    c.stop().await;
                }
                return None;
            }
        };
    // The registries file: rendered into the supervised containerd's hosts directory (read
    // by containerd at every pull, so no restart) and its credentials given to the kubelet.
    // A file that cannot be used is one line, and the node runs without it.
    let registries = Registries::new();
    let mut registries_watcher = registries::Watcher::new(
        args.private_registry
            .clone()
            .unwrap_or_else(|| data_dir.join("agent").join(registries::DEFAULT_FILE)),
        containerd
            .as_ref()
            .map(|c| c.layout().registry_config_dir.clone()),
        registries.clone(),
    );
    if let Err(e) = registries_watcher.reload() {
        eprintln!("skerry: {e}; running with no registry configuration");
    }
    tokio::spawn(registries_watcher.run(stop.clone()));

    let memory = status
        .capacity()
        .get("memory")
        .map_or(0, |q| q.0 / 1_000_000_000);
    // `kubepods` and the QoS cgroups, capped at allocatable (the kubelet's container
    // manager: it does not start without them).
    let cgroup_root = format!("{}/{KUBEPODS}", args.cgroup_root.trim_end_matches('/'));
    let cgroups = match container_manager(args, &status, &cgroup_root) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("skerry: no node agent: the pods' cgroups: {e}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    let resource_managers = match resource_managers(args, &root_dir, status.capacity(), &devices) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("skerry: no node agent: the resource managers: {e}");
            if let Some(c) = containerd {
                c.stop().await;
            }
            return None;
        }
    };
    let config = KubeletConfig {
        resource_managers,
        node_name: node_name.clone(),
        root_dir,
        node_ips: vec![node_ip.to_string()],
        cluster_dns: args.cluster_dns.iter().map(IpAddr::to_string).collect(),
        cluster_domain: args.cluster_domain.clone(),
        cgroup_root,
        memory_capacity: i64::try_from(memory).unwrap_or(i64::MAX),
        allocatable: machine::to_api(status.allocatable()),
        resolv_conf: args.resolv_conf.clone(),
        hosts_file: PathBuf::from("/etc/hosts"),
        registries,
        log_policy,
        sync_frequency: args.sync_frequency,
        cgroups,
        pod_manifest_path: pod_manifest_path(args.pod_manifest_path.as_deref(), data_dir),
        file_check_frequency: args.file_check_frequency,
        streaming_connection_idle_timeout: args.streaming_connection_idle_timeout,
        node_pressure: pressure_rx,
    };
    let token = stop.clone();
    tokio::spawn(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
        token.cancel();
    });
    if !args.disable_network {
        match identity.network_client(api_url) {
            Ok(network_client) => {
                crate::network::start(
                    crate::network::NetworkContext {
                        args,
                        client: network_client,
                        node_name: node_name.clone(),
                        node_ip,
                        resolv_conf: config.resolv_conf.clone(),
                    },
                    stop.clone(),
                )
                .await;
            }
            Err(e) => eprintln!("skerry: no node network: {e:#}"),
        }
    }
    // Without a runtime only the Node and its Lease are kept: the kubelet has nothing to run
    // pods with, and its API nothing to serve.
    let kubelet = cri.map(|cri| {
        tokio::spawn(runtime::watch_health(
            runtime::cri_status(cri.clone()),
            readiness.clone(),
            stop.clone(),
        ));
        Kubelet::new(config, cri, client.clone(), stop.clone())
    });
    {
        let (devices, stop) = (devices.clone(), stop.clone());
        tokio::spawn(async move {
            if let Err(e) = device_plugin::serve(devices, stop).await {
                eprintln!("skerry: no device plugins: the registration socket: {e}");
            }
        });
    }
    if let (Some(kubelet), Some((listener, tls))) = (&kubelet, kubelet_api) {
        let server = KubeletServer::new(kubelet.clone(), Auth::new(&client));
        tokio::spawn(server.serve(listener, tls, stop.clone()));
    }
    let task_stop = stop.clone();
    let pause_image = args.pod_infra_container_image.clone();
    let image_min_age = args.minimum_image_ttl_duration;
    let task = tokio::spawn(async move {
        // No binding to wait for: the apiserver's Node authorizer grants the node what it
        // needs (its pods' secrets, configmaps and tokens, its Node and Lease), and
        // NodeRestriction narrows its writes to its own.
        match kubelet {
            Some(kubelet) => {
                tokio::spawn(status.run(task_stop.clone()));
                // The memory threshold notifier wakes the manager when the kernel reports a
                // crossing (a memcg threshold on an eventfd, a PSI trigger on v2); between
                // crossings the manager sleeps its monitoring interval.
                let wake = Arc::new(tokio::sync::Notify::new());
                let cgroups = kubelet.config().cgroups.clone();
                let notifier = MemoryThresholdNotifier::new(
                    cgroups.cgroups().clone(),
                    u64::try_from(kubelet.config().memory_capacity).unwrap_or(0),
                    skerry_node::eviction::memory_watches(&eviction_config, cgroups.root()),
                    notifier::HOUSEKEEPING_INTERVAL,
                );
                let crossed = wake.clone();
                let notifier_stop = task_stop.clone();
                tokio::spawn(async move {
                    let run = notifier.run(move |w| {
                        if let notifier::Wake::Crossed { message, .. } = w {
                            info!("{message}");
                            crossed.notify_one();
                        }
                    });
                    tokio::select! {
                        () = run => {}
                        () = notifier_stop.cancelled() => {}
                    }
                });
                let eviction = Arc::new(EvictionManager::new(
                    eviction_config,
                    kubelet.clone(),
                    pressure_tx,
                    vec![pause_image],
                    image_min_age,
                ));
                tokio::spawn(eviction.run(wake, task_stop.clone()));
                info!(node = %node_name, ip = %node_ip, "node agent running");
                kubelet.run().await;
            }
            None => status.run(task_stop).await,
        }
    });
    Some(NodeAgent {
        task,
        stop,
        containerd,
    })
}

/// The kubelet's cgroups under `root` (`<cgroup-root>/kubepods`), started: `kubepods` capped
/// at the node's capacity with `pid` (`/proc/sys/kernel/pid_max`, the kubelet's internal
/// capacity) minus the reservations when `pods` is enforced.
fn container_manager(
    args: &NodeArgs,
    status: &NodeStatusManager,
    root: &str,
) -> Result<ContainerManager, String> {
    let reservations = args.reservations()?;
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    let enforce = args
        .enforce_node_allocatable
        .iter()
        .any(|e| e == ENFORCE_PODS);
    let limits = node_allocatable_limits(
        status.capacity(),
        pid_max,
        &reservations.kube_reserved,
        &reservations.system_reserved,
        enforce,
    );
    let cgroups = CgroupManager::detect().map_err(|e| e.to_string())?;
    let manager = ContainerManager::new(
        cgroups,
        root,
        node_allocatable_config(&limits),
        args.pod_max_pids,
    );
    manager.start().map_err(|e| e.to_string())?;
    Ok(manager)
}

/// `--pod-manifest-path`: the folder given, k3s's under the data dir when none is, no static
/// pods when it is empty (the kubelet's empty `staticPodPath`).
fn pod_manifest_path(flag: Option<&Path>, data_dir: &Path) -> Option<PathBuf> {
    match flag {
        Some(p) if p.as_os_str().is_empty() => None,
        Some(p) => Some(p.to_path_buf()),
        None => Some(data_dir.join(POD_MANIFESTS_DIR)),
    }
}

/// The kubelet API's listener on `port` (all addresses, as the kubelet's `--address`
/// 0.0.0.0) and its TLS: the node's serving certificate from the cluster CA for its name,
/// its IP and the loopbacks, client certificates asked for and verified against the CA (a
/// caller without one may still present a bearer token). `None` for port 0.
async fn kubelet_listener(
    port: u16,
    identity: &Identity,
    node: &str,
    node_ip: IpAddr,
) -> Result<
    Option<(
        tokio::net::TcpListener,
        Arc<tokio_rustls::rustls::ServerConfig>,
    )>,
> {
    if port == 0 {
        return Ok(None);
    }
    let mut ips = vec![node_ip];
    ips.extend(crate::pki::SERVING_IPS.iter().filter(|ip| **ip != node_ip));
    let (chain, key) = identity.serving(node, &ips)?;
    let roots = skerry_tls::config::roots(identity.client_ca()?)?;
    let tls = skerry_tls::config::server_config(
        chain,
        key,
        skerry_tls::config::ClientAuth::Optional(Arc::new(roots)),
        &[b"http/1.1"],
    )?;
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port))
        .await
        .with_context(|| format!("--kubelet-port {port}: bind"))?;
    Ok(Some((listener, Arc::new(tls))))
}

/// Who the node agent is, to the API and to the callers of its own API.
pub enum Identity {
    /// A member's own PKI (`skerry server`): the node's client certificate
    /// (`system:node:<name>` in `system:nodes`) and its serving certificate are issued in
    /// memory from the cluster CA for the name the node finds at start.
    Pki(Arc<Pki>),
    /// Files given by flags (`skerry agent`), as the upstream kubelet's `--kubeconfig`,
    /// `--tls-cert-file`, `--tls-private-key-file` and `--client-ca-file`.
    Files(Box<AgentCredentials>),
}

/// The credentials `skerry agent` reads from its flags' files.
pub struct AgentCredentials {
    /// The API client (server, CA, client certificate) from the kubeconfig, with the URL
    /// of `--server`.
    pub client: skerry_client::Config,
    /// The kubelet API's certificate chain and key.
    pub serving_chain: Vec<rustls_pki_types::CertificateDer<'static>>,
    pub serving_key: rustls_pki_types::PrivateKeyDer<'static>,
    /// The CAs that sign callers' client certificates (the apiserver's among them).
    pub client_ca: Vec<rustls_pki_types::CertificateDer<'static>>,
    /// The node network's API client (`system:kube-proxy`), from `--network-kubeconfig`;
    /// `None` when the network is off.
    pub network: Option<skerry_client::Config>,
}

impl AgentCredentials {
    /// Reads the files: the kubeconfig's current context gives the client (its server
    /// replaced by `server`), `client_ca` defaults to the kubeconfig's CA. An error names
    /// the file.
    pub fn read(
        server: &str,
        kubeconfig: &Path,
        cert_file: &Path,
        key_file: &Path,
        client_ca: Option<&Path>,
    ) -> Result<AgentCredentials> {
        let mut client = skerry_client::Config::from_kubeconfig(kubeconfig)
            .with_context(|| format!("--kubeconfig {}", kubeconfig.display()))?;
        client.server = server.to_string();
        use skerry_tls::config::{certs_from_pem, read_certs, read_key};
        let chain = read_certs(cert_file, "--tls-cert-file")?;
        let key = read_key(key_file, "--tls-private-key-file")?;
        let client_ca = match client_ca {
            Some(path) => read_certs(path, "--client-ca-file")?,
            None => {
                let pem = client.ca_pem.clone().with_context(|| {
                    format!(
                        "--kubeconfig {} names no certificate authority: give --client-ca-file",
                        kubeconfig.display()
                    )
                })?;
                certs_from_pem(pem.as_bytes()).map_err(|e| {
                    anyhow::anyhow!(
                        "--kubeconfig {}: its certificate authority: {e}",
                        kubeconfig.display()
                    )
                })?
            }
        };
        Ok(AgentCredentials {
            client,
            serving_chain: chain,
            serving_key: key,
            client_ca,
            network: None,
        })
    }
}

impl Identity {
    /// The kubelet's API client, with the node's QPS and burst.
    fn node_client(&self, url: &str, node: &str, args: &NodeArgs) -> Result<Client> {
        let mut config = match self {
            Identity::Pki(pki) => {
                let user = format!("system:node:{node}");
                let cert = pki
                    .issue_client_cert(&user, &["system:nodes"], LEAF_VALIDITY)
                    .with_context(|| format!("issue a client certificate for {user}"))?;
                client_config(pki, url, &user, cert.cert_pem, cert.key_pem)
            }
            Identity::Files(files) => files.client.clone(),
        };
        config.qps = args.kube_api_qps;
        config.burst = args.kube_api_burst;
        Ok(Client::new(config)?)
    }

    /// The node network's API client: kube-proxy's user ([`KUBE_PROXY_USER`], bound to
    /// `system:node-proxier`), which reads every Service, EndpointSlice and Node, where the
    /// node's own identity reads only its own Node.
    fn network_client(&self, url: &str) -> Result<Client> {
        let config = match self {
            Identity::Pki(pki) => {
                let cert = pki
                    .issue_client_cert(KUBE_PROXY_USER, &[], LEAF_VALIDITY)
                    .with_context(|| format!("issue a client certificate for {KUBE_PROXY_USER}"))?;
                client_config(pki, url, KUBE_PROXY_USER, cert.cert_pem, cert.key_pem)
            }
            Identity::Files(files) => files.network.clone().context(
                "no --network-kubeconfig: the node's network calls the API as system:kube-proxy (skerry node-credentials writes its kubeconfig)",
            )?,
        };
        Ok(Client::new(config)?)
    }

    /// The kubelet API's serving certificate chain and key.
    fn serving(
        &self,
        node: &str,
        ips: &[IpAddr],
    ) -> Result<(
        Vec<rustls_pki_types::CertificateDer<'static>>,
        rustls_pki_types::PrivateKeyDer<'static>,
    )> {
        match self {
            Identity::Pki(pki) => {
                let cert = pki
                    .issue_node_serving_cert(node, ips)
                    .context("issue the kubelet's serving certificate")?;
                Ok((cert.cert_chain()?, cert.private_key()?))
            }
            Identity::Files(files) => {
                Ok((files.serving_chain.clone(), files.serving_key.clone_key()))
            }
        }
    }

    /// The CAs whose client certificates the kubelet's API accepts.
    fn client_ca(&self) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>> {
        match self {
            Identity::Pki(pki) => Ok(vec![pki.ca_cert_der().clone()]),
            Identity::Files(files) => Ok(files.client_ca.clone()),
        }
    }
}

fn client_config(
    pki: &Pki,
    url: &str,
    user: &str,
    cert_pem: String,
    key_pem: String,
) -> skerry_client::Config {
    let mut config = skerry_client::Config::new(url);
    config.ca_pem = Some(pki.ca_cert_pem().to_string());
    config.credentials = skerry_client::Credentials::ClientCert { cert_pem, key_pem };
    config.user_agent = format!("skerry/{user}");
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_folder_defaults_to_k3ss_and_empty_turns_it_off() {
        let data = Path::new("/d");
        assert_eq!(
            pod_manifest_path(None, data),
            Some(PathBuf::from("/d/agent/pod-manifests"))
        );
        assert_eq!(
            pod_manifest_path(Some(Path::new("/m")), data),
            Some(PathBuf::from("/m"))
        );
        assert_eq!(pod_manifest_path(Some(Path::new("")), data), None);
    }

    #[test]
    fn the_minimum_image_age_defaults_to_the_kubelet_s() {
        assert_eq!(
            parse_transition_period(MINIMUM_IMAGE_TTL_DEFAULT),
            Ok(skerry_node::images::gc::DEFAULT_MIN_AGE)
        );
        assert_eq!(parse_transition_period("0"), Ok(Duration::ZERO));
        assert!(parse_transition_period("-1m").is_err());
    }

    #[test]
    fn the_idle_timeout_is_a_duration_or_zero_for_none() {
        assert_eq!(parse_idle_timeout("4h"), Ok(Duration::from_secs(4 * 3600)));
        assert_eq!(parse_idle_timeout("3s"), Ok(Duration::from_secs(3)));
        for zero in ["0", "0s", "0m", "0h", "0ms"] {
            assert_eq!(parse_idle_timeout(zero), Ok(Duration::ZERO), "{zero}");
        }
        assert!(parse_idle_timeout("soon").is_err());
        assert!(parse_idle_timeout("10").is_err());
    }
}
