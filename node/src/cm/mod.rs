//! The kubelet's resource managers (upstream `pkg/kubelet/cm/`): which CPUs and which NUMA
//! nodes a container may use.
//!
//! - [`topology`]: the machine's NUMA nodes, sockets, cores and CPUs read from /sys, and the
//!   topology manager that merges the providers' NUMA hints by bitwise AND and admits or
//!   rejects a pod (`TopologyAffinityError`);
//! - [`memory_manager`]: the memory manager, `None` or `Static` (a Guaranteed container's
//!   memory on the merged NUMA nodes, its `cpuset.mems` set at creation), kept in the
//!   `memory_manager_state` checkpoint;
//! - [`device_manager`]: the device manager, the kubelet's side of the device plugin API:
//!   plugins register on `device-plugins/kubelet.sock`, their devices become extended
//!   resources on the Node and are handed to the containers that request them (a third hint
//!   provider), kept in the `device-plugins/kubelet_internal_checkpoint` checkpoint;
//! - [`cpu_manager`]: the CPU manager, `none` or `static` (exclusive CPUs for the integer CPU
//!   requests of Guaranteed pods, a shared pool for everything else), kept in the
//!   `cpu_manager_state` checkpoint and reconciled into every container's cpuset over CRI.
//!
//! The trick they carry: each provider answers "which NUMA masks could hold this
//! container?", the manager ANDs one mask of every provider over the cross product of their
//! answers and keeps the narrowest preferred result, and a provider with no preference
//! contributes a don't-care hint (all ones, preferred), never a zero that would veto the
//! merge.

pub mod cpu_manager;
pub mod device_manager;
pub mod memory_manager;
pub mod topology;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::cpu_manager::CpuSet;
use crate::cri::Cri;

/// The managers the kubelet runs its pods with (upstream's container manager holds them).
pub struct ResourceManagers {
    /// The CPU manager.
    pub cpu: Arc<cpu_manager::CpuManager>,
    /// The memory manager (`None`: policy `None`).
    pub memory: Option<Arc<memory_manager::MemoryManager>>,
    /// The device manager (always there: upstream always runs it).
    pub devices: Arc<device_manager::DeviceManager>,
    /// The topology manager, over the CPU, memory and device managers as its hint providers.
    pub topology: topology::TopologyManager,
    /// `--cpu-manager-reconcile-period`.
    pub reconcile_period: Duration,
}

impl ResourceManagers {
    /// The topology manager's admission of `pod` (which allocates its exclusive CPUs).
    pub fn admit(&self, pod: &Pod) -> Result<(), topology::AdmitError> {
        self.topology.admit(pod)
    }

    /// The devices of `pod`'s containers, after [`ResourceManagers::admit`]: chosen within
    /// the affinities the topology manager recorded and allocated by their plugins; `active`
    /// are the pods still holding resources. A failure frees everything of the pod and is
    /// upstream's `UnexpectedAdmissionError`.
    pub async fn allocate_devices(
        &self,
        pod: &Pod,
        active: &std::collections::HashSet<String>,
    ) -> Result<(), topology::AdmitError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let result = self
            .devices
            .allocate_pod(pod, active, |c| {
                self.topology.affinity(&uid, c).and_then(|h| h.affinity)
            })
            .await;
        result.map_err(|e| {
            self.release_pod(&uid);
            topology::AdmitError {
                reason: topology::UNEXPECTED_ADMISSION_ERROR.to_string(),
                message: format!("Allocate failed due to {e}, which is unexpected"),
            }
        })
    }

    /// The pod stopped: its affinities, exclusive CPUs, memory and devices are freed.
    pub fn release_pod(&self, uid: &str) {
        self.topology.remove_pod(uid);
        use topology::HintProvider as _;
        self.cpu.release_pod(uid);
        if let Some(m) = &self.memory {
            m.release_pod(uid);
        }
        self.devices.release(uid);
    }

    /// What a new container gets from its devices (`None`: it holds none).
    pub fn device_options(&self, uid: &str, container: &str) -> Option<device_manager::RunOptions> {
        self.devices.run_options(uid, container)
    }

    /// The cpuset a new container is created with (`None`: leave it alone).
    pub fn cpuset_for(&self, uid: &str, container: &str) -> Option<CpuSet> {
        self.cpu
            .cpuset_for(uid, container)
            .filter(|s| !s.is_empty())
    }

    /// The `cpuset.mems` a new container is created with (the memory manager's NUMA nodes
    /// of its memory, `None`: leave it alone).
    pub fn cpuset_mems_for(&self, uid: &str, container: &str) -> Option<String> {
        let nodes = self.memory.as_ref()?.numa_nodes_for(uid, container)?;
        Some(crate::checkpoint::cpu_manager::format_cpuset(
            &nodes.into_iter().collect(),
        ))
    }

    /// Reconciles every `reconcile_period` until `stop` (`cpuManager.reconcileState` in its
    /// loop); `active` gives the pods not terminated.
    pub async fn run_reconcile(
        self: Arc<Self>,
        cri: Cri,
        active: impl Fn() -> Vec<Arc<Pod>> + Send,
        stop: CancellationToken,
    ) {
        if !self.cpu.is_static() {
            return;
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.reconcile_period) => {}
                () = stop.cancelled() => return,
            }
            self.cpu.reconcile(&cri, &active()).await;
        }
    }
}

impl std::fmt::Debug for ResourceManagers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceManagers")
            .field("cpu_static", &self.cpu.is_static())
            .field("topology_policy", &self.topology.policy())
            .field("reconcile_period", &self.reconcile_period)
            .finish_non_exhaustive()
    }
}
