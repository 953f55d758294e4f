//! One sync of one Deployment (Kubernetes' `syncDeployment` and `deployment/sync.go`): from a
//! snapshot of the Deployment and the ReplicaSets and pods in its namespace (read from the
//! informer caches), claim its ReplicaSets, find or create the new one, scale, clean up old
//! revisions and write the status.
//!
//! Every write goes through [`Writes`], so the whole decision logic runs in tests over an
//! in-memory fake (`tests/deployment.rs`) and in production over the apiserver
//! (`super::ApiWrites`). A write that returns an object replaces the sync's working copy of
//! it, so a later write in the same sync carries the resourceVersion the server just issued;
//! a write from a stale cache fails with 409 Conflict and the key is retried — the controller
//! never merges.
//!
//! `docs/tricks.md` #28 lives in [`Run::get_new_replica_set`]: the new ReplicaSet is named
//! `<deployment>-<hash(template, collisionCount)>`; when that name is taken by a ReplicaSet
//! that is not this Deployment's (another owner, or a different template that hashed the same),
//! the sync bumps `status.collisionCount`, persists it, and fails so the retry computes a new
//! name — deterministic, unlike a random suffix, so a lagging cache can never make it create
//! two ReplicaSets for one template.
//!
//! The sync also tells the user what it did, as Events on the Deployment with
//! kube-controller-manager's (1.32) reasons and wording, through [`Writes::record_event`]:
//! `ScalingReplicaSet` "Scaled up replica set web-x from 0 to 3" / "Scaled down replica set
//! web-y from 3 to 2" on every size change it writes, a `ReplicaSetCreateError` warning when
//! the new ReplicaSet cannot be created, and a `SelectingAll` warning for an empty selector.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use skerry_client::Error;
use skerry_client::events::{EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING};

use super::history::{
    cleanup_plan, find_new_replica_set, max_revision, replicas_annotations_need_update,
    set_new_replica_set_annotations, set_replicas_annotations,
};
use super::progress::{
    calculate_status, deployment_complete, deployment_progressing, deployment_timed_out,
    get_condition, new_condition, remove_condition, replica_failures, requeue_after, set_condition,
};
use super::rolling::{InvalidIntOrPercent, max_surge, new_rs_new_replicas, proportional_sizes};
use super::spec::{
    CONDITION_PROGRESSING, CONDITION_REPLICA_FAILURE, DESIRED_REPLICAS_ANNOTATION,
    EVENT_REASON_SCALING_REPLICA_SET, EVENT_REASON_SELECTING_ALL, REASON_DEPLOYMENT_PAUSED,
    REASON_DEPLOYMENT_RESUMED, REASON_FOUND_NEW_REPLICA_SET, REASON_NEW_REPLICA_SET_AVAILABLE,
    REASON_NEW_REPLICA_SET_CREATED, REASON_PROGRESS_DEADLINE_EXCEEDED,
    REASON_REPLICA_SET_CREATE_ERROR, REASON_REPLICA_SET_UPDATED, REVISION_ANNOTATION,
    available_replicas, by_creation, collision_count, desired_replicas, int_annotation, is_active,
    is_paused, is_recreate, is_rolling_update, min_ready_seconds, name, progress_deadline_seconds,
    replicas, revision_history_limit, rs_template, selector, selector_is_empty, set_replicas,
    status_replicas, template, uid,
};
use crate::hash::{POD_TEMPLATE_HASH_LABEL, compute_hash, equal_ignore_hash};
use crate::podcontrol::{error_message, is_namespace_terminating};
use crate::util::{controller_of, controller_ref};

/// The `SelectingAll` warning's message, Kubernetes' word for word.
pub const SELECTING_ALL_MESSAGE: &str =
    "This deployment is selecting all pods. A non-empty selector is required.";

/// The writes a sync makes. Implemented over the apiserver by `super::ApiWrites` and in
/// memory by tests; each returns the object as the server stored it.
pub trait Writes: Send + Sync {
    /// POST a ReplicaSet (AlreadyExists when the name is taken).
    fn create_replica_set(
        &self,
        rs: &ReplicaSet,
    ) -> impl Future<Output = Result<ReplicaSet, Error>> + Send;
    /// GET a ReplicaSet live (not from the cache), `None` on 404.
    fn get_replica_set(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ReplicaSet>, Error>> + Send;
    /// PUT a ReplicaSet (409 Conflict on a stale resourceVersion).
    fn update_replica_set(
        &self,
        rs: &ReplicaSet,
    ) -> impl Future<Output = Result<ReplicaSet, Error>> + Send;
    /// DELETE a ReplicaSet, preconditioned on its uid.
    fn delete_replica_set(&self, rs: &ReplicaSet)
    -> impl Future<Output = Result<(), Error>> + Send;
    /// GET a Deployment live, `None` on 404 (the adoption recheck).
    fn get_deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Deployment>, Error>> + Send;
    /// PUT a Deployment's status subresource.
    fn update_deployment_status(
        &self,
        d: &Deployment,
    ) -> impl Future<Output = Result<Deployment, Error>> + Send;
    /// Sets one annotation on a Deployment: a PUT of the main resource with the working
    /// copy's resourceVersion (409 when stale), since the controller's RBAC role may update
    /// Deployments but not patch them, and skerry's status subresource, unlike Kubernetes',
    /// keeps metadata from the stored object. An annotation change does not bump
    /// `generation`.
    fn set_deployment_annotation(
        &self,
        d: &Deployment,
        key: &str,
        value: &str,
    ) -> impl Future<Output = Result<Deployment, Error>> + Send;
    /// Records an Event about `d` (`type_` Normal or Warning). Best-effort: never blocks,
    /// never fails the sync. The default records nothing, for fakes that do not care.
    fn record_event(&self, d: &Deployment, type_: &str, reason: &str, message: &str) {
        let _ = (d, type_, reason, message);
    }
}

/// Why a sync failed; every variant re-queues the Deployment with backoff.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SyncError {
    /// A request failed (409 Conflict from a stale cache is the common one).
    #[error(transparent)]
    Api(#[from] Error),
    /// The new ReplicaSet's name belongs to a ReplicaSet that is not this Deployment's; the
    /// collision counter was bumped and persisted, and the retry will use a new name.
    #[error("hash collision on replica set {name}: collisionCount is now {collision_count}")]
    HashCollision {
        /// The name that was taken.
        name: String,
        /// The counter after the bump.
        collision_count: i32,
    },
    /// maxSurge or maxUnavailable is not an integer or a percentage.
    #[error(transparent)]
    InvalidStrategy(#[from] InvalidIntOrPercent),
    /// The Deployment changed identity or started deleting while we were about to adopt.
    #[error("cannot adopt for deployment {0}: {1}")]
    CannotAdopt(String, &'static str),
    /// The selector does not convert; nothing is claimed (Kubernetes'
    /// `getReplicaSetsForDeployment` error).
    #[error("{0}")]
    InvalidSelector(String),
}

/// What a sync reads: one Deployment, and the ReplicaSets and pods of its namespace as the
/// caches hold them (ReplicaSets are claimed inside; pods matter only to Recreate).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The Deployment.
    pub deployment: Deployment,
    /// Every ReplicaSet in the Deployment's namespace.
    pub replica_sets: Vec<ReplicaSet>,
    /// The pods in the Deployment's namespace (may be empty for RollingUpdate).
    pub pods: Vec<Pod>,
}

/// What a successful sync asks of the queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Look at this Deployment again after this long (the progress-deadline check).
    pub requeue_after: Option<Duration>,
}

/// Runs one sync of `snapshot.deployment` at time `now`.
pub async fn sync_deployment<W: Writes>(
    writes: &W,
    snapshot: Snapshot,
    now: Time,
) -> Result<SyncOutcome, SyncError> {
    let mut run = Run {
        w: writes,
        d: snapshot.deployment,
        now,
        rss: Vec::new(),
        requeue_after: None,
    };
    run.sync(snapshot.replica_sets, snapshot.pods).await?;
    Ok(SyncOutcome {
        requeue_after: run.requeue_after,
    })
}

/// The new ReplicaSet and the old ones of a Deployment, as indexes into [`Run::rss`].
#[derive(Clone, Debug, Default)]
pub(super) struct Sets {
    pub(super) new: Option<usize>,
    pub(super) old: Vec<usize>,
}

impl Sets {
    /// Old then new.
    pub(super) fn all(&self) -> Vec<usize> {
        self.old.iter().copied().chain(self.new).collect()
    }
}

/// The working state of one sync.
pub(super) struct Run<'w, W> {
    pub(super) w: &'w W,
    /// The Deployment as last written (status and resourceVersion follow our own writes).
    pub(super) d: Deployment,
    pub(super) now: Time,
    /// The Deployment's claimed ReplicaSets as last written.
    pub(super) rss: Vec<ReplicaSet>,
    pub(super) requeue_after: Option<Duration>,
}

impl<W: Writes> Run<'_, W> {
    pub(super) fn refs(&self, indexes: &[usize]) -> Vec<&ReplicaSet> {
        indexes.iter().map(|&i| &self.rss[i]).collect()
    }

    fn key(&self) -> String {
        crate::util::key(&self.d.metadata)
    }

    async fn sync(
        &mut self,
        in_namespace: Vec<ReplicaSet>,
        pods: Vec<Pod>,
    ) -> Result<(), SyncError> {
        let everything = selector(&self.d).is_none_or(selector_is_empty);
        if everything {
            // An empty selector would claim every ReplicaSet in the namespace.
            tracing::warn!(deployment = %self.key(), "deployment selects all pods; not acting on it");
            self.w.record_event(
                &self.d,
                EVENT_TYPE_WARNING,
                EVENT_REASON_SELECTING_ALL,
                SELECTING_ALL_MESSAGE,
            );
            let observed = self.d.status.as_ref().and_then(|s| s.observed_generation);
            if observed.unwrap_or(0) < self.d.metadata.generation.unwrap_or(0) {
                self.d
                    .status
                    .get_or_insert_with(Default::default)
                    .observed_generation = self.d.metadata.generation;
                self.update_status().await?;
            }
            return Ok(());
        }
        self.rss = self.claim(in_namespace).await?;
        if self.d.metadata.deletion_timestamp.is_some() {
            let sets = self.get_all_and_sync_revision(false).await?;
            return self.sync_deployment_status(&sets).await;
        }
        self.check_paused_conditions().await?;
        if is_paused(&self.d) || self.is_scaling_event().await? {
            return self.sync_scale().await;
        }
        if is_recreate(&self.d) {
            self.rollout_recreate(&pods).await
        } else {
            self.rollout_rolling().await
        }
    }

    /// Writes the working status; the server's answer becomes the working copy.
    pub(super) async fn update_status(&mut self) -> Result<(), SyncError> {
        let updated = self.w.update_deployment_status(&self.d).await?;
        self.d.metadata = updated.metadata;
        self.d.status = updated.status;
        Ok(())
    }

    /// Sets the Deployment's revision annotation if it differs (Kubernetes'
    /// `SetDeploymentRevision`).
    async fn set_deployment_revision(&mut self, revision: &str) -> Result<(), SyncError> {
        let current = self
            .d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REVISION_ANNOTATION));
        if current.map(String::as_str) == Some(revision) {
            return Ok(());
        }
        let patched = self
            .w
            .set_deployment_annotation(&self.d, REVISION_ANNOTATION, revision)
            .await?;
        self.d.metadata = patched.metadata;
        Ok(())
    }

    /// The new and old ReplicaSets, syncing the new one's revision and annotations; with
    /// `create`, creates the new one if there is none (Kubernetes'
    /// `getAllReplicaSetsAndSyncRevision`).
    pub(super) async fn get_all_and_sync_revision(
        &mut self,
        create: bool,
    ) -> Result<Sets, SyncError> {
        let existing = find_new_replica_set(&self.d, &self.rss);
        let old: Vec<usize> = (0..self.rss.len())
            .filter(|&i| Some(i) != existing)
            .collect();
        let new = self.get_new_replica_set(existing, &old, create).await?;
        Ok(Sets { new, old })
    }

    /// Kubernetes' `getNewReplicaSet`: brings an existing new ReplicaSet's revision (max of
    /// the old ones + 1) and minReadySeconds up to date, or creates it — escaping a hash
    /// collision with the persisted counter.
    async fn get_new_replica_set(
        &mut self,
        existing: Option<usize>,
        old: &[usize],
        create: bool,
    ) -> Result<Option<usize>, SyncError> {
        let new_revision = max_revision(self.refs(old)) + 1;
        let desired = desired_replicas(&self.d);
        let max_replicas = desired + max_surge(&self.d);
        if let Some(i) = existing {
            let mut copy = self.rss[i].clone();
            let annotations_changed = set_new_replica_set_annotations(
                &self.d,
                &mut copy,
                new_revision,
                true,
                desired,
                max_replicas,
            );
            let min_ready = min_ready_seconds(&self.d);
            let min_ready_changed = copy
                .spec
                .as_ref()
                .and_then(|s| s.min_ready_seconds)
                .unwrap_or(0)
                != min_ready;
            if annotations_changed || min_ready_changed {
                copy.spec
                    .get_or_insert_with(Default::default)
                    .min_ready_seconds = Some(min_ready);
                self.rss[i] = self.w.update_replica_set(&copy).await?;
            }
            let revision = self.rss[i]
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REVISION_ANNOTATION))
                .cloned()
                .unwrap_or_default();
            self.set_deployment_revision(&revision).await?;
            let has_progressing = self
                .d
                .status
                .as_ref()
                .and_then(|s| get_condition(s, CONDITION_PROGRESSING))
                .is_some();
            if progress_deadline_seconds(&self.d).is_some() && !has_progressing {
                let message = format!("Found new replica set \"{}\"", name(&self.rss[i].metadata));
                let condition = new_condition(
                    CONDITION_PROGRESSING,
                    "True",
                    REASON_FOUND_NEW_REPLICA_SET,
                    message,
                    &self.now,
                );
                set_condition(
                    self.d.status.get_or_insert_with(Default::default),
                    condition,
                );
                self.update_status().await?;
            }
            return Ok(Some(i));
        }
        if !create {
            return Ok(None);
        }

        let mut rs = self.new_replica_set_object();
        let rs_name = name(&rs.metadata).to_string();
        let size = {
            let mut all = self.refs(old);
            all.push(&rs);
            new_rs_new_replicas(&self.d, &all, &rs)?
        };
        set_replicas(&mut rs, size);
        set_new_replica_set_annotations(
            &self.d,
            &mut rs,
            new_revision,
            false,
            desired,
            max_replicas,
        );

        let (created, already_existed) = match self.w.create_replica_set(&rs).await {
            Ok(created) => (created, false),
            Err(e) if e.is_already_exists() => {
                let namespace = rs.metadata.namespace.clone().unwrap_or_default();
                // Live, not from the cache: the cache may not have the ReplicaSet yet.
                let Some(found) = self.w.get_replica_set(&namespace, &rs_name).await? else {
                    // Deleted in between: the retry will create it.
                    return Err(e.into());
                };
                let ours =
                    controller_of(&found.metadata).is_some_and(|r| r.uid == uid(&self.d.metadata));
                if ours && equal_ignore_hash(&template(&self.d), &rs_template(&found)) {
                    // Our own create from an earlier sync, not yet in the cache.
                    (found, true)
                } else {
                    return Err(self.bump_collision_count(rs_name).await);
                }
            }
            // Every create in a terminating namespace fails; nothing to report or record.
            Err(e) if is_namespace_terminating(&e) => return Err(e.into()),
            Err(e) => {
                let message = format!(
                    "Failed to create new replica set \"{rs_name}\": {}",
                    error_message(&e)
                );
                if progress_deadline_seconds(&self.d).is_some() {
                    let condition = new_condition(
                        CONDITION_PROGRESSING,
                        "False",
                        REASON_REPLICA_SET_CREATE_ERROR,
                        message.clone(),
                        &self.now,
                    );
                    set_condition(
                        self.d.status.get_or_insert_with(Default::default),
                        condition,
                    );
                    if let Err(status_error) = self.update_status().await {
                        tracing::debug!(deployment = %self.key(), error = %status_error, "failed to record the create failure");
                    }
                }
                self.w.record_event(
                    &self.d,
                    EVENT_TYPE_WARNING,
                    REASON_REPLICA_SET_CREATE_ERROR,
                    &message,
                );
                return Err(e.into());
            }
        };
        if !already_existed && size > 0 {
            tracing::info!(deployment = %self.key(), replica_set = %rs_name, replicas = size, "scaled up replica set");
            self.w.record_event(
                &self.d,
                EVENT_TYPE_NORMAL,
                EVENT_REASON_SCALING_REPLICA_SET,
                &format!("Scaled up replica set {rs_name} from 0 to {size}"),
            );
        }
        self.rss.push(created);
        let i = self.rss.len() - 1;
        self.set_deployment_revision(&new_revision.to_string())
            .await?;
        if !already_existed && progress_deadline_seconds(&self.d).is_some() {
            let message = format!("Created new replica set \"{rs_name}\"");
            let condition = new_condition(
                CONDITION_PROGRESSING,
                "True",
                REASON_NEW_REPLICA_SET_CREATED,
                message,
                &self.now,
            );
            set_condition(
                self.d.status.get_or_insert_with(Default::default),
                condition,
            );
            self.update_status().await?;
        }
        Ok(Some(i))
    }

    /// The ReplicaSet for the Deployment's current template: named and labelled with the hash
    /// of (template, collisionCount), selecting on it, owned by the Deployment, at 0 replicas.
    fn new_replica_set_object(&self) -> ReplicaSet {
        let hash = compute_hash(&template(&self.d), collision_count(&self.d));
        let mut pod_template = template(&self.d);
        pod_template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH_LABEL.into(), hash.clone());
        let mut rs_selector = selector(&self.d).cloned().unwrap_or_default();
        rs_selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH_LABEL.into(), hash.clone());
        let labels = pod_template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone());
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(format!("{}-{hash}", name(&self.d.metadata))),
                namespace: self.d.metadata.namespace.clone(),
                labels,
                owner_references: Some(vec![controller_ref(
                    "apps/v1",
                    "Deployment",
                    &self.d.metadata,
                )]),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: Some(min_ready_seconds(&self.d)),
                selector: rs_selector,
                template: Some(pod_template),
            }),
            status: None,
        }
    }

    /// Bumps and persists `status.collisionCount` after `taken` turned out to be someone
    /// else's; returns the error that makes the sync retry with the new name.
    async fn bump_collision_count(&mut self, taken: String) -> SyncError {
        let before = collision_count(&self.d).unwrap_or(0);
        let after = before.saturating_add(1);
        self.d
            .status
            .get_or_insert_with(Default::default)
            .collision_count = Some(after);
        match self.update_status().await {
            Ok(()) => {
                tracing::info!(deployment = %self.key(), replica_set = %taken, before, after, "found a hash collision; bumped collisionCount");
                SyncError::HashCollision {
                    name: taken,
                    collision_count: after,
                }
            }
            Err(e) => e,
        }
    }

    /// Scales the ReplicaSet at `i` to `size`, refreshing its replicas annotations; returns
    /// whether the size changed (Kubernetes' `scaleReplicaSet`).
    pub(super) async fn scale_replica_set(
        &mut self,
        i: usize,
        size: i32,
    ) -> Result<bool, SyncError> {
        let desired = desired_replicas(&self.d);
        let max_replicas = desired + max_surge(&self.d);
        let rs = &self.rss[i];
        let size_changed = replicas(rs) != size;
        if !size_changed && !replicas_annotations_need_update(rs, desired, max_replicas) {
            return Ok(false);
        }
        let before = replicas(rs);
        let mut copy = rs.clone();
        set_replicas(&mut copy, size);
        set_replicas_annotations(&mut copy, desired, max_replicas);
        self.rss[i] = self.w.update_replica_set(&copy).await?;
        if size_changed {
            let direction = if size > before { "up" } else { "down" };
            let rs_name = name(&self.rss[i].metadata).to_string();
            tracing::info!(deployment = %self.key(), replica_set = %rs_name, from = before, to = size, "scaled {direction} replica set");
            self.w.record_event(
                &self.d,
                EVENT_TYPE_NORMAL,
                EVENT_REASON_SCALING_REPLICA_SET,
                &format!("Scaled {direction} replica set {rs_name} from {before} to {size}"),
            );
        }
        Ok(size_changed)
    }

    /// Whether the Deployment's replicas differ from what its active ReplicaSets were last
    /// scaled for (Kubernetes' `isScalingEvent`): a scale is applied at once, even paused.
    async fn is_scaling_event(&mut self) -> Result<bool, SyncError> {
        let sets = self.get_all_and_sync_revision(false).await?;
        let desired = desired_replicas(&self.d);
        Ok(self
            .refs(&sets.all())
            .into_iter()
            .filter(|rs| is_active(rs))
            .any(|rs| {
                int_annotation(rs, DESIRED_REPLICAS_ANNOTATION).is_some_and(|n| n != desired)
            }))
    }

    /// Scaling without a rollout (Kubernetes' `sync`): used when paused or when only
    /// `replicas` changed.
    async fn sync_scale(&mut self) -> Result<(), SyncError> {
        let sets = self.get_all_and_sync_revision(false).await?;
        self.scale(&sets).await?;
        if is_paused(&self.d) {
            self.cleanup(&sets.old).await?;
        }
        self.sync_deployment_status(&sets).await
    }

    /// Kubernetes' `scale`: one active (or the latest) ReplicaSet takes all the replicas; a
    /// saturated new one empties the old ones; otherwise a rolling Deployment scales every
    /// active ReplicaSet in proportion.
    async fn scale(&mut self, sets: &Sets) -> Result<(), SyncError> {
        let desired = desired_replicas(&self.d);
        if let Some(i) = self.active_or_latest(sets) {
            if replicas(&self.rss[i]) != desired {
                self.scale_replica_set(i, desired).await?;
            }
            return Ok(());
        }
        if sets
            .new
            .is_some_and(|n| is_saturated(&self.d, &self.rss[n]))
        {
            for &i in &sets.old {
                if is_active(&self.rss[i]) {
                    self.scale_replica_set(i, 0).await?;
                }
            }
            return Ok(());
        }
        if is_rolling_update(&self.d) {
            let active: Vec<usize> = sets
                .all()
                .into_iter()
                .filter(|&i| is_active(&self.rss[i]))
                .collect();
            let status_replicas = self.d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            let plan: Vec<(String, i32)> =
                proportional_sizes(&self.d, status_replicas, &self.refs(&active))
                    .into_iter()
                    .map(|(rs, size)| (uid(&rs.metadata).to_string(), size))
                    .collect();
            for (rs_uid, size) in plan {
                if let Some(i) = self.rss.iter().position(|rs| uid(&rs.metadata) == rs_uid) {
                    self.scale_replica_set(i, size).await?;
                }
            }
        }
        Ok(())
    }

    /// Kubernetes' `FindActiveOrLatest`: the only active ReplicaSet; with none active, the
    /// new one, else the newest old one; with several active, none.
    fn active_or_latest(&self, sets: &Sets) -> Option<usize> {
        let mut old = sets.old.clone();
        old.sort_by(|&a, &b| by_creation(&self.rss[b], &self.rss[a]));
        let active: Vec<usize> = old
            .iter()
            .copied()
            .chain(sets.new)
            .filter(|&i| is_active(&self.rss[i]))
            .collect();
        match active.as_slice() {
            [] => sets.new.or_else(|| old.first().copied()),
            [only] => Some(*only),
            _ => None,
        }
    }

    /// Deletes old ReplicaSets beyond `revisionHistoryLimit` (Kubernetes' `cleanupDeployment`).
    pub(super) async fn cleanup(&mut self, old: &[usize]) -> Result<(), SyncError> {
        let old_rss: Vec<ReplicaSet> = old.iter().map(|&i| self.rss[i].clone()).collect();
        for j in cleanup_plan(&old_rss, revision_history_limit(&self.d)) {
            let rs = &old_rss[j];
            match self.w.delete_replica_set(rs).await {
                Ok(()) => {
                    tracing::info!(deployment = %self.key(), replica_set = %name(&rs.metadata), "deleted old replica set beyond revisionHistoryLimit");
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Writes the status the ReplicaSets add up to, if it changed (Kubernetes'
    /// `syncDeploymentStatus`).
    pub(super) async fn sync_deployment_status(&mut self, sets: &Sets) -> Result<(), SyncError> {
        let all = self.refs(&sets.all());
        let new_rs = sets.new.map(|i| &self.rss[i]);
        let status = calculate_status(&self.d, &all, new_rs, &self.now);
        if self.d.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.d.status = Some(status);
        self.update_status().await
    }

    /// Writes the status with the `Progressing` condition brought up to date, or, when nothing
    /// changed, asks to be re-queued for the deadline check (Kubernetes' `syncRolloutStatus`).
    pub(super) async fn sync_rollout_status(&mut self, sets: &Sets) -> Result<(), SyncError> {
        let all = self.refs(&sets.all());
        let new_rs = sets.new.map(|i| &self.rss[i]);
        let mut status = calculate_status(&self.d, &all, new_rs, &self.now);
        let deadline = progress_deadline_seconds(&self.d);
        if deadline.is_none() {
            remove_condition(&mut status, CONDITION_PROGRESSING);
        }
        let current = self
            .d
            .status
            .as_ref()
            .and_then(|s| get_condition(s, CONDITION_PROGRESSING))
            .cloned();
        let is_complete = status.replicas == status.updated_replicas
            && current.as_ref().and_then(|c| c.reason.as_deref())
                == Some(REASON_NEW_REPLICA_SET_AVAILABLE);
        let d_name = name(&self.d.metadata).to_string();
        let subject = match new_rs {
            Some(rs) => format!("ReplicaSet \"{}\"", name(&rs.metadata)),
            None => format!("Deployment \"{d_name}\""),
        };
        if deadline.is_some() && !is_complete {
            if deployment_complete(&self.d, &status) {
                let condition = new_condition(
                    CONDITION_PROGRESSING,
                    "True",
                    REASON_NEW_REPLICA_SET_AVAILABLE,
                    format!("{subject} has successfully progressed."),
                    &self.now,
                );
                set_condition(&mut status, condition);
            } else if deployment_progressing(&self.d, &status) {
                let mut condition = new_condition(
                    CONDITION_PROGRESSING,
                    "True",
                    REASON_REPLICA_SET_UPDATED,
                    format!("{subject} is progressing."),
                    &self.now,
                );
                // Progress refreshes lastUpdateTime (the deadline's origin) even when the
                // reason is unchanged, which `set_condition` alone would not.
                if let Some(current) = &current {
                    if current.status == "True" {
                        condition.last_transition_time = current.last_transition_time.clone();
                    }
                    remove_condition(&mut status, CONDITION_PROGRESSING);
                }
                set_condition(&mut status, condition);
            } else if deployment_timed_out(&self.d, &status, &self.now) {
                let condition = new_condition(
                    CONDITION_PROGRESSING,
                    "False",
                    REASON_PROGRESS_DEADLINE_EXCEEDED,
                    format!("{subject} has timed out progressing."),
                    &self.now,
                );
                set_condition(&mut status, condition);
            }
        }
        match replica_failures(&all, new_rs).into_iter().next() {
            Some(failure) => set_condition(&mut status, failure),
            None => remove_condition(&mut status, CONDITION_REPLICA_FAILURE),
        }
        if self.d.status.as_ref() == Some(&status) {
            self.requeue_after = requeue_after(&self.d, &status, &self.now);
            return Ok(());
        }
        self.d.status = Some(status);
        self.update_status().await
    }

    /// Records pause and resume in the `Progressing` condition, unless the rollout already
    /// timed out (Kubernetes' `checkPausedConditions`).
    async fn check_paused_conditions(&mut self) -> Result<(), SyncError> {
        if progress_deadline_seconds(&self.d).is_none() {
            return Ok(());
        }
        let reason = self
            .d
            .status
            .as_ref()
            .and_then(|s| get_condition(s, CONDITION_PROGRESSING))
            .and_then(|c| c.reason.clone());
        if reason.as_deref() == Some(REASON_PROGRESS_DEADLINE_EXCEEDED) {
            return Ok(());
        }
        let paused_recorded = reason.as_deref() == Some(REASON_DEPLOYMENT_PAUSED);
        let condition = match (is_paused(&self.d), paused_recorded) {
            (true, false) => new_condition(
                CONDITION_PROGRESSING,
                "Unknown",
                REASON_DEPLOYMENT_PAUSED,
                "Deployment is paused".into(),
                &self.now,
            ),
            (false, true) => new_condition(
                CONDITION_PROGRESSING,
                "Unknown",
                REASON_DEPLOYMENT_RESUMED,
                "Deployment is resumed".into(),
                &self.now,
            ),
            _ => return Ok(()),
        };
        set_condition(
            self.d.status.get_or_insert_with(Default::default),
            condition,
        );
        self.update_status().await
    }
}

/// Whether the new ReplicaSet holds every replica, was last scaled for this size and has them
/// all available (Kubernetes' `IsSaturated`).
fn is_saturated(d: &Deployment, rs: &ReplicaSet) -> bool {
    let desired = desired_replicas(d);
    replicas(rs) == desired
        && int_annotation(rs, DESIRED_REPLICAS_ANNOTATION) == Some(desired)
        && available_replicas(rs) == desired
}

/// Sum of `status.replicas` (pods that exist).
pub(super) fn sum_status_replicas(rss: &[&ReplicaSet]) -> i32 {
    rss.iter().map(|rs| status_replicas(rs)).sum()
}
