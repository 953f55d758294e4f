//! The kubelet's eviction manager (upstream `pkg/kubelet/eviction/eviction_manager.go`):
//! when memory, disk or process ids run short, the node evicts pods before the kernel's OOM
//! killer or a full disk picks for it.
//!
//! Each [`EvictionManager::synchronize`]:
//! 1. reads the Summary (`crate::stats::StatsProvider`) and observes the signals
//!    ([`signals`]);
//! 2. finds the thresholds met, keeping those met before until their minimum reclaim is
//!    also free, and lets soft thresholds act only after their grace period ([`thresholds`]);
//! 3. publishes the node conditions (MemoryPressure, DiskPressure, PIDPressure), each held
//!    for `--eviction-pressure-transition-period` after its last sighting: the node status
//!    loop writes them (`crate::nodestatus`), the node lifecycle controller taints the node
//!    from them (`node.kubernetes.io/memory-pressure:NoSchedule`..., upstream's
//!    TaintNodesByCondition), and [`admit`] refuses new pods with them;
//! 4. for disk, first removes dead containers and unused images (CRI `RemoveContainer`,
//!    `RemoveImage`) and measures again: no pod is evicted when that was enough. An image
//!    first seen less than `--minimum-image-ttl-duration` ago is kept
//!    (`crate::images::gc`: the records are brought up to date at the first pass, every
//!    five minutes and at each collection);
//! 5. ranks the active pods ([`rank`]) and evicts the first one that is not critical, at most
//!    one per pass: its worker stops it (1 s for a hard threshold, else
//!    `--eviction-max-pod-grace-period`) and writes it `Failed`, reason `Evicted`, with the
//!    message and the `DisruptionTarget` condition; a `Warning` `Evicted` event and
//!    `kubelet_evictions{eviction_signal}` record it. After an eviction the next pass
//!    runs at once (upstream waits for the pod's cleanup, then synchronizes again).
//!
//! The loop wakes on [`MONITORING_INTERVAL`] and on any notification given to
//! [`EvictionManager::run`]: the memory threshold notifier (`notifier`, the memcg eventfd on
//! cgroup v1 and a PSI trigger on `memory.pressure` on v2) plugs in there by
//! notifying that `Notify` when the kernel reports a crossing, so memory pressure is acted
//! on when it happens, not up to 10 s later.

pub mod notifier;
pub mod rank;
pub mod signals;
pub mod thresholds;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Taint};
use skerry_api::pod::taints::{
    TAINT_EFFECT_NO_SCHEDULE, TAINT_NODE_MEMORY_PRESSURE, tolerations_of,
    tolerations_tolerate_taint,
};
use skerry_client::events::object_reference;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cri::{Cri, api};
use crate::images::gc::ImageRecords;
use crate::kubelet::Kubelet;
use crate::kubelet::admission::Rejection;
use crate::machine::Pressure;
use crate::nodestatus::setters::conditions;
use crate::stats::StatsProvider;
use thresholds::{
    EvictionConfig, FirstObserved, LastObserved, Threshold, merge_thresholds, node_conditions,
    node_conditions_last_observed_at, node_conditions_observed_since, sort_by_eviction_priority,
    thresholds_first_observed_at, thresholds_met, thresholds_met_grace_period,
};

/// How often the manager synchronizes without a notification (the kubelet's
/// `evictionMonitoringPeriod`, 10 s, which is also cAdvisor's housekeeping interval the
/// stats follow). Shorter reads the Summary (CRI lists, statvfs, `du` of logs) more often on
/// a quiet node; the memory notifier is what makes reactions fast, not this.
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);

/// The grace period of a pod evicted for a hard threshold
/// (`immediateEvictionGracePeriodSeconds`, 1 s): the node is already short.
pub const IMMEDIATE_EVICTION_GRACE_PERIOD: Duration = Duration::from_secs(1);

/// `SystemCriticalPriority` (`scheduling.SystemCriticalPriority`, 2,000,000,000): pods at or
/// above it (`system-cluster-critical`, `system-node-critical`) are never evicted.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The event reason on the Node when a threshold acts (`EvictionThresholdMet`).
pub const EVENT_THRESHOLD_MET: &str = "EvictionThresholdMet";

/// `IsCriticalPod`: a static or mirror pod, or one of system-critical priority.
pub fn is_critical(pod: &Pod) -> bool {
    crate::kubelet::static_pods::is_static(pod)
        || crate::kubelet::static_pods::is_mirror(pod)
        || rank::priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

/// The conditions of `pressure`, in the order MemoryPressure, DiskPressure, PIDPressure.
pub fn pressure_conditions(pressure: &Pressure) -> Vec<&'static str> {
    [
        (pressure.memory, conditions::MEMORY_PRESSURE),
        (pressure.disk, conditions::DISK_PRESSURE),
        (pressure.pid, conditions::PID_PRESSURE),
    ]
    .into_iter()
    .filter_map(|(on, c)| on.then_some(c))
    .collect()
}

/// The eviction manager's `Admit`: under no pressure every pod; critical pods always; under
/// memory pressure alone, pods that are not BestEffort, and BestEffort pods tolerating the
/// memory-pressure taint; under any other pressure nothing. Refused: reason `Evicted`,
/// message `The node had condition: [MemoryPressure]. `.
pub fn admit(pod: &Pod, pressure: &Pressure) -> Result<(), Rejection> {
    let conditions = pressure_conditions(pressure);
    if conditions.is_empty() || is_critical(pod) {
        return Ok(());
    }
    if conditions == [conditions::MEMORY_PRESSURE] {
        if crate::kubelet::sandbox::qos_class(pod) != "BestEffort" {
            return Ok(());
        }
        let taint = Taint {
            key: TAINT_NODE_MEMORY_PRESSURE.to_string(),
            effect: TAINT_EFFECT_NO_SCHEDULE.to_string(),
            ..Taint::default()
        };
        if tolerations_tolerate_taint(tolerations_of(pod), &taint) {
            return Ok(());
        }
    }
    Err(Rejection {
        reason: rank::REASON_EVICTED.to_string(),
        message: rank::condition_message(&conditions),
    })
}

/// What a pass remembers for the next.
#[derive(Default)]
struct State {
    /// The thresholds that acted last pass (kept until their minimum reclaim is free).
    met: Vec<Threshold>,
    first_observed: FirstObserved,
    last_observed: LastObserved,
}

/// What a pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No threshold acts.
    Nothing,
    /// Dead containers and unused images freed enough.
    Reclaimed,
    /// This pod (`namespace/name`) was evicted for this signal.
    Evicted(String, String),
    /// A threshold acts but no pod could be evicted.
    NoneEvictable,
}

/// The eviction manager. Build with [`EvictionManager::new`], run with
/// [`EvictionManager::run`].
pub struct EvictionManager {
    config: EvictionConfig,
    kubelet: Arc<Kubelet>,
    cri: Cri,
    stats: StatsProvider,
    node_ref: ObjectReference,
    conditions: watch::Sender<Pressure>,
    /// Images never removed (the sandbox image, which runs no container of its own).
    pinned_images: Vec<String>,
    /// Image GC's records: when each image was first seen and last used.
    images: Mutex<ImageRecords>,
    state: Mutex<State>,
}

impl EvictionManager {
    /// A manager for `kubelet`'s pods; it publishes the node conditions on `conditions`
    /// (whose receivers are the node status loop and the kubelet's admission), and removes
    /// no image younger than `image_min_age` (`--minimum-image-ttl-duration`).
    pub fn new(
        config: EvictionConfig,
        kubelet: Arc<Kubelet>,
        conditions: watch::Sender<Pressure>,
        pinned_images: Vec<String>,
        image_min_age: Duration,
    ) -> EvictionManager {
        let c = kubelet.config();
        let stats = StatsProvider::new(
            &c.node_name,
            c.root_dir.clone(),
            c.root_dir.join(crate::kubelet::POD_LOGS_DIR),
            kubelet.cri().clone(),
            c.cgroups.clone(),
            u64::try_from(c.memory_capacity).unwrap_or(0),
        );
        let node_ref = ObjectReference {
            kind: Some("Node".into()),
            name: Some(c.node_name.clone()),
            uid: Some(c.node_name.clone()),
            ..ObjectReference::default()
        };
        EvictionManager {
            config,
            cri: kubelet.cri().clone(),
            kubelet,
            stats,
            node_ref,
            conditions,
            pinned_images,
            images: Mutex::new(ImageRecords::new(image_min_age)),
            state: Mutex::new(State::default()),
        }
    }

    /// Synchronizes every [`MONITORING_INTERVAL`], when `notify` is notified, and at once
    /// after an eviction, until `stop`.
    pub async fn run(self: Arc<Self>, notify: Arc<Notify>, stop: CancellationToken) {
        loop {
            let outcome = self.synchronize().await;
            if matches!(outcome, Outcome::Evicted(..)) {
                debug!(reason = "evicted", "eviction manager: woke");
                continue;
            }
            // The wake-ups are logged at debug, so that a benchmark counts them
            // (`skerry-evictionbench`, `--log-level info,skerry_node::eviction=debug`).
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(MONITORING_INTERVAL) => {
                    debug!(reason = "interval", "eviction manager: woke");
                }
                () = notify.notified() => {
                    debug!(reason = "notified", "eviction manager: woke");
                }
            }
        }
    }

    /// One pass (`synchronize`).
    pub async fn synchronize(&self) -> Outcome {
        let started = Instant::now();
        let due = self
            .images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .detection_due(started);
        if due {
            self.detect_images(started).await;
        }
        let pods = self.kubelet.active_pods();
        let summary = match self.stats.summary(false, &pods).await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "eviction manager: failed to get summary stats");
                return Outcome::Nothing;
            }
        };
        let observations = signals::observations(&summary);
        let now = Instant::now();
        let acting = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let mut met = thresholds_met(&self.config.thresholds, &observations, false);
            if !state.met.is_empty() {
                let unresolved = thresholds_met(&state.met, &observations, true);
                met = merge_thresholds(met, unresolved);
            }
            let first = thresholds_first_observed_at(&met, &state.first_observed, now);
            let last =
                node_conditions_last_observed_at(&node_conditions(&met), &state.last_observed, now);
            let conditions =
                node_conditions_observed_since(&last, self.config.pressure_transition_period, now);
            let acting = thresholds_met_grace_period(&first, now);
            state.met = acting.clone();
            state.first_observed = first;
            state.last_observed = last;
            let pressure = Pressure {
                memory: conditions.contains(&conditions::MEMORY_PRESSURE),
                disk: conditions.contains(&conditions::DISK_PRESSURE),
                pid: conditions.contains(&conditions::PID_PRESSURE),
            };
            self.conditions.send_if_modified(|p| {
                let changed = *p != pressure;
                if changed {
                    info!(%pressure, "eviction manager: node conditions changed");
                }
                *p = pressure;
                changed
            });
            acting
        };
        if acting.is_empty() {
            return Outcome::Nothing;
        }
        let mut sorted = acting.clone();
        sort_by_eviction_priority(&mut sorted);
        let Some((threshold, resource)) = sorted
            .iter()
            .find_map(|t| Some((t.clone(), rank::signal_resource(&t.signal)?)))
        else {
            return Outcome::Nothing;
        };
        info!(signal = %threshold.signal, resource, "eviction manager: attempting to reclaim");
        self.kubelet.event(
            &self.node_ref,
            crate::env::EVENT_WARNING,
            EVENT_THRESHOLD_MET,
            &format!("Attempting to reclaim {resource}"),
        );
        if resource != rank::RESOURCE_MEMORY
            && resource != rank::RESOURCE_PIDS
            && self.reclaim_node_level(&pods).await
        {
            info!(
                resource,
                "eviction manager: able to reduce resource pressure without evicting pods"
            );
            return Outcome::Reclaimed;
        }
        let stats_by_uid: rank::StatsByUid<'_> = summary
            .pods
            .iter()
            .map(|s| (s.pod_ref.uid.as_str(), s))
            .collect();
        let mut ranked: Vec<Pod> = pods
            .iter()
            .map(|p| self.kubelet.current_pod(p).as_ref().clone())
            .collect();
        rank::rank(&mut ranked, &stats_by_uid, resource);
        for pod in &ranked {
            if is_critical(pod) {
                warn!(pod = %pod_name(pod), "eviction manager: cannot evict a critical pod");
                continue;
            }
            let grace = if threshold.is_hard() {
                IMMEDIATE_EVICTION_GRACE_PERIOD
            } else {
                let spec = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)));
                spec.map_or(self.config.max_pod_grace_period, |s| {
                    s.min(self.config.max_pod_grace_period)
                })
            };
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let message = rank::eviction_message(
                resource,
                pod,
                stats_by_uid.get(uid).copied(),
                &acting,
                &observations,
            );
            info!(pod = %pod_name(pod), signal = %threshold.signal, reaction_ms = started.elapsed().as_millis() as u64, %message, "eviction manager: evicting pod");
            self.kubelet.event(
                &object_reference(pod),
                crate::env::EVENT_WARNING,
                rank::REASON_EVICTED,
                &message,
            );
            if !self.kubelet.evict_pod(pod, grace, message).await {
                warn!(pod = %pod_name(pod), "eviction manager: the pod was not stopped in time");
            }
            crate::metrics::metrics().evicted(&threshold.signal);
            return Outcome::Evicted(pod_name(pod), threshold.signal.clone());
        }
        Outcome::NoneEvictable
    }

    /// `reclaimNodeLevelResources` for disk: dead containers, then unused images, then a new
    /// measurement; whether no threshold is met any more (minimum reclaims included).
    async fn reclaim_node_level(&self, pods: &[Arc<Pod>]) -> bool {
        let active: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        self.delete_unused_containers(&active).await;
        self.delete_unused_images().await;
        match self.stats.summary(false, pods).await {
            Ok(summary) => {
                let observations = signals::observations(&summary);
                thresholds_met(&self.config.thresholds, &observations, true).is_empty()
            }
            Err(e) => {
                warn!(error = %e, "eviction manager: failed to get summary stats after reclaim");
                false
            }
        }
    }

    /// Container GC's `DeleteAllUnusedContainers`: every exited container of a pod that no
    /// longer runs, and the exited instances beyond the newest of each container of the
    /// others (kept for `kubectl logs --previous`).
    async fn delete_unused_containers(&self, active: &HashSet<String>) {
        let Ok(containers) = self.cri.list_containers(None).await else {
            return;
        };
        let mut exited: Vec<&api::Container> = containers
            .iter()
            .filter(|c| c.state == api::ContainerState::ContainerExited as i32)
            .collect();
        exited.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        let mut kept: HashSet<(String, String)> = HashSet::new();
        for c in exited {
            let uid = c
                .labels
                .get(crate::kubelet::runtime::LABEL_POD_UID)
                .cloned()
                .unwrap_or_default();
            let name = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            if active.contains(&uid) && kept.insert((uid, name)) {
                continue;
            }
            match self.cri.remove_container(&c.id).await {
                Ok(()) => info!(container = %c.id, "eviction manager: removed a dead container"),
                Err(e) => warn!(container = %c.id, error = %e, "removing a dead container failed"),
            }
        }
    }

    /// Image GC's `detectImages` at `now`: the runtime's images and the IDs of those its
    /// containers (running or not) use, recorded. `None` when the runtime did not answer.
    async fn detect_images(&self, now: Instant) -> Option<()> {
        let (Ok(images), Ok(containers)) = (
            self.cri.list_images(None).await,
            self.cri.list_containers(None).await,
        ) else {
            warn!("eviction manager: listing images and containers to detect images failed");
            return None;
        };
        let used: HashSet<&str> = containers
            .iter()
            .flat_map(|c| {
                [
                    c.image_ref.as_str(),
                    c.image.as_ref().map_or("", |i| i.image.as_str()),
                ]
            })
            .collect();
        let in_use: HashSet<String> = images
            .iter()
            .filter(|i| {
                used.contains(i.id.as_str())
                    || i.repo_tags.iter().any(|t| used.contains(t.as_str()))
            })
            .map(|i| i.id.clone())
            .collect();
        self.images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .detect(&images, &in_use, &self.pinned_images, now);
        Some(())
    }

    /// Image GC's `DeleteUnusedImages` (`freeSpace` with no bound): every image no container
    /// (running or not) uses, not pinned by the runtime, not the sandbox image, and first
    /// seen at least the minimum age ago.
    async fn delete_unused_images(&self) {
        let free_time = Instant::now();
        if self.detect_images(free_time).await.is_none() {
            return;
        }
        let removable = self
            .images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .removable(free_time);
        for (id, size) in removable {
            match self.cri.remove_image(&id).await {
                Ok(()) => {
                    info!(image = %id, size, "eviction manager: removed an unused image");
                    self.images
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .removed(&id);
                }
                Err(e) => warn!(image = %id, error = %e, "removing an unused image failed"),
            }
        }
    }
}

/// The memory thresholds the kernel is asked to watch (upstream `startMemoryThresholdNotifier`:
/// one notifier per `memory.available` threshold on the root memcg, one per
/// `allocatableMemory.available` threshold on the pods' cgroup `pods_cgroup`). Upstream keeps
/// this behind `--experimental-kernel-memcg-notification`, off by default; skerry always
/// watches, since an edge box that polls reacts up to [`MONITORING_INTERVAL`] late and the
/// kernel's notification costs nothing while memory is quiet.
pub fn memory_watches(config: &EvictionConfig, pods_cgroup: &str) -> Vec<notifier::Watch> {
    use crate::machine::{NANO, ThresholdValue, signals as names};
    config
        .thresholds
        .iter()
        .filter_map(|t| {
            let allocatable = match t.signal.as_str() {
                names::MEMORY_AVAILABLE => false,
                names::ALLOCATABLE_MEMORY_AVAILABLE => true,
                _ => return None,
            };
            let threshold = match t.value {
                ThresholdValue::Quantity(q) => notifier::ThresholdValue::Quantity(
                    u64::try_from(q.0.div_euclid(NANO)).unwrap_or(0),
                ),
                ThresholdValue::PercentageMillionths(ppm) => {
                    notifier::ThresholdValue::Percentage(f64::from(ppm) / 1e6)
                }
            };
            Some(notifier::Watch {
                cgroup: if allocatable {
                    pods_cgroup.to_string()
                } else {
                    String::new()
                },
                allocatable,
                hard: t.is_hard(),
                threshold,
            })
        })
        .collect()
}

fn pod_name(pod: &Pod) -> String {
    crate::kubelet::pod_workers::pod_name(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_thresholds_are_watched_on_the_root_and_the_pods_cgroup() {
        let config = EvictionConfig {
            thresholds: thresholds::parse_threshold_config(
                true,
                "memory.available<100Mi,nodefs.available<10%",
                "memory.available<10%",
                "memory.available=1m",
                "",
            )
            .expect("flags"),
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period: Duration::ZERO,
        };
        let watches = memory_watches(&config, "/kubepods");
        let memory: Vec<_> = watches
            .iter()
            .map(|w| (w.cgroup.as_str(), w.allocatable, w.hard, w.threshold))
            .collect();
        assert!(memory.contains(&(
            "",
            false,
            true,
            notifier::ThresholdValue::Quantity(100 << 20)
        )));
        assert!(memory.contains(&("", false, false, notifier::ThresholdValue::Percentage(0.1))));
        assert!(
            watches
                .iter()
                .all(|w| !w.allocatable || w.cgroup == "/kubepods"),
            "{watches:?}"
        );
        // Hard and soft memory.available, and the hard one copied to allocatable; no
        // nodefs.
        assert_eq!(watches.len(), 3, "{watches:?}");
        assert!(
            watches.iter().any(|w| w.allocatable && w.hard),
            "{watches:?}"
        );
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
    }

    /// `TestAdmitUnderNodeConditions` and its memory-pressure toleration case.
    #[test]
    fn admission_under_pressure_as_upstream() {
        let best_effort = pod(serde_json::json!({
            "metadata": {"name": "be", "uid": "1"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }));
        let burstable = pod(serde_json::json!({
            "metadata": {"name": "bu", "uid": "2"},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"memory": "10Mi"}}}]}
        }));
        let tolerating = pod(serde_json::json!({
            "metadata": {"name": "t", "uid": "3"},
            "spec": {"containers": [{"name": "c", "image": "i"}],
                "tolerations": [{"key": "node.kubernetes.io/memory-pressure",
                    "operator": "Exists", "effect": "NoSchedule"}]}
        }));
        let critical = pod(serde_json::json!({
            "metadata": {"name": "k", "uid": "4"},
            "spec": {"priority": 2_000_001_000, "containers": [{"name": "c", "image": "i"}]}
        }));
        let none = Pressure::default();
        let memory = Pressure {
            memory: true,
            ..Pressure::default()
        };
        let disk = Pressure {
            disk: true,
            ..Pressure::default()
        };
        let both = Pressure {
            memory: true,
            disk: true,
            pid: false,
        };
        assert!(admit(&best_effort, &none).is_ok());
        let r = admit(&best_effort, &memory).expect_err("BestEffort under memory pressure");
        assert_eq!(r.reason, "Evicted");
        assert_eq!(r.message, "The node had condition: [MemoryPressure]. ");
        assert!(admit(&burstable, &memory).is_ok());
        assert!(admit(&tolerating, &memory).is_ok());
        assert!(admit(&critical, &both).is_ok());
        assert_eq!(
            admit(&burstable, &disk).expect_err("disk pressure").message,
            "The node had condition: [DiskPressure]. "
        );
        assert_eq!(
            admit(&tolerating, &both)
                .expect_err("two conditions")
                .message,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
    }

    #[test]
    fn evicted_status_is_failed_with_the_disruption_target() {
        let mut status = k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        crate::kubelet::pod_workers::evicted_status(
            &mut status,
            "The node was low on resource: memory. ",
        );
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        let c = &status.conditions.as_ref().expect("conditions")[0];
        assert_eq!(c.type_, "DisruptionTarget");
        assert_eq!(c.status, "True");
        assert_eq!(c.reason.as_deref(), Some("TerminationByKubelet"));
        assert_eq!(
            c.message.as_deref(),
            Some("The node was low on resource: memory. ")
        );
    }
}
