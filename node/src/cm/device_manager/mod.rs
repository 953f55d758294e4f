//! The device manager (upstream `pkg/kubelet/cm/devicemanager/`): the kubelet's side of the
//! device plugin API ([`crate::deviceplugin::v1beta1`]), so a vendor's plugin (GPUs, FPGAs,
//! NICs, USB sticks) advertises its devices as an extended resource and hands them to the
//! containers that request them.
//!
//! - **Registration** ([`plugin`]): a gRPC server on `<root-dir>/device-plugins/kubelet.sock`;
//!   a plugin calls `Register` with its resource name and socket, the kubelet dials it back,
//!   asks its options and follows its `ListAndWatch` stream: each answer replaces the
//!   resource's devices. A plugin whose stream ends has its devices marked unhealthy, and
//!   removed after [`ENDPOINT_STOP_GRACE_PERIOD`] unless it registers again.
//! - **Node status**: [`DeviceManager::subscribe`] gives every resource's capacity (all its
//!   devices) and allocatable (the healthy ones); the node status manager writes them into
//!   the Node, a removed resource as zero.
//! - **Allocation** at admission ([`DeviceManager::allocate_pod`]): each container's request
//!   of a registered resource (extended resources have requests equal to limits) gets that
//!   many healthy devices nobody else holds, the plugin's preferred ones when it offers
//!   `GetPreferredAllocation`, else those on the NUMA nodes the topology manager merged
//!   (the device manager is also a [`HintProvider`]); the plugin's `Allocate` answer (envs,
//!   mounts, device nodes, annotations) goes into the container's CRI config
//!   ([`DeviceManager::run_options`]). Too few devices refuse the pod with upstream's
//!   `UnexpectedAdmissionError`.
//! - **Checkpoint** (`docs/tricks.md` #22): every allocation and release is written to
//!   `device-plugins/kubelet_internal_checkpoint` (upstream's file, JSON and FNV-32a checksum,
//!   [`crate::checkpoint::device_manager`]); at start it is read back, so a container keeps
//!   its devices across a kubelet restart, and a corrupt file starts the manager empty.
//!
//! The trick it carries (#22, the checksummed checkpoint): the allocation answer is stored as
//! the plugin's protobuf bytes, so a kubelet that restarts gives a restarted container the
//! same environment and device nodes without asking the plugin again (which may not be back
//! yet), and a torn or edited file is detected by the checksum instead of handing a device
//! to two containers.

pub mod plugin;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use prost::Message as _;
use tracing::{info, warn};

use crate::checkpoint::CheckpointManager;
use crate::checkpoint::device_manager::{self as ckpt, DeviceData, PodDevicesEntry};
use crate::cm::topology::bitmask::{BitMask, iterate_bitmasks};
use crate::cm::topology::{HintMap, HintProvider, TopologyHint};
use crate::deviceplugin::v1beta1 as api;

pub use crate::checkpoint::device_manager::DEVICE_PLUGINS_DIR;

/// The API version this kubelet speaks (`pluginapi.Version`).
pub const VERSION: &str = "v1beta1";
/// The versions a plugin may register with (`pluginapi.SupportedVersions`).
pub const SUPPORTED_VERSIONS: &[&str] = &[VERSION];
/// The registration socket's file name in the device plugin directory
/// (`pluginapi.KubeletSocket`).
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// A device's health as the plugin reports it (`pluginapi.Healthy`).
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`] (`pluginapi.Unhealthy`).
pub const UNHEALTHY: &str = "Unhealthy";
/// How long the devices of a plugin whose stream ended stay (unhealthy) before they are
/// removed (`devicemanager/manager.go` `endpointStopGracePeriod`): a plugin restarting
/// within it keeps the resource on the Node.
pub const ENDPOINT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);
/// The NUMA key of devices without topology in the checkpoint (`nodeWithoutTopology`).
const NODE_WITHOUT_TOPOLOGY: i64 = -1;
/// The prefix of quota names, which an extended resource must not carry
/// (`v1.DefaultResourceRequestsPrefix`).
const REQUESTS_PREFIX: &str = "requests.";
/// The namespace of Kubernetes' own resources (`v1.ResourceDefaultNamespacePrefix`).
const DEFAULT_NAMESPACE_PREFIX: &str = "kubernetes.io/";

/// Whether `name` is an extended resource a plugin may register (upstream
/// `v1helper.IsExtendedResourceName`): `domain/name`, outside `kubernetes.io/`, not a quota's
/// `requests.` name, and a qualified name once prefixed with `requests.`.
pub fn is_extended_resource_name(name: &str) -> bool {
    if !name.contains('/') || name.contains(DEFAULT_NAMESPACE_PREFIX) {
        return false;
    }
    if name.starts_with(REQUESTS_PREFIX) {
        return false;
    }
    skerry_api::validation::names::qualified_name(&format!("{REQUESTS_PREFIX}{name}")).is_empty()
}

/// A device as the plugin last listed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub healthy: bool,
    /// Its NUMA nodes (empty: no topology).
    pub numa: Vec<i64>,
}

/// A resource's devices, capacity and allocatable, as the Node shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub capacity: i64,
    pub allocatable: i64,
}

/// What the containers get from their devices (upstream `DeviceRunContainerOptions`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunOptions {
    pub envs: Vec<(String, String)>,
    pub mounts: Vec<api::Mount>,
    pub devices: Vec<api::DeviceSpec>,
    pub annotations: Vec<(String, String)>,
}

/// One container's devices of one resource.
#[derive(Clone, Debug, PartialEq)]
struct Allocation {
    ids: Vec<String>,
    /// The plugin's answer (`None`: reserved, `Allocate` under way).
    resp: Option<api::ContainerAllocateResponse>,
}

struct Endpoint {
    client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    options: api::DevicePluginOptions,
}

#[derive(Default)]
struct Resource {
    devices: BTreeMap<String, DeviceInfo>,
    /// `None`: no plugin connected (its stream ended, or restored from the checkpoint).
    endpoint: Option<Arc<Endpoint>>,
    /// Stops the stream of the connected plugin (a new registration replaces it).
    stream_stop: Option<tokio_util::sync::CancellationToken>,
    /// Bumped on each registration: a stream task of an older one no longer writes.
    generation: u64,
    /// Removed after its grace period: shown as zero.
    removed: bool,
}

/// pod UID -> container -> resource -> devices.
type PodDevices = BTreeMap<String, BTreeMap<String, BTreeMap<String, Allocation>>>;

#[derive(Default)]
struct Inner {
    resources: BTreeMap<String, Resource>,
    pods: PodDevices,
}

/// The device manager. Build with [`DeviceManager::new`], serve registrations with
/// [`plugin::serve`].
pub struct DeviceManager {
    dir: std::path::PathBuf,
    checkpoints: CheckpointManager,
    inner: parking_lot::Mutex<Inner>,
    /// One allocation at a time: the choice of devices and the `Allocate` call stay together.
    allocating: tokio::sync::Mutex<()>,
    counts: tokio::sync::watch::Sender<BTreeMap<String, Counts>>,
    grace: Duration,
}

fn numa_of(d: &api::Device) -> Vec<i64> {
    d.topology
        .as_ref()
        .map(|t| t.nodes.iter().map(|n| n.id).collect())
        .unwrap_or_default()
}

/// The resources a container requests from device plugins (`limits`, which equal requests for
/// extended resources; whole units).
fn device_requests(
    c: &Container,
    registered: &BTreeMap<String, Resource>,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let Some(r) = c.resources.as_ref() else {
        return out;
    };
    for list in [r.limits.as_ref(), r.requests.as_ref()]
        .into_iter()
        .flatten()
    {
        for (name, q) in list {
            if !registered.contains_key(name) || out.contains_key(name) {
                continue;
            }
            let n = skerry_api::validation::quantity::Quantity::parse(&q.0)
                .map_or(0, |q| q.0.div_euclid(NANO_PER_UNIT));
            if let Ok(n) = usize::try_from(n)
                && n > 0
            {
                out.insert(name.clone(), n);
            }
        }
    }
    out
}

/// A quantity's unit in nano-units ([`skerry_api::validation::quantity::Quantity`] counts them).
const NANO_PER_UNIT: i128 = 1_000_000_000;

fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

impl DeviceManager {
    /// The manager for the kubelet at `root_dir`: creates `device-plugins/` and reads the
    /// checkpoint (resources it lists stay at zero until their plugin registers again).
    pub fn new(root_dir: &std::path::Path) -> std::io::Result<DeviceManager> {
        Self::with_grace(root_dir, ENDPOINT_STOP_GRACE_PERIOD)
    }

    /// As [`DeviceManager::new`], with another grace period for stopped plugins (tests).
    pub fn with_grace(
        root_dir: &std::path::Path,
        grace: Duration,
    ) -> std::io::Result<DeviceManager> {
        let dir = root_dir.join(DEVICE_PLUGINS_DIR);
        let checkpoints = CheckpointManager::new(dir.clone()).map_err(std::io::Error::other)?;
        let data = ckpt::restore(&checkpoints);
        let mut inner = Inner::default();
        for resource in data.registered_devices.keys() {
            inner
                .resources
                .insert(resource.clone(), Resource::default());
        }
        for e in data.pod_device_entries.into_iter().flatten() {
            let ids: BTreeSet<String> =
                e.device_ids.values().flatten().flatten().cloned().collect();
            let resp = match e
                .alloc_resp
                .as_deref()
                .map(api::ContainerAllocateResponse::decode)
            {
                Some(Ok(r)) => Some(r),
                Some(Err(err)) => {
                    warn!(pod = %e.pod_uid, container = %e.container_name, error = %err, "an allocation answer in the device checkpoint does not decode");
                    Some(api::ContainerAllocateResponse::default())
                }
                None => Some(api::ContainerAllocateResponse::default()),
            };
            inner
                .pods
                .entry(e.pod_uid)
                .or_default()
                .entry(e.container_name)
                .or_default()
                .insert(
                    e.resource_name,
                    Allocation {
                        ids: ids.into_iter().collect(),
                        resp,
                    },
                );
        }
        let (counts, _) = tokio::sync::watch::channel(BTreeMap::new());
        let m = DeviceManager {
            dir,
            checkpoints,
            inner: parking_lot::Mutex::new(inner),
            allocating: tokio::sync::Mutex::new(()),
            counts,
            grace,
        };
        m.publish();
        Ok(m)
    }

    /// The device plugin directory (`<root-dir>/device-plugins`).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The registration socket's path.
    pub fn socket_path(&self) -> std::path::PathBuf {
        self.dir.join(KUBELET_SOCKET)
    }

    /// Capacity and allocatable of every resource a plugin registered (a removed one at zero),
    /// updated on every change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<BTreeMap<String, Counts>> {
        self.counts.subscribe()
    }

    /// The current counts.
    pub fn counts(&self) -> BTreeMap<String, Counts> {
        self.counts.borrow().clone()
    }

    /// A resource's devices.
    pub fn devices(&self, resource: &str) -> BTreeMap<String, DeviceInfo> {
        self.inner
            .lock()
            .resources
            .get(resource)
            .map(|r| r.devices.clone())
            .unwrap_or_default()
    }

    /// The device ids a container holds of `resource`.
    pub fn allocated(&self, uid: &str, container: &str, resource: &str) -> Vec<String> {
        self.inner
            .lock()
            .pods
            .get(uid)
            .and_then(|p| p.get(container))
            .and_then(|c| c.get(resource))
            .map(|a| a.ids.clone())
            .unwrap_or_default()
    }

    fn publish(&self) {
        let counts: BTreeMap<String, Counts> = self
            .inner
            .lock()
            .resources
            .iter()
            .map(|(name, r)| {
                let capacity = if r.removed { 0 } else { r.devices.len() };
                let healthy = if r.removed {
                    0
                } else {
                    r.devices.values().filter(|d| d.healthy).count()
                };
                (
                    name.clone(),
                    Counts {
                        capacity: i64::try_from(capacity).unwrap_or(i64::MAX),
                        allocatable: i64::try_from(healthy).unwrap_or(i64::MAX),
                    },
                )
            })
            .collect();
        self.counts.send_if_modified(|old| {
            if *old == counts {
                false
            } else {
                *old = counts;
                true
            }
        });
    }

    /// A plugin registered (its options read): it replaces the resource's endpoint. Returns
    /// the generation its stream writes under.
    fn connected(
        &self,
        resource: &str,
        endpoint: Endpoint,
        stream_stop: tokio_util::sync::CancellationToken,
    ) -> u64 {
        let mut inner = self.inner.lock();
        let r = inner.resources.entry(resource.to_string()).or_default();
        if let Some(old) = r.stream_stop.replace(stream_stop) {
            old.cancel();
        }
        r.endpoint = Some(Arc::new(endpoint));
        r.generation += 1;
        r.removed = false;
        r.generation
    }

    /// A `ListAndWatch` answer: the resource's devices become `devices`.
    fn update_devices(&self, resource: &str, generation: u64, devices: &[api::Device]) {
        {
            let mut inner = self.inner.lock();
            let Some(r) = inner
                .resources
                .get_mut(resource)
                .filter(|r| r.generation == generation)
            else {
                return;
            };
            r.devices = devices
                .iter()
                .map(|d| {
                    (
                        d.id.clone(),
                        DeviceInfo {
                            healthy: d.health == HEALTHY,
                            numa: numa_of(d),
                        },
                    )
                })
                .collect();
        }
        self.publish();
        self.write_checkpoint();
    }

    /// The plugin's stream ended (`markResourceUnhealthy`): every device unhealthy, the
    /// endpoint gone; after the grace period the resource is removed unless it registered
    /// again.
    fn stopped(self: &Arc<Self>, resource: &str, generation: u64) {
        {
            let mut inner = self.inner.lock();
            let Some(r) = inner
                .resources
                .get_mut(resource)
                .filter(|r| r.generation == generation)
            else {
                return;
            };
            r.endpoint = None;
            for d in r.devices.values_mut() {
                d.healthy = false;
            }
        }
        self.publish();
        self.write_checkpoint();
        self.schedule_removal(resource.to_string(), generation);
    }

    fn schedule_removal(self: &Arc<Self>, resource: String, generation: u64) {
        let this = Arc::downgrade(self);
        let grace = self.grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let Some(this) = this.upgrade() else {
                return;
            };
            {
                let mut inner = this.inner.lock();
                let Some(r) = inner
                    .resources
                    .get_mut(&resource)
                    .filter(|r| r.generation == generation && r.endpoint.is_none())
                else {
                    return;
                };
                info!(resource = %resource, "device plugin gone past its grace period: resource removed");
                r.devices.clear();
                r.removed = true;
            }
            this.publish();
            this.write_checkpoint();
        });
    }

    /// Starts the grace period of the resources read from the checkpoint (their plugins have
    /// that long to come back), as upstream's stopped endpoints do.
    pub fn start_restored_grace(self: &Arc<Self>) {
        let restored: Vec<(String, u64)> = self
            .inner
            .lock()
            .resources
            .iter()
            .filter(|(_, r)| r.endpoint.is_none())
            .map(|(n, r)| (n.clone(), r.generation))
            .collect();
        for (name, generation) in restored {
            self.schedule_removal(name, generation);
        }
    }

    fn checkpoint_data(inner: &Inner) -> DeviceData {
        let mut entries = Vec::new();
        for (uid, containers) in &inner.pods {
            for (container, resources) in containers {
                for (resource, a) in resources {
                    let Some(resp) = &a.resp else {
                        continue;
                    };
                    let mut by_numa: BTreeMap<i64, Option<Vec<String>>> = BTreeMap::new();
                    let devices = inner.resources.get(resource).map(|r| &r.devices);
                    for id in &a.ids {
                        let numa = devices
                            .and_then(|d| d.get(id))
                            .map(|d| d.numa.clone())
                            .filter(|n| !n.is_empty())
                            .unwrap_or_else(|| vec![NODE_WITHOUT_TOPOLOGY]);
                        for n in numa {
                            by_numa.entry(n).or_insert_with(|| Some(Vec::new()));
                            if let Some(Some(v)) = by_numa.get_mut(&n) {
                                v.push(id.clone());
                            }
                        }
                    }
                    entries.push(PodDevicesEntry {
                        pod_uid: uid.clone(),
                        container_name: container.clone(),
                        resource_name: resource.clone(),
                        device_ids: by_numa,
                        alloc_resp: Some(resp.encode_to_vec()),
                    });
                }
            }
        }
        // The healthy devices of each resource (`writeCheckpoint`'s `registeredDevs`).
        let registered_devices = inner
            .resources
            .iter()
            .filter(|(_, r)| !r.removed)
            .map(|(name, r)| {
                let ids: Vec<String> = r
                    .devices
                    .iter()
                    .filter(|(_, d)| d.healthy)
                    .map(|(id, _)| id.clone())
                    .collect();
                (name.clone(), Some(ids))
            })
            .collect();
        DeviceData {
            pod_device_entries: (!entries.is_empty()).then_some(entries),
            registered_devices,
        }
    }

    fn write_checkpoint(&self) {
        let data = Self::checkpoint_data(&self.inner.lock());
        if let Err(e) = ckpt::store(&self.checkpoints, &data) {
            warn!(error = %e, "writing the device manager checkpoint");
        }
    }

    /// The devices of `resource` a new allocation of pod `uid` may take: healthy, held by no
    /// other pod nor by this pod's regular containers (its init containers' devices are
    /// reused, as upstream's `devicesToReuse`), those of its init containers first.
    fn free_devices(inner: &Inner, pod: &Pod, uid: &str, resource: &str) -> Vec<String> {
        let Some(r) = inner.resources.get(resource) else {
            return Vec::new();
        };
        let init: HashSet<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .filter(|c| !is_restartable_init(c))
            .map(|c| c.name.as_str())
            .collect();
        let mut used = HashSet::new();
        let mut reusable = HashSet::new();
        for (u, containers) in &inner.pods {
            for (name, resources) in containers {
                let Some(a) = resources.get(resource) else {
                    continue;
                };
                for id in &a.ids {
                    if u == uid && init.contains(name.as_str()) {
                        reusable.insert(id.clone());
                    } else {
                        used.insert(id.clone());
                    }
                }
            }
        }
        let mut free: Vec<String> = r
            .devices
            .iter()
            .filter(|(id, d)| d.healthy && !used.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        free.sort_by_key(|id| !reusable.contains(id));
        free
    }

    /// Picks `n` of `free`, those on the affinity's NUMA nodes first, then those without
    /// topology, then the rest (`filterByAffinity`).
    fn pick(
        inner: &Inner,
        resource: &str,
        free: &[String],
        n: usize,
        affinity: Option<BitMask>,
    ) -> Vec<String> {
        let devices = inner.resources.get(resource).map(|r| &r.devices);
        let rank = |id: &String| {
            let numa = devices
                .and_then(|d| d.get(id))
                .map(|d| d.numa.clone())
                .unwrap_or_default();
            match affinity {
                None => 0,
                Some(_) if numa.is_empty() => 1,
                Some(mask) => {
                    if numa
                        .iter()
                        .any(|&x| u32::try_from(x).is_ok_and(|b| b < 64 && mask.is_set(b)))
                    {
                        0
                    } else {
                        2
                    }
                }
            }
        };
        let mut ranked: Vec<&String> = free.iter().collect();
        ranked.sort_by_key(|id| rank(id));
        ranked.into_iter().take(n).cloned().collect()
    }

    /// Allocates the devices of every container of `pod` (init containers first), each
    /// within the NUMA affinity `affinity` gives for it (`Allocate` from the topology
    /// manager's admit handler). Allocations the pod already has (a kubelet restart, from the
    /// checkpoint) are kept. First forgets the allocations of pods not in `active`
    /// (`UpdateAllocatedDevices`). On an error the pod holds no devices.
    pub async fn allocate_pod(
        &self,
        pod: &Pod,
        active: &HashSet<String>,
        affinity: impl Fn(&str) -> Option<BitMask>,
    ) -> Result<(), String> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let _one = self.allocating.lock().await;
        self.remove_stale(active, &uid);
        let containers: Vec<&Container> = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .chain(s.containers.iter())
            })
            .collect();
        for c in containers {
            if let Err(e) = self
                .allocate_container(pod, &uid, c, affinity(&c.name))
                .await
            {
                self.release(&uid);
                return Err(e);
            }
        }
        Ok(())
    }

    fn remove_stale(&self, active: &HashSet<String>, current: &str) {
        let removed = {
            let mut inner = self.inner.lock();
            let before = inner.pods.len();
            inner.pods.retain(|u, _| u == current || active.contains(u));
            before != inner.pods.len()
        };
        if removed {
            self.write_checkpoint();
        }
    }

    async fn allocate_container(
        &self,
        pod: &Pod,
        uid: &str,
        c: &Container,
        affinity: Option<BitMask>,
    ) -> Result<(), String> {
        let requests = device_requests(c, &self.inner.lock().resources);
        for (resource, n) in requests {
            // Already held with the right count (a restart): keep it.
            let (free, endpoint) = {
                let inner = self.inner.lock();
                if inner
                    .pods
                    .get(uid)
                    .and_then(|p| p.get(&c.name))
                    .and_then(|p| p.get(&resource))
                    .is_some_and(|a| a.ids.len() == n && a.resp.is_some())
                {
                    continue;
                }
                let endpoint = inner
                    .resources
                    .get(&resource)
                    .and_then(|r| r.endpoint.clone());
                (Self::free_devices(&inner, pod, uid, &resource), endpoint)
            };
            if free.len() < n {
                return Err(format!(
                    "requested number of devices unavailable for {resource}. Requested: {n}, Available: {}",
                    free.len()
                ));
            }
            let Some(endpoint) = endpoint else {
                return Err(format!(
                    "no healthy devices present for {resource}: its device plugin is not registered"
                ));
            };
            let mut ids = None;
            if endpoint.options.get_preferred_allocation_available {
                let req = api::PreferredAllocationRequest {
                    container_requests: vec![api::ContainerPreferredAllocationRequest {
                        available_device_i_ds: free.clone(),
                        must_include_device_i_ds: Vec::new(),
                        allocation_size: i32::try_from(n).unwrap_or(i32::MAX),
                    }],
                };
                match endpoint.client.clone().get_preferred_allocation(req).await {
                    Ok(resp) => {
                        let got: Vec<String> = resp
                            .into_inner()
                            .container_responses
                            .into_iter()
                            .next()
                            .map(|r| r.device_i_ds)
                            .unwrap_or_default();
                        let distinct: BTreeSet<&String> = got.iter().collect();
                        if got.len() == n
                            && distinct.len() == n
                            && got.iter().all(|id| free.contains(id))
                        {
                            ids = Some(got);
                        } else {
                            warn!(resource = %resource, "the plugin's preferred allocation is not one of the available devices: ignored");
                        }
                    }
                    Err(e) => {
                        warn!(resource = %resource, error = %e, "GetPreferredAllocation failed: choosing without it")
                    }
                }
            }
            let ids = {
                let mut inner = self.inner.lock();
                let ids = ids.unwrap_or_else(|| Self::pick(&inner, &resource, &free, n, affinity));
                inner
                    .pods
                    .entry(uid.to_string())
                    .or_default()
                    .entry(c.name.clone())
                    .or_default()
                    .insert(
                        resource.clone(),
                        Allocation {
                            ids: ids.clone(),
                            resp: None,
                        },
                    );
                ids
            };
            let req = api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_i_ds: ids.clone(),
                }],
            };
            let resp = endpoint
                .client
                .clone()
                .allocate(req)
                .await
                .map_err(|e| format!("rpc error: code = {:?} desc = {}", e.code(), e.message()))?
                .into_inner();
            let Some(resp) = resp.container_responses.into_iter().next() else {
                return Err(format!(
                    "{resource}: the device plugin's AllocateResponse has no container response"
                ));
            };
            if let Some(a) = self
                .inner
                .lock()
                .pods
                .get_mut(uid)
                .and_then(|p| p.get_mut(&c.name))
                .and_then(|p| p.get_mut(&resource))
            {
                a.resp = Some(resp);
            }
            self.write_checkpoint();
        }
        Ok(())
    }

    /// Frees the devices of pod `uid` (it terminated) and writes the checkpoint.
    pub fn release(&self, uid: &str) {
        let removed = self.inner.lock().pods.remove(uid).is_some();
        if removed {
            self.write_checkpoint();
        }
    }

    /// What a container gets from its devices (`GetDeviceRunContainerOptions`): the plugins'
    /// envs, mounts, device nodes and annotations, a mount or device path once.
    pub fn run_options(&self, uid: &str, container: &str) -> Option<RunOptions> {
        let inner = self.inner.lock();
        let resources = inner.pods.get(uid)?.get(container)?;
        let mut out = RunOptions::default();
        let mut mounts = HashSet::new();
        let mut devices = HashSet::new();
        for a in resources.values() {
            let Some(resp) = &a.resp else {
                continue;
            };
            let mut envs: Vec<_> = resp.envs.iter().collect();
            envs.sort();
            out.envs
                .extend(envs.into_iter().map(|(k, v)| (k.clone(), v.clone())));
            for m in &resp.mounts {
                if mounts.insert(m.container_path.clone()) {
                    out.mounts.push(m.clone());
                }
            }
            for d in &resp.devices {
                if devices.insert(d.host_path.clone()) {
                    out.devices.push(d.clone());
                }
            }
            let mut annotations: Vec<_> = resp.annotations.iter().collect();
            annotations.sort();
            out.annotations
                .extend(annotations.into_iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Some(out)
    }

    /// Calls `PreStartContainer` of the plugins that asked for it, with the container's
    /// devices (`callPreStartContainerIfNeeded`), before it is created.
    pub async fn pre_start(&self, uid: &str, container: &str) -> Result<(), String> {
        let calls: Vec<(String, Arc<Endpoint>, Vec<String>)> = {
            let inner = self.inner.lock();
            let Some(resources) = inner.pods.get(uid).and_then(|p| p.get(container)) else {
                return Ok(());
            };
            resources
                .iter()
                .filter_map(|(name, a)| {
                    let e = inner.resources.get(name)?.endpoint.clone()?;
                    e.options
                        .pre_start_required
                        .then(|| (name.clone(), e, a.ids.clone()))
                })
                .collect()
        };
        for (name, endpoint, ids) in calls {
            endpoint
                .client
                .clone()
                .pre_start_container(api::PreStartContainerRequest { devices_i_ds: ids })
                .await
                .map_err(|e| format!("{name}: PreStartContainer: {}", e.message()))?;
        }
        Ok(())
    }

    /// The NUMA hints for `requests` (`generateDeviceTopologyHints`): every mask of NUMA
    /// nodes whose free devices can hold the request, preferred when it is as narrow as the
    /// narrowest such mask (devices without topology count in none); a resource none of whose
    /// devices has topology gives no preference.
    fn hints(&self, pod: &Pod, requests: &BTreeMap<String, usize>) -> HintMap {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let inner = self.inner.lock();
        let mut out = HintMap::new();
        for (resource, &n) in requests {
            let Some(r) = inner.resources.get(resource) else {
                continue;
            };
            // No device reports its NUMA nodes: the plugin does not care about alignment
            // (`deviceHasTopologyAlignment`).
            if r.devices.values().all(|d| d.numa.is_empty()) {
                out.insert(resource.clone(), None);
                continue;
            }
            let free = Self::free_devices(&inner, pod, &uid, resource);
            let mut nodes: BTreeSet<u32> = BTreeSet::new();
            for d in r.devices.values() {
                nodes.extend(
                    d.numa
                        .iter()
                        .filter_map(|&x| u32::try_from(x).ok().filter(|b| *b < 64)),
                );
            }
            let nodes: Vec<u32> = nodes.into_iter().collect();
            let mut found: Vec<BitMask> = Vec::new();
            let mut min_all = usize::MAX;
            iterate_bitmasks(&nodes, |mask| {
                let within = |id: &String| {
                    r.devices.get(id).is_some_and(|d| {
                        d.numa
                            .iter()
                            .any(|&x| u32::try_from(x).is_ok_and(|b| b < 64 && mask.is_set(b)))
                    })
                };
                if r.devices.keys().filter(|id| within(id)).count() >= n {
                    min_all = min_all.min(mask.count() as usize);
                }
                if free.iter().filter(|id| within(id)).count() >= n {
                    found.push(mask);
                }
            });
            let hints = found
                .into_iter()
                .map(|mask| TopologyHint {
                    affinity: Some(mask),
                    preferred: mask.count() as usize == min_all,
                })
                .collect();
            out.insert(resource.clone(), Some(hints));
        }
        out
    }

    fn pod_device_requests(&self, pod: &Pod) -> BTreeMap<String, usize> {
        let inner = self.inner.lock();
        let mut init_max: BTreeMap<String, usize> = BTreeMap::new();
        let mut apps: BTreeMap<String, usize> = BTreeMap::new();
        for s in pod.spec.iter() {
            for c in s.init_containers.iter().flatten() {
                for (r, n) in device_requests(c, &inner.resources) {
                    if is_restartable_init(c) {
                        *apps.entry(r).or_default() += n;
                    } else {
                        let e = init_max.entry(r).or_default();
                        *e = (*e).max(n);
                    }
                }
            }
            for c in &s.containers {
                for (r, n) in device_requests(c, &inner.resources) {
                    *apps.entry(r).or_default() += n;
                }
            }
        }
        for (r, n) in init_max {
            let e = apps.entry(r).or_default();
            *e = (*e).max(n);
        }
        apps
    }
}

impl HintProvider for DeviceManager {
    fn container_hints(&self, pod: &Pod, c: &Container) -> HintMap {
        let requests = device_requests(c, &self.inner.lock().resources);
        if requests.is_empty() {
            return HintMap::new();
        }
        self.hints(pod, &requests)
    }

    fn pod_hints(&self, pod: &Pod) -> HintMap {
        let requests = self.pod_device_requests(pod);
        if requests.is_empty() {
            return HintMap::new();
        }
        self.hints(pod, &requests)
    }

    /// The devices are chosen and the plugin called right after the topology manager's
    /// admission, in [`DeviceManager::allocate_pod`] (the `Allocate` call is a network call,
    /// the topology manager's is not), with the affinity recorded here.
    fn allocate(&self, _pod: &Pod, _c: &Container, _hint: TopologyHint) -> Result<(), String> {
        Ok(())
    }

    fn release_pod(&self, uid: &str) {
        self.release(uid);
    }
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("dir", &self.dir)
            .field("counts", &*self.counts.borrow())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
