//! The node in the API: registration, status and heartbeat, as the upstream kubelet keeps
//! them (`pkg/kubelet/kubelet_node_status.go`, `nodestatus/setters.go`, the node lease
//! controller).
//!
//! - **Registration** ([`NodeStatusManager::register`]): the Node is created with its labels
//!   (`kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch`, `--node-labels`),
//!   `--register-with-taints` and a full first status; when it already exists (a restart) it
//!   is reconciled as `tryRegisterWithAPIServer` does: default labels put back, hugepage
//!   pools brought to what the host has, extended resources zeroed until their device
//!   plugins come back ([`NodeStatusManager::with_device_counts`]: the device manager's
//!   counts, each change written at once). Attempts back off from 100 ms doubling to 7 s.
//! - **Status** ([`NodeStatusManager::sync_status`]): every `nodeStatusUpdateFrequency`
//!   (10 s), and at once when a readiness input changes or the Node's podCIDRs appear, the
//!   status is computed over the stored Node ([`setters`]) and patched only if it changed
//!   (heartbeats aside) or `nodeStatusReportFrequency` (5 min) has passed since the last
//!   post; five tries (`nodeStatusUpdateRetry`), each from a fresh read.
//! - **Heartbeat** ([`lease`]): the Lease `kube-node-lease/<node>` renewed every 10 s.
//!
//! The trick carried here (the Lease as the heartbeat, KEP-589): because the Lease
//! says "alive" every 10 s, the full status is posted only when something in it changed or
//! every five minutes, so an idle node costs the store one small write per 10 s instead of
//! a multi-kilobyte Node. The setters stamp heartbeats on every computation and
//! [`setters::status_changed`] ignores them, which is what makes "unchanged" detectable.
//!
//! Inputs the rest of the kubelet provides: the runtime's version and images through
//! [`RuntimeInfo`] (the CRI client implements it), readiness through [`Readiness`] (the pod
//! workers and the network setup call it), the podCIDRs the IPAM controller gives through a
//! [`PodCidrHandler`] (the CNI configuration of [`crate::cni`]).

pub mod address;
pub mod flags;
pub mod lease;
pub mod readiness;
pub mod runtime;
pub mod setters;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, ObjectReference, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};
use skerry_api::node::pod_cidrs;
use skerry_client::events::{EventRecorder, RecorderOptions};
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::reflector::ListerWatcher;
use skerry_client::{
    Api, Client, ListParams, ObjectList, Patch, PatchParams, PostParams, WatchParams, WatchStream,
};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::machine::{
    self, HostPaths, MAX_PODS_DEFAULT, MachineError, MachineInfo, Pressure, Reservations,
    ResourceList, resources,
};
pub use lease::{LeaseConfig, NODE_LEASE_NAMESPACE, NodeLease};
pub use readiness::Readiness;

/// How often the status is computed (the kubelet's `nodeStatusUpdateFrequency` default):
/// the longest a change of something nobody announces (an address, an image) waits.
pub const NODE_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
/// How often an unchanged status is posted anyway (`nodeStatusReportFrequency` default):
/// the Lease is the heartbeat, this only refreshes `lastHeartbeatTime` for readers of the
/// conditions.
pub const NODE_STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(5 * 60);
/// Tries of one status update (`kubelet.go`, `nodeStatusUpdateRetry`).
pub const NODE_STATUS_UPDATE_RETRY: usize = 5;
/// The kubelet's port, published in `status.daemonEndpoints` (`ports.KubeletPort`).
pub const KUBELET_PORT: i32 = 10250;
/// The first pause between registration attempts (`registerWithAPIServer`)...
pub const REGISTER_BACKOFF_START: Duration = Duration::from_millis(100);
/// ... doubling up to 7 s.
pub const REGISTER_BACKOFF_MAX: Duration = Duration::from_secs(7);
/// The event source of the kubelet (`source.component`).
pub const KUBELET_COMPONENT: &str = "kubelet";
/// The Kubernetes API this kubelet speaks, as the apiserver reports it (`gitVersion`).
pub const KUBELET_VERSION: &str = concat!("v1.32.0-skerry.", env!("CARGO_PKG_VERSION"));

/// The runtime's `Version` answer (CRI `VersionResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// `runtime_name` (`containerd`).
    pub runtime_name: String,
    /// `runtime_version` (`1.6.20`).
    pub runtime_version: String,
}

/// An image the runtime holds (CRI `Image`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `id` (`sha256:...`).
    pub id: String,
    /// `repo_tags`.
    pub repo_tags: Vec<String>,
    /// `repo_digests`.
    pub repo_digests: Vec<String>,
    /// `size` in bytes.
    pub size: u64,
}

/// What the node status needs from the container runtime: implemented over the CRI client.
pub trait RuntimeInfo: Send + Sync + 'static {
    /// CRI `Version`.
    fn version(&self) -> BoxFuture<'_, anyhow::Result<RuntimeVersion>>;
    /// CRI `ListImages`.
    fn list_images(&self) -> BoxFuture<'_, anyhow::Result<Vec<Image>>>;
}

/// Called with the Node's `spec.podCIDRs` when they are first seen or change (the kubelet's
/// `updatePodCIDR`); an error is logged and the call repeated at the next sync.
pub type PodCidrHandler = Arc<dyn Fn(&[String]) -> anyhow::Result<()> + Send + Sync>;

/// The node's settings: the kubelet's flags and timings.
#[derive(Debug, Clone)]
pub struct NodeStatusConfig {
    /// The Node's name (the host name, lower-cased, or `--hostname-override`).
    pub node_name: String,
    /// The Hostname address and the `kubernetes.io/hostname` label.
    pub hostname: String,
    /// `--node-ip`.
    pub node_ip: Option<IpAddr>,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `--register-with-taints`.
    pub register_with_taints: Vec<Taint>,
    /// `--max-pods`.
    pub max_pods: u32,
    /// `--root-dir`: its filesystem is the node's ephemeral storage.
    pub root_dir: PathBuf,
    /// `--kube-reserved`, `--system-reserved`, `--eviction-hard`.
    pub reservations: Reservations,
    /// The kubelet's port.
    pub kubelet_port: i32,
    /// Where the host is read.
    pub host: HostPaths,
    /// See [`NODE_STATUS_UPDATE_FREQUENCY`].
    pub status_update_frequency: Duration,
    /// See [`NODE_STATUS_REPORT_FREQUENCY`].
    pub status_report_frequency: Duration,
    /// The Lease's timing.
    pub lease: LeaseConfig,
}

impl NodeStatusConfig {
    /// The kubelet's defaults for node `node_name` with root dir `root_dir`: no reservations
    /// but the default hard eviction thresholds.
    pub fn new(node_name: &str, root_dir: PathBuf) -> NodeStatusConfig {
        NodeStatusConfig {
            node_name: node_name.to_string(),
            hostname: node_name.to_string(),
            node_ip: None,
            node_labels: BTreeMap::new(),
            register_with_taints: Vec::new(),
            max_pods: MAX_PODS_DEFAULT,
            root_dir,
            reservations: Reservations {
                eviction_hard: machine::parse_eviction_thresholds(machine::EVICTION_HARD_DEFAULT)
                    .expect("the default eviction thresholds parse"),
                ..Reservations::default()
            },
            kubelet_port: KUBELET_PORT,
            host: HostPaths::default(),
            status_update_frequency: NODE_STATUS_UPDATE_FREQUENCY,
            status_report_frequency: NODE_STATUS_REPORT_FREQUENCY,
            lease: LeaseConfig::default(),
        }
    }
}

/// What the status loop remembers between syncs.
#[derive(Default)]
struct LoopState {
    /// When the status was last posted.
    last_report: Option<Instant>,
    /// The runtime's last `Version` answer, kept when a later call fails.
    runtime_version: Option<RuntimeVersion>,
    /// The podCIDRs last handed to the [`PodCidrHandler`] successfully.
    applied_pod_cidrs: Vec<String>,
}

/// Registers the node and keeps its status and Lease. Build with
/// [`NodeStatusManager::new`], run with [`NodeStatusManager::run`].
pub struct NodeStatusManager {
    nodes: Api<Node>,
    client: Client,
    config: NodeStatusConfig,
    machine: MachineInfo,
    capacity: ResourceList,
    allocatable: ResourceList,
    runtime: Arc<dyn RuntimeInfo>,
    readiness: Readiness,
    pod_cidr_handler: Option<PodCidrHandler>,
    recorder: EventRecorder,
    state: tokio::sync::Mutex<LoopState>,
    /// The events of the last [`NodeStatusManager::initial_node`], recorded if it is created.
    registration_events: tokio::sync::Mutex<Vec<setters::NodeEvent>>,
    /// Woken when the Node's podCIDRs change (the own-node informer).
    node_changed: Notify,
    /// The eviction manager's node conditions, when it runs (else the thresholds are
    /// observed here directly).
    pressure: Option<tokio::sync::watch::Receiver<Pressure>>,
    /// The device plugins' resources (capacity: all devices, allocatable: the healthy ones),
    /// when the device manager runs.
    devices: Option<tokio::sync::watch::Receiver<DeviceCounts>>,
}

/// The device manager's counts by resource name.
pub type DeviceCounts = BTreeMap<String, crate::cm::device_manager::Counts>;

impl NodeStatusManager {
    /// Reads the machine and prepares the manager; `client` writes as the node.
    ///
    /// # Panics
    /// Outside a tokio runtime (the event recorder's writer is spawned).
    pub fn new(
        client: Client,
        config: NodeStatusConfig,
        runtime: Arc<dyn RuntimeInfo>,
        readiness: Readiness,
    ) -> Result<NodeStatusManager, MachineError> {
        let machine = MachineInfo::read(&config.host, &config.root_dir)?;
        let capacity = machine.capacity(config.max_pods);
        let allocatable = config.reservations.allocatable(&capacity);
        let mut options = RecorderOptions::new(KUBELET_COMPONENT);
        options.host = Some(config.node_name.clone());
        let (recorder, writer) = EventRecorder::with_options(client.clone(), options);
        tokio::spawn(writer.run());
        Ok(NodeStatusManager {
            nodes: client.api::<Node>(None),
            client,
            config,
            machine,
            capacity,
            allocatable,
            runtime,
            readiness,
            pod_cidr_handler: None,
            recorder,
            state: tokio::sync::Mutex::new(LoopState::default()),
            registration_events: tokio::sync::Mutex::new(Vec::new()),
            node_changed: Notify::new(),
            pressure: None,
            devices: None,
        })
    }

    /// Hands the Node's podCIDRs to `handler` (the CNI setup) when they appear or change.
    pub fn with_pod_cidr_handler(mut self, handler: PodCidrHandler) -> NodeStatusManager {
        self.pod_cidr_handler = Some(handler);
        self
    }

    /// Takes MemoryPressure, DiskPressure and PIDPressure from the eviction manager
    /// (`crate::eviction`), which holds them for the transition period; a change is written
    /// at once.
    pub fn with_pressure(
        mut self,
        pressure: tokio::sync::watch::Receiver<Pressure>,
    ) -> NodeStatusManager {
        self.pressure = Some(pressure);
        self
    }

    /// Adds the device plugins' resources to capacity and allocatable (upstream's
    /// `devicePluginResourceCapacityFunc` in the `MachineInfo` setter); a change is written at
    /// once.
    pub fn with_device_counts(
        mut self,
        devices: tokio::sync::watch::Receiver<DeviceCounts>,
    ) -> NodeStatusManager {
        self.devices = Some(devices);
        self
    }

    /// Capacity and allocatable with the device plugins' resources.
    fn with_devices(&self) -> (ResourceList, ResourceList) {
        let mut capacity = self.capacity.clone();
        let mut allocatable = self.allocatable.clone();
        if let Some(d) = &self.devices {
            for (name, c) in d.borrow().iter() {
                let unit = |n: i64| {
                    skerry_api::validation::quantity::Quantity(i128::from(n) * machine::NANO)
                };
                capacity.insert(name.clone(), unit(c.capacity));
                allocatable.insert(name.clone(), unit(c.allocatable));
            }
        }
        (capacity, allocatable)
    }

    /// The machine as read at start.
    pub fn machine(&self) -> &MachineInfo {
        &self.machine
    }

    /// The node's capacity.
    pub fn capacity(&self) -> &ResourceList {
        &self.capacity
    }

    /// The node's allocatable.
    pub fn allocatable(&self) -> &ResourceList {
        &self.allocatable
    }

    /// The event recorder (component `kubelet`, host the node's name).
    pub fn recorder(&self) -> &EventRecorder {
        &self.recorder
    }

    /// The kubelet's reference to its Node in events: UID is the node's name, as upstream's
    /// `nodeRef` (the kubelet may record events before it knows the Node's real UID).
    pub fn node_ref(&self) -> ObjectReference {
        ObjectReference {
            kind: Some("Node".into()),
            name: Some(self.config.node_name.clone()),
            uid: Some(self.config.node_name.clone()),
            ..ObjectReference::default()
        }
    }

    /// Registers the node, then runs the Lease and the status loop until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let lease = NodeLease::new(
            &self.client,
            &self.config.node_name,
            self.config.lease.clone(),
        );
        let lease_task = tokio::spawn(lease.run(stop.clone()));
        // The own Node, watched by name, as the kubelet's node informer: a podCIDR set by
        // the IPAM controller wakes the status loop at once.
        let informer = SharedInformer::new(
            OwnNode {
                api: self.nodes.clone(),
                selector: format!("metadata.name={}", self.config.node_name),
            },
            None,
        );
        informer.add_handler(PodCidrWatch(Arc::downgrade(&self)));
        informer.run(stop.clone());
        if self.register(&stop).await {
            let mut readiness = self.readiness.subscribe();
            let mut pressure = self.pressure.clone();
            let mut devices = self.devices.clone();
            loop {
                if let Err(e) = self.sync_status().await {
                    tracing::error!(node = %self.config.node_name, error = %e, "unable to update node status");
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(self.config.status_update_frequency) => {}
                    changed = readiness.changed() => {
                        if changed.is_err() {
                            break;
                        }
                    }
                    () = self.node_changed.notified() => {}
                    changed = async {
                        match pressure.as_mut() {
                            Some(p) => p.changed().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        if changed.is_err() {
                            pressure = None;
                        }
                    }
                    changed = async {
                        match devices.as_mut() {
                            Some(d) => d.changed().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        if changed.is_err() {
                            devices = None;
                        }
                    }
                }
            }
        }
        let _ = lease_task.await;
    }

    /// The Node this kubelet would create now: labels, taints and a full status.
    pub async fn initial_node(&self) -> Node {
        let mut labels = BTreeMap::from([
            (
                flags::LABEL_HOSTNAME.to_string(),
                self.config.hostname.clone(),
            ),
            (
                flags::LABEL_OS.to_string(),
                self.machine.operating_system.to_string(),
            ),
            (
                flags::LABEL_ARCH.to_string(),
                self.machine.architecture.to_string(),
            ),
            (
                flags::LABEL_OS_BETA.to_string(),
                self.machine.operating_system.to_string(),
            ),
            (
                flags::LABEL_ARCH_BETA.to_string(),
                self.machine.architecture.to_string(),
            ),
        ]);
        for (k, v) in &self.config.node_labels {
            if let Some(old) = labels.get(k) {
                tracing::warn!(label = %k, value = %v, default = %old, "the node label overrides the default");
            }
            labels.insert(k.clone(), v.clone());
        }
        let taints = &self.config.register_with_taints;
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some(self.config.node_name.clone()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: (!taints.is_empty()).then(|| taints.clone()),
                ..NodeSpec::default()
            }),
            status: None,
        };
        let (events, errors) = self.set_status(&mut node).await;
        for e in errors {
            tracing::warn!(node = %self.config.node_name, error = %e, "initial node status incomplete");
        }
        // The transitions from nothing ("status is now: NodeHasSufficientMemory"...) are the
        // kubelet's first events; they are recorded once the Node is created.
        *self.registration_events.lock().await = events;
        node
    }

    /// Computes this node's status onto `node` ([`setters::set_node_status`]).
    async fn set_status(&self, node: &mut Node) -> (Vec<setters::NodeEvent>, Vec<String>) {
        let version = match self.runtime.version().await {
            Ok(v) => {
                let mut state = self.state.lock().await;
                state.runtime_version = Some(v.clone());
                Some(v)
            }
            Err(e) => {
                tracing::warn!(error = %e, "container runtime version unknown");
                self.state.lock().await.runtime_version.clone()
            }
        };
        let images = self.runtime.list_images().await.map_err(|e| e.to_string());
        let addresses = address::node_addresses(
            &self.config.node_name,
            self.config.node_ip,
            &self.config.hostname,
            &self.config.host.proc,
        );
        let pressure = match &self.pressure {
            Some(p) => *p.borrow(),
            None => machine::observe_pressure(
                &self.config.host,
                &self.config.root_dir,
                &self.config.reservations.eviction_hard,
            ),
        };
        let (capacity, allocatable) = self.with_devices();
        let inputs = setters::Inputs {
            node_name: &self.config.node_name,
            now: Timestamp::now(),
            machine: &self.machine,
            capacity: &capacity,
            allocatable: &allocatable,
            addresses,
            runtime_version: version.as_ref(),
            images,
            readiness_errors: self.readiness.errors(),
            pressure,
            kubelet_port: self.config.kubelet_port,
            kubelet_version: KUBELET_VERSION,
        };
        setters::set_node_status(node, &inputs)
    }

    /// Registers the node, retrying with backoff until it is registered or `stop`. Returns
    /// whether it is registered.
    pub async fn register(&self, stop: &CancellationToken) -> bool {
        let mut step = REGISTER_BACKOFF_START;
        loop {
            let node = self.initial_node().await;
            tracing::info!(node = %self.config.node_name, "attempting to register node");
            match self.try_register(node).await {
                Ok(()) => {
                    tracing::info!(node = %self.config.node_name, "successfully registered node");
                    return true;
                }
                Err(e) => {
                    tracing::error!(node = %self.config.node_name, error = %e, "unable to register node with API server")
                }
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(step) => {}
            }
            step = (step * 2).min(REGISTER_BACKOFF_MAX);
        }
    }

    /// One registration attempt (`tryRegisterWithAPIServer`): create, or reconcile the Node
    /// that already exists.
    pub async fn try_register(&self, node: Node) -> Result<(), String> {
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {
                let events = std::mem::take(&mut *self.registration_events.lock().await);
                self.record(events);
                return Ok(());
            }
            Err(e) if e.is_already_exists() => {}
            Err(e) => return Err(e.to_string()),
        }
        let existing = self
            .nodes
            .get(&self.config.node_name)
            .await
            .map_err(|e| format!("error getting existing node: {e}"))?;
        tracing::info!(node = %self.config.node_name, "node was previously registered");
        let mut reconciled = existing.clone();
        let mut requires_update = update_default_labels(&node, &mut reconciled);
        requires_update |= reconcile_extended_resources(&mut reconciled);
        requires_update |= reconcile_hugepages(&node, &mut reconciled);
        if requires_update {
            // Kubernetes takes the labels in the same status patch (its node status strategy
            // keeps metadata); skerry's apiserver keeps only the status of a status write, so
            // the labels go through the Node itself, which `system:node` may patch too.
            let mut patch = node_status_patch(&existing, &reconciled);
            if let Some(metadata) = patch.as_object_mut().and_then(|p| p.remove("metadata")) {
                self.nodes
                    .patch(
                        &self.config.node_name,
                        &PatchParams::default(),
                        &Patch::Strategic(json!({ "metadata": metadata })),
                    )
                    .await
                    .map_err(|e| format!("error updating node labels: {e}"))?;
            }
            if patch.get("status").is_some() {
                self.nodes
                    .patch_status(
                        &self.config.node_name,
                        &PatchParams::default(),
                        &Patch::Strategic(patch),
                    )
                    .await
                    .map_err(|e| format!("error updating node: {e}"))?;
            }
        }
        Ok(())
    }

    /// Updates the status with up to [`NODE_STATUS_UPDATE_RETRY`] tries (`updateNodeStatus`).
    pub async fn sync_status(&self) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..NODE_STATUS_UPDATE_RETRY {
            match self.try_update_status().await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(node = %self.config.node_name, error = %e, "error updating node status, will retry");
                    last = e;
                }
            }
        }
        Err(format!("update node status exceeds retry count: {last}"))
    }

    /// One status update (`tryUpdateNodeStatus`): read the Node, hand new podCIDRs over,
    /// compute the status, and patch it if it changed or the report period is over.
    async fn try_update_status(&self) -> Result<(), String> {
        let original = self
            .nodes
            .get(&self.config.node_name)
            .await
            .map_err(|e| format!("error getting node {:?}: {e}", self.config.node_name))?;
        let pod_cidr_changed = self.apply_pod_cidrs(&original).await;
        let mut node = original.clone();
        let (events, errors) = self.set_status(&mut node).await;
        for e in errors {
            tracing::warn!(node = %self.config.node_name, error = %e, "node status incomplete");
        }
        let now = Instant::now();
        let report_due = {
            let state = self.state.lock().await;
            state
                .last_report
                .is_none_or(|t| now >= t + self.config.status_report_frequency)
        };
        if !report_due
            && !pod_cidr_changed
            && !setters::status_changed(original.status.as_ref(), node.status.as_ref())
        {
            return Ok(());
        }
        let patch = node_status_patch(&original, &node);
        self.nodes
            .patch_status(
                &self.config.node_name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
            .map_err(|e| e.to_string())?;
        self.state.lock().await.last_report = Some(now);
        self.record(events);
        Ok(())
    }

    /// Hands `node`'s podCIDRs to the handler when they differ from those last handed over;
    /// returns whether they changed.
    async fn apply_pod_cidrs(&self, node: &Node) -> bool {
        let cidrs = pod_cidrs(node);
        let Some(handler) = &self.pod_cidr_handler else {
            return false;
        };
        let mut state = self.state.lock().await;
        if cidrs.is_empty() || cidrs == state.applied_pod_cidrs {
            return false;
        }
        match handler(&cidrs) {
            Ok(()) => {
                tracing::info!(node = %self.config.node_name, ?cidrs, "pod CIDRs configured");
                state.applied_pod_cidrs = cidrs;
                true
            }
            Err(e) => {
                tracing::error!(node = %self.config.node_name, ?cidrs, error = %e, "failed to configure the pod CIDRs");
                false
            }
        }
    }

    fn record(&self, events: Vec<setters::NodeEvent>) {
        let node_ref = self.node_ref();
        for (kind, reason, message) in events {
            self.recorder.event(&node_ref, kind, &reason, &message);
        }
    }
}

/// The labels the kubelet owns, put back on an existing Node (`updateDefaultLabels`): a
/// default label the initial Node has is set to its value (and removed if that is empty).
fn update_default_labels(initial: &Node, existing: &mut Node) -> bool {
    const DEFAULT_LABELS: &[&str] = &[
        flags::LABEL_HOSTNAME,
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
        flags::LABEL_OS,
        flags::LABEL_ARCH,
        flags::LABEL_OS_BETA,
        flags::LABEL_ARCH_BETA,
    ];
    let empty = BTreeMap::new();
    let wanted = initial.metadata.labels.as_ref().unwrap_or(&empty);
    let labels = existing.metadata.labels.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for key in DEFAULT_LABELS {
        let Some(value) = wanted.get(*key) else {
            continue;
        };
        if labels.get(*key) != Some(value) {
            labels.insert((*key).to_string(), value.clone());
            changed = true;
        }
        if labels.get(*key).is_some_and(String::is_empty) {
            labels.remove(*key);
        }
    }
    changed
}

/// Whether `name` is an extended resource (`v1helper.IsExtendedResourceName`): a domain
/// outside `kubernetes.io`, not a quota's `requests.` name.
fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// Zeroes extended resources on an existing Node (`reconcileExtendedResource`): their
/// device plugins re-register after a restart and set them again.
fn reconcile_extended_resources(existing: &mut Node) -> bool {
    let Some(status) = existing.status.as_mut() else {
        return false;
    };
    let mut changed = false;
    for list in [status.capacity.as_mut(), status.allocatable.as_mut()]
        .into_iter()
        .flatten()
    {
        for (name, q) in list.iter_mut() {
            if is_extended_resource(name) && q.0 != "0" {
                q.0 = "0".into();
                changed = true;
            }
        }
    }
    changed
}

/// Brings an existing Node's hugepage pools to the host's (`reconcileHugePageResource`):
/// pools the host has are set, pools it no longer has are removed.
fn reconcile_hugepages(initial: &Node, existing: &mut Node) -> bool {
    let is_huge = |name: &String| name.starts_with(resources::HUGEPAGES_PREFIX);
    let wanted = |f: fn(&NodeStatus) -> Option<&BTreeMap<String, ApiQuantity>>| {
        initial
            .status
            .as_ref()
            .and_then(f)
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| is_huge(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<BTreeMap<_, _>>()
            })
            .unwrap_or_default()
    };
    let want_capacity = wanted(|s| s.capacity.as_ref());
    let want_allocatable = wanted(|s| s.allocatable.as_ref());
    let status = existing.status.get_or_insert_with(NodeStatus::default);
    let mut changed = false;
    for (list, want) in [
        (&mut status.capacity, &want_capacity),
        (&mut status.allocatable, &want_allocatable),
    ] {
        let list = list.get_or_insert_with(BTreeMap::new);
        let before = list.clone();
        list.retain(|k, _| !is_huge(k) || want.contains_key(k));
        list.extend(want.iter().map(|(k, v)| (k.clone(), v.clone())));
        changed |= *list != before;
    }
    changed
}

/// The two-way difference of two string maps as a merge patch: changed and new keys with
/// their values, removed keys as `null`.
fn map_patch<V: serde::Serialize + PartialEq>(
    old: Option<&BTreeMap<String, V>>,
    new: Option<&BTreeMap<String, V>>,
) -> Option<Value> {
    let empty = BTreeMap::new();
    let (old, new) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
    let mut patch = Map::new();
    for (k, v) in new {
        if old.get(k) != Some(v) {
            patch.insert(k.clone(), serde_json::to_value(v).unwrap_or(Value::Null));
        }
    }
    for k in old.keys() {
        if !new.contains_key(k) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// The strategic merge patch from `old` to `new` over what the kubelet owns (the shape
/// `nodeutil.PatchNodeStatus` sends): labels, the conditions (merged by type, so conditions
/// others set are kept), addresses (replaced whole when they changed: the field is declared
/// merge-by-type although a node may have two InternalIPs, upstream's
/// `fixupPatchForNodeStatusAddresses`), capacity and allocatable key by key, nodeInfo,
/// daemonEndpoints and images.
pub fn node_status_patch(old: &Node, new: &Node) -> Value {
    let mut patch = Map::new();
    if let Some(labels) = map_patch(old.metadata.labels.as_ref(), new.metadata.labels.as_ref()) {
        patch.insert("metadata".into(), json!({ "labels": labels }));
    }
    let empty = NodeStatus::default();
    let (o, n) = (
        old.status.as_ref().unwrap_or(&empty),
        new.status.as_ref().unwrap_or(&empty),
    );
    let mut status = Map::new();
    if let Some(conditions) = &n.conditions {
        let changed: Vec<_> = conditions
            .iter()
            .filter(|c| {
                o.conditions
                    .as_ref()
                    .is_none_or(|old| !old.iter().any(|oc| oc == *c))
            })
            .collect();
        if !changed.is_empty() {
            status.insert("conditions".into(), json!(changed));
        }
    }
    if n.addresses != o.addresses {
        let mut addresses = serde_json::to_value(n.addresses.clone().unwrap_or_default())
            .unwrap_or_else(|_| json!([]));
        if o.addresses.as_ref().is_some_and(|a| !a.is_empty())
            && let Value::Array(items) = &mut addresses
        {
            items.push(json!({"$patch": "replace"}));
        }
        status.insert("addresses".into(), addresses);
    }
    if let Some(p) = map_patch(o.capacity.as_ref(), n.capacity.as_ref()) {
        status.insert("capacity".into(), p);
    }
    if let Some(p) = map_patch(o.allocatable.as_ref(), n.allocatable.as_ref()) {
        status.insert("allocatable".into(), p);
    }
    if n.node_info != o.node_info {
        status.insert("nodeInfo".into(), json!(n.node_info));
    }
    if n.daemon_endpoints != o.daemon_endpoints {
        status.insert("daemonEndpoints".into(), json!(n.daemon_endpoints));
    }
    if n.images != o.images {
        status.insert("images".into(), json!(n.images));
    }
    if !status.is_empty() {
        patch.insert("status".into(), Value::Object(status));
    }
    Value::Object(patch)
}

/// The Node API restricted to one name by field selector: the kubelet's own-node informer.
struct OwnNode {
    api: Api<Node>,
    selector: String,
}

impl ListerWatcher<Node> for OwnNode {
    async fn list(&self, params: &ListParams) -> Result<ObjectList<Node>, skerry_client::Error> {
        let mut params = params.clone();
        params.field_selector = Some(self.selector.clone());
        self.api.list(&params).await
    }
    async fn watch(&self, params: &WatchParams) -> Result<WatchStream<Node>, skerry_client::Error> {
        let mut params = params.clone();
        params.field_selector = Some(self.selector.clone());
        self.api.watch(&params).await
    }
}

/// Wakes the status loop when the Node's podCIDRs change.
struct PodCidrWatch(Weak<NodeStatusManager>);

impl EventHandler<Node> for PodCidrWatch {
    fn on_add(&self, obj: &Arc<Node>, _is_initial_list: bool) {
        if let Some(m) = self.0.upgrade()
            && !pod_cidrs(obj).is_empty()
        {
            m.node_changed.notify_one();
        }
    }
    fn on_update(&self, old: &Arc<Node>, new: &Arc<Node>) {
        if let Some(m) = self.0.upgrade()
            && pod_cidrs(old) != pod_cidrs(new)
        {
            m.node_changed.notify_one();
        }
    }
    fn on_delete(&self, _obj: &Deleted<Node>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition};

    fn node(labels: &[(&str, &str)], status: NodeStatus) -> Node {
        Node {
            metadata: ObjectMeta {
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(status),
        }
    }

    #[test]
    fn the_patch_carries_only_what_changed() {
        let addr = |ip: &str| NodeAddress {
            type_: "InternalIP".into(),
            address: ip.into(),
        };
        let ready = |status: &str| NodeCondition {
            type_: "Ready".into(),
            status: status.into(),
            ..NodeCondition::default()
        };
        let old = node(
            &[("a", "1"), ("gone", "x")],
            NodeStatus {
                addresses: Some(vec![addr("192.0.2.2")]),
                conditions: Some(vec![ready("True")]),
                capacity: Some(BTreeMap::from([("cpu".into(), ApiQuantity("2".into()))])),
                ..NodeStatus::default()
            },
        );
        let mut new = old.clone();
        let labels = new.metadata.labels.as_mut().expect("labels");
        labels.remove("gone");
        labels.insert("b".into(), "2".into());
        let status = new.status.as_mut().expect("status");
        status.addresses = Some(vec![addr("192.0.2.3")]);
        status.conditions = Some(vec![ready("False")]);
        let patch = node_status_patch(&old, &new);
        assert_eq!(
            patch,
            json!({
                "metadata": {"labels": {"b": "2", "gone": null}},
                "status": {
                    "conditions": [{"type": "Ready", "status": "False"}],
                    "addresses": [{"type": "InternalIP", "address": "192.0.2.3"}, {"$patch": "replace"}],
                }
            })
        );
        assert_eq!(node_status_patch(&old, &old), json!({}));
    }

    #[test]
    fn an_existing_node_is_reconciled() {
        let initial = node(
            &[
                ("kubernetes.io/hostname", "n1"),
                ("kubernetes.io/os", "linux"),
            ],
            NodeStatus {
                capacity: Some(BTreeMap::from([(
                    "hugepages-2Mi".into(),
                    ApiQuantity("4Mi".into()),
                )])),
                ..NodeStatus::default()
            },
        );
        let mut existing = node(
            &[("kubernetes.io/hostname", "old"), ("user", "kept")],
            NodeStatus {
                capacity: Some(BTreeMap::from([
                    ("hugepages-1Gi".into(), ApiQuantity("1Gi".into())),
                    ("example.com/gpu".into(), ApiQuantity("2".into())),
                    ("cpu".into(), ApiQuantity("2".into())),
                ])),
                ..NodeStatus::default()
            },
        );
        assert!(update_default_labels(&initial, &mut existing));
        assert!(reconcile_extended_resources(&mut existing));
        assert!(reconcile_hugepages(&initial, &mut existing));
        let labels = existing.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["user"], "kept");
        let cap = existing
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .expect("capacity");
        assert_eq!(cap["example.com/gpu"].0, "0");
        assert_eq!(cap["hugepages-2Mi"].0, "4Mi");
        assert!(!cap.contains_key("hugepages-1Gi"));
        assert_eq!(cap["cpu"].0, "2");
        assert!(
            !update_default_labels(&initial, &mut existing),
            "idempotent"
        );
        assert!(!reconcile_extended_resources(&mut existing));
        assert!(!reconcile_hugepages(&initial, &mut existing));
    }
}
