//! The Deployment controller (kube-controller-manager's `pkg/controller/deployment`): rolls a
//! Deployment's pod template out through ReplicaSets, one per template revision.
//!
//! It carries the Deployment hash (`docs/tricks.md` #28): each ReplicaSet is
//! named `<deployment>-<pod-template-hash>`, the hash an FNV-32a of the template safe-encoded
//! into a vowel-free alphabet ([`crate::hash`]), and a name taken by someone else is escaped by
//! bumping the Deployment's persisted `status.collisionCount` ([`sync`]) — never by a random
//! suffix, so a sync acting on a lagging cache re-derives the same name and finds its own
//! earlier create instead of making a second ReplicaSet.
//!
//! Layout, in the order a sync uses them:
//! - [`spec`]: the annotation/condition vocabulary and defaulted field accessors.
//! - [`claim`]: adopting orphan ReplicaSets and releasing ones that stopped matching.
//! - [`history`]: new vs old ReplicaSets, revisions, revision history, cleanup.
//! - [`rolling`] / [`recreate`]: the two strategies, arithmetic kept pure.
//! - [`progress`]: status, `Available`/`Progressing` conditions, the progress deadline.
//! - [`sync`]: one sync over a snapshot and a [`sync::Writes`]; [`ApiWrites`] is the real one.
//!
//! Rollback needs no code here: `kubectl rollout undo` (1.32) copies the old ReplicaSet's
//! template back into the Deployment with a JSON patch, and [`history::find_new_replica_set`]
//! then finds that ReplicaSet by template equality (ignoring the hash label) and gives it the
//! next revision.
//!
//! Events: the sync records what it did on the Deployment (`ScalingReplicaSet`,
//! `ReplicaSetCreateError`, `SelectingAll`; see [`sync`]) through an [`EventRecorder`] writing
//! with the controller's own client under the component [`EVENT_COMPONENT`], so `kubectl
//! describe deployment` lists them as on Kubernetes.
//!
//! What starts a sync: any change to a Deployment; a ReplicaSet event, routed to its
//! controlling Deployment (or, for an orphan, to every Deployment whose selector matches it,
//! so one can adopt it); a pod deletion under a Recreate Deployment (the new ReplicaSet waits
//! for the old pods to be gone); and the progress-deadline re-check a sync asks for.

pub mod claim;
pub mod history;
pub mod progress;
pub mod recreate;
pub mod rolling;
pub mod spec;
pub mod sync;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use skerry_client::cache::Indexer;
use skerry_client::events::{EventRecorder, object_reference};
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, DeleteParams, Error, PostParams};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::Context;
use crate::podcontrol::event_recorder;
use crate::runtime::{self, Reconciler};
use crate::util::{controller_of, key, split_key};
use spec::{is_recreate, selector, selector_is_empty, selects, uid};
pub use sync::{Snapshot, SyncError, SyncOutcome, Writes, sync_deployment};

/// Workers syncing Deployments at once (kube-controller-manager's
/// `--concurrent-deployment-syncs` default): a key is never synced by two at once, so this
/// only bounds how many different Deployments progress in parallel.
pub const DEFAULT_WORKERS: usize = 5;

/// The workqueue's name (its metrics' `name` label), as in kube-controller-manager.
const QUEUE_NAME: &str = "deployment";

/// The `source.component` of this controller's events, as kube-controller-manager names it
/// (what `kubectl describe` prints in the "From" column).
pub const EVENT_COMPONENT: &str = "deployment-controller";

/// The controller: three shared informers' caches, a queue of `namespace/name` keys, and a
/// client for writes.
pub struct DeploymentController {
    deployment_informer: SharedInformer<Deployment>,
    replica_set_informer: SharedInformer<ReplicaSet>,
    pod_informer: SharedInformer<Pod>,
    deployments: Indexer<Deployment>,
    replica_sets: Indexer<ReplicaSet>,
    pods: Indexer<Pod>,
    queue: WorkQueue<String>,
    writes: ApiWrites,
}

impl DeploymentController {
    /// Gets the shared informers and registers the event handlers that enqueue Deployments;
    /// writes (objects and events) go through `ctx.client`, the controller's own identity.
    pub fn new(ctx: &Context) -> Arc<DeploymentController> {
        let deployment_informer = ctx.informers.informer::<Deployment>();
        let replica_set_informer = ctx.informers.informer::<ReplicaSet>();
        let pod_informer = ctx.informers.informer::<Pod>();
        let queue = WorkQueue::new(QUEUE_NAME);
        let deployments = deployment_informer.store();
        let replica_sets = replica_set_informer.store();
        deployment_informer.add_handler(DeploymentEvents {
            queue: queue.clone(),
        });
        replica_set_informer.add_handler(ReplicaSetEvents {
            queue: queue.clone(),
            deployments: deployments.clone(),
        });
        pod_informer.add_handler(PodEvents {
            queue: queue.clone(),
            deployments: deployments.clone(),
            replica_sets: replica_sets.clone(),
        });
        Arc::new(DeploymentController {
            pods: pod_informer.store(),
            deployment_informer,
            replica_set_informer,
            pod_informer,
            deployments,
            replica_sets,
            queue,
            writes: ApiWrites {
                client: ctx.client.clone(),
                recorder: event_recorder(&ctx.client, EVENT_COMPONENT),
            },
        })
    }

    /// Waits until the events recorded so far are written (tests and graceful shutdown).
    pub async fn flush_events(&self) {
        if let Some(recorder) = &self.writes.recorder {
            recorder.flush().await;
        }
    }

    /// Waits for the caches, then syncs with `workers` workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        let synced = self.deployment_informer.wait_for_sync(&stop).await
            && self.replica_set_informer.wait_for_sync(&stop).await
            && self.pod_informer.wait_for_sync(&stop).await;
        if !synced {
            tracing::info!("deployment controller stopped before its caches synced");
            return;
        }
        tracing::info!(workers, "deployment controller started");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }
}

impl Reconciler for DeploymentController {
    fn name(&self) -> &'static str {
        "deployment"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        let (namespace, name) = split_key(key);
        let Some(deployment) = self.deployments.get_by(namespace, name) else {
            tracing::debug!(deployment = %key, "deployment has been deleted");
            return Ok(());
        };
        let pods = if is_recreate(&deployment) {
            self.pods
                .list_namespace(namespace)
                .iter()
                .map(|p| (**p).clone())
                .collect()
        } else {
            Vec::new()
        };
        let snapshot = Snapshot {
            deployment: (*deployment).clone(),
            replica_sets: self
                .replica_sets
                .list_namespace(namespace)
                .iter()
                .map(|rs| (**rs).clone())
                .collect(),
            pods,
        };
        let outcome = sync_deployment(&self.writes, snapshot, crate::util::now())
            .instrument(tracing::debug_span!("sync", deployment = %key))
            .await?;
        if let Some(after) = outcome.requeue_after {
            self.queue.add_after(key.to_string(), after);
        }
        Ok(())
    }
}

/// The Deployment controlling an object, by its controller reference (Kubernetes'
/// `resolveControllerRef`): the kind must be Deployment and the uid must match the cached
/// Deployment of that name, or the reference is to a deleted predecessor.
fn resolve_controller_ref(
    deployments: &Indexer<Deployment>,
    namespace: &str,
    owner: &OwnerReference,
) -> Option<Arc<Deployment>> {
    if owner.kind != "Deployment" {
        return None;
    }
    deployments
        .get_by(namespace, &owner.name)
        .filter(|d| uid(&d.metadata) == owner.uid)
}

/// Enqueues every Deployment change.
struct DeploymentEvents {
    queue: WorkQueue<String>,
}

impl EventHandler<Deployment> for DeploymentEvents {
    fn on_add(&self, obj: &Arc<Deployment>, _is_initial_list: bool) {
        self.queue.add(key(&obj.metadata));
    }
    fn on_update(&self, _old: &Arc<Deployment>, new: &Arc<Deployment>) {
        self.queue.add(key(&new.metadata));
    }
    fn on_delete(&self, obj: &Deleted<Deployment>) {
        self.queue.add(key(&obj.object().metadata));
    }
}

/// Routes ReplicaSet events to Deployments (Kubernetes' `addReplicaSet`, `updateReplicaSet`,
/// `deleteReplicaSet`).
struct ReplicaSetEvents {
    queue: WorkQueue<String>,
    deployments: Indexer<Deployment>,
}

impl ReplicaSetEvents {
    fn enqueue_owner(&self, rs: &ReplicaSet, owner: &OwnerReference) {
        let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
        if let Some(d) = resolve_controller_ref(&self.deployments, namespace, owner) {
            self.queue.add(key(&d.metadata));
        }
    }

    /// An orphan: every Deployment whose (non-empty) selector matches it, so one can adopt it.
    fn enqueue_matching(&self, rs: &ReplicaSet) {
        let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
        for d in self.deployments.list_namespace(namespace) {
            if let Some(sel) = selector(&d).filter(|s| !selector_is_empty(s))
                && selects(sel, &rs.metadata)
            {
                self.queue.add(key(&d.metadata));
            }
        }
    }
}

impl EventHandler<ReplicaSet> for ReplicaSetEvents {
    fn on_add(&self, rs: &Arc<ReplicaSet>, _is_initial_list: bool) {
        match controller_of(&rs.metadata) {
            Some(owner) => self.enqueue_owner(rs, owner),
            // An orphan being deleted interests nobody.
            None if rs.metadata.deletion_timestamp.is_some() => {}
            None => self.enqueue_matching(rs),
        }
    }

    fn on_update(&self, old: &Arc<ReplicaSet>, new: &Arc<ReplicaSet>) {
        if old.metadata.resource_version == new.metadata.resource_version {
            // A resync: the Deployment's own resync covers it.
            return;
        }
        let old_owner = controller_of(&old.metadata);
        let new_owner = controller_of(&new.metadata);
        let owner_changed = old_owner != new_owner;
        if owner_changed && let Some(owner) = old_owner {
            self.enqueue_owner(old, owner);
        }
        if let Some(owner) = new_owner {
            self.enqueue_owner(new, owner);
            return;
        }
        if owner_changed || old.metadata.labels != new.metadata.labels {
            self.enqueue_matching(new);
        }
    }

    fn on_delete(&self, obj: &Deleted<ReplicaSet>) {
        let rs = obj.object();
        if let Some(owner) = controller_of(&rs.metadata) {
            self.enqueue_owner(rs, owner);
        }
    }
}

/// A Recreate Deployment waits for its old pods to be gone: their deletions wake it
/// (Kubernetes' `deletePod`).
struct PodEvents {
    queue: WorkQueue<String>,
    deployments: Indexer<Deployment>,
    replica_sets: Indexer<ReplicaSet>,
}

impl EventHandler<Pod> for PodEvents {
    fn on_add(&self, _obj: &Arc<Pod>, _is_initial_list: bool) {}
    fn on_update(&self, _old: &Arc<Pod>, _new: &Arc<Pod>) {}
    fn on_delete(&self, obj: &Deleted<Pod>) {
        let pod = obj.object();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some(rs_ref) = controller_of(&pod.metadata).filter(|r| r.kind == "ReplicaSet") else {
            return;
        };
        let Some(rs) = self
            .replica_sets
            .get_by(namespace, &rs_ref.name)
            .filter(|rs| uid(&rs.metadata) == rs_ref.uid)
        else {
            return;
        };
        let Some(d_ref) = controller_of(&rs.metadata) else {
            return;
        };
        if let Some(d) = resolve_controller_ref(&self.deployments, namespace, d_ref)
            && is_recreate(&d)
        {
            self.queue.add(key(&d.metadata));
        }
    }
}

/// [`Writes`] over the apiserver, events through an optional [`EventRecorder`].
#[derive(Clone)]
pub struct ApiWrites {
    client: Client,
    recorder: Option<EventRecorder>,
}

impl ApiWrites {
    /// Writes through `client`, recording no events.
    pub fn new(client: Client) -> ApiWrites {
        ApiWrites {
            client,
            recorder: None,
        }
    }

    /// Writes through `client`, events through `recorder`.
    pub fn with_recorder(client: Client, recorder: EventRecorder) -> ApiWrites {
        ApiWrites {
            client,
            recorder: Some(recorder),
        }
    }
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.namespace.as_deref()
}

impl Writes for ApiWrites {
    async fn create_replica_set(&self, rs: &ReplicaSet) -> Result<ReplicaSet, Error> {
        self.client
            .api::<ReplicaSet>(namespace_of(&rs.metadata))
            .create(&PostParams::default(), rs)
            .await
    }

    async fn get_replica_set(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ReplicaSet>, Error> {
        self.client
            .api::<ReplicaSet>(Some(namespace))
            .get_opt(name)
            .await
    }

    async fn update_replica_set(&self, rs: &ReplicaSet) -> Result<ReplicaSet, Error> {
        self.client
            .api::<ReplicaSet>(namespace_of(&rs.metadata))
            .replace(spec::name(&rs.metadata), &PostParams::default(), rs)
            .await
    }

    async fn delete_replica_set(&self, rs: &ReplicaSet) -> Result<(), Error> {
        let params = DeleteParams {
            // Never delete a same-named successor of the ReplicaSet we decided about.
            precondition_uid: rs.metadata.uid.clone(),
            ..Default::default()
        };
        self.client
            .api::<ReplicaSet>(namespace_of(&rs.metadata))
            .delete(spec::name(&rs.metadata), &params)
            .await
            .map(|_| ())
    }

    async fn get_deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Deployment>, Error> {
        self.client
            .api::<Deployment>(Some(namespace))
            .get_opt(name)
            .await
    }

    async fn update_deployment_status(&self, d: &Deployment) -> Result<Deployment, Error> {
        self.client
            .api::<Deployment>(namespace_of(&d.metadata))
            .replace_status(spec::name(&d.metadata), &PostParams::default(), d)
            .await
    }

    async fn set_deployment_annotation(
        &self,
        d: &Deployment,
        key: &str,
        value: &str,
    ) -> Result<Deployment, Error> {
        // An update with the cached resourceVersion, as Kubernetes' controller does: its
        // role (`system:controller:deployment-controller`) may update Deployments, not patch
        // them, and a conflict just re-queues the sync.
        let mut updated = d.clone();
        updated
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_string(), value.to_string());
        self.client
            .api::<Deployment>(namespace_of(&d.metadata))
            .replace(spec::name(&d.metadata), &PostParams::default(), &updated)
            .await
    }

    fn record_event(&self, d: &Deployment, type_: &str, reason: &str, message: &str) {
        if let Some(recorder) = &self.recorder {
            recorder.event(&object_reference(d), type_, reason, message);
        }
    }
}
