//! One worker per pod UID (upstream `pkg/kubelet/pod_workers.go`): the pod source and the
//! PLEG hand updates and wake-ups to [`PodWorkers`], and each pod's worker task works through
//! them one at a time, on the latest spec only: updates that arrive while it syncs replace
//! each other in a `watch` channel, so a burst of ten updates costs one sync, not ten.
//!
//! A worker moves through upstream's states: **syncing** (the pod runs: [`super::Kubelet::sync_pod`]),
//! **terminating** (deleted, or done: containers stopped with their grace period) and
//! **terminated** (nothing runs; the final status stays; once the API deletion is confirmed
//! the runtime's leftovers and the volumes go and the worker ends).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Kubelet;

/// What a worker is told.
#[derive(Clone, Debug)]
pub enum PodUpdate {
    /// The pod as the API has it now.
    Pod(Arc<Pod>),
    /// The pod is gone from the API (its last state).
    Removed(Arc<Pod>),
}

impl PodUpdate {
    fn pod(&self) -> &Arc<Pod> {
        match self {
            PodUpdate::Pod(p) | PodUpdate::Removed(p) => p,
        }
    }
}

/// Where a worker is in the pod's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// Running the pod.
    Syncing,
    /// Stopped; the pod waits for its deletion from the API.
    Terminated,
}

/// What a sync asks of the worker next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncResult {
    /// Sync again after this long (or sooner, when woken).
    Again(Duration),
    /// The pod is done: stop it and keep its final status.
    Terminal,
}

struct Handle {
    updates: watch::Sender<PodUpdate>,
    wake: Arc<Notify>,
}

/// The workers, by pod UID.
#[derive(Clone, Default)]
pub struct PodWorkers {
    workers: Arc<Mutex<HashMap<String, Handle>>>,
}

/// How long a worker waits between syncs when nothing wakes it (upstream's resync,
/// `--sync-frequency`, is 1 minute; a shorter one here notices a lost sandbox sooner, and a
/// sync of a healthy pod is two CRI lists).
pub const RESYNC: Duration = Duration::from_secs(10);

impl PodWorkers {
    /// No workers.
    pub fn new() -> PodWorkers {
        PodWorkers::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `update` to the pod's worker, starting one if there is none (a removal of a pod
    /// with no worker starts one too, to clean up what the runtime may hold).
    pub fn update(&self, kubelet: &Arc<Kubelet>, update: PodUpdate, rt: &tokio::runtime::Handle) {
        self.update_and_wake(kubelet, update, rt, true);
    }

    /// [`PodWorkers::update`], but a running worker is woken only when `wake`: a change the
    /// pod's sync does not depend on (its status, written by this kubelet) is stored for the
    /// next sync without causing one (upstream's `HandlePodReconcile` versus
    /// `HandlePodUpdates`).
    pub fn update_and_wake(
        &self,
        kubelet: &Arc<Kubelet>,
        update: PodUpdate,
        rt: &tokio::runtime::Handle,
        wake: bool,
    ) {
        let uid = update.pod().metadata.uid.clone().unwrap_or_default();
        if uid.is_empty() {
            return;
        }
        let mut workers = self.lock();
        if let Some(h) = workers.get(&uid) {
            h.updates.send_if_modified(|current| {
                *current = update;
                wake
            });
            return;
        }
        self.spawn(&mut workers, uid, kubelet, update, rt);
    }

    /// Starts the worker of `uid` (the caller holds the lock and saw none).
    fn spawn(
        &self,
        workers: &mut HashMap<String, Handle>,
        uid: String,
        kubelet: &Arc<Kubelet>,
        update: PodUpdate,
        rt: &tokio::runtime::Handle,
    ) {
        let (tx, rx) = watch::channel(update);
        let wake = Arc::new(Notify::new());
        workers.insert(
            uid.clone(),
            Handle {
                updates: tx,
                wake: wake.clone(),
            },
        );
        let this = self.clone();
        let kubelet = kubelet.clone();
        rt.spawn(async move {
            let stop = kubelet.stop.clone();
            work(&kubelet, &uid, rx, wake, stop).await;
            this.lock().remove(&uid);
            debug!(%uid, "pod worker ended");
        });
    }

    /// Starts a worker for `pod` only if none runs for its UID; returns whether it started
    /// one. The pods of the checkpoint go this way: the API's list may have come between the
    /// kubelet's wait and the restore, and its pod (newer) must not be replaced by the
    /// checkpoint's.
    pub fn start_if_absent(
        &self,
        kubelet: &Arc<Kubelet>,
        pod: Arc<Pod>,
        rt: &tokio::runtime::Handle,
        before: impl FnOnce(),
    ) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if uid.is_empty() {
            return false;
        }
        let mut workers = self.lock();
        if workers.contains_key(&uid) {
            return false;
        }
        // Under the lock: an update of the API's for this UID waits until the worker exists,
        // and then replaces the checkpoint's pod.
        before();
        self.spawn(&mut workers, uid, kubelet, PodUpdate::Pod(pod), rt);
        true
    }

    /// Wakes the worker of `uid` (the PLEG saw a change), if there is one.
    pub fn wake(&self, uid: &str) {
        if let Some(h) = self.lock().get(uid) {
            h.wake.notify_one();
        }
    }

    /// Whether a worker runs for `uid`.
    pub fn has(&self, uid: &str) -> bool {
        self.lock().contains_key(uid)
    }

    /// How many workers run.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// A worker's loop.
async fn work(
    kubelet: &Arc<Kubelet>,
    uid: &str,
    mut updates: watch::Receiver<PodUpdate>,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut state = WorkerState::Syncing;
    let mut delete_sent = false;
    let mut admitted = false;
    crate::metrics::metrics().pod_seen(uid);
    // Upstream's `SyncPodType` of the next pass: a new pod's first sync creates, a changed
    // pod's updates, a timer's or a wake-up's syncs.
    let mut kind = "create";
    loop {
        let started = std::time::Instant::now();
        let mut recorded: Option<&str> = None;
        let update = updates.borrow_and_update().clone();
        // A static pod carries its latest status (a manifest has none) and keeps its mirror.
        let update = kubelet.static_pods().with_status(update);
        if let PodUpdate::Pod(pod) = &update
            && super::static_pods::is_static(pod)
        {
            kubelet.sync_mirror(pod).await;
        }
        let mut next = RESYNC;
        let mut eviction = match (&update, state) {
            (PodUpdate::Pod(_), WorkerState::Syncing) => kubelet.take_eviction(uid),
            _ => kubelet.take_eviction(uid).and_then(|e| {
                // Nothing runs any more: the eviction is moot.
                let _ = e.done.send(());
                None
            }),
        };
        match (&update, state) {
            (PodUpdate::Removed(pod), _) => {
                // Gone from the API (deleted by us after termination, or forced): stop what
                // still runs and clean up.
                if state == WorkerState::Syncing {
                    kubelet.kill_pod(pod, Some(kubelet.grace_period(pod))).await;
                }
                kubelet.clean_up(pod).await;
                kubelet.pod_gone(uid);
                crate::metrics::metrics().pod_worker("kill", started.elapsed());
                crate::metrics::metrics().pod_forgotten(uid);
                return;
            }
            (PodUpdate::Pod(pod), WorkerState::Syncing)
                if pod.metadata.deletion_timestamp.is_some() =>
            {
                let grace = kubelet.grace_period(pod);
                kubelet.kill_pod(pod, Some(grace)).await;
                kubelet.write_final_status(pod).await;
                state = WorkerState::Terminated;
                recorded = Some("kill");
                delete_sent = kubelet.delete_from_api(pod).await;
            }
            (PodUpdate::Pod(pod), WorkerState::Syncing) if eviction.is_some() => {
                // Evicted (`killPodNow`): stopped with the eviction's grace period, then
                // Failed / Evicted with the DisruptionTarget condition; the pod stays in the
                // API, terminal, as upstream leaves it.
                if let Some(e) = eviction.take() {
                    kubelet.kill_pod(pod, Some(e.grace)).await;
                    kubelet
                        .write_final_status_with(pod, |s| evicted_status(s, &e.message))
                        .await;
                    kubelet.release_volumes(pod).await;
                    let _ = e.done.send(());
                }
                state = WorkerState::Terminated;
                recorded = Some("kill");
            }
            (PodUpdate::Pod(pod), WorkerState::Syncing)
                if !admitted && kubelet.static_pods().must_wait(pod) =>
            {
                // The previous instance of this static pod still stops.
                next = super::static_pods::START_WAIT;
            }
            (PodUpdate::Pod(pod), WorkerState::Syncing) if !admitted => {
                match kubelet.admit(pod).await {
                    Ok(true) => {
                        admitted = true;
                        next = Duration::ZERO;
                    }
                    Ok(false) => state = WorkerState::Terminated,
                    Err(e) => {
                        warn!(pod = %pod_name(pod), %uid, error = %e, "admission failed; retrying");
                        next = super::SYNC_ERROR_RETRY;
                    }
                }
            }
            (PodUpdate::Pod(pod), WorkerState::Syncing) => {
                recorded = Some(kind);
                let synced = kubelet.sync_pod(pod).await;
                match synced {
                    Ok(SyncResult::Again(after)) => next = after,
                    Ok(SyncResult::Terminal) => {
                        kubelet.kill_pod(pod, Some(kubelet.grace_period(pod))).await;
                        kubelet.write_final_status(pod).await;
                        kubelet.release_volumes(pod).await;
                        state = WorkerState::Terminated;
                    }
                    Err(e) => {
                        warn!(pod = %pod_name(pod), %uid, error = %e, "sync failed; retrying");
                        next = super::SYNC_ERROR_RETRY;
                    }
                }
            }
            (PodUpdate::Pod(pod), WorkerState::Terminated) => {
                if pod.metadata.deletion_timestamp.is_some() && !delete_sent {
                    delete_sent = kubelet.delete_from_api(pod).await;
                }
                next = if delete_sent {
                    RESYNC
                } else {
                    super::SYNC_ERROR_RETRY
                };
            }
        }
        if let Some(op) = recorded {
            crate::metrics::metrics().pod_worker(op, started.elapsed());
            kind = "sync";
        }
        tokio::select! {
            changed = updates.changed() => {
                if changed.is_err() {
                    return;
                }
                if kind != "create" {
                    kind = "update";
                }
            }
            () = wake.notified() => {}
            () = tokio::time::sleep(next) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// The status of an evicted pod (the eviction manager's `PodStatusFunc`): `Failed`, reason
/// `Evicted`, the message, and `DisruptionTarget=True` with reason `TerminationByKubelet`
/// (`podutil.UpdatePodCondition`: its transition time kept when it was already so).
pub fn evicted_status(status: &mut k8s_openapi::api::core::v1::PodStatus, message: &str) {
    status.phase = Some(super::status::PHASE_FAILED.to_string());
    status.reason = Some(crate::eviction::rank::REASON_EVICTED.to_string());
    status.message = Some(message.to_string());
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let condition = k8s_openapi::api::core::v1::PodCondition {
        type_: DISRUPTION_TARGET.to_string(),
        status: "True".to_string(),
        reason: Some(TERMINATION_BY_KUBELET.to_string()),
        message: Some(message.to_string()),
        last_transition_time: Some(now),
        ..Default::default()
    };
    match conditions.iter_mut().find(|c| c.type_ == DISRUPTION_TARGET) {
        Some(c) if c.status == condition.status => {
            c.reason = condition.reason;
            c.message = condition.message;
        }
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
}

/// The pod condition of a pod being disrupted (`v1.DisruptionTarget`).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Its reason when the kubelet terminates the pod (`v1.PodReasonTerminationByKubelet`).
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// `namespace/name` for logs.
pub fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}
