//! The kubelet's core: pods bound to this node run for real (upstream `pkg/kubelet`).
//!
//! The path of a pod:
//! 1. the pod source: a shared informer over the pods with `spec.nodeName=<node>`
//!    ([`NodePods`]) hands every add, update and delete to [`PodWorkers`];
//! 2. a new pod is admitted first ([`admission`]: node name, affinity, `NoExecute` taints,
//!    resources, host ports, then the topology manager's NUMA admission and the CPU
//!    manager's exclusive CPUs, `crate::cm`; a rejected pod is `Failed`); the pod's worker ([`pod_workers`]) syncs it on its latest spec: [`actions`] says what
//!    the runtime must do, [`Kubelet::sync_pod`] ([`sync`]) does it over CRI with the
//!    sandbox ([`sandbox`]) and container ([`container`]) configurations, the environment
//!    (`crate::env`) and the volumes (`crate::volume`), with the restart and pull
//!    [`backoff`];
//! 3. the [`pleg`] relists the runtime every second and wakes the worker of any pod whose
//!    containers changed;
//! 4. after every sync the pod's status ([`status`]) goes to the API through the
//!    [`status_manager`], only when it changed; the [`prober`] runs the containers' probes
//!    and wakes the worker when a result changes (readiness into the status, a liveness
//!    failure into a restart);
//! 5. static pods ([`static_pods`]) come from `--pod-manifest-path` beside the API's and run
//!    the same way; their mirror pods in the API are only a window on them, never run;
//! 6. the pods bound here are checkpointed (`crate::checkpoint::pods`) when the pod set or a
//!    pod's spec changes; when the API does not answer within [`API_SOURCE_WAIT`] at start,
//!    the checkpointed pods run as the API's would, until the API's list replaces them (a
//!    pod it no longer has is stopped and removed);
//! 7. a deleted pod is stopped (preStop, then its grace period), its sandbox and volumes
//!    removed, and it is deleted from the API with grace 0 and its UID as precondition.
//!
//! The trick it carries: the runtime is the only record. Every sandbox and container carries
//! the pod's UID as a label and the kubelet's facts (restart count, spec hash, grace period,
//! preStop) as annotations, so a restarted kubelet rebuilds everything from one CRI list
//! and nothing about the runtime's side is kept on disk (the pod checkpoint keeps only the
//! API's side: which pods are bound here, for a start without the API).

pub mod actions;
pub mod admission;
pub mod backoff;
pub mod container;
pub mod env_lookup;
pub mod keyring;
pub mod log_rotation;
pub mod pleg;
pub mod pod_workers;
pub mod prober;
pub mod runtime;
pub mod sandbox;
pub mod static_pods;
pub mod status;
pub mod status_manager;
pub mod sync;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use skerry_client::events::EventRecorder;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::reflector::ListerWatcher;
use skerry_client::{Api, Client, Error, ListParams, ObjectList, WatchParams, WatchStream};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cri::Cri;
use crate::env::ApiLookup;
use crate::env::fieldpath::Allocatable;
use crate::volume::VolumeManager;
use crate::volume::token::ApiTokenSource;

pub use pod_workers::{PodUpdate, PodWorkers};

/// How soon a sync that failed (the runtime or the API unreachable) is tried again.
pub const SYNC_ERROR_RETRY: Duration = Duration::from_secs(2);

/// How often the kubelet looks for runtime pods no API pod owns (upstream's housekeeping,
/// `housekeepingPeriod = 2s`): sandboxes left by a pod deleted while the kubelet was down.
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);

/// The least time an eviction waits for its pod to stop (`killPodNow`'s `minTimeout`, 10 s):
/// a pod given 1 s still needs its preStop, its `StopContainer` and its status write.
pub const EVICTION_KILL_TIMEOUT_MIN: Duration = Duration::from_secs(10);

/// The name the kubelet records events under (`source.component`).
pub const COMPONENT: &str = "kubelet";

/// The root of the container log directories under `--root-dir` (upstream's
/// `/var/log/pods`, kept under the data dir here).
pub const POD_LOGS_DIR: &str = "pods-logs";

/// How long the kubelet waits at start for the API's first list of its pods before it runs the
/// pods of its checkpoint instead: longer than a healthy apiserver takes to answer a LIST of
/// one node's pods (milliseconds, a second on a loaded box), short enough that a box that
/// rebooted without its network brings its pods back within seconds.
pub const API_SOURCE_WAIT: Duration = Duration::from_secs(5);

/// The node facts and flags the kubelet runs with.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// The node's name (`--hostname-override`).
    pub node_name: String,
    /// `--root-dir`.
    pub root_dir: PathBuf,
    /// The node's IPs, the primary first (`--node-ip`).
    pub node_ips: Vec<String>,
    /// `--cluster-dns`.
    pub cluster_dns: Vec<String>,
    /// `--cluster-domain`.
    pub cluster_domain: String,
    /// The cgroup pods go under (`/kubepods`).
    pub cgroup_root: String,
    /// The node's memory in bytes (for `oom_score_adj`).
    pub memory_capacity: i64,
    /// The node's allocatable resources (downward API limits of unlimited containers).
    pub allocatable: Allocatable,
    /// The node's resolver configuration file.
    pub resolv_conf: PathBuf,
    /// The node's hosts file (copied into host-network pods).
    pub hosts_file: PathBuf,
    /// The registries file's credentials (`--private-registry`), tried after a pod's
    /// `imagePullSecrets`.
    pub registries: crate::registries::Registries,
    /// `--container-log-max-size` and `--container-log-max-files`.
    pub log_policy: log_rotation::LogPolicy,
    /// `--sync-frequency`: how often a running pod's configMap, secret, downwardAPI and
    /// projected volumes are re-read and rewritten when their objects changed.
    pub sync_frequency: Duration,
    /// The QoS and pod cgroups under `cgroup_root`, started ([`crate::cgroups::pod`]).
    pub cgroups: Arc<crate::cgroups::pod::ContainerManager>,
    /// `--pod-manifest-path`: the folder of static pod manifests (`None`: no static pods).
    pub pod_manifest_path: Option<PathBuf>,
    /// `--file-check-frequency`: how often that folder is read again without an inotify
    /// event.
    pub file_check_frequency: Duration,
    /// `--streaming-connection-idle-timeout`: an exec, attach or port-forward session with no
    /// traffic for this long is closed (zero: never; [`crate::streaming::idle`]).
    pub streaming_connection_idle_timeout: Duration,
    /// The node conditions the eviction manager reports ([`crate::eviction`]): its
    /// admission refuses pods under pressure.
    pub node_pressure: tokio::sync::watch::Receiver<crate::machine::Pressure>,
    /// The CPU and topology managers (`crate::cm`); `None`: containers keep every CPU and
    /// no NUMA admission runs.
    pub resource_managers: Option<Arc<crate::cm::ResourceManagers>>,
}

/// The kubelet's default `--sync-frequency` (`KubeletConfiguration` `syncFrequency`, 1 minute):
/// a configMap or secret update reaches a running pod's files within about this long. Shorter
/// propagates sooner at a GET per referenced object per pod per period.
pub const SYNC_FREQUENCY: Duration = Duration::from_secs(60);

/// The kubelet: shared by every pod worker.
pub struct Kubelet {
    config: KubeletConfig,
    cri: Cri,
    client: Client,
    lookup: ApiLookup,
    volumes: VolumeManager<ApiLookup, ApiTokenSource>,
    events: EventRecorder,
    statuses: status_manager::StatusManager,
    backoff: Mutex<backoff::Backoff>,
    reasons: Mutex<HashMap<String, HashMap<String, status::Reason>>>,
    sandbox_env: sandbox::SandboxEnv,
    workers: PodWorkers,
    probes: prober::ProbeManager,
    /// The pods admitted and not stopped ([`admission`]).
    admitted: Mutex<HashMap<String, Arc<Pod>>>,
    /// Whether the API's list of this node's pods came once: until then the pods run from
    /// the checkpoint and their containers' environment is built without the Services the
    /// API cannot list ([`env_lookup::Offline`]).
    api_synced: std::sync::atomic::AtomicBool,
    /// When each running pod's payload volumes were last set up or refreshed, by pod UID.
    volumes_refreshed: Mutex<HashMap<String, std::time::Instant>>,
    stop: CancellationToken,
    /// The pod source's store, once it runs (read by the kubelet's API, `crate::server`).
    pods: std::sync::OnceLock<skerry_client::cache::Indexer<Pod>>,
    /// The pods of `--pod-manifest-path`.
    static_pods: static_pods::StaticPods,
    /// Evictions asked of pod workers by the eviction manager, by pod UID.
    evictions: Mutex<HashMap<String, Eviction>>,
    /// The pods bound here, on disk (`None` when the directory cannot be made).
    pod_checkpoints: Option<crate::checkpoint::pods::PodCheckpoints>,
}

/// An eviction handed to a pod's worker (upstream's `killPodNow` with a `PodStatusFunc`):
/// the pod is stopped with `grace`, then written `Failed` with reason `Evicted`, `message`
/// and the `DisruptionTarget` condition; `done` is told when that is over.
pub struct Eviction {
    /// The grace period override.
    pub grace: Duration,
    /// The status message (and the condition's).
    pub message: String,
    /// Told once the pod is stopped and its status written.
    pub done: tokio::sync::oneshot::Sender<()>,
}

/// The pods bound to one node: a LIST and WATCH with `fieldSelector=spec.nodeName=<node>`
/// (the kubelet's `NewSourceApiserver`).
pub struct NodePods {
    api: Api<Pod>,
    selector: String,
}

impl NodePods {
    /// The pods of every namespace bound to `node`.
    pub fn new(client: &Client, node: &str) -> NodePods {
        NodePods {
            api: client.api(None),
            selector: format!("spec.nodeName={node}"),
        }
    }
}

impl ListerWatcher<Pod> for NodePods {
    fn list(
        &self,
        params: &ListParams,
    ) -> impl Future<Output = Result<ObjectList<Pod>, Error>> + Send {
        let mut params = params.clone();
        params.field_selector = Some(self.selector.clone());
        let api = self.api.clone();
        async move { api.list(&params).await }
    }
    fn watch(
        &self,
        params: &WatchParams,
    ) -> impl Future<Output = Result<WatchStream<Pod>, Error>> + Send {
        let mut params = params.clone();
        params.field_selector = Some(self.selector.clone());
        let api = self.api.clone();
        async move { api.watch(&params).await }
    }
}

struct Source {
    kubelet: Arc<Kubelet>,
    rt: tokio::runtime::Handle,
}

impl Source {
    /// A mirror pod is never run: its change wakes the worker of its static pod, whose sync
    /// puts the mirror right (`kubelet.go` `HandlePodAdditions` / `HandlePodUpdates` with
    /// `IsMirrorPod`).
    fn mirror(&self, pod: &Pod) -> bool {
        if !static_pods::is_mirror(pod) {
            return false;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if let Some(uid) = self
            .kubelet
            .static_pods
            .get(namespace, name)
            .and_then(|p| p.metadata.uid.clone())
        {
            self.kubelet.workers.wake(&uid);
        }
        true
    }
}

/// Whether an update of a pod is one its sync depends on, as the kubelet's config source
/// decides (`pkg/kubelet/config/config.go` `checkAndUpdatePod`, `podsDifferSemantically`):
/// the spec, labels, annotations, deletion timestamp or grace period changed. A status-only
/// change (most often the kubelet's own status write coming back through the watch) is a
/// reconcile: stored, no sync, so a status like `ErrImagePull` is not replaced by the next
/// sync's at once. A pod with readiness gates also syncs when its conditions change
/// (`NeedToReconcilePodReadiness`).
fn differs_for_sync(old: &Pod, new: &Pod) -> bool {
    let (o, n) = (&old.metadata, &new.metadata);
    if old.spec != new.spec
        || o.labels != n.labels
        || o.annotations != n.annotations
        || o.deletion_timestamp != n.deletion_timestamp
        || o.deletion_grace_period_seconds != n.deletion_grace_period_seconds
    {
        return true;
    }
    let gated = new
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    let conditions = |p: &Pod| p.status.as_ref().and_then(|s| s.conditions.clone());
    gated && conditions(old) != conditions(new)
}

impl Source {
    /// Keeps the pod's checkpoint current (called when the pod set or a pod's sync inputs
    /// change, and when it reaches a terminal phase, not on other status writes). A pod in a
    /// terminal phase never runs again: its checkpoint is removed, so a start without the API
    /// does not run it from the spec it had when it came.
    fn checkpoint(&self, pod: &Pod) {
        let Some(c) = &self.kubelet.pod_checkpoints else {
            return;
        };
        let result = if is_terminal(pod) {
            c.remove(pod.metadata.uid.as_deref().unwrap_or_default())
        } else {
            c.store(pod)
        };
        if let Err(e) = result {
            warn!(pod = %pod_workers::pod_name(pod), error = %e, "writing the pod checkpoint failed");
        }
    }
}

/// Whether the pod's phase is `Succeeded` or `Failed`.
fn is_terminal(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(status::is_terminal_phase)
}

impl EventHandler<Pod> for Source {
    fn on_add(&self, pod: &Arc<Pod>, _: bool) {
        if self.mirror(pod) {
            return;
        }
        self.checkpoint(pod);
        self.kubelet
            .workers
            .update(&self.kubelet, PodUpdate::Pod(pod.clone()), &self.rt);
    }
    fn on_update(&self, old: &Arc<Pod>, pod: &Arc<Pod>) {
        if self.mirror(pod) {
            return;
        }
        let wake = differs_for_sync(old, pod);
        if wake || (is_terminal(pod) && !is_terminal(old)) {
            self.checkpoint(pod);
        }
        self.kubelet.workers.update_and_wake(
            &self.kubelet,
            PodUpdate::Pod(pod.clone()),
            &self.rt,
            wake,
        );
    }
    fn on_delete(&self, pod: &Deleted<Pod>) {
        if self.mirror(pod.object()) {
            return;
        }
        if let (Some(c), Some(uid)) = (
            &self.kubelet.pod_checkpoints,
            pod.object().metadata.uid.as_deref(),
        ) && let Err(e) = c.remove(uid)
        {
            warn!(%uid, error = %e, "removing the pod checkpoint failed");
        }
        self.kubelet.workers.update(
            &self.kubelet,
            PodUpdate::Removed(pod.object().clone()),
            &self.rt,
        );
    }
}

impl Kubelet {
    /// A kubelet over `cri`, reaching the API as `client` (the node's credentials).
    pub fn new(
        config: KubeletConfig,
        cri: Cri,
        client: Client,
        stop: CancellationToken,
    ) -> Arc<Kubelet> {
        let lookup = ApiLookup::new(client.clone());
        let tokens = crate::volume::token::TokenManager::new(
            ApiTokenSource::new(client.clone()),
            Arc::new(crate::volume::token::SystemClock),
        );
        let volumes = VolumeManager::new(
            crate::volume::VolumeConfig {
                root_dir: config.root_dir.clone(),
                node_allocatable: config.allocatable.clone(),
            },
            lookup.clone(),
            tokens,
        );
        let mut options = skerry_client::events::RecorderOptions::new(COMPONENT);
        options.host = Some(config.node_name.clone());
        let (events, writer) = EventRecorder::with_options(client.clone(), options);
        tokio::spawn(writer.run());
        let host_dns = std::fs::read_to_string(&config.resolv_conf)
            .map(|t| sandbox::parse_resolv_conf(&t))
            .unwrap_or_default();
        let sandbox_env = sandbox::SandboxEnv {
            cluster_dns: config.cluster_dns.clone(),
            cluster_domain: config.cluster_domain.clone(),
            host_dns,
            logs_root: config.root_dir.join(POD_LOGS_DIR),
            cgroup_root: config.cgroup_root.clone(),
        };
        let workers = PodWorkers::new();
        let probes = {
            let workers = workers.clone();
            prober::ProbeManager::new(cri.clone(), events.clone(), move |uid| workers.wake(uid))
        };
        let pod_checkpoints = crate::checkpoint::pods::PodCheckpoints::new(
            config
                .root_dir
                .join(crate::checkpoint::pods::POD_CHECKPOINT_DIR),
        )
        .inspect_err(|e| warn!(error = %e, "no pod checkpoints: the directory cannot be made"))
        .ok();
        Arc::new(Kubelet {
            pod_checkpoints,
            statuses: status_manager::StatusManager::new(client.clone()),
            config,
            cri,
            client,
            lookup,
            volumes,
            events,
            backoff: Mutex::new(backoff::Backoff::new()),
            reasons: Mutex::new(HashMap::new()),
            sandbox_env,
            workers,
            probes,
            admitted: Mutex::new(HashMap::new()),
            api_synced: std::sync::atomic::AtomicBool::new(false),
            volumes_refreshed: Mutex::new(HashMap::new()),
            stop,
            pods: std::sync::OnceLock::new(),
            static_pods: static_pods::StaticPods::default(),
            evictions: Mutex::new(HashMap::new()),
        })
    }

    /// The pods admitted and not stopped: what the eviction manager may evict
    /// (`GetActivePods`).
    pub fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.admitted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The latest version of an admitted pod: the API's (or the static pod's), else what
    /// was admitted.
    pub fn current_pod(&self, pod: &Arc<Pod>) -> Arc<Pod> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.pods()
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .unwrap_or_else(|| pod.clone())
    }

    /// Has the pod's worker stop `pod` with `grace` and write it `Failed` / `Evicted` with
    /// `message` (upstream's `killPodNow`); returns once that is done or after upstream's
    /// timeout (one and a half times the grace period, at least 10 s): whether it was done.
    pub async fn evict_pod(&self, pod: &Pod, grace: Duration, message: String) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let (done, finished) = tokio::sync::oneshot::channel();
        self.evictions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                uid.clone(),
                Eviction {
                    grace,
                    message,
                    done,
                },
            );
        self.workers.wake(&uid);
        let timeout = (grace + grace / 2).max(EVICTION_KILL_TIMEOUT_MIN);
        matches!(tokio::time::timeout(timeout, finished).await, Ok(Ok(())))
    }

    /// The eviction asked for the pod `uid`, if any (taken by its worker).
    pub fn take_eviction(&self, uid: &str) -> Option<Eviction> {
        self.evictions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid)
    }

    /// Records an event on `object` under the kubelet's name.
    pub fn event(
        &self,
        object: &k8s_openapi::api::core::v1::ObjectReference,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        self.events.event(object, type_, reason, message);
    }

    /// Its configuration.
    pub fn config(&self) -> &KubeletConfig {
        &self.config
    }

    /// The pods this node runs: the API's bound to it (empty until the pod source runs),
    /// mirror pods left out, and the static pods.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        let mut pods: Vec<Arc<Pod>> = self
            .pods
            .get()
            .map(|s| s.list())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !static_pods::is_mirror(p))
            .collect();
        pods.extend(self.static_pods.pods());
        pods
    }

    /// The pods that may hold CPUs and memory (the resource managers' `GetActivePods`):
    /// those admitted and not stopped, and those of the sources not in a final phase
    /// (admitted soon, or running from before a restart), so the resource managers keep
    /// what they hold. The eviction manager takes [`Kubelet::active_pods`], the admitted
    /// ones only: a pod not admitted yet is not running to be evicted.
    pub fn pods_holding_resources(&self) -> Vec<Arc<Pod>> {
        let mut pods: HashMap<String, Arc<Pod>> = self
            .admitted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for p in self.pods() {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or_default();
            if let Some(uid) = p.metadata.uid.clone()
                && !status::is_terminal_phase(phase)
            {
                pods.entry(uid).or_insert(p);
            }
        }
        pods.into_values().collect()
    }

    /// The runtime.
    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    /// The pod workers (for tests and metrics).
    pub fn workers(&self) -> &PodWorkers {
        &self.workers
    }

    /// Runs the kubelet until its stop token is cancelled: the pod source, the PLEG and
    /// housekeeping. Returns when they have stopped (containers keep running, as when the
    /// upstream kubelet stops).
    pub async fn run(self: Arc<Self>) {
        let stop = self.stop.clone();
        let informer =
            SharedInformer::new(NodePods::new(&self.client, &self.config.node_name), None);
        informer.add_handler(Source {
            kubelet: self.clone(),
            rt: tokio::runtime::Handle::current(),
        });
        informer.run(stop.clone());
        let _ = self.pods.set(informer.store());
        match self.config.pod_manifest_path.clone() {
            // Static pods do not wait for the API (they may be what serves it).
            Some(dir) => {
                tokio::spawn(self.clone().run_static_source(
                    dir,
                    self.config.file_check_frequency,
                    stop.clone(),
                ));
            }
            None => self.static_pods.mark_synced(),
        }
        let start_pleg = || {
            let workers = self.workers.clone();
            tokio::spawn(pleg::run(
                self.cri.clone(),
                move |uid| workers.wake(uid),
                stop.clone(),
            ))
        };
        // Log rotation needs no API: it runs from the start, so the logs of pods running from
        // the checkpoint stay bounded while the API is away.
        tokio::spawn(log_rotation::run(
            self.cri.clone(),
            self.config.log_policy,
            stop.clone(),
        ));
        let mut pleg = None;
        let mut restored = Vec::new();
        let first = tokio::time::timeout(API_SOURCE_WAIT, informer.wait_for_sync(&stop)).await;
        match first {
            Ok(false) => return,
            Ok(true) => {}
            Err(_) => {
                restored = self.run_checkpointed_pods();
                if !restored.is_empty() {
                    pleg = Some(start_pleg());
                }
                if !informer.wait_for_sync(&stop).await {
                    return;
                }
            }
        }
        info!(node = %self.config.node_name, "kubelet: pod source synced");
        self.api_synced
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // The API's view replaces the checkpoint's: a pod it no longer has is stopped.
        let store = informer.store();
        let listed: std::collections::HashSet<String> = store
            .list()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        for pod in restored {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            if listed.contains(&uid) {
                continue;
            }
            info!(pod = %pod_workers::pod_name(&pod), "a checkpointed pod is gone from the API: stopping it");
            if let Some(c) = &self.pod_checkpoints {
                let _ = c.remove(&uid);
            }
            self.workers.update(
                &self,
                PodUpdate::Removed(pod),
                &tokio::runtime::Handle::current(),
            );
        }
        let pleg = match pleg {
            Some(p) => p,
            None => start_pleg(),
        };
        if let Some(m) = self.config.resource_managers.clone() {
            let kubelet = self.clone();
            tokio::spawn(m.run_reconcile(
                self.cri.clone(),
                move || kubelet.pods_holding_resources(),
                stop.clone(),
            ));
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep(HOUSEKEEPING_PERIOD) => {}
                () = stop.cancelled() => break,
            }
            self.housekeeping(&store).await;
        }
        let _ = pleg.await;
        self.events.flush().await;
    }

    /// Runs the pods of the checkpoint as the API's would be (the API did not answer in
    /// time); they were admitted when they first came, so they are not checked again (the
    /// Node cannot be read without the API). Returns them.
    fn run_checkpointed_pods(self: &Arc<Self>) -> Vec<Arc<Pod>> {
        let Some(c) = &self.pod_checkpoints else {
            return Vec::new();
        };
        let pods = c.load();
        warn!(
            node = %self.config.node_name,
            pods = pods.len(),
            wait = ?API_SOURCE_WAIT,
            "the API did not list this node's pods in time: running the checkpointed pods"
        );
        let rt = tokio::runtime::Handle::current();
        pods.into_iter()
            .filter(|pod| {
                // Only a pod no worker runs yet: the API's list may have come since the wait
                // ended, and its pod, newer, stays the one the worker syncs.
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let admit = || {
                    self.admitted
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(uid, pod.clone());
                };
                self.workers.start_if_absent(self, pod.clone(), &rt, admit)
            })
            .collect()
    }

    /// Removes runtime pods that no API pod and no worker owns; brings the QoS cgroups to
    /// the pods admitted now and retries `kubepods`' limits if they could not be set yet.
    async fn housekeeping(&self, store: &skerry_client::cache::Indexer<Pod>) {
        self.update_qos_cgroups();
        if let Err(e) = self.config.cgroups.enforce_allocatable() {
            warn!(error = %e, "enforcing node allocatable on the pods' cgroup failed; retrying");
        }
        let api_pods = store.list();
        self.delete_orphaned_mirrors(&api_pods).await;
        let known: std::collections::HashSet<String> = api_pods
            .iter()
            .filter(|p| !static_pods::is_mirror(p))
            .chain(self.static_pods.pods().iter())
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let sandboxes = match self.cri.list_pod_sandbox(None).await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "housekeeping: listing sandboxes failed");
                return;
            }
        };
        let mut sandbox_uids = std::collections::HashSet::new();
        for s in sandboxes {
            let Some(uid) = s.labels.get(runtime::LABEL_POD_UID) else {
                continue;
            };
            if known.contains(uid) || self.workers.has(uid) {
                sandbox_uids.insert(uid.clone());
                continue;
            }
            info!(%uid, sandbox = %s.id, "removing a sandbox no pod owns");
            let _ = self.cri.stop_pod_sandbox(&s.id).await;
            if let Err(e) = self.cri.remove_pod_sandbox(&s.id).await {
                warn!(%uid, error = %e, "removing an orphaned sandbox failed");
            }
            sandbox_uids.insert(uid.clone());
        }
        // Pod cgroups no pod owns (`cleanupOrphanedPodCgroups`), once no sandbox of theirs
        // is left to run in them.
        for (qos, uid) in self.config.cgroups.pod_cgroups() {
            if known.contains(&uid) || self.workers.has(&uid) || sandbox_uids.contains(&uid) {
                continue;
            }
            info!(%uid, "removing a pod cgroup no pod owns");
            if let Err(e) = self.config.cgroups.destroy_pod(&qos, &uid).await {
                warn!(%uid, error = %e, "removing an orphaned pod cgroup failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("a pod")
    }

    #[test]
    fn only_what_the_sync_reads_wakes_a_worker() {
        let base = serde_json::json!({
            "metadata": {"name": "p", "uid": "u", "resourceVersion": "1", "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending"}
        });
        let old = pod(base.clone());
        let mut status = base.clone();
        status["status"] = serde_json::json!({"phase": "Pending", "containerStatuses": [
            {"name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ErrImagePull"}}}]});
        status["metadata"]["resourceVersion"] = "2".into();
        assert!(
            !differs_for_sync(&old, &pod(status)),
            "a status write is a reconcile"
        );
        let mut deleted = base.clone();
        deleted["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z".into();
        assert!(differs_for_sync(&old, &pod(deleted)));
        let mut relabelled = base.clone();
        relabelled["metadata"]["labels"]["a"] = "c".into();
        assert!(differs_for_sync(&old, &pod(relabelled)));
        let mut gated = base.clone();
        gated["spec"]["readinessGates"] = serde_json::json!([{"conditionType": "x/ready"}]);
        let gated_old = pod(gated.clone());
        gated["status"]["conditions"] = serde_json::json!([{"type": "x/ready", "status": "True"}]);
        assert!(
            differs_for_sync(&gated_old, &pod(gated)),
            "a readiness gate's condition is the sync's input"
        );
    }
}
