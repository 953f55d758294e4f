//! A pod's volumes on the node: set up before its containers start, refreshed while it runs,
//! torn down when it is gone, in upstream's directory layout
//! (`<root-dir>/pods/<uid>/volumes/kubernetes.io~configmap/<name>`, ...;
//! `pkg/kubelet/kubelet_getters.go`, `pkg/volume/*`).
//!
//! | volume | on the node |
//! |---|---|
//! | `emptyDir` | a 0777 directory under the pod's; `medium: Memory` a tmpfs with `size=` the smallest of `sizeLimit`, the pod's memory limit and the node's allocatable memory (`calculateEmptyDirMemorySize`) |
//! | `configMap`, `downwardAPI` | a directory filled by the [`atomic_writer`] ([`sources`]) |
//! | `secret`, `projected` | the same on a tmpfs (sized like a memory emptyDir), so secrets and tokens never reach a disk, as upstream wraps them in a memory emptyDir |
//! | `hostPath` | the node's path itself, after its `type` check ([`hostpath`]) |
//!
//! configMap, secret, downwardAPI and projected volumes are always given read-only to the
//! containers (upstream's `GetAttributes().ReadOnly`, since CVE-2017-1002102). [`VolumeManager::set_up`]
//! is idempotent: a volume already there is checked, not made again; a payload is rewritten
//! only when it changed. [`VolumeManager::refresh`] re-reads the objects of payload volumes
//! (a ConfigMap or Secret update, a token at 80 % of its life) and goes through the atomic
//! writer again; the pod workers call it on each periodic sync, as upstream's reconciler
//! remounts these volumes. A failure is reported per volume as upstream's `FailedMount`
//! event ([`VolumeFailure::event`]).

pub mod atomic_writer;
pub mod hostpath;
pub mod mount;
pub mod sources;
pub mod subpath;
pub mod token;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use skerry_api::validation::quantity::Quantity;

use self::atomic_writer::{AtomicWriter, Payload};
use self::token::{TokenManager, TokenSource};
use crate::env::fieldpath::Allocatable;
use crate::env::{EVENT_WARNING, Lookup, PodEvent, expand_subpath_expr};

/// The folder of pods under the root dir (upstream's `config.DefaultKubeletPodsDirName`).
pub const PODS_DIR: &str = "pods";
/// The folder of a pod's volumes (`DefaultKubeletVolumesDirName`).
pub const VOLUMES_DIR: &str = "volumes";
/// Plugin folders: the plugin name with `/` escaped as `~` (`utilstrings.EscapeQualifiedName`).
pub const PLUGIN_EMPTY_DIR: &str = "kubernetes.io~empty-dir";
/// See [`PLUGIN_EMPTY_DIR`].
pub const PLUGIN_CONFIG_MAP: &str = "kubernetes.io~configmap";
/// See [`PLUGIN_EMPTY_DIR`].
pub const PLUGIN_SECRET: &str = "kubernetes.io~secret";
/// See [`PLUGIN_EMPTY_DIR`].
pub const PLUGIN_DOWNWARD_API: &str = "kubernetes.io~downward-api";
/// See [`PLUGIN_EMPTY_DIR`].
pub const PLUGIN_PROJECTED: &str = "kubernetes.io~projected";

/// The event reason of a volume that failed to mount (`events.FailedMountVolume`).
pub const EVENT_FAILED_MOUNT: &str = "FailedMount";
/// Mode of an emptyDir (and of the directory under a payload volume): anyone in the pod may
/// write, whatever user it runs as (upstream's `setupDir` uses 0777).
const EMPTY_DIR_MODE: u32 = 0o777;
/// The `medium` of a memory-backed emptyDir.
const MEDIUM_MEMORY: &str = "Memory";
/// The file system a memory-backed volume is on.
const TMPFS: &str = "tmpfs";

/// A volume as it is on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedVolume {
    /// The volume's name in the pod.
    pub name: String,
    /// Its path on the node.
    pub path: PathBuf,
    /// Always mounted read-only (configMap, secret, downwardAPI, projected).
    pub read_only: bool,
}

/// One volume that failed to set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeFailure {
    /// The volume's name.
    pub volume: String,
    /// Why (`configmap "x" not found`, `hostPath type check failed: ...`).
    pub message: String,
}

impl VolumeFailure {
    /// The Warning event the kubelet records (`FailedMount`,
    /// `MountVolume.SetUp failed for volume "<name>" : <message>`).
    pub fn event(&self) -> PodEvent {
        PodEvent {
            type_: EVENT_WARNING,
            reason: EVENT_FAILED_MOUNT,
            message: format!(
                "MountVolume.SetUp failed for volume \"{}\" : {}",
                self.volume, self.message
            ),
        }
    }
}

/// Some volumes of a pod failed; the others are set up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unmounted volumes=[{}]: {}", .failures.iter().map(|f| f.volume.as_str()).collect::<Vec<_>>().join(" "), .failures.iter().map(|f| f.message.as_str()).collect::<Vec<_>>().join("; "))]
pub struct SetUpError {
    /// Each failed volume.
    pub failures: Vec<VolumeFailure>,
}

/// A mount to give one container (what CRI's `Mount` carries).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMount {
    /// Where in the container.
    pub container_path: String,
    /// What on the node.
    pub host_path: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

/// The node facts volumes need.
#[derive(Clone, Debug)]
pub struct VolumeConfig {
    /// `--root-dir` (upstream's default is `/var/lib/kubelet`).
    pub root_dir: PathBuf,
    /// The node's allocatable resources: the size of memory volumes and the limits the
    /// downward API reports for containers without one.
    pub node_allocatable: Allocatable,
}

#[derive(Default)]
struct PodState {
    volumes: BTreeMap<String, MountedVolume>,
    writers: HashMap<String, AtomicWriter>,
}

/// The volumes of every pod on the node.
pub struct VolumeManager<L, T> {
    config: VolumeConfig,
    lookup: L,
    tokens: TokenManager<T>,
    pods: Mutex<HashMap<String, Arc<tokio::sync::Mutex<PodState>>>>,
}

impl<L: Lookup, T: TokenSource> VolumeManager<L, T> {
    /// A manager reading objects through `lookup` and tokens through `tokens`.
    pub fn new(config: VolumeConfig, lookup: L, tokens: TokenManager<T>) -> Self {
        VolumeManager {
            config,
            lookup,
            tokens,
            pods: Mutex::new(HashMap::new()),
        }
    }

    /// The token cache (the pod workers run its `cleanup` every minute).
    pub fn tokens(&self) -> &TokenManager<T> {
        &self.tokens
    }

    /// `<root-dir>/pods/<uid>`.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.config.root_dir.join(PODS_DIR).join(uid)
    }

    /// `<root-dir>/pods/<uid>/volumes/<plugin>/<name>`.
    pub fn volume_dir(&self, uid: &str, plugin: &str, name: &str) -> PathBuf {
        self.pod_dir(uid).join(VOLUMES_DIR).join(plugin).join(name)
    }

    fn state(&self, uid: &str) -> Arc<tokio::sync::Mutex<PodState>> {
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        pods.entry(uid.to_string()).or_default().clone()
    }

    /// Sets up every volume of `pod` (idempotent); returns them by name, or the failures
    /// (the volumes that did set up stay set up).
    pub async fn set_up(&self, pod: &Pod) -> Result<BTreeMap<String, MountedVolume>, SetUpError> {
        let uid = pod_uid(pod);
        let state = self.state(&uid);
        let mut state = state.lock().await;
        let mut failures = Vec::new();
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            match self.set_up_volume(pod, &mut state, volume).await {
                Ok(mounted) => {
                    state.volumes.insert(volume.name.clone(), mounted);
                }
                Err(message) => failures.push(VolumeFailure {
                    volume: volume.name.clone(),
                    message,
                }),
            }
        }
        if failures.is_empty() {
            Ok(state.volumes.clone())
        } else {
            Err(SetUpError { failures })
        }
    }

    /// Re-reads the objects of the pod's configMap, secret, downwardAPI and projected volumes
    /// and rewrites those whose content changed (tokens are re-requested when due).
    pub async fn refresh(&self, pod: &Pod) -> Result<(), SetUpError> {
        let uid = pod_uid(pod);
        let state = self.state(&uid);
        let mut state = state.lock().await;
        let mut failures = Vec::new();
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let payload_volume = volume.config_map.is_some()
                || volume.secret.is_some()
                || volume.downward_api.is_some()
                || volume.projected.is_some();
            if !payload_volume || !state.volumes.contains_key(&volume.name) {
                continue;
            }
            if let Err(message) = self.set_up_volume(pod, &mut state, volume).await {
                failures.push(VolumeFailure {
                    volume: volume.name.clone(),
                    message,
                });
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(SetUpError { failures })
        }
    }

    async fn set_up_volume(
        &self,
        pod: &Pod,
        state: &mut PodState,
        volume: &Volume,
    ) -> Result<MountedVolume, String> {
        let uid = pod_uid(pod);
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = volume.name.as_str();
        let allocatable = &self.config.node_allocatable;
        let mounted = |path: PathBuf, read_only: bool| MountedVolume {
            name: name.to_string(),
            path,
            read_only,
        };
        if let Some(empty) = &volume.empty_dir {
            let dir = self.volume_dir(&uid, PLUGIN_EMPTY_DIR, name);
            let memory = empty.medium.as_deref() == Some(MEDIUM_MEMORY);
            let size =
                memory.then(|| memory_volume_size(pod, allocatable, empty.size_limit.as_ref()));
            make_dir(&dir, memory, size.flatten())?;
            return Ok(mounted(dir, false));
        }
        if let Some(host) = &volume.host_path {
            hostpath::set_up(&host.path, host.type_.as_deref())?;
            return Ok(mounted(PathBuf::from(&host.path), false));
        }
        let (plugin, memory, payload) = if let Some(source) = &volume.config_map {
            (
                PLUGIN_CONFIG_MAP,
                false,
                sources::config_map_volume(&self.lookup, namespace, source).await?,
            )
        } else if let Some(source) = &volume.secret {
            (
                PLUGIN_SECRET,
                true,
                sources::secret_volume(&self.lookup, namespace, source).await?,
            )
        } else if let Some(source) = &volume.downward_api {
            let mode = source
                .default_mode
                .and_then(|m| u32::try_from(m).ok())
                .unwrap_or(sources::DEFAULT_MODE);
            let items = source.items.as_deref().unwrap_or_default();
            let payload = sources::downward_api_payload(items, pod, allocatable, mode)
                .map_err(sources::aggregate)?;
            (PLUGIN_DOWNWARD_API, false, payload)
        } else if let Some(source) = &volume.projected {
            let payload =
                sources::projected_volume(&self.lookup, &self.tokens, pod, allocatable, source)
                    .await?;
            (PLUGIN_PROJECTED, true, payload)
        } else {
            return Err(format!(
                "volume \"{name}\": skerry's kubelet supports emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes only"
            ));
        };
        let dir = self.volume_dir(&uid, plugin, name);
        let size = memory.then(|| memory_volume_size(pod, allocatable, None));
        make_dir(&dir, memory, size.flatten())?;
        write_payload(state, name, &dir, &payload)?;
        Ok(mounted(dir, true))
    }

    /// The mounts of one container: each `volumeMount` resolved to a path on the node,
    /// `subPath` / `subPathExpr` (expanded against `env`) bind-mounted safely
    /// ([`subpath::prepare`]), read-only when the mount or the volume says so.
    pub fn container_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        env: &BTreeMap<String, String>,
    ) -> Result<Vec<ContainerMount>, String> {
        let uid = pod_uid(pod);
        let volumes: BTreeMap<&str, &Volume> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .map(|v| (v.name.as_str(), v))
            .collect();
        let mut out = Vec::new();
        for (index, vm) in container.volume_mounts.iter().flatten().enumerate() {
            let Some(volume) = volumes.get(vm.name.as_str()) else {
                return Err(format!(
                    "cannot find volume \"{}\" to mount into container \"{}\"",
                    vm.name, container.name
                ));
            };
            let (volume_path, forced_read_only) = self.volume_path(&uid, volume)?;
            let mut sub_path = vm.sub_path.clone().unwrap_or_default();
            if let Some(expr) = vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                sub_path = expand_subpath_expr(expr, env)?;
            }
            let host_path = if sub_path.is_empty() {
                volume_path
            } else {
                subpath::prepare(&subpath::SubPath {
                    volume_path: &volume_path,
                    sub_path: &sub_path,
                    pod_dir: &self.pod_dir(&uid),
                    volume_name: &vm.name,
                    container_name: &container.name,
                    index,
                    mount_name: &vm.name,
                })?
            };
            out.push(ContainerMount {
                container_path: vm.mount_path.clone(),
                host_path,
                read_only: vm.read_only.unwrap_or(false) || forced_read_only,
            });
        }
        Ok(out)
    }

    fn volume_path(&self, uid: &str, volume: &Volume) -> Result<(PathBuf, bool), String> {
        let name = volume.name.as_str();
        Ok(if volume.empty_dir.is_some() {
            (self.volume_dir(uid, PLUGIN_EMPTY_DIR, name), false)
        } else if let Some(host) = &volume.host_path {
            (PathBuf::from(&host.path), false)
        } else if volume.config_map.is_some() {
            (self.volume_dir(uid, PLUGIN_CONFIG_MAP, name), true)
        } else if volume.secret.is_some() {
            (self.volume_dir(uid, PLUGIN_SECRET, name), true)
        } else if volume.downward_api.is_some() {
            (self.volume_dir(uid, PLUGIN_DOWNWARD_API, name), true)
        } else if volume.projected.is_some() {
            (self.volume_dir(uid, PLUGIN_PROJECTED, name), true)
        } else {
            return Err(format!(
                "volume \"{name}\" is of a type skerry's kubelet does not support"
            ));
        })
    }

    /// Tears down every volume of the pod `uid`: subPath bind mounts and tmpfs unmounted,
    /// the `volumes` and `volume-subpaths` folders removed (only once nothing is mounted
    /// below them, so a bind mount can never make it delete the node's files), its tokens
    /// forgotten.
    pub async fn tear_down(&self, uid: &str) -> Result<(), String> {
        let state = self.state(uid);
        let mut state = state.lock().await;
        let pod_dir = self.pod_dir(uid);
        for folder in [subpath::VOLUME_SUBPATHS_DIR, VOLUMES_DIR] {
            let dir = pod_dir.join(folder);
            if fs::symlink_metadata(&dir).is_err() {
                continue;
            }
            mount::unmount_all_under(&dir)
                .map_err(|e| format!("unmount under {}: {e}", dir.display()))?;
            let canonical =
                fs::canonicalize(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let still = mount::mounts()
                .map_err(|e| format!("read the mount table: {e}"))?
                .into_iter()
                .any(|m| m.mount_point.starts_with(&canonical));
            if still {
                return Err(format!("{} still has mounts below it", dir.display()));
            }
            fs::remove_dir_all(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
        }
        self.tokens.delete_pod_tokens(uid);
        state.volumes.clear();
        state.writers.clear();
        drop(state);
        self.pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
        Ok(())
    }
}

fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Makes a volume's directory (0777); on a tmpfs of `size` bytes when `memory` (unless one is
/// mounted there already: set-up is idempotent).
fn make_dir(dir: &Path, memory: bool, size: Option<u64>) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    if memory {
        let mounted = mount::mount_at(dir).map_err(|e| format!("read the mount table: {e}"))?;
        if mounted.is_none_or(|m| m.fs_type != TMPFS) {
            mount::mount_tmpfs(dir, size)
                .map_err(|e| format!("mount tmpfs on {}: {e}", dir.display()))?;
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(EMPTY_DIR_MODE))
        .map_err(|e| format!("chmod {}: {e}", dir.display()))
}

fn write_payload(
    state: &mut PodState,
    name: &str,
    dir: &Path,
    payload: &Payload,
) -> Result<(), String> {
    if !state.writers.contains_key(name) {
        let writer = AtomicWriter::new(dir).map_err(|e| e.to_string())?;
        state.writers.insert(name.to_string(), writer);
    }
    let writer = state.writers.get_mut(name).expect("inserted just above");
    writer.write(payload).map(|_| ()).map_err(|e| e.to_string())
}

/// Bytes of a memory-backed volume (`calculateEmptyDirMemorySize`): the node's allocatable
/// memory, lowered to the pod's memory limit when every container has one, lowered to the
/// volume's `sizeLimit` when that is positive and smaller. `None` (the kernel's default)
/// only when the node's allocatable memory is unknown and nothing else bounds it.
pub fn memory_volume_size(
    pod: &Pod,
    allocatable: &Allocatable,
    size_limit: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Option<u64> {
    let bytes = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        Quantity::parse(q.0.trim()).map(|q| {
            let nano = q.0;
            let whole = nano / 1_000_000_000 + i128::from(nano % 1_000_000_000 != 0);
            u64::try_from(whole.max(0)).unwrap_or(u64::MAX)
        })
    };
    let mut size = allocatable.get("memory").and_then(bytes);
    if let Some(limit) = pod_memory_limit(pod)
        && limit > 0
        && size.is_none_or(|s| limit <= s)
    {
        size = Some(limit);
    }
    if let Some(limit) = size_limit.and_then(bytes)
        && limit > 0
        && size.is_none_or(|s| limit <= s)
    {
        size = Some(limit);
    }
    size
}

/// The pod's memory limit when every container (init ones too) declares one: the app
/// containers' and sidecars' sum, at least each regular init container's (upstream's
/// `ResourceConfigForPod` over `PodLimits`), plus the pod overhead.
fn pod_memory_limit(pod: &Pod) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &Container| -> Option<i128> {
        let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
        Quantity::parse(q.0.trim()).map(|q| q.0)
    };
    let mut sum: i128 = 0;
    for c in &spec.containers {
        sum += limit(c)?;
    }
    let mut floor: i128 = 0;
    let mut sidecars: i128 = 0;
    for c in spec.init_containers.iter().flatten() {
        let l = limit(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars += l;
            sum += l;
        } else {
            floor = floor.max(l + sidecars);
        }
    }
    let mut total = sum.max(floor);
    if let Some(overhead) = spec.overhead.as_ref().and_then(|o| o.get("memory")) {
        total += Quantity::parse(overhead.0.trim()).map(|q| q.0).unwrap_or(0);
    }
    let whole = total / 1_000_000_000 + i128::from(total % 1_000_000_000 != 0);
    u64::try_from(whole).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    fn limited(name: &str, memory: &str) -> serde_json::Value {
        serde_json::json!({"name": name, "resources": {"limits": {"memory": memory}}})
    }

    #[test]
    fn memory_volumes_are_sized_as_upstream_sizes_them() {
        let allocatable: Allocatable = [("memory".to_string(), ApiQuantity("1Gi".into()))].into();
        let mi = |n: u64| Some(n * 1024 * 1024);
        let q = |s: &str| ApiQuantity(s.into());
        // Every container limited: the sum (sidecars added), at least each init container
        // plus the sidecars started before it.
        let p = pod(serde_json::json!({
            "containers": [limited("a", "100Mi"), limited("b", "50Mi")],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"memory": "30Mi"}}},
                limited("big-init", "400Mi"),
            ],
        }));
        assert_eq!(memory_volume_size(&p, &allocatable, None), mi(430));
        assert_eq!(
            memory_volume_size(&p, &allocatable, Some(&q("64Mi"))),
            mi(64)
        );
        assert_eq!(
            memory_volume_size(&p, &allocatable, Some(&q("2Gi"))),
            mi(430),
            "a larger sizeLimit does not count"
        );
        assert_eq!(
            memory_volume_size(&p, &allocatable, Some(&q("0"))),
            mi(430),
            "zero means none"
        );
        // One container without a limit: the pod is unbounded, the node's allocatable counts.
        let p = pod(serde_json::json!({"containers": [limited("a", "100Mi"), {"name": "b"}]}));
        assert_eq!(memory_volume_size(&p, &allocatable, None), mi(1024));
        // A pod limit above the node's allocatable does not raise it.
        let p = pod(serde_json::json!({"containers": [limited("a", "4Gi")]}));
        assert_eq!(memory_volume_size(&p, &allocatable, None), mi(1024));
        // Nothing known: the kernel's default.
        let p = pod(serde_json::json!({"containers": [{"name": "a"}]}));
        assert_eq!(memory_volume_size(&p, &Allocatable::new(), None), None);
    }
}
