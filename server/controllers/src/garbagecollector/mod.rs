//! The garbage collector (kube-controller-manager's `pkg/controller/garbagecollector`):
//! deletes objects whose owners are gone, and carries out foreground and orphan deletion.
//! It carries `docs/tricks.md` #29, the garbage collector's solid / dangling / waiting and
//! the foreground cycle breaker.
//!
//! # Layout
//! - Monitors: one **metadata-only** informer (`as=PartialObjectMetadata`) per resource that
//!   can be listed, watched and deleted ([`monitored_resources`]). The collector needs only
//!   owner references, finalizers and deletion timestamps, and it watches *everything*; a
//!   collector that watched full objects would hold every object of the cluster in memory.
//! - [`graph`]: the dependency graph, built by one task from the monitors' events in order,
//!   with virtual nodes for owners referenced but not yet observed. It feeds two workqueues:
//!   attemptToDelete and attemptToOrphan.
//! - [`classify`]: the three buckets, decided by a **live** GET of each owner (the graph can
//!   lag the apiserver), and the pure decisions that follow, including the cycle breaker.
//! - [`patches`]: the writes as patch bodies.
//!
//! Propagation, as the apiserver's DELETE sets it up:
//! - background: the owner is gone; its dependents' references now dangle, and they are
//!   deleted;
//! - foreground (`foregroundDeletion` finalizer): the owner's dependents are deleted, and once
//!   no dependent with `blockOwnerDeletion: true` remains the finalizer is removed;
//! - orphan (`orphan` finalizer): the owner's reference is removed from every dependent, then
//!   the finalizer.
//!
//! Every delete carries a UID precondition (and a resourceVersion one, dropped if only
//! unrelated fields changed), so a new object that reuses a name is never collected for its
//! predecessor's sake.

pub mod classify;
pub mod graph;
pub mod patches;

use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;
use skerry_api::ResourceInfo;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::retry::{Backoff, DEFAULT_BACKOFF, on_error};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{ApiResource, Client, DeleteParams, PartialObjectMetadata, Patch, PatchParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::{Context, DEFAULT_RESYNC};
use classify::{
    ClassifyError, Decision, DeletingDependentsDecision, OwnerLookup, Propagation,
    classify_references, decide, deleting_dependents_decision, resource_of,
};
use graph::{
    ABSENT_OWNER_CACHE_ENTRIES_MAX, AbsentOwnerCache, Effect, EventType, FINALIZER_FOREGROUND,
    FINALIZER_ORPHAN, Graph, GraphEvent, Identity, NodeView, ObjectState,
};

/// Resources the collector never watches: Events are the most numerous objects of a
/// cluster, never own anything and expire on their own (kube-controller-manager's
/// `DefaultIgnoredResources`).
pub const IGNORED_RESOURCES: &[(&str, &str)] = &[("", "events"), ("events.k8s.io", "events")];

/// The schedule of removing a finalizer whose object changes under the patch: client-go's
/// `retry.DefaultBackoff` (four runs, 10 / 50 / 250 ms apart), which Kubernetes'
/// `removeFinalizer` retries with. After that the item goes back to its queue with backoff.
pub const FINALIZER_PATCH_BACKOFF: Backoff = DEFAULT_BACKOFF;

/// The workers of each queue when the caller asks for none: kube-controller-manager's
/// `--concurrent-gc-syncs` default is 20; a three-box cluster has far fewer objects.
pub const DEFAULT_WORKERS: usize = 5;

/// The resources the collector monitors: every served resource that can be listed,
/// watched and deleted, except [`IGNORED_RESOURCES`].
pub fn monitored_resources() -> Vec<&'static ResourceInfo> {
    skerry_api::catalogue::RESOURCES
        .iter()
        .filter(|r| {
            ["list", "watch", "delete", "get"]
                .iter()
                .all(|v| r.has_verb(v))
        })
        .filter(|r| !IGNORED_RESOURCES.contains(&(r.group, r.resource)))
        .collect()
}

/// The client's name for a served resource.
pub fn api_resource(resource: &ResourceInfo) -> ApiResource {
    ApiResource {
        group: resource.group.to_string(),
        version: resource.version.to_string(),
        plural: resource.resource.to_string(),
        kind: resource.kind.to_string(),
        namespaced: resource.namespaced,
    }
}

/// One metadata-only informer.
struct Monitor {
    resource: &'static ResourceInfo,
    informer: SharedInformer<PartialObjectMetadata>,
}

/// Why one attempt on an item failed (the item is retried with backoff unless said
/// otherwise).
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error(transparent)]
    Classify(#[from] ClassifyError),
    #[error("{verb} {item}")]
    Api {
        verb: &'static str,
        item: String,
        #[source]
        source: skerry_client::Error,
    },
    #[error("{item} kept changing while its {finalizer} finalizer was removed")]
    FinalizerConflict {
        item: String,
        finalizer: &'static str,
    },
}

/// What a worker does with an item once an attempt is over.
#[derive(Debug, PartialEq, Eq)]
enum WorkerAction {
    Forget,
    Requeue,
}

/// What an attempt on an item came to, when it did not fail.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Done,
    /// The item does not exist; a virtual delete event went to the graph builder, which
    /// takes it from there.
    VirtualDeleteEnqueued,
}

/// The garbage collector.
pub struct GarbageCollector {
    client: Client,
    monitors: Vec<Monitor>,
    /// The graph: written only by the graph-builder task, read by the workers. A
    /// `parking_lot::Mutex` because every critical section is a few map operations and none
    /// holds it across an `.await`.
    graph: Arc<Mutex<Graph>>,
    /// Owners verified absent, shared by the builder (which records deleted owners) and the
    /// workers (which consult and fill it). Same kind of lock, same reason.
    absent: Arc<Mutex<AbsentOwnerCache>>,
    attempt_to_delete: WorkQueue<Identity>,
    attempt_to_orphan: WorkQueue<Identity>,
    /// Graph changes, from the monitors' handlers and the workers' virtual deletes, to the
    /// one builder task. Unbounded on purpose: the informers' handler rings before it are
    /// unbounded already (a bound here would only move the backlog into them, or block a
    /// synchronous handler), and the builder's work per event is a few map operations.
    changes: mpsc::UnboundedSender<GraphEvent>,
    changes_receiver: Mutex<Option<mpsc::UnboundedReceiver<GraphEvent>>>,
}

/// Turns a monitor's notifications into graph events.
struct MonitorHandler {
    resource: &'static ResourceInfo,
    changes: mpsc::UnboundedSender<GraphEvent>,
}

impl MonitorHandler {
    fn state(&self, object: &PartialObjectMetadata) -> ObjectState {
        // A PartialObjectMetadata says `meta.k8s.io/v1 PartialObjectMetadata`; the object's
        // own coordinates are the monitor's resource's.
        ObjectState::from_meta(
            &self.resource.api_version(),
            self.resource.kind,
            &object.metadata,
        )
    }

    fn send(&self, event: GraphEvent) {
        // Fails only once the builder has stopped, at shutdown.
        let _ = self.changes.send(event);
    }
}

impl EventHandler<PartialObjectMetadata> for MonitorHandler {
    fn on_add(&self, obj: &Arc<PartialObjectMetadata>, _is_initial_list: bool) {
        self.send(GraphEvent::observed(EventType::Add, self.state(obj), None));
    }

    fn on_update(&self, old: &Arc<PartialObjectMetadata>, new: &Arc<PartialObjectMetadata>) {
        self.send(GraphEvent::observed(
            EventType::Update,
            self.state(new),
            Some(self.state(old)),
        ));
    }

    fn on_delete(&self, obj: &Deleted<PartialObjectMetadata>) {
        self.send(GraphEvent::observed(
            EventType::Delete,
            self.state(obj.object()),
            None,
        ));
    }
}

/// Owner lookups against the apiserver, through the metadata-only API.
struct LiveLookup {
    client: Client,
}

impl OwnerLookup for LiveLookup {
    async fn get_meta(
        &self,
        resource: &'static ResourceInfo,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<ObjectMeta>, skerry_client::Error> {
        let api = self.client.metadata(api_resource(resource), namespace);
        match api.get(name).await {
            Ok(object) => Ok(Some(object.metadata)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl GarbageCollector {
    /// A collector over `ctx`'s client, with one metadata informer per monitored resource
    /// (its own, not the factory's: they are keyed by resource, not by Rust type). Started
    /// by [`GarbageCollector::run`].
    pub fn new(ctx: &Context) -> Arc<GarbageCollector> {
        let (changes, receiver) = mpsc::unbounded_channel();
        let monitors = monitored_resources()
            .into_iter()
            .map(|resource| {
                let informer = SharedInformer::new(
                    ctx.client.metadata(api_resource(resource), None),
                    Some(DEFAULT_RESYNC),
                );
                informer.add_handler(MonitorHandler {
                    resource,
                    changes: changes.clone(),
                });
                Monitor { resource, informer }
            })
            .collect();
        Arc::new(GarbageCollector {
            client: ctx.client.clone(),
            monitors,
            graph: Arc::new(Mutex::new(Graph::new())),
            absent: Arc::new(Mutex::new(AbsentOwnerCache::new(
                ABSENT_OWNER_CACHE_ENTRIES_MAX,
            ))),
            attempt_to_delete: WorkQueue::new("garbage_collector_attempt_to_delete"),
            attempt_to_orphan: WorkQueue::new("garbage_collector_attempt_to_orphan"),
            changes,
            changes_receiver: Mutex::new(Some(receiver)),
        })
    }

    /// Starts the monitors and the graph builder, waits for every monitor's first list,
    /// then runs `workers` workers on each queue until `stop`. Runs once; a second call
    /// returns at once.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        let Some(receiver) = self.changes_receiver.lock().take() else {
            tracing::warn!("garbage collector already running");
            return;
        };
        let builder = tokio::spawn(self.clone().run_graph_builder(receiver, stop.clone()));
        for monitor in &self.monitors {
            monitor.informer.run(stop.clone());
        }
        let synced = join_all(
            self.monitors
                .iter()
                .map(|m| m.informer.wait_for_sync(&stop)),
        )
        .await;
        if synced.iter().any(|s| !s) {
            // Stopped before every monitor listed.
            let _ = builder.await;
            return;
        }
        tracing::info!(
            monitors = self.monitors.len(),
            "garbage collector: all resource monitors have synced; collecting garbage"
        );
        let workers = if workers == 0 {
            DEFAULT_WORKERS
        } else {
            workers
        };
        let mut tasks = Vec::with_capacity(2 * workers);
        for _ in 0..workers {
            tasks.push(tokio::spawn(self.clone().run_delete_worker()));
            tasks.push(tokio::spawn(self.clone().run_orphan_worker()));
        }
        stop.cancelled().await;
        self.attempt_to_delete.shut_down_with_drain().await;
        self.attempt_to_orphan.shut_down_with_drain().await;
        for task in tasks {
            let _ = task.await;
        }
        let _ = builder.await;
    }

    /// The resources watched.
    pub fn monitored(&self) -> Vec<&'static ResourceInfo> {
        self.monitors.iter().map(|m| m.resource).collect()
    }

    /// Nodes in the graph (virtual ones included).
    pub fn graph_len(&self) -> usize {
        self.graph.lock().len()
    }

    /// The graph builder: applies graph changes in order, one at a time.
    async fn run_graph_builder(
        self: Arc<Self>,
        mut receiver: mpsc::UnboundedReceiver<GraphEvent>,
        stop: CancellationToken,
    ) {
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = receiver.recv() => match event {
                    Some(event) => event,
                    None => return,
                },
            };
            let effects = self.graph.lock().process(event);
            self.apply(effects);
        }
    }

    fn apply(&self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::AttemptToDelete(identity) => self.attempt_to_delete.add(identity),
                Effect::AttemptToDeleteRateLimited(identity) => {
                    self.attempt_to_delete.add_rate_limited(identity)
                }
                Effect::AttemptToOrphan(identity) => self.attempt_to_orphan.add(identity),
                Effect::Absent(identity) => self.absent.lock().add(identity),
            }
        }
    }

    async fn run_delete_worker(self: Arc<Self>) {
        while let Some(item) = self.attempt_to_delete.get().await {
            let span = tracing::debug_span!("attempt_to_delete", item = %item);
            let action = self.attempt_to_delete_worker(&item).instrument(span).await;
            finish(&self.attempt_to_delete, item, action);
        }
    }

    async fn run_orphan_worker(self: Arc<Self>) {
        while let Some(owner) = self.attempt_to_orphan.get().await {
            let span = tracing::debug_span!("attempt_to_orphan", owner = %owner);
            let action = match self.attempt_to_orphan_item(&owner).instrument(span).await {
                Ok(()) => WorkerAction::Forget,
                Err(e) => {
                    tracing::warn!(owner = %owner, error = %e, "orphaning dependents failed; retrying");
                    WorkerAction::Requeue
                }
            };
            finish(&self.attempt_to_orphan, owner, action);
        }
    }

    /// Kubernetes' `attemptToDeleteWorker`.
    async fn attempt_to_delete_worker(&self, item: &Identity) -> WorkerAction {
        let Some(view) = self.graph.lock().view(&item.uid) else {
            // Left the graph since it was queued (its deletion was observed).
            return WorkerAction::Forget;
        };
        match self.attempt_to_delete_item(&view).await {
            Ok(Outcome::VirtualDeleteEnqueued) => WorkerAction::Forget,
            Ok(Outcome::Done) => {
                // A virtual node is polled until an informer reports it or a GET proves it
                // absent: one added and removed while a watch was down would otherwise stay
                // in the graph forever (kubernetes#56121).
                let observed = self.graph.lock().node(&item.uid).is_none_or(|n| n.observed);
                if observed {
                    WorkerAction::Forget
                } else {
                    WorkerAction::Requeue
                }
            }
            Err(AttemptError::Classify(
                e @ ClassifyError::NamespacedOwnerOfClusterScopedObject(_),
            )) => {
                tracing::warn!(error = %e, "invalid owner reference; not retried");
                WorkerAction::Forget
            }
            Err(e) => {
                tracing::debug!(error = %e, "attempt to delete failed; retrying");
                WorkerAction::Requeue
            }
        }
    }

    /// Kubernetes' `attemptToDeleteItem`.
    async fn attempt_to_delete_item(&self, view: &NodeView) -> Result<Outcome, AttemptError> {
        let item = &view.node;
        if item.being_deleted && !item.deleting_dependents {
            // Deletion is a one-way trip: wait for the object to go, then its dependents
            // are looked at.
            return Ok(Outcome::Done);
        }
        let latest = match self.get_object(&item.identity).await? {
            Some(latest) if latest.uid.as_deref() == Some(item.identity.uid.as_str()) => latest,
            // Gone, or a new object has the name: tell the graph builder.
            _ => {
                let _ = self
                    .changes
                    .send(GraphEvent::virtual_delete(item.identity.clone()));
                return Ok(Outcome::VirtualDeleteEnqueued);
            }
        };
        if item.deleting_dependents {
            return self.process_deleting_dependents(view, &latest).await;
        }
        let references = latest.owner_references.clone().unwrap_or_default();
        if references.is_empty() {
            return Ok(Outcome::Done);
        }
        let namespace = latest.namespace.clone().unwrap_or_default();
        let lookup = LiveLookup {
            client: self.client.clone(),
        };
        let classification =
            classify_references(&namespace, &references, &lookup, &self.absent).await?;
        let decision = decide(view, &latest, &classification);
        tracing::debug!(?classification, ?decision, "classified owner references");
        match decision {
            Decision::Keep => {}
            Decision::RemoveReferences(owner_uids) => {
                let patch = patches::remove_owner_references(&item.identity.uid, &owner_uids);
                self.patch(
                    &item.identity,
                    Patch::Strategic(patch),
                    "remove owner references",
                )
                .await?;
            }
            Decision::Delete {
                propagation,
                unblock_first,
            } => {
                if unblock_first {
                    tracing::info!(
                        item = %item.identity,
                        "an owner and a dependent of the item are in foreground deletion; \
                         unblocking its owner references to prevent a cycle"
                    );
                    if let Some(patch) =
                        patches::unblock_owner_references(&item.identity.uid, &references, |_| true)
                    {
                        self.patch(&item.identity, Patch::Strategic(patch), "unblock owners")
                            .await?;
                    }
                }
                tracing::info!(item = %item.identity, policy = propagation.as_str(), "deleting");
                self.delete_object(&item.identity, &latest, propagation)
                    .await?;
            }
        }
        Ok(Outcome::Done)
    }

    /// Kubernetes' `processDeletingDependentsItem`, with the cycle breaker.
    async fn process_deleting_dependents(
        &self,
        view: &NodeView,
        latest: &ObjectMeta,
    ) -> Result<Outcome, AttemptError> {
        let identity = &view.node.identity;
        match deleting_dependents_decision(view) {
            DeletingDependentsDecision::RemoveFinalizer => {
                tracing::info!(item = %identity, "no blocking dependent left; removing foregroundDeletion");
                self.remove_finalizer(identity, FINALIZER_FOREGROUND)
                    .await?;
            }
            DeletingDependentsDecision::Wait(enqueue) => {
                for dependent in enqueue {
                    self.attempt_to_delete.add(dependent);
                }
            }
            DeletingDependentsDecision::BreakCycle { unblock, enqueue } => {
                tracing::info!(
                    item = %identity,
                    owners = ?unblock,
                    "items in foreground deletion block each other; unblocking the item's owners"
                );
                let references = latest.owner_references.as_deref().unwrap_or_default();
                if let Some(patch) =
                    patches::unblock_owner_references(&identity.uid, references, |uid| {
                        unblock.iter().any(|u| u == uid)
                    })
                {
                    self.patch(identity, Patch::Strategic(patch), "unblock owners")
                        .await?;
                }
                for dependent in enqueue {
                    self.attempt_to_delete.add(dependent);
                }
            }
        }
        Ok(Outcome::Done)
    }

    /// Kubernetes' `attemptToOrphanWorker`: removes the owner's reference from each of its
    /// dependents, then the `orphan` finalizer.
    async fn attempt_to_orphan_item(&self, owner: &Identity) -> Result<(), AttemptError> {
        let dependents: Vec<Identity> = self
            .graph
            .lock()
            .view(&owner.uid)
            .map(|v| v.dependents.into_iter().map(|d| d.identity).collect())
            .unwrap_or_default();
        let owner_uids = [owner.uid.clone()];
        let results = join_all(dependents.iter().map(|dependent| {
            let patch = patches::remove_owner_references(&dependent.uid, &owner_uids);
            self.patch(dependent, Patch::Strategic(patch), "orphan")
        }))
        .await;
        for result in results {
            match result {
                Ok(()) => {}
                Err(AttemptError::Api { ref source, .. }) if source.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        self.remove_finalizer(owner, FINALIZER_ORPHAN).await
    }

    /// The metadata API of an item's resource and namespace.
    fn api_for(&self, identity: &Identity) -> Result<skerry_client::MetadataApi, AttemptError> {
        let resource = resource_of(&identity.api_version, &identity.kind).ok_or_else(|| {
            ClassifyError::UnknownKind {
                api_version: identity.api_version.clone(),
                kind: identity.kind.clone(),
            }
        })?;
        let namespace = if resource.namespaced {
            if identity.namespace.is_empty() {
                // Only a cluster-scoped dependent can have named a namespaced owner without
                // a namespace.
                return Err(ClassifyError::NamespacedOwnerOfClusterScopedObject(
                    identity.to_string(),
                )
                .into());
            }
            Some(identity.namespace.as_str())
        } else {
            None
        };
        Ok(self.client.metadata(api_resource(resource), namespace))
    }

    /// A live GET of the item (Kubernetes' `getObject`): `None` on 404.
    async fn get_object(&self, identity: &Identity) -> Result<Option<ObjectMeta>, AttemptError> {
        match self.api_for(identity)?.get(&identity.name).await {
            Ok(object) => Ok(Some(object.metadata)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(source) => Err(AttemptError::Api {
                verb: "get",
                item: identity.to_string(),
                source,
            }),
        }
    }

    async fn patch(
        &self,
        identity: &Identity,
        patch: Patch,
        verb: &'static str,
    ) -> Result<(), AttemptError> {
        self.api_for(identity)?
            .patch(&identity.name, &PatchParams::default(), &patch)
            .await
            .map(drop)
            .map_err(|source| AttemptError::Api {
                verb,
                item: identity.to_string(),
                source,
            })
    }

    /// Kubernetes' `deleteObject`: a DELETE with UID and resourceVersion preconditions; on
    /// a conflict, if only fields other than the owner references changed, again without
    /// the resourceVersion (so that busy objects are not starved of collection).
    async fn delete_object(
        &self,
        identity: &Identity,
        latest: &ObjectMeta,
        propagation: Propagation,
    ) -> Result<(), AttemptError> {
        let api = self.api_for(identity)?;
        let mut params = DeleteParams {
            propagation_policy: Some(propagation.as_str().to_string()),
            precondition_uid: Some(identity.uid.clone()),
            precondition_resource_version: latest.resource_version.clone(),
            ..DeleteParams::default()
        };
        let api_error = |source| AttemptError::Api {
            verb: "delete",
            item: identity.to_string(),
            source,
        };
        match api.delete(&identity.name, &params).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) if e.is_conflict() && params.precondition_resource_version.is_some() => {
                let live = match api.get(&identity.name).await {
                    Ok(live) => live.metadata,
                    Err(e) if e.is_not_found() => return Ok(()),
                    Err(e) => return Err(api_error(e)),
                };
                let unrelated_change = live.uid == latest.uid
                    && live.resource_version != latest.resource_version
                    && live.owner_references == latest.owner_references;
                if !unrelated_change {
                    return Err(api_error(e));
                }
                params.precondition_resource_version = None;
                match api.delete(&identity.name, &params).await {
                    Ok(()) => Ok(()),
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(api_error(e)),
                }
            }
            Err(e) => Err(api_error(e)),
        }
    }

    /// Kubernetes' `removeFinalizer`: read, drop the finalizer with a patch that tests what
    /// was read, and read again if the object changed meanwhile.
    async fn remove_finalizer(
        &self,
        identity: &Identity,
        finalizer: &'static str,
    ) -> Result<(), AttemptError> {
        // A failed `test` (422) or a write conflict: the object changed; read again.
        let changed = |e: &AttemptError| {
            matches!(e, AttemptError::Api { verb: REMOVE_FINALIZER, source, .. }
                if source.is_conflict() || source.code() == Some(422))
        };
        on_error(FINALIZER_PATCH_BACKOFF, changed, || async {
            let Some(live) = self.get_object(identity).await? else {
                return Ok(());
            };
            if live.uid.as_deref() != Some(identity.uid.as_str()) {
                // Another object has the name now; ours is gone.
                return Ok(());
            }
            let current = live.finalizers.unwrap_or_default();
            let Some(patch) = patches::remove_finalizer(&identity.uid, &current, finalizer) else {
                return Ok(());
            };
            match self
                .api_for(identity)?
                .patch(&identity.name, &PatchParams::default(), &Patch::Json(patch))
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if e.is_not_found() => Ok(()),
                Err(source) => Err(AttemptError::Api {
                    verb: REMOVE_FINALIZER,
                    item: identity.to_string(),
                    source,
                }),
            }
        })
        .await
        .map_err(|e| {
            if changed(&e) {
                AttemptError::FinalizerConflict {
                    item: identity.to_string(),
                    finalizer,
                }
            } else {
                e
            }
        })
    }
}

/// The verb of a failed finalizer patch in [`AttemptError::Api`].
const REMOVE_FINALIZER: &str = "remove finalizer";

/// Ends a worker's turn on `item`. The collector's queues never drop an item: it leaves
/// when it succeeds or when its node leaves the graph (Kubernetes' `requeueItem`).
fn finish(queue: &WorkQueue<Identity>, item: Identity, action: WorkerAction) {
    match action {
        WorkerAction::Forget => queue.forget(&item),
        WorkerAction::Requeue => queue.add_rate_limited(item.clone()),
    }
    queue.done(&item);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitors_cover_deletable_resources_but_not_events() {
        let monitored: Vec<&str> = monitored_resources().iter().map(|r| r.resource).collect();
        for expected in [
            "pods",
            "replicasets",
            "deployments",
            "configmaps",
            "secrets",
            "services",
            "leases",
            "namespaces",
        ] {
            assert!(monitored.contains(&expected), "{expected} in {monitored:?}");
        }
        assert!(!monitored.contains(&"events"));
        assert!(!monitored.contains(&"selfsubjectaccessreviews"));
    }

    #[test]
    fn api_resources_name_the_served_paths() {
        let rs = resource_of("apps/v1", "ReplicaSet").expect("served");
        let api = api_resource(rs);
        assert_eq!(
            api.collection_path(Some("ns")),
            "/apis/apps/v1/namespaces/ns/replicasets"
        );
        let ns = resource_of("v1", "Namespace").expect("served");
        assert_eq!(
            api_resource(ns).collection_path(Some("x")),
            "/api/v1/namespaces"
        );
    }
}
