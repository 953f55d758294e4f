//! The ReplicaSet controller (kube-controller-manager's `pkg/controller/replicaset`): keeps
//! `spec.replicas` pods matching each ReplicaSet's selector, owned by it through a controller
//! reference, and reports how many exist, are ready and are available in its status.
//!
//! It carries expectations (`docs/tricks.md` #27). The controller decides from
//! its pod informer cache, which learns of the controller's own creations and deletions only
//! when they come back through the watch. So:
//! - before creating `n` pods it raises `expect_creations(key, n)`, and before deleting pods it
//!   raises `expect_deletions(key, uids)`; the pod event handlers lower them as the ADDED /
//!   DELETED events (or a `deletionTimestamp`) arrive;
//! - `sync` only creates or deletes while the expectations are satisfied; otherwise it only
//!   refreshes status. A second sync that runs before the first one's pods are in the cache
//!   therefore creates nothing, instead of creating the same pods again;
//! - writes that fail (or are never attempted, see [`slow_start_batch`]) lower the
//!   expectations at once, since no event will ever come back for them;
//! - deletions are tracked by pod UID, so a pod seen deleted twice (the update that sets its
//!   `deletionTimestamp`, then the DELETE event) or deleted by someone else counts at most
//!   once.
//!
//! Every pod it creates or deletes is also told to the user as an Event on the ReplicaSet
//! (`SuccessfulCreate` "Created pod: web-x", `FailedCreate` "Error creating: ...",
//! `SuccessfulDelete`, `FailedDelete`), recorded with the controller's own identity under the
//! component [`EVENT_COMPONENT`], so `kubectl describe rs` reads as it does on Kubernetes.
//!
//! Where to start: [`ReplicaSetController::sync_replica_set`], then `manage_replicas`. The
//! pure decisions — which pods to delete ([`get_pods_to_delete`]) and the status
//! ([`calculate_status`]) — take no client.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use skerry_api::selector::LabelSelector;
use skerry_client::cache::Indexer;
use skerry_client::events::object_reference;
use skerry_client::informer::SharedInformer;
use skerry_client::retry::{Backoff, on_error};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, Error, PostParams, key_of};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::Context;
use crate::expectations::{Clock, SystemClock, UidTrackingControllerExpectations};
use crate::podcontrol::{
    EventSink, NoEvents, PodControl, SLOW_START_INITIAL_BATCH_SIZE, adopt_patch,
    create_pod_from_template, event_recorder, is_namespace_terminating, record_pod_create,
    record_pod_delete, release_patch, slow_start_batch,
};
use crate::runtime::{self, Reconciler};
use crate::util::{
    self, Forward, controller_of, is_pod_active, is_pod_ready, ready_condition,
    resolve_controller_ref,
};

/// The most pods one sync creates or deletes. A ReplicaSet scaled from 0 to 10,000 gets there
/// in 20 syncs of 500, each waiting for its expectations, rather than in one burst that
/// floods the apiserver and the watch. Kubernetes' `BurstReplicas` (500), which
/// kube-controller-manager passes as the controller's `burstReplicas`.
pub const BURST_REPLICAS: usize = 500;

/// Workers syncing ReplicaSets at once: kube-controller-manager's
/// `--concurrent-replicaset-syncs` default. More would only queue on the client's QPS limit.
pub const DEFAULT_WORKERS: usize = 5;

/// Extra attempts at a status write that failed, after a fresh GET; past it the key is
/// re-queued with backoff instead (Kubernetes' `statusUpdateRetries`).
pub const STATUS_UPDATE_RETRIES: u32 = 1;

/// The status write's schedule: Kubernetes' `updateReplicaSetStatus` writes again at once,
/// on a fresh GET, whatever the error was, [`STATUS_UPDATE_RETRIES`] times (a failed GET ends
/// it: it is the last run).
const STATUS_UPDATE_BACKOFF: Backoff = Backoff::immediate(STATUS_UPDATE_RETRIES + 1);

/// The annotation with which a user tells the controller which pods to delete first on a
/// scale-down (lower first); an integer in int32 range, anything else counts as 0.
pub const POD_DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The status condition reporting that pods could not be created or deleted.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// The `source.component` of this controller's events, as kube-controller-manager names it
/// (what `kubectl describe` prints in the "From" column).
pub const EVENT_COMPONENT: &str = "replicaset-controller";

/// The kind and apiVersion in a pod's controller reference to its ReplicaSet.
const KIND: &str = "ReplicaSet";
const API_VERSION: &str = "apps/v1";

/// The ReplicaSet reads and writes the controller makes besides pods: a live GET (to recheck
/// that a ReplicaSet is not being deleted before adopting pods for it) and the status write.
/// Object-safe so tests substitute a fake; [`Client`] implements it.
pub trait ReplicaSetClient: Send + Sync + 'static {
    /// GET `namespace/name`.
    fn get_replica_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ReplicaSet, Error>>;
    /// PUT the status subresource (409 on a stale resourceVersion).
    fn replace_replica_set_status<'a>(
        &'a self,
        rs: &'a ReplicaSet,
    ) -> BoxFuture<'a, Result<ReplicaSet, Error>>;
}

impl ReplicaSetClient for Client {
    fn get_replica_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ReplicaSet, Error>> {
        Box::pin(async move { self.api::<ReplicaSet>(Some(namespace)).get(name).await })
    }

    fn replace_replica_set_status<'a>(
        &'a self,
        rs: &'a ReplicaSet,
    ) -> BoxFuture<'a, Result<ReplicaSet, Error>> {
        Box::pin(async move {
            let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
            let name = rs.metadata.name.as_deref().unwrap_or_default();
            self.api::<ReplicaSet>(Some(namespace))
                .replace_status(name, &PostParams::default(), rs)
                .await
        })
    }
}

/// What a [`ReplicaSetController`] is built from, for tests that fill the caches themselves
/// and fake the writes.
pub struct Parts {
    /// The ReplicaSet lister's store.
    pub replica_sets: Indexer<ReplicaSet>,
    /// The pod lister's store.
    pub pods: Indexer<Pod>,
    /// Pod writes.
    pub pod_control: Arc<dyn PodControl>,
    /// ReplicaSet GET and status writes.
    pub replica_set_client: Arc<dyn ReplicaSetClient>,
    /// The expectations' clock.
    pub clock: Arc<dyn Clock>,
    /// Where pod create/delete events go; `None` records nothing.
    pub events: Option<Arc<dyn EventSink>>,
}

/// The ReplicaSet controller. Build it with [`ReplicaSetController::new`], then run it with
/// [`ReplicaSetController::run`] once the informers are started.
pub struct ReplicaSetController {
    replica_sets: Indexer<ReplicaSet>,
    pods: Indexer<Pod>,
    pod_control: Arc<dyn PodControl>,
    replica_set_client: Arc<dyn ReplicaSetClient>,
    events: Arc<dyn EventSink>,
    expectations: UidTrackingControllerExpectations,
    queue: WorkQueue<String>,
    /// The shared informers `run` waits for (none when built from [`Parts`]).
    informers: Option<(SharedInformer<ReplicaSet>, SharedInformer<Pod>)>,
}

impl ReplicaSetController {
    /// A controller over the context's shared ReplicaSet and Pod informers, with its event
    /// handlers registered, writing (pods and events) with `ctx.client`.
    pub fn new(ctx: &Context) -> Arc<ReplicaSetController> {
        let rs_informer = ctx.informers.informer::<ReplicaSet>();
        let pod_informer = ctx.informers.informer::<Pod>();
        let parts = Parts {
            replica_sets: rs_informer.store(),
            pods: pod_informer.store(),
            pod_control: Arc::new(ctx.client.clone()),
            replica_set_client: Arc::new(ctx.client.clone()),
            clock: Arc::new(SystemClock),
            events: event_recorder(&ctx.client, EVENT_COMPONENT)
                .map(|r| Arc::new(r) as Arc<dyn EventSink>),
        };
        let controller = Arc::new(Self::build(
            parts,
            Some((rs_informer.clone(), pod_informer.clone())),
        ));
        rs_informer.add_handler(Forward::new(
            &controller,
            |c, rs| c.add_replica_set(rs),
            |c, old, new| c.update_replica_set(old, new),
            |c, rs| c.delete_replica_set(rs),
        ));
        // A deleted pod's tombstone carries the last state the cache had; its UID is what matters.
        pod_informer.add_handler(Forward::new(
            &controller,
            |c, pod| c.add_pod(pod),
            |c, old, new| c.update_pod(old, new),
            |c, pod| c.delete_pod(pod),
        ));
        controller
    }

    /// A controller over caches and writers the caller provides; no handlers are registered
    /// (the caller calls [`Self::add_pod`] and friends to deliver events).
    pub fn from_parts(parts: Parts) -> Arc<ReplicaSetController> {
        Arc::new(Self::build(parts, None))
    }

    fn build(
        parts: Parts,
        informers: Option<(SharedInformer<ReplicaSet>, SharedInformer<Pod>)>,
    ) -> ReplicaSetController {
        ReplicaSetController {
            replica_sets: parts.replica_sets,
            pods: parts.pods,
            pod_control: parts.pod_control,
            replica_set_client: parts.replica_set_client,
            events: parts.events.unwrap_or_else(|| Arc::new(NoEvents)),
            expectations: UidTrackingControllerExpectations::with_clock(parts.clock),
            queue: WorkQueue::new("replicaset"),
            informers,
        }
    }

    /// The controller's expectations.
    pub fn expectations(&self) -> &UidTrackingControllerExpectations {
        &self.expectations
    }

    /// The controller's work queue of ReplicaSet keys.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits until the events recorded so far are written (tests and graceful shutdown).
    pub async fn flush_events(&self) {
        self.events.flush().await;
    }

    /// Waits for the informers' first lists, then runs `workers` workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        if let Some((rs, pods)) = &self.informers
            && (!rs.wait_for_sync(&stop).await || !pods.wait_for_sync(&stop).await)
        {
            tracing::info!("replicaset controller stopped before its caches synced");
            return;
        }
        tracing::info!(workers, "starting replicaset controller");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }

    // ---- event handlers -------------------------------------------------------------------

    fn enqueue(&self, rs: &ReplicaSet) {
        self.queue.add(key_of(rs));
    }

    /// The ReplicaSets whose selector matches an orphan `pod` (Kubernetes'
    /// `GetPodReplicaSets`; an empty selector adopts nothing here).
    fn pod_replica_sets(&self, pod: &Pod) -> Vec<Arc<ReplicaSet>> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        self.replica_sets
            .list_namespace(namespace)
            .into_iter()
            .filter(|rs| {
                LabelSelector::from_api(
                    &rs.spec
                        .as_ref()
                        .map(|s| s.selector.clone())
                        .unwrap_or_default(),
                )
                .is_ok_and(|s| !s.is_empty() && s.matches_opt(pod.metadata.labels.as_ref()))
            })
            .collect()
    }

    /// A ReplicaSet appeared.
    pub fn add_replica_set(&self, rs: &ReplicaSet) {
        self.enqueue(rs);
    }

    /// A ReplicaSet changed (or a resync). A changed UID is a delete and re-create the watch
    /// folded into one update: the old one's expectations go.
    pub fn update_replica_set(&self, old: &ReplicaSet, cur: &ReplicaSet) {
        if old.metadata.uid != cur.metadata.uid {
            self.delete_replica_set(old);
        }
        self.enqueue(cur);
    }

    /// A ReplicaSet was deleted: its expectations can never be met, so they go.
    pub fn delete_replica_set(&self, rs: &ReplicaSet) {
        let key = key_of(rs);
        self.expectations.delete_expectations(&key);
        self.queue.add(key);
    }

    /// A pod appeared: one of our creations came back (or an orphan to consider adopting).
    pub fn add_pod(&self, pod: &Pod) {
        if pod.metadata.deletion_timestamp.is_some() {
            // After a controller restart a pod can first appear already being deleted: that is
            // a deletion to observe, not a creation.
            self.delete_pod(pod);
            return;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        if let Some(r) = controller_of(&pod.metadata) {
            let Some(rs) = resolve_controller_ref(&self.replica_sets, namespace, r) else {
                return;
            };
            let key = key_of(rs.as_ref());
            self.expectations.creation_observed(&key);
            self.queue.add(key);
            return;
        }
        // An orphan: wake every ReplicaSet that might adopt it. Expectations are not touched;
        // only a controlled pod can be one of our creations.
        for rs in self.pod_replica_sets(pod) {
            self.enqueue(&rs);
        }
    }

    /// A pod changed.
    pub fn update_pod(&self, old: &Pod, cur: &Pod) {
        if old.metadata.resource_version == cur.metadata.resource_version {
            // A resync: two versions of one pod always have different resource versions.
            return;
        }
        let labels_changed = old.metadata.labels != cur.metadata.labels;
        if cur.metadata.deletion_timestamp.is_some() {
            // A graceful delete sets deletionTimestamp long before the pod goes; the
            // ReplicaSet should replace it now, so this counts as the deletion. The DELETE
            // event later is the same UID and does not count again.
            self.delete_pod(cur);
            if labels_changed {
                // The old labels may have belonged to another ReplicaSet's selector.
                self.delete_pod(old);
            }
            return;
        }
        let namespace = cur.metadata.namespace.as_deref().unwrap_or_default();
        let cur_ref = controller_of(&cur.metadata);
        let old_ref = controller_of(&old.metadata);
        let ref_changed = cur_ref != old_ref;
        if ref_changed
            && let Some(rs) =
                old_ref.and_then(|r| resolve_controller_ref(&self.replica_sets, namespace, r))
        {
            self.enqueue(&rs);
        }
        if let Some(r) = cur_ref {
            let Some(rs) = resolve_controller_ref(&self.replica_sets, namespace, r) else {
                return;
            };
            self.enqueue(&rs);
            // A pod that just became ready is available minReadySeconds later, and nothing
            // else will wake the ReplicaSet then.
            let min_ready = min_ready_seconds(&rs);
            if !is_pod_ready(old) && is_pod_ready(cur) && min_ready > 0 {
                let delay = Duration::from_secs(u64::from(min_ready.unsigned_abs()) + 1);
                self.queue.add_after(key_of(rs.as_ref()), delay);
            }
            return;
        }
        if labels_changed || ref_changed {
            for rs in self.pod_replica_sets(cur) {
                self.enqueue(&rs);
            }
        }
    }

    /// A pod was deleted (or, from a relist tombstone, was found gone).
    pub fn delete_pod(&self, pod: &Pod) {
        let Some(r) = controller_of(&pod.metadata) else {
            return;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some(rs) = resolve_controller_ref(&self.replica_sets, namespace, r) else {
            return;
        };
        let key = key_of(rs.as_ref());
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.expectations.deletion_observed(&key, uid);
        }
        self.queue.add(key);
    }

    // ---- sync -------------------------------------------------------------------------------

    /// Brings the ReplicaSet at `key` towards `spec.replicas` pods and writes its status.
    pub async fn sync_replica_set(&self, key: &str) -> anyhow::Result<()> {
        let (namespace, name) = util::split_key(key);
        let Some(rs) = self.replica_sets.get_by(namespace, name) else {
            tracing::debug!(replicaset = %key, "replicaset gone");
            self.expectations.delete_expectations(key);
            return Ok(());
        };
        // Read before listing pods: if an event lowers the expectations after this, the pods
        // it reports are in the list below, never the other way round.
        let needs_sync = self.expectations.satisfied(key);
        let spec = rs.spec.clone().unwrap_or_default();
        let selector = match LabelSelector::from_api(&spec.selector) {
            Ok(s) => s,
            Err(e) => {
                // Retrying cannot fix a bad selector; the next update of the ReplicaSet will.
                tracing::warn!(replicaset = %key, error = %e, "invalid selector");
                return Ok(());
            }
        };
        let active: Vec<Arc<Pod>> = self
            .pods
            .list_namespace(namespace)
            .into_iter()
            .filter(|p| is_pod_active(p))
            .collect();
        let pods = self.claim_pods(&rs, &selector, active).await?;

        let mut manage_error = None;
        if needs_sync
            && rs.metadata.deletion_timestamp.is_none()
            && let Err(e) = self.manage_replicas(&pods, &rs, key).await
        {
            manage_error = Some(e);
        }
        let now = util::now();
        let status = calculate_status(
            &rs,
            &pods,
            manage_error.as_ref().map(|e| format!("{e:#}")).as_deref(),
            &now,
        );
        let updated = self.update_status(&rs, status).await?;
        let replicas = spec.replicas.unwrap_or(1);
        let min_ready = spec.min_ready_seconds.unwrap_or(0);
        let ready = updated
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        let available = updated
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        if manage_error.is_none() && min_ready > 0 && ready == replicas && available != replicas {
            // All ready, not all available yet: look again when they will be.
            let delay = Duration::from_secs(u64::from(min_ready.unsigned_abs()));
            self.queue.add_after(key.to_string(), delay);
        }
        match manage_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Adopts orphans that match the selector, releases owned pods that no longer do, and
    /// returns the active pods this ReplicaSet controls (Kubernetes' `ClaimPods`).
    async fn claim_pods(
        &self,
        rs: &ReplicaSet,
        selector: &LabelSelector,
        pods: Vec<Arc<Pod>>,
    ) -> anyhow::Result<Vec<Arc<Pod>>> {
        let rs_uid = rs.metadata.uid.clone().unwrap_or_default();
        let deleting = rs.metadata.deletion_timestamp.is_some();
        let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
        let controller_ref = util::controller_ref(API_VERSION, KIND, &rs.metadata);
        let mut claimed = Vec::with_capacity(pods.len());
        let mut errors = Vec::new();
        // Whether adopting is allowed, checked live once per sync and only if needed.
        let mut can_adopt: Option<Result<(), String>> = None;
        for pod in pods {
            let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
            let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let matches =
                !selector.is_empty() && selector.matches_opt(pod.metadata.labels.as_ref());
            match controller_of(&pod.metadata) {
                Some(r) if r.uid == rs_uid => {
                    if matches {
                        claimed.push(pod);
                        continue;
                    }
                    if deleting {
                        // A ReplicaSet being deleted keeps its pods for the garbage collector.
                        continue;
                    }
                    match self
                        .pod_control
                        .patch_pod(namespace, pod_name, &release_patch(&rs_uid, pod_uid))
                        .await
                    {
                        Ok(_) => {
                            tracing::info!(pod = pod_name, replicaset = ?rs.metadata.name, "released pod")
                        }
                        // Gone, or replaced / no longer ours: nothing to release.
                        Err(e) if e.is_not_found() || e.code() == Some(422) => {}
                        Err(e) => errors.push(format!("release pod {pod_name}: {e}")),
                    }
                }
                Some(_) => {} // Another controller's.
                None => {
                    if deleting || !matches || pod.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let allowed = match &can_adopt {
                        Some(r) => r.clone(),
                        None => {
                            let r = self.recheck_not_deleted(rs).await;
                            can_adopt = Some(r.clone());
                            r
                        }
                    };
                    if let Err(e) = allowed {
                        errors.push(format!("cannot adopt pod {pod_name}: {e}"));
                        continue;
                    }
                    match self
                        .pod_control
                        .patch_pod(namespace, pod_name, &adopt_patch(&controller_ref, pod_uid))
                        .await
                    {
                        Ok(_) => {
                            tracing::info!(pod = pod_name, replicaset = ?rs.metadata.name, "adopted pod");
                            claimed.push(pod);
                        }
                        Err(e) if e.is_not_found() => {}
                        Err(e) => errors.push(format!("adopt pod {pod_name}: {e}")),
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(claimed)
        } else {
            Err(anyhow::anyhow!(errors.join("; ")))
        }
    }

    /// Adoption must not race a deletion of the ReplicaSet the cache has not seen yet: a live
    /// GET (Kubernetes' `RecheckDeletionTimestamp`).
    async fn recheck_not_deleted(&self, rs: &ReplicaSet) -> Result<(), String> {
        let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
        let name = rs.metadata.name.as_deref().unwrap_or_default();
        let fresh = self
            .replica_set_client
            .get_replica_set(namespace, name)
            .await
            .map_err(|e| e.to_string())?;
        if fresh.metadata.uid != rs.metadata.uid {
            return Err(format!(
                "original {namespace}/{name} is gone: got uid {:?}",
                fresh.metadata.uid
            ));
        }
        if fresh.metadata.deletion_timestamp.is_some() {
            return Err(format!("{namespace}/{name} has just been deleted"));
        }
        Ok(())
    }

    /// Creates or deletes pods to move `pods.len()` towards `spec.replicas`, raising the
    /// expectations before each write and lowering them for writes that fail.
    async fn manage_replicas(
        &self,
        pods: &[Arc<Pod>],
        rs: &ReplicaSet,
        key: &str,
    ) -> anyhow::Result<()> {
        let spec = rs.spec.clone().unwrap_or_default();
        let wanted = usize::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0);
        let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
        if pods.len() < wanted {
            let count = (wanted - pods.len()).min(BURST_REPLICAS);
            // Raised BEFORE the first write: an ADDED event can arrive before `create`
            // returns, and must find the expectation to lower.
            self.expectations.expect_creations(key, count);
            let template = spec.template.clone().unwrap_or_default();
            let controller_ref = util::controller_ref(API_VERSION, KIND, &rs.metadata);
            let owner = object_reference(rs);
            tracing::debug!(replicaset = %key, count, "creating pods");
            let outcome = slow_start_batch(count, SLOW_START_INITIAL_BATCH_SIZE, || {
                let template = &template;
                let owner = &owner;
                let controller_ref = controller_ref.clone();
                async move {
                    let created = create_pod_from_template(
                        self.pod_control.as_ref(),
                        namespace,
                        template,
                        &rs.metadata,
                        controller_ref,
                    )
                    .await;
                    record_pod_create(self.events.as_ref(), owner, &created);
                    match created {
                        Ok(_) => Ok(()),
                        // The namespace is going away and the pod with it: not a failure.
                        Err(crate::podcontrol::CreatePodError::Api(e))
                            if is_namespace_terminating(&e) =>
                        {
                            Ok(())
                        }
                        Err(e) => Err(e),
                    }
                }
            })
            .await;
            // Creations that failed or were never attempted will never be observed.
            let skipped = count - outcome.successes;
            if skipped > 0 {
                tracing::debug!(replicaset = %key, skipped, "slow start stopped; lowering expectations");
                self.expectations.lower_expectations(
                    key,
                    i64::try_from(skipped).unwrap_or(i64::MAX),
                    0,
                );
            }
            if let Some(e) = outcome.error {
                return Err(anyhow::Error::new(e).context("create pods"));
            }
        } else if pods.len() > wanted {
            let count = (pods.len() - wanted).min(BURST_REPLICAS);
            let related = self.indirectly_related_pods(rs);
            let victims = get_pods_to_delete(pods.to_vec(), &related, count, &util::now());
            let uids: Vec<String> = victims
                .iter()
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            // Raised BEFORE the deletes, by UID.
            self.expectations.expect_deletions(key, uids);
            tracing::debug!(replicaset = %key, count, "deleting pods");
            let results = futures::future::join_all(victims.iter().map(|pod| async move {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                (pod, self.pod_control.delete_pod(namespace, name).await)
            }))
            .await;
            let owner = object_reference(rs);
            let mut first_error = None;
            for (pod, result) in results {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                record_pod_delete(self.events.as_ref(), &owner, name, &result);
                if let Err(e) = result {
                    // No DELETED event will come for a delete that failed (or for a pod that
                    // was already gone and whose event we have seen or will not see again).
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        self.expectations.deletion_observed(key, uid);
                    }
                    if !e.is_not_found() && first_error.is_none() {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        first_error =
                            Some(anyhow::Error::new(e).context(format!("delete pod {name}")));
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The pods of every ReplicaSet with the same controller (a Deployment's old and new
    /// ReplicaSets), for ranking by how many share a node; none for a ReplicaSet without a
    /// controller, as in Kubernetes' `getIndirectlyRelatedPods`.
    fn indirectly_related_pods(&self, rs: &ReplicaSet) -> Vec<Arc<Pod>> {
        let Some(owner) = controller_of(&rs.metadata) else {
            return Vec::new();
        };
        let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
        let pods = self.pods.list_namespace(namespace);
        let mut seen = HashSet::new();
        let mut related = Vec::new();
        for sibling in self.replica_sets.list_namespace(namespace) {
            if controller_of(&sibling.metadata).is_none_or(|r| r.uid != owner.uid) {
                continue;
            }
            let Ok(selector) = LabelSelector::from_api(
                &sibling
                    .spec
                    .as_ref()
                    .map(|s| s.selector.clone())
                    .unwrap_or_default(),
            ) else {
                continue;
            };
            for pod in &pods {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if selector.matches_opt(pod.metadata.labels.as_ref()) && seen.insert(uid) {
                    related.push(pod.clone());
                }
            }
        }
        related
    }

    /// Writes `status` if it differs from what the ReplicaSet has (or the generation moved),
    /// retrying once on a fresh copy; returns the ReplicaSet as written.
    async fn update_status(
        &self,
        rs: &ReplicaSet,
        mut status: ReplicaSetStatus,
    ) -> anyhow::Result<ReplicaSet> {
        let generation = rs.metadata.generation;
        let current = rs.status.clone().unwrap_or_default();
        if status_counts_equal(&current, &status)
            && generation == current.observed_generation
            && current.conditions == status.conditions
        {
            return Ok(rs.clone());
        }
        status.observed_generation = generation;
        let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
        let name = rs.metadata.name.as_deref().unwrap_or_default();
        let client = &self.replica_set_client;
        let status = &status;
        let mut runs = 0;
        on_error(
            STATUS_UPDATE_BACKOFF,
            // Any error: Kubernetes retries whatever made the write fail.
            |_: &Error| true,
            || {
                runs += 1;
                let fresh = runs > 1;
                async move {
                    let mut target = if fresh {
                        tracing::debug!(replicaset = %key_of(rs), "status update failed; retrying on a fresh copy");
                        client.get_replica_set(namespace, name).await?
                    } else {
                        rs.clone()
                    };
                    target.status = Some(status.clone());
                    client.replace_replica_set_status(&target).await
                }
            },
        )
        .await
        .context("update replicaset status")
    }
}

impl Reconciler for ReplicaSetController {
    fn name(&self) -> &'static str {
        "replicaset"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        let span = tracing::debug_span!("sync", replicaset = %key);
        self.sync_replica_set(key).instrument(span).await
    }
}

fn min_ready_seconds(rs: &ReplicaSet) -> i32 {
    rs.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
}

fn status_counts_equal(a: &ReplicaSetStatus, b: &ReplicaSetStatus) -> bool {
    let n = |x: Option<i32>| x.unwrap_or(0);
    a.replicas == b.replicas
        && n(a.fully_labeled_replicas) == n(b.fully_labeled_replicas)
        && n(a.ready_replicas) == n(b.ready_replicas)
        && n(a.available_replicas) == n(b.available_replicas)
}

/// The status `rs` should have with `pods` (its active, claimed pods): counts, and the
/// ReplicaFailure condition set when `manage_error` is some and cleared when it is none
/// (Kubernetes' `calculateStatus`). `observedGeneration` is left as it is; the writer sets it.
pub fn calculate_status(
    rs: &ReplicaSet,
    pods: &[Arc<Pod>],
    manage_error: Option<&str>,
    now: &Time,
) -> ReplicaSetStatus {
    let spec = rs.spec.clone().unwrap_or_default();
    let template_labels: BTreeMap<String, String> = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let mut fully_labeled = 0;
    let mut ready = 0;
    let mut available = 0;
    for pod in pods {
        let labels = pod.metadata.labels.as_ref();
        if template_labels
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        {
            fully_labeled += 1;
        }
        if is_pod_ready(pod) {
            ready += 1;
            if util::is_pod_available(pod, min_ready, now.clone()) {
                available += 1;
            }
        }
    }
    let mut status = rs.status.clone().unwrap_or_default();
    let has_failure = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == REPLICA_FAILURE);
    match manage_error {
        Some(message) if !has_failure => {
            let wanted = spec.replicas.unwrap_or(1);
            let have = i32::try_from(pods.len()).unwrap_or(i32::MAX);
            let reason = match have.cmp(&wanted) {
                Ordering::Less => Some("FailedCreate".to_string()),
                Ordering::Greater => Some("FailedDelete".to_string()),
                Ordering::Equal => None,
            };
            status
                .conditions
                .get_or_insert_with(Vec::new)
                .push(ReplicaSetCondition {
                    type_: REPLICA_FAILURE.to_string(),
                    status: "True".to_string(),
                    reason,
                    message: Some(message.to_string()),
                    last_transition_time: Some(now.clone()),
                });
        }
        None if has_failure => {
            let kept: Vec<ReplicaSetCondition> = status
                .conditions
                .take()
                .into_iter()
                .flatten()
                .filter(|c| c.type_ != REPLICA_FAILURE)
                .collect();
            status.conditions = (!kept.is_empty()).then_some(kept);
        }
        _ => {}
    }
    status.replicas = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    status.fully_labeled_replicas = Some(fully_labeled);
    status.ready_replicas = Some(ready);
    status.available_replicas = Some(available);
    status
}

// ---- which pods to delete ---------------------------------------------------------------------

/// Picks the `diff` pods of `pods` to delete on a scale-down: all of them if that is all,
/// else the first `diff` by [`compare_for_deletion`], with each pod's rank the number of
/// active `related` pods on its node (Kubernetes' `getPodsToDelete`).
pub fn get_pods_to_delete(
    mut pods: Vec<Arc<Pod>>,
    related: &[Arc<Pod>],
    diff: usize,
    now: &Time,
) -> Vec<Arc<Pod>> {
    if diff < pods.len() {
        let mut on_node: HashMap<&str, usize> = HashMap::new();
        for pod in related.iter().filter(|p| is_pod_active(p)) {
            *on_node.entry(node_name(pod)).or_default() += 1;
        }
        let mut ranked: Vec<(Arc<Pod>, usize)> = pods
            .into_iter()
            .map(|p| {
                let rank = on_node.get(node_name(&p)).copied().unwrap_or(0);
                (p, rank)
            })
            .collect();
        ranked.sort_by(|(a, ra), (b, rb)| compare_for_deletion(a, *ra, b, *rb, now));
        pods = ranked.into_iter().map(|(p, _)| p).collect();
    }
    pods.truncate(diff);
    pods
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

/// Pending < Unknown < Running; anything else sorts with Pending.
fn phase_ordinal(pod: &Pod) -> u8 {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 0,
    }
}

/// The pod's deletion cost; a missing or malformed annotation is 0.
pub fn deletion_cost(pod: &Pod) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_DELETION_COST_ANNOTATION))
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0)
}

/// When the pod became ready, if it is.
fn ready_time(pod: &Pod) -> Option<&Time> {
    if !is_pod_ready(pod) {
        return None;
    }
    ready_condition(pod)?.last_transition_time.as_ref()
}

/// The highest restart count among regular containers, and among sidecars (init containers
/// with `restartPolicy: Always`).
fn max_restarts(pod: &Pod) -> (i32, i32) {
    let Some(status) = pod.status.as_ref() else {
        return (0, 0);
    };
    let regular = status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0);
    let sidecars: HashSet<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let sidecar = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter(|c| sidecars.contains(c.name.as_str()))
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0);
    (regular, sidecar)
}

/// floor(log2(now - t in ns)), or -1 if `t` is not in the past: pods whose ages are within a
/// factor of two of each other are equally old (Kubernetes' `LogarithmicScaleDown`, on by
/// default since 1.22), so a scale-down does not always strike the newest pods and leave the
/// oldest to accumulate on one set of nodes.
fn log_age(t: &Time, now: &Time) -> i64 {
    let d = now.0.as_nanosecond() - t.0.as_nanosecond();
    if d > 0 {
        // `as` on an f64: the value is at most ~log2(i128::MAX) = 127.
        (d as f64).log2().floor() as i64
    } else {
        -1
    }
}

/// Empty < newer < older, by logarithmic age bucket, ties broken by UID (Kubernetes'
/// `afterOrZero` / `logarithmicRankDiff`). Only called when the times differ.
fn compare_times(a: &Pod, ta: Option<&Time>, b: &Pod, tb: Option<&Time>, now: &Time) -> Ordering {
    match (ta, tb) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(ta), Some(tb)) => match log_age(ta, now).cmp(&log_age(tb, now)) {
            Ordering::Equal => a.metadata.uid.cmp(&b.metadata.uid),
            other => other,
        },
    }
}

/// The order in which pods are deleted on a scale-down (`Less`: delete `a` first), rule by
/// rule as Kubernetes' `ActivePodsWithRanks.Less` with pod deletion cost and logarithmic
/// scale-down on:
/// 1. unassigned before assigned;
/// 2. Pending before Unknown before Running;
/// 3. not ready before ready;
/// 4. lower `controller.kubernetes.io/pod-deletion-cost` first;
/// 5. higher rank (more related pods on the same node) first;
/// 6. if both are ready, ready for less time first;
/// 7. more container restarts first (then more sidecar restarts);
/// 8. newer creation first.
pub fn compare_for_deletion(
    a: &Pod,
    rank_a: usize,
    b: &Pod,
    rank_b: usize,
    now: &Time,
) -> Ordering {
    // 1. Unassigned < assigned.
    let (na, nb) = (node_name(a), node_name(b));
    if na != nb && (na.is_empty() || nb.is_empty()) {
        return if na.is_empty() {
            Ordering::Less
        } else {
            Ordering::Greater
        };
    }
    // 2. Pending < Unknown < Running.
    let by_phase = phase_ordinal(a).cmp(&phase_ordinal(b));
    if by_phase != Ordering::Equal {
        return by_phase;
    }
    // 3. Not ready < ready.
    let (ready_a, ready_b) = (is_pod_ready(a), is_pod_ready(b));
    if ready_a != ready_b {
        return ready_a.cmp(&ready_b);
    }
    // 4. Lower deletion cost < higher.
    let by_cost = deletion_cost(a).cmp(&deletion_cost(b));
    if by_cost != Ordering::Equal {
        return by_cost;
    }
    // 5. Doubled up < not doubled up.
    if rank_a != rank_b {
        return rank_b.cmp(&rank_a);
    }
    // 6. Ready for less time < more time.
    if ready_a && ready_b {
        let (ta, tb) = (ready_time(a), ready_time(b));
        if ta != tb {
            return compare_times(a, ta, b, tb, now);
        }
    }
    // 7. More restarts < fewer.
    let ((regular_a, sidecar_a), (regular_b, sidecar_b)) = (max_restarts(a), max_restarts(b));
    if regular_a != regular_b {
        return regular_b.cmp(&regular_a);
    }
    if sidecar_a != sidecar_b {
        return sidecar_b.cmp(&sidecar_a);
    }
    // 8. Empty creation time < newer < older.
    let (ca, cb) = (
        a.metadata.creation_timestamp.as_ref(),
        b.metadata.creation_timestamp.as_ref(),
    );
    if ca != cb {
        return compare_times(a, ca, b, cb, now);
    }
    Ordering::Equal
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use crate::expectations::{EXPECTATIONS_TIMEOUT, ManualClock};
    use crate::podcontrol::{
        FAILED_CREATE_POD_REASON, FAILED_DELETE_POD_REASON, SUCCESSFUL_CREATE_POD_REASON,
        SUCCESSFUL_DELETE_POD_REASON,
    };
    use k8s_openapi::api::apps::v1::ReplicaSetSpec;
    use k8s_openapi::api::core::v1::{
        Container, ContainerStatus, PodCondition, PodSpec, PodStatus, PodTemplateSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Status};
    use k8s_openapi::jiff::SignedDuration;
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

    const NS: &str = "default";

    fn api_error(code: i32, reason: &str) -> Error {
        Error::Api(Box::new(Status {
            code: Some(code),
            reason: Some(reason.to_string()),
            message: Some(format!("{reason} ({code})")),
            ..Status::default()
        }))
    }

    /// Records pod writes; its creations never reach the pod cache (a watch that lags until
    /// the test delivers the events itself).
    #[derive(Default)]
    struct FakePods {
        created: Mutex<Vec<Pod>>,
        deleted: Mutex<Vec<String>>,
        patched: Mutex<Vec<(String, Value)>>,
        creates_attempted: AtomicUsize,
        /// The 1-based create call that fails with a quota error, if any.
        fail_create_call: Mutex<Option<usize>>,
        /// Pod names whose delete answers 404.
        delete_not_found: Mutex<HashSet<String>>,
        /// Pod names whose delete answers 500.
        delete_fails: Mutex<HashSet<String>>,
    }

    /// One recorded event: (involved object's kind, its name, type, reason, message).
    type Recorded = (String, String, String, String, String);

    /// Records the events the controller emits.
    #[derive(Default)]
    struct FakeEvents(Mutex<Vec<Recorded>>);

    impl EventSink for FakeEvents {
        fn event(
            &self,
            object: &k8s_openapi::api::core::v1::ObjectReference,
            type_: &str,
            reason: &str,
            message: &str,
        ) {
            self.0.lock().push((
                object.kind.clone().unwrap_or_default(),
                object.name.clone().unwrap_or_default(),
                type_.to_string(),
                reason.to_string(),
                message.to_string(),
            ));
        }
    }

    impl FakeEvents {
        /// The recorded events with `reason`, as (object name, type, message).
        fn with_reason(&self, reason: &str) -> Vec<(String, String, String)> {
            self.0
                .lock()
                .iter()
                .filter(|e| e.3 == reason)
                .map(|e| (e.1.clone(), e.2.clone(), e.4.clone()))
                .collect()
        }
    }

    use serde_json::Value;

    impl PodControl for FakePods {
        fn create_pod<'a>(
            &'a self,
            _namespace: &'a str,
            pod: &'a Pod,
        ) -> BoxFuture<'a, Result<Pod, Error>> {
            Box::pin(async move {
                let n = self.creates_attempted.fetch_add(1, AtomicOrdering::SeqCst) + 1;
                if *self.fail_create_call.lock() == Some(n) {
                    return Err(api_error(403, "Forbidden: exceeded quota"));
                }
                let mut created = pod.clone();
                let prefix = pod.metadata.generate_name.clone().unwrap_or_default();
                created.metadata.name = Some(format!("{prefix}{n:05}"));
                created.metadata.uid = Some(format!("uid-{n}"));
                created.metadata.resource_version = Some(n.to_string());
                self.created.lock().push(created.clone());
                Ok(created)
            })
        }
        fn delete_pod<'a>(
            &'a self,
            _namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async move {
                if self.delete_not_found.lock().contains(name) {
                    return Err(api_error(404, "NotFound"));
                }
                if self.delete_fails.lock().contains(name) {
                    return Err(api_error(500, "InternalError"));
                }
                self.deleted.lock().push(name.to_string());
                Ok(())
            })
        }
        fn patch_pod<'a>(
            &'a self,
            _namespace: &'a str,
            name: &'a str,
            patch: &'a Value,
        ) -> BoxFuture<'a, Result<Pod, Error>> {
            Box::pin(async move {
                self.patched.lock().push((name.to_string(), patch.clone()));
                Ok(Pod::default())
            })
        }
    }

    /// Serves GETs from the ReplicaSet cache and records status writes.
    struct FakeReplicaSets {
        store: Indexer<ReplicaSet>,
        status_writes: Mutex<Vec<ReplicaSetStatus>>,
    }

    impl ReplicaSetClient for FakeReplicaSets {
        fn get_replica_set<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<ReplicaSet, Error>> {
            Box::pin(async move {
                self.store
                    .get_by(namespace, name)
                    .map(|rs| (*rs).clone())
                    .ok_or_else(|| api_error(404, "NotFound"))
            })
        }
        fn replace_replica_set_status<'a>(
            &'a self,
            rs: &'a ReplicaSet,
        ) -> BoxFuture<'a, Result<ReplicaSet, Error>> {
            Box::pin(async move {
                self.status_writes
                    .lock()
                    .push(rs.status.clone().unwrap_or_default());
                // What the watch would bring back: the cache catches up with the write.
                self.store.upsert(&key_of(rs), Arc::new(rs.clone()));
                Ok(rs.clone())
            })
        }
    }

    struct Harness {
        controller: Arc<ReplicaSetController>,
        pods: Indexer<Pod>,
        replica_sets: Indexer<ReplicaSet>,
        pod_writes: Arc<FakePods>,
        rs_client: Arc<FakeReplicaSets>,
        clock: Arc<ManualClock>,
        events: Arc<FakeEvents>,
    }

    impl Harness {
        fn new() -> Harness {
            let pods = Indexer::new();
            let replica_sets = Indexer::new();
            let pod_writes = Arc::new(FakePods::default());
            let rs_client = Arc::new(FakeReplicaSets {
                store: replica_sets.clone(),
                status_writes: Mutex::new(Vec::new()),
            });
            let clock = Arc::new(ManualClock::new());
            let events = Arc::new(FakeEvents::default());
            let controller = ReplicaSetController::from_parts(Parts {
                replica_sets: replica_sets.clone(),
                pods: pods.clone(),
                pod_control: pod_writes.clone(),
                replica_set_client: rs_client.clone(),
                clock: clock.clone(),
                events: Some(events.clone()),
            });
            Harness {
                controller,
                pods,
                replica_sets,
                pod_writes,
                rs_client,
                clock,
                events,
            }
        }

        fn add_rs(&self, rs: ReplicaSet) {
            self.replica_sets.upsert(&key_of(&rs), Arc::new(rs.clone()));
            self.controller.add_replica_set(&rs);
        }

        fn rs(&self, name: &str) -> Arc<ReplicaSet> {
            self.replica_sets.get_by(NS, name).unwrap()
        }

        /// The watch catches up: every pod the fake created is delivered as ADDED.
        fn deliver_created(&self) {
            let created: Vec<Pod> = self.pod_writes.created.lock().clone();
            for pod in created {
                let key = key_of(&pod);
                if self.pods.get(&key).is_none() {
                    self.pods.upsert(&key, Arc::new(pod.clone()));
                    self.controller.add_pod(&pod);
                }
            }
        }

        fn creates(&self) -> usize {
            self.pod_writes.created.lock().len()
        }

        async fn sync(&self, name: &str) -> anyhow::Result<()> {
            self.controller
                .sync_replica_set(&format!("{NS}/{name}"))
                .await
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn replica_set(name: &str, replicas: i32) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                uid: Some(format!("rs-uid-{name}")),
                generation: Some(1),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                selector: LabelSelector {
                    match_labels: Some(labels(&[("app", name)])),
                    match_expressions: None,
                },
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels(&[("app", name)])),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "c".into(),
                            image: Some("nginx".into()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                }),
                min_ready_seconds: None,
            }),
            status: None,
        }
    }

    /// A pod of `rs` in the cache, named `name`.
    fn owned_pod(rs: &ReplicaSet, name: &str) -> Pod {
        let app = rs.metadata.name.clone().unwrap();
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("1".into()),
                labels: Some(labels(&[("app", &app)])),
                owner_references: Some(vec![util::controller_ref(API_VERSION, KIND, &rs.metadata)]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..PodStatus::default()
            }),
        }
    }

    fn add_cached_pod(h: &Harness, pod: &Pod) {
        h.pods.upsert(&key_of(pod), Arc::new(pod.clone()));
    }

    fn running_ready(mut pod: Pod, node: &str, ready_since: Time) -> Pod {
        pod.spec.get_or_insert_with(PodSpec::default).node_name = Some(node.into());
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_transition_time: Some(ready_since),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    fn ago(now: &Time, secs: i64) -> Time {
        Time(now.0.checked_sub(SignedDuration::from_secs(secs)).unwrap())
    }

    // ---- docs/tricks.md #27: expectations stop a double create ------------------------------

    #[tokio::test]
    async fn second_sync_before_the_watch_catches_up_creates_nothing() {
        let h = Harness::new();
        h.add_rs(replica_set("web", 3));
        h.sync("web").await.unwrap();
        assert_eq!(h.creates(), 3);
        let created = h.pod_writes.created.lock().clone();
        for pod in &created {
            assert!(pod.metadata.name.as_deref().unwrap().starts_with("web-"));
            let r = controller_of(&pod.metadata).unwrap();
            assert_eq!(r.uid, "rs-uid-web");
            assert_eq!(r.kind, "ReplicaSet");
        }
        // The ADDED events have not arrived: the cache still shows no pods, so without
        // expectations this sync would create three more.
        assert!(h.pods.is_empty());
        h.sync("web").await.unwrap();
        h.sync("web").await.unwrap();
        assert_eq!(
            h.creates(),
            3,
            "a lagging watch must not cause a double create"
        );
        assert!(!h.controller.expectations().satisfied("default/web"));

        // The watch catches up; the expectations are met and the state is steady.
        h.deliver_created();
        assert!(h.controller.expectations().satisfied("default/web"));
        h.sync("web").await.unwrap();
        assert_eq!(h.creates(), 3);
        assert_eq!(h.rs("web").status.as_ref().unwrap().replicas, 3);
    }

    #[tokio::test]
    async fn without_expectations_the_lagging_cache_would_double_create() {
        // The counterfactual of the test above: forget the expectations between the syncs and
        // the second sync, reading the same stale cache, creates the pods again.
        let h = Harness::new();
        h.add_rs(replica_set("web", 3));
        h.sync("web").await.unwrap();
        h.controller
            .expectations()
            .delete_expectations("default/web");
        h.sync("web").await.unwrap();
        assert_eq!(h.creates(), 6);
    }

    #[tokio::test]
    async fn lost_events_heal_after_the_expectations_timeout() {
        let h = Harness::new();
        h.add_rs(replica_set("web", 2));
        h.sync("web").await.unwrap();
        assert_eq!(h.creates(), 2);
        h.clock.advance(EXPECTATIONS_TIMEOUT);
        h.sync("web").await.unwrap();
        assert_eq!(h.creates(), 2, "still waiting at exactly the timeout");
        h.clock.advance(Duration::from_secs(1));
        // The events were lost for good (the pods are not in the cache): after the timeout the
        // controller trusts its cache again and acts on it.
        h.sync("web").await.unwrap();
        assert_eq!(h.creates(), 4);
    }

    #[tokio::test]
    async fn slow_start_stops_at_the_first_failure_and_lowers_expectations() {
        let h = Harness::new();
        *h.pod_writes.fail_create_call.lock() = Some(4);
        h.add_rs(replica_set("web", 10));
        let err = h.sync("web").await.unwrap_err();
        assert!(format!("{err:#}").contains("quota"), "{err:#}");
        // Batches 1 and 2 succeed; the batch of 4 has one failure and is the last.
        assert_eq!(
            h.pod_writes.creates_attempted.load(AtomicOrdering::SeqCst),
            7
        );
        assert_eq!(h.creates(), 6);
        // 10 expected, 4 will never come (1 failed, 3 never tried): 6 remain.
        assert_eq!(
            h.controller.expectations().get("default/web").unwrap().add,
            6
        );
        let status = h.rs("web").status.clone().unwrap();
        let cond = &status.conditions.unwrap()[0];
        assert_eq!(cond.type_, REPLICA_FAILURE);
        assert_eq!(cond.reason.as_deref(), Some("FailedCreate"));
        assert!(cond.message.as_deref().unwrap().contains("quota"));

        // The six creations come back; the next sync creates the remaining four and clears the
        // failure condition.
        h.deliver_created();
        assert!(h.controller.expectations().satisfied("default/web"));
        h.sync("web").await.unwrap();
        assert_eq!(h.creates(), 10);
        h.deliver_created();
        h.sync("web").await.unwrap();
        let status = h.rs("web").status.clone().unwrap();
        assert_eq!(status.replicas, 10);
        assert!(status.conditions.is_none(), "{:?}", status.conditions);
    }

    #[tokio::test]
    async fn creations_are_capped_at_burst_replicas() {
        let h = Harness::new();
        h.add_rs(replica_set("big", 600));
        h.sync("big").await.unwrap();
        assert_eq!(h.creates(), BURST_REPLICAS);
        h.deliver_created();
        h.sync("big").await.unwrap();
        assert_eq!(h.creates(), 600);
    }

    // ---- deletions, by UID ------------------------------------------------------------------

    #[tokio::test]
    async fn scale_down_deletes_by_ranking_and_counts_each_uid_once() {
        let h = Harness::new();
        let rs = replica_set("web", 1);
        h.add_rs(rs.clone());
        let now = util::now();
        let keep = running_ready(owned_pod(&rs, "keep"), "n1", ago(&now, 3600));
        let pending = {
            let mut p = owned_pod(&rs, "pending");
            p.spec.as_mut().unwrap().node_name = Some("n2".into());
            p
        };
        let unassigned = owned_pod(&rs, "unassigned");
        for p in [&keep, &pending, &unassigned] {
            add_cached_pod(&h, p);
        }
        h.sync("web").await.unwrap();
        let mut deleted = h.pod_writes.deleted.lock().clone();
        deleted.sort();
        assert_eq!(deleted, vec!["pending", "unassigned"]);
        let e = h.controller.expectations();
        assert_eq!(e.get("default/web").unwrap().del, 2);

        // The pod's deletionTimestamp arrives first (graceful delete)...
        let mut terminating = pending.clone();
        terminating.metadata.deletion_timestamp = Some(now.clone());
        terminating.metadata.resource_version = Some("2".into());
        h.controller.update_pod(&pending, &terminating);
        assert_eq!(e.get("default/web").unwrap().del, 1);
        // ...then its DELETE event, then a relist tombstone: the same UID, not counted again.
        h.controller.delete_pod(&terminating);
        h.controller.delete_pod(&pending);
        assert_eq!(e.get("default/web").unwrap().del, 1);
        // Someone else deleting the surviving pod does not stand in for the one we expect.
        h.controller.delete_pod(&keep);
        assert_eq!(e.get("default/web").unwrap().del, 1);
        assert!(!e.satisfied("default/web"));
        // While unsatisfied, a sync writes status only.
        h.pods.remove(&key_of(&pending));
        h.sync("web").await.unwrap();
        assert_eq!(h.pod_writes.deleted.lock().len(), 2);
        assert_eq!(h.creates(), 0);
        h.controller.delete_pod(&unassigned);
        assert!(e.satisfied("default/web"));
    }

    #[tokio::test]
    async fn a_delete_that_finds_the_pod_gone_lowers_the_expectation() {
        let h = Harness::new();
        let rs = replica_set("web", 0);
        h.add_rs(rs.clone());
        let a = owned_pod(&rs, "a");
        let b = owned_pod(&rs, "b");
        add_cached_pod(&h, &a);
        add_cached_pod(&h, &b);
        h.pod_writes.delete_not_found.lock().insert("a".into());
        // A 404 is not an error: the pod is gone, which is what we wanted.
        h.sync("web").await.unwrap();
        let e = h.controller.expectations();
        assert_eq!(e.get("default/web").unwrap().del, 1);
        assert_eq!(
            e.expected_deletion_uids("default/web"),
            HashSet::from(["uid-b".to_string()])
        );
        h.controller.delete_pod(&b);
        assert!(e.satisfied("default/web"));
    }

    // ---- events ---------------------------------------------------------------------------

    #[tokio::test]
    async fn every_pod_write_is_an_event_on_the_replica_set() {
        let h = Harness::new();
        *h.pod_writes.fail_create_call.lock() = Some(2);
        h.add_rs(replica_set("web", 3));
        h.sync("web").await.unwrap_err();
        // The first create succeeded; in the next batch (of two) the second was refused and
        // the third succeeded: slow start finishes the batch it started.
        let created: Vec<String> = h
            .pod_writes
            .created
            .lock()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        let mut successes = h.events.with_reason(SUCCESSFUL_CREATE_POD_REASON);
        successes.sort();
        let expected: Vec<(String, String, String)> = created
            .iter()
            .map(|n| ("web".into(), "Normal".into(), format!("Created pod: {n}")))
            .collect();
        assert_eq!(successes, expected);
        assert_eq!(
            h.events.with_reason(FAILED_CREATE_POD_REASON),
            vec![(
                "web".into(),
                "Warning".into(),
                "Error creating: Forbidden: exceeded quota (403)".into()
            )]
        );
        assert!(h.events.0.lock().iter().all(|e| e.0 == "ReplicaSet"));

        // Scale-down: a successful delete, a 404 (the pod is already gone: no event) and a
        // failed one.
        let h = Harness::new();
        let rs = replica_set("web", 0);
        h.add_rs(rs.clone());
        for name in ["gone", "fails", "ok"] {
            add_cached_pod(&h, &owned_pod(&rs, name));
        }
        h.pod_writes.delete_not_found.lock().insert("gone".into());
        h.pod_writes.delete_fails.lock().insert("fails".into());
        h.sync("web").await.unwrap_err();
        assert_eq!(
            h.events.with_reason(SUCCESSFUL_DELETE_POD_REASON),
            vec![("web".into(), "Normal".into(), "Deleted pod: ok".into())]
        );
        assert_eq!(
            h.events.with_reason(FAILED_DELETE_POD_REASON),
            vec![(
                "web".into(),
                "Warning".into(),
                "Error deleting: InternalError (500)".into()
            )]
        );
        assert_eq!(h.events.0.lock().len(), 2);
    }

    #[tokio::test]
    async fn a_pod_first_seen_terminating_is_a_deletion_not_a_creation() {
        let h = Harness::new();
        let rs = replica_set("web", 1);
        h.add_rs(rs.clone());
        h.sync("web").await.unwrap();
        assert_eq!(
            h.controller.expectations().get("default/web").unwrap().add,
            1
        );
        let mut pod = h.pod_writes.created.lock()[0].clone();
        pod.metadata.deletion_timestamp = Some(util::now());
        h.controller.add_pod(&pod);
        assert_eq!(
            h.controller.expectations().get("default/web").unwrap().add,
            1
        );
    }

    // ---- status, adoption -------------------------------------------------------------------

    #[tokio::test]
    async fn status_is_written_only_when_it_changes() {
        let h = Harness::new();
        let mut rs = replica_set("web", 2);
        rs.spec.as_mut().unwrap().min_ready_seconds = Some(30);
        h.add_rs(rs.clone());
        let now = util::now();
        add_cached_pod(
            &h,
            &running_ready(owned_pod(&rs, "old"), "n1", ago(&now, 60)),
        );
        add_cached_pod(
            &h,
            &running_ready(owned_pod(&rs, "new"), "n1", ago(&now, 5)),
        );
        h.sync("web").await.unwrap();
        let writes = h.rs_client.status_writes.lock().clone();
        assert_eq!(writes.len(), 1);
        let s = &writes[0];
        assert_eq!(s.replicas, 2);
        assert_eq!(s.fully_labeled_replicas, Some(2));
        assert_eq!(s.ready_replicas, Some(2));
        assert_eq!(
            s.available_replicas,
            Some(1),
            "one pod has not been ready for 30 s yet"
        );
        assert_eq!(s.observed_generation, Some(1));
        h.sync("web").await.unwrap();
        assert_eq!(
            h.rs_client.status_writes.lock().len(),
            1,
            "unchanged status is not written"
        );
    }

    #[tokio::test]
    async fn orphans_are_adopted_and_strays_released() {
        let h = Harness::new();
        let rs = replica_set("web", 2);
        h.add_rs(rs.clone());
        let mut orphan = owned_pod(&rs, "orphan");
        orphan.metadata.owner_references = None;
        let mut stray = owned_pod(&rs, "stray");
        stray.metadata.labels = Some(labels(&[("app", "other")]));
        let mut foreign = owned_pod(&rs, "foreign");
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
        for p in [&orphan, &stray, &foreign] {
            add_cached_pod(&h, p);
        }
        h.sync("web").await.unwrap();
        let patched = h.pod_writes.patched.lock().clone();
        assert_eq!(patched.len(), 2, "{patched:?}");
        let (name, patch) = patched.iter().find(|(n, _)| n == "orphan").unwrap();
        assert_eq!(name, "orphan");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "rs-uid-web");
        assert_eq!(patch["metadata"]["uid"], "uid-orphan");
        let (_, patch) = patched.iter().find(|(n, _)| n == "stray").unwrap();
        assert_eq!(patch["metadata"]["ownerReferences"][0]["$patch"], "delete");
        // The adopted orphan counts; the released stray and the foreign pod do not.
        assert_eq!(h.creates(), 1);
    }

    #[tokio::test]
    async fn pod_events_enqueue_the_owner() {
        let h = Harness::new();
        let rs = replica_set("web", 1);
        h.replica_sets.upsert(&key_of(&rs), Arc::new(rs.clone()));
        let pod = owned_pod(&rs, "p");
        h.controller.add_pod(&pod);
        assert_eq!(h.controller.queue().len(), 1);
        assert_eq!(
            h.controller.queue().get().await.as_deref(),
            Some("default/web")
        );
        // A pod whose controller reference names a re-created ReplicaSet (other UID) is not ours.
        let mut stale = pod.clone();
        stale.metadata.owner_references.as_mut().unwrap()[0].uid = "old-uid".into();
        let before = h.controller.queue().len();
        h.controller.add_pod(&stale);
        assert_eq!(h.controller.queue().len(), before);
    }

    // ---- the deletion ranking, rule by rule -------------------------------------------------

    fn base(name: &str, now: &Time) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                uid: Some(name.into()),
                creation_timestamp: Some(ago(now, 7200)),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..PodStatus::default()
            }),
        }
    }

    /// Asserts that `first` is deleted before `second`, both ways round.
    fn deleted_first(first: &Pod, second: &Pod, now: &Time) {
        assert_eq!(
            compare_for_deletion(first, 0, second, 0, now),
            Ordering::Less
        );
        assert_eq!(
            compare_for_deletion(second, 0, first, 0, now),
            Ordering::Greater
        );
    }

    #[test]
    fn rank_1_unassigned_before_assigned() {
        let now = util::now();
        let mut unassigned = base("a", &now);
        unassigned.spec.as_mut().unwrap().node_name = None;
        deleted_first(&unassigned, &base("b", &now), &now);
    }

    #[test]
    fn rank_2_pending_before_unknown_before_running() {
        let now = util::now();
        let with_phase = |name: &str, phase: &str| {
            let mut p = base(name, &now);
            p.status.as_mut().unwrap().phase = Some(phase.into());
            p
        };
        let pending = with_phase("a", "Pending");
        let unknown = with_phase("b", "Unknown");
        let running = with_phase("c", "Running");
        deleted_first(&pending, &unknown, &now);
        deleted_first(&unknown, &running, &now);
    }

    #[test]
    fn rank_3_not_ready_before_ready() {
        let now = util::now();
        let ready = running_ready(base("b", &now), "n1", ago(&now, 100));
        deleted_first(&base("a", &now), &ready, &now);
    }

    #[test]
    fn rank_4_lower_deletion_cost_first() {
        let now = util::now();
        let with_cost = |name: &str, cost: &str| {
            let mut p = base(name, &now);
            p.metadata.annotations = Some(labels(&[(POD_DELETION_COST_ANNOTATION, cost)]));
            p
        };
        deleted_first(&with_cost("a", "-5"), &with_cost("b", "10"), &now);
        // A malformed cost counts as 0.
        deleted_first(&with_cost("a", "-1"), &with_cost("b", "lots"), &now);
        assert_eq!(deletion_cost(&with_cost("x", "lots")), 0);
    }

    #[test]
    fn rank_5_more_related_pods_on_the_node_first() {
        let now = util::now();
        let (a, b) = (base("a", &now), base("b", &now));
        assert_eq!(compare_for_deletion(&a, 3, &b, 1, &now), Ordering::Less);
        assert_eq!(compare_for_deletion(&a, 1, &b, 3, &now), Ordering::Greater);
        // Through get_pods_to_delete: two related pods on n2, one on n1.
        let mut on_n2 = base("on-n2", &now);
        on_n2.spec.as_mut().unwrap().node_name = Some("n2".into());
        let mut also_n2 = base("also-n2", &now);
        also_n2.spec.as_mut().unwrap().node_name = Some("n2".into());
        let on_n1 = base("on-n1", &now);
        let related = vec![
            Arc::new(on_n2.clone()),
            Arc::new(also_n2),
            Arc::new(on_n1.clone()),
        ];
        let picked = get_pods_to_delete(vec![Arc::new(on_n1), Arc::new(on_n2)], &related, 1, &now);
        assert_eq!(picked[0].metadata.name.as_deref(), Some("on-n2"));
    }

    #[test]
    fn rank_6_ready_for_less_time_first() {
        let now = util::now();
        let recent = running_ready(base("a", &now), "n1", ago(&now, 10));
        let long = running_ready(base("b", &now), "n1", ago(&now, 10_000));
        deleted_first(&recent, &long, &now);
        // Within one power of two the ages are equal, and the UID decides.
        let x = running_ready(base("x", &now), "n1", ago(&now, 1000));
        let y = running_ready(base("y", &now), "n1", ago(&now, 1100));
        deleted_first(&x, &y, &now);
    }

    #[test]
    fn rank_7_more_restarts_first() {
        let now = util::now();
        let with_restarts = |name: &str, n: i32| {
            let mut p = base(name, &now);
            p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
                name: "c".into(),
                restart_count: n,
                ..ContainerStatus::default()
            }]);
            p
        };
        deleted_first(&with_restarts("a", 5), &with_restarts("b", 1), &now);
    }

    #[test]
    fn rank_8_newer_first_and_no_timestamp_first_of_all() {
        let now = util::now();
        let mut newer = base("a", &now);
        newer.metadata.creation_timestamp = Some(ago(&now, 10));
        let older = base("b", &now);
        deleted_first(&newer, &older, &now);
        let mut none = base("c", &now);
        none.metadata.creation_timestamp = None;
        deleted_first(&none, &newer, &now);
    }

    #[test]
    fn earlier_rules_dominate_later_ones() {
        let now = util::now();
        // An unassigned pod goes before a pending one with many restarts and a low cost, etc.
        let mut unassigned_running = base("a", &now);
        unassigned_running.spec.as_mut().unwrap().node_name = None;
        let mut pending_cheap = base("b", &now);
        pending_cheap.status.as_mut().unwrap().phase = Some("Pending".into());
        pending_cheap.metadata.annotations =
            Some(labels(&[(POD_DELETION_COST_ANNOTATION, "-100")]));
        deleted_first(&unassigned_running, &pending_cheap, &now);
        // Not ready beats a lower deletion cost.
        let ready_cheap = {
            let mut p = running_ready(base("c", &now), "n1", ago(&now, 100));
            p.metadata.annotations = Some(labels(&[(POD_DELETION_COST_ANNOTATION, "-100")]));
            p
        };
        deleted_first(&base("d", &now), &ready_cheap, &now);
    }

    #[test]
    fn deleting_everything_needs_no_ranking() {
        let now = util::now();
        let pods = vec![Arc::new(base("a", &now)), Arc::new(base("b", &now))];
        assert_eq!(get_pods_to_delete(pods, &[], 2, &now).len(), 2);
    }

    #[test]
    fn status_failure_condition_set_and_cleared() {
        let now = util::now();
        let rs = replica_set("web", 3);
        let s = calculate_status(&rs, &[], Some("quota exceeded"), &now);
        let conds = s.conditions.clone().unwrap();
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].reason.as_deref(), Some("FailedCreate"));
        let mut failed = rs.clone();
        failed.status = Some(s);
        // A second failure keeps the first condition (and its transition time).
        let again = calculate_status(&failed, &[], Some("other"), &now);
        assert_eq!(
            again.conditions.as_ref().unwrap()[0].message.as_deref(),
            Some("quota exceeded")
        );
        let cleared = calculate_status(&failed, &[], None, &now);
        assert!(cleared.conditions.is_none());
    }
}
