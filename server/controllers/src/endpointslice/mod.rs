//! The EndpointSlice controller (kube-controller-manager's `pkg/controller/endpointslice`):
//! publishes each selector Service's pods as `discovery.k8s.io/v1` EndpointSlices — at most
//! [`reconciler::DEFAULT_MAX_ENDPOINTS_PER_SLICE`] endpoints a slice, with `ready` / `serving`
//! / `terminating` conditions, node, zone and pod reference — which is what the service
//! proxy reads (`docs/tricks.md`, networking).
//!
//! It carries two tricks of `docs/tricks.md`:
//! - #27, expectations, in the form of a tracker: the [`tracker::EndpointSliceTracker`]
//!   remembers the version of every slice the controller writes; a sync whose slice cache is
//!   older than that is refused and retried with backoff, so a burst of pod events never
//!   creates a second set of slices before the first comes back through the watch, and the
//!   controller's own writes coming back wake nothing while someone else's edit is reverted;
//! - #35, topology hints by CPU share (the controller half): Services annotated
//!   `service.kubernetes.io/topology-mode: Auto` get per-endpoint zone hints allocated by each
//!   zone's share of allocatable CPU with the 20 % overload guarantee
//!   ([`topology::TopologyCache`]).
//!
//! Layout: this module holds the controller (informers, event handlers, the sync and its
//! writes); [`reconciler`] decides the writes as a pure function; [`topology`] allocates
//! hints; [`tracker`] tracks the controller's own writes.

pub mod reconciler;
pub mod topology;
pub mod tracker;

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use skerry_api::selector::set_matches;
use skerry_client::cache::Indexer;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, DeleteParams, Error, PostParams, key_of};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::Context;
use crate::endpoints::{
    LAST_CHANGE_TRIGGER_TIME_ANNOTATION, TriggerTimeTracker, managed_selector, services_for_pod,
    services_for_pod_update,
};
use crate::runtime::{self, Reconciler};
use crate::util;
use reconciler::{DEFAULT_MAX_ENDPOINTS_PER_SLICE, MAX_ENDPOINTS_PER_SLICE_LIMIT, Plan};
use topology::{HintEvent, TopologyCache, ZONE_LABEL, hints_enabled};
use tracker::{EndpointSliceTracker, service_key_of};

/// The label naming a slice's Service (`discovery.LabelServiceName`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The label naming the controller that manages a slice (`discovery.LabelManagedBy`).
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";

/// This controller's value of [`MANAGED_BY_LABEL`] (Kubernetes' `ControllerName`); slices
/// with another value (the mirroring controller's, a user's) are never touched.
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";

/// Workers syncing Services at once: kube-controller-manager's
/// `--concurrent-service-endpoint-syncs` default.
pub const DEFAULT_WORKERS: usize = 5;

/// How long a slice event waits before its Service is synced (Kubernetes'
/// `endpointSliceChangeMinSyncDelay`): edits to several slices of one Service coalesce into
/// one sync, at the price of a second's delay in reverting a foreign edit.
pub const SLICE_CHANGE_MIN_SYNC_DELAY: Duration = Duration::from_secs(1);

/// The component named in the events this controller records.
const EVENT_COMPONENT: &str = "endpoint-slice-controller";

/// The writes the controller makes: EndpointSlices and Events. Object-safe so tests
/// substitute a fake; [`Client`] implements it.
pub trait SliceWriter: Send + Sync + 'static {
    /// POST a slice (with `generateName`); the apiserver's answer.
    fn create_slice<'a>(
        &'a self,
        slice: &'a EndpointSlice,
    ) -> BoxFuture<'a, Result<EndpointSlice, Error>>;
    /// PUT a slice (409 on a stale resourceVersion).
    fn replace_slice<'a>(
        &'a self,
        slice: &'a EndpointSlice,
    ) -> BoxFuture<'a, Result<EndpointSlice, Error>>;
    /// DELETE a slice.
    fn delete_slice<'a>(&'a self, slice: &'a EndpointSlice) -> BoxFuture<'a, Result<(), Error>>;
    /// POST an Event.
    fn create_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>>;
}

impl SliceWriter for Client {
    fn create_slice<'a>(
        &'a self,
        slice: &'a EndpointSlice,
    ) -> BoxFuture<'a, Result<EndpointSlice, Error>> {
        Box::pin(async move {
            self.api::<EndpointSlice>(slice.metadata.namespace.as_deref())
                .create(&PostParams::default(), slice)
                .await
        })
    }

    fn replace_slice<'a>(
        &'a self,
        slice: &'a EndpointSlice,
    ) -> BoxFuture<'a, Result<EndpointSlice, Error>> {
        Box::pin(async move {
            let name = slice.metadata.name.as_deref().unwrap_or_default();
            self.api::<EndpointSlice>(slice.metadata.namespace.as_deref())
                .replace(name, &PostParams::default(), slice)
                .await
        })
    }

    fn delete_slice<'a>(&'a self, slice: &'a EndpointSlice) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let name = slice.metadata.name.as_deref().unwrap_or_default();
            self.api::<EndpointSlice>(slice.metadata.namespace.as_deref())
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ())
        })
    }

    fn create_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.api::<Event>(event.metadata.namespace.as_deref())
                .create(&PostParams::default(), event)
                .await
                .map(|_| ())
        })
    }
}

/// What an [`EndpointSliceController`] is built from, for tests that fill the caches
/// themselves and fake the writes.
pub struct Parts {
    /// The Service lister's store.
    pub services: Indexer<Service>,
    /// The pod lister's store.
    pub pods: Indexer<Pod>,
    /// The node lister's store.
    pub nodes: Indexer<Node>,
    /// The EndpointSlice lister's store.
    pub slices: Indexer<EndpointSlice>,
    /// The writes.
    pub writer: Arc<dyn SliceWriter>,
    /// Endpoints per slice (clamped as in [`EndpointSliceController::with_max_endpoints_per_slice`]).
    pub max_endpoints_per_slice: usize,
}

/// The EndpointSlice controller. Build it with [`EndpointSliceController::new`], then run it
/// with [`EndpointSliceController::run`] once the informers are started.
pub struct EndpointSliceController {
    writer: Arc<dyn SliceWriter>,
    services: Indexer<Service>,
    pods: Indexer<Pod>,
    nodes: Indexer<Node>,
    slices: Indexer<EndpointSlice>,
    max_endpoints_per_slice: usize,
    tracker: EndpointSliceTracker,
    topology: TopologyCache,
    trigger_times: TriggerTimeTracker,
    queue: WorkQueue<String>,
    /// The shared informers `run` waits for (none when built from [`Parts`]).
    informers: Option<Informers>,
}

/// The shared informers the controller reads.
type Informers = (
    SharedInformer<Service>,
    SharedInformer<Pod>,
    SharedInformer<Node>,
    SharedInformer<EndpointSlice>,
);

impl EndpointSliceController {
    /// A controller over the context's shared Service, Pod, Node and EndpointSlice informers,
    /// with the default of [`DEFAULT_MAX_ENDPOINTS_PER_SLICE`].
    pub fn new(ctx: &Context) -> Arc<EndpointSliceController> {
        Self::with_max_endpoints_per_slice(ctx, DEFAULT_MAX_ENDPOINTS_PER_SLICE)
    }

    /// A controller packing at most `max` endpoints a slice (clamped to 1 ..=
    /// [`MAX_ENDPOINTS_PER_SLICE_LIMIT`], the API's own limit).
    pub fn with_max_endpoints_per_slice(ctx: &Context, max: usize) -> Arc<EndpointSliceController> {
        let services = ctx.informers.informer::<Service>();
        let pods = ctx.informers.informer::<Pod>();
        let nodes = ctx.informers.informer::<Node>();
        let slices = ctx.informers.informer::<EndpointSlice>();
        let parts = Parts {
            services: services.store(),
            pods: pods.store(),
            nodes: nodes.store(),
            slices: slices.store(),
            writer: Arc::new(ctx.client.clone()),
            max_endpoints_per_slice: max,
        };
        let controller = Arc::new(Self::build(
            parts,
            Some((
                services.clone(),
                pods.clone(),
                nodes.clone(),
                slices.clone(),
            )),
        ));
        let weak = Arc::downgrade(&controller);
        services.add_handler(ServiceHandler(weak.clone()));
        pods.add_handler(PodHandler(weak.clone()));
        nodes.add_handler(NodeHandler(weak.clone()));
        slices.add_handler(SliceHandler(weak));
        controller
    }

    /// A controller over caches and a writer the caller provides; no handlers are registered
    /// and the caller calls [`Self::sync_service`] itself.
    pub fn from_parts(parts: Parts) -> Arc<EndpointSliceController> {
        Arc::new(Self::build(parts, None))
    }

    fn build(parts: Parts, informers: Option<Informers>) -> EndpointSliceController {
        let controller = EndpointSliceController {
            writer: parts.writer,
            services: parts.services,
            pods: parts.pods,
            nodes: parts.nodes,
            slices: parts.slices,
            max_endpoints_per_slice: parts
                .max_endpoints_per_slice
                .clamp(1, MAX_ENDPOINTS_PER_SLICE_LIMIT),
            tracker: EndpointSliceTracker::new(),
            topology: TopologyCache::new(),
            trigger_times: TriggerTimeTracker::new(),
            queue: WorkQueue::new("endpoint_slice"),
            informers,
        };
        controller
            .topology
            .set_nodes(controller.nodes.list().iter().map(|n| n.as_ref()));
        controller
    }

    /// The controller's work queue of Service keys.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// The topology cache (zones' CPU shares, hints per Service).
    pub fn topology(&self) -> &TopologyCache {
        &self.topology
    }

    /// Waits for the informers' first lists, reads the nodes' zones, then runs `workers`
    /// workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        if let Some((services, pods, nodes, slices)) = &self.informers
            && (!services.wait_for_sync(&stop).await
                || !pods.wait_for_sync(&stop).await
                || !nodes.wait_for_sync(&stop).await
                || !slices.wait_for_sync(&stop).await)
        {
            tracing::info!("endpointslice controller stopped before its caches synced");
            return;
        }
        self.check_node_topology_distribution();
        tracing::info!(workers, "starting endpointslice controller");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }

    /// Recomputes the zones' CPU shares and queues the Services whose hints they change:
    /// those now overloaded and, when the shares changed, every Service asking for hints
    /// (Kubernetes queues only the overloaded ones; hints that could now be turned on would
    /// otherwise wait for the next resync).
    fn check_node_topology_distribution(&self) {
        let before = self.topology.cpu_ratios();
        let nodes = self.nodes.list();
        self.topology.set_nodes(nodes.iter().map(|n| n.as_ref()));
        for key in self.topology.overloaded_services() {
            tracing::debug!(service = %key, "queueing service overloaded after a node change");
            self.queue.add(key);
        }
        if self.topology.cpu_ratios() != before {
            for service in self.services.list() {
                if hints_enabled(service.metadata.annotations.as_ref()) {
                    self.queue.add(key_of(service.as_ref()));
                }
            }
        }
    }

    /// Brings the EndpointSlices of the Service at `key` in line with its pods.
    pub async fn sync_service(&self, key: &str) -> anyhow::Result<()> {
        let (namespace, name) = util::split_key(key);
        let Some(service) = self.services.get_by(namespace, name) else {
            // The garbage collector deletes the slices through their owner reference.
            self.trigger_times.delete_service(key);
            self.tracker.delete_service(key);
            for address_type in ["IPv4", "IPv6"] {
                self.topology.remove_hints(key, address_type);
            }
            return Ok(());
        };
        let Some(selector) = managed_selector(&service) else {
            return Ok(());
        };
        let pods: Vec<Arc<Pod>> = self
            .pods
            .list_namespace(namespace)
            .into_iter()
            .filter(|p| set_matches(selector, p.metadata.labels.as_ref()))
            .collect();
        let slices: Vec<Arc<EndpointSlice>> = self
            .slices
            .list_namespace(namespace)
            .into_iter()
            .filter(|s| {
                let labels = s.metadata.labels.as_ref();
                labels.and_then(|l| l.get(SERVICE_NAME_LABEL)).map(String::as_str) == Some(name)
                    && labels.and_then(|l| l.get(MANAGED_BY_LABEL)).map(String::as_str)
                        == Some(CONTROLLER_NAME)
                    // A slice being deleted is on its way out; reconciling it would stall.
                    && s.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let refs: Vec<&EndpointSlice> = slices.iter().map(|s| s.as_ref()).collect();
        if self.tracker.stale_slices(key, &refs) {
            anyhow::bail!("EndpointSlice informer cache is out of date");
        }
        let trigger_time = self.trigger_times.compute(&service, &pods);
        let existing: Vec<EndpointSlice> = slices.iter().map(|s| (**s).clone()).collect();
        let plan = reconciler::reconcile(
            &service,
            &pods,
            &self.nodes,
            existing,
            self.max_endpoints_per_slice,
            &self.topology,
        );
        let result = self.apply(&plan, trigger_time).await;
        for event in &plan.events {
            self.record_event(&service, event).await;
        }
        if let Err(e) = result {
            self.record_event(
                &service,
                &HintEvent {
                    type_: "Warning",
                    reason: "FailedToUpdateEndpointSlices",
                    message: format!("Error updating Endpoint Slices for Service {key}: {e:#}"),
                },
            )
            .await;
            return Err(e);
        }
        if !plan.pods_with_missing_node.is_empty() {
            anyhow::bail!(
                "pods on nodes not in the cache yet: {}",
                plan.pods_with_missing_node.join(", ")
            );
        }
        Ok(())
    }

    /// Makes the plan's writes: creates, then updates, then deletes (Kubernetes' order),
    /// recording each in the tracker.
    async fn apply(&self, plan: &Plan, trigger_time: Option<Timestamp>) -> anyhow::Result<()> {
        for slice in &plan.to_create {
            let mut slice = slice.clone();
            set_trigger_time(&mut slice, trigger_time);
            let created = self
                .writer
                .create_slice(&slice)
                .await
                .context("create EndpointSlice")?;
            tracing::debug!(slice = %key_of(&created), endpoints = created.endpoints.len(), "created endpointslice");
            self.tracker.update(&created);
        }
        for slice in &plan.to_update {
            let mut slice = slice.clone();
            set_trigger_time(&mut slice, trigger_time);
            let name = slice.metadata.name.clone().unwrap_or_default();
            let updated = self
                .writer
                .replace_slice(&slice)
                .await
                .with_context(|| format!("update EndpointSlice {name}"))?;
            tracing::debug!(slice = %key_of(&updated), endpoints = updated.endpoints.len(), "updated endpointslice");
            self.tracker.update(&updated);
        }
        for slice in &plan.to_delete {
            let name = slice.metadata.name.clone().unwrap_or_default();
            match self.writer.delete_slice(slice).await {
                Ok(()) => self.tracker.expect_deletion(slice),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e).with_context(|| format!("delete EndpointSlice {name}")),
            }
            tracing::debug!(slice = %name, "deleted endpointslice");
        }
        Ok(())
    }

    /// Records an event on the Service; best effort (a lost event loses no state).
    async fn record_event(&self, service: &Service, event: &HintEvent) {
        let namespace = service.metadata.namespace.clone().unwrap_or_default();
        let name = service.metadata.name.clone().unwrap_or_default();
        let now = util::now();
        let object = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.")),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: Some(namespace.clone()),
                name: Some(name),
                uid: service.metadata.uid.clone(),
                resource_version: service.metadata.resource_version.clone(),
                ..ObjectReference::default()
            },
            type_: Some(event.type_.into()),
            reason: Some(event.reason.into()),
            message: Some(event.message.clone()),
            source: Some(EventSource {
                component: Some(EVENT_COMPONENT.into()),
                host: None,
            }),
            reporting_component: Some(EVENT_COMPONENT.into()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Event::default()
        };
        if let Err(e) = self.writer.create_event(&object).await {
            tracing::debug!(reason = event.reason, error = %e, "could not record event");
        }
    }

    /// Queues the Service a slice belongs to, after [`SLICE_CHANGE_MIN_SYNC_DELAY`].
    fn queue_for_slice(&self, slice: &EndpointSlice) {
        if let Some(key) = service_key_of(slice) {
            self.queue.add_after(key, SLICE_CHANGE_MIN_SYNC_DELAY);
        }
    }
}

/// Sets or clears the last-change trigger time on a slice about to be written.
fn set_trigger_time(slice: &mut EndpointSlice, trigger_time: Option<Timestamp>) {
    let annotations = slice.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match trigger_time {
        Some(t) => {
            annotations.insert(LAST_CHANGE_TRIGGER_TIME_ANNOTATION.into(), t.to_string());
        }
        None => {
            annotations.remove(LAST_CHANGE_TRIGGER_TIME_ANNOTATION);
        }
    }
}

/// Whether this controller manages the slice.
fn managed(slice: &EndpointSlice) -> bool {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .map(String::as_str)
        == Some(CONTROLLER_NAME)
}

impl Reconciler for EndpointSliceController {
    fn name(&self) -> &'static str {
        "endpointslice"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        let span = tracing::debug_span!("sync", controller = "endpointslice", service = %key);
        self.sync_service(key).instrument(span).await
    }
}

struct ServiceHandler(Weak<EndpointSliceController>);

impl EventHandler<Service> for ServiceHandler {
    fn on_add(&self, obj: &Arc<Service>, _is_initial_list: bool) {
        if let Some(c) = self.0.upgrade() {
            c.queue.add(key_of(obj.as_ref()));
        }
    }
    fn on_update(&self, _old: &Arc<Service>, new: &Arc<Service>) {
        if let Some(c) = self.0.upgrade() {
            c.queue.add(key_of(new.as_ref()));
        }
    }
    fn on_delete(&self, obj: &Deleted<Service>) {
        if let Some(c) = self.0.upgrade() {
            c.queue.add(key_of(obj.object().as_ref()));
        }
    }
}

struct PodHandler(Weak<EndpointSliceController>);

impl EventHandler<Pod> for PodHandler {
    fn on_add(&self, obj: &Arc<Pod>, _is_initial_list: bool) {
        if let Some(c) = self.0.upgrade() {
            for key in services_for_pod(&c.services, obj) {
                c.queue.add(key);
            }
        }
    }
    fn on_update(&self, old: &Arc<Pod>, new: &Arc<Pod>) {
        if let Some(c) = self.0.upgrade() {
            for key in services_for_pod_update(&c.services, old, new) {
                c.queue.add(key);
            }
        }
    }
    fn on_delete(&self, obj: &Deleted<Pod>) {
        if let Some(c) = self.0.upgrade() {
            for key in services_for_pod(&c.services, obj.object()) {
                c.queue.add(key);
            }
        }
    }
}

/// Node events matter only through the zones' CPU shares: readiness, zone and allocatable CPU.
struct NodeHandler(Weak<EndpointSliceController>);

fn node_topology_facts(node: &Node) -> (bool, Option<String>, Option<String>) {
    let status = node.status.as_ref();
    (
        status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        node.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL))
            .cloned(),
        status
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("cpu"))
            .map(|q| q.0.clone()),
    )
}

impl EventHandler<Node> for NodeHandler {
    fn on_add(&self, _obj: &Arc<Node>, _is_initial_list: bool) {
        if let Some(c) = self.0.upgrade() {
            c.check_node_topology_distribution();
        }
    }
    fn on_update(&self, old: &Arc<Node>, new: &Arc<Node>) {
        if node_topology_facts(old) == node_topology_facts(new)
            && old.metadata.labels == new.metadata.labels
        {
            return;
        }
        if let Some(c) = self.0.upgrade() {
            c.check_node_topology_distribution();
        }
    }
    fn on_delete(&self, _obj: &Deleted<Node>) {
        if let Some(c) = self.0.upgrade() {
            c.check_node_topology_distribution();
        }
    }
}

/// Slice events: the controller's own writes coming back wake nothing (the tracker knows
/// them); anything else touching a managed slice is reconciled back.
struct SliceHandler(Weak<EndpointSliceController>);

impl EventHandler<EndpointSlice> for SliceHandler {
    fn on_add(&self, obj: &Arc<EndpointSlice>, _is_initial_list: bool) {
        if let Some(c) = self.0.upgrade()
            && managed(obj)
            && c.tracker.should_sync(obj)
        {
            c.queue_for_slice(obj);
        }
    }
    fn on_update(&self, old: &Arc<EndpointSlice>, new: &Arc<EndpointSlice>) {
        let Some(c) = self.0.upgrade() else {
            return;
        };
        // The service-name label is not covered by the version check when only labels move,
        // and a user may change it: both Services then need a look.
        let service_changed = service_key_of(old) != service_key_of(new);
        if managed(old) != managed(new) || service_changed {
            c.queue_for_slice(old);
            c.queue_for_slice(new);
        } else if managed(new) && c.tracker.should_sync(new) {
            c.queue_for_slice(new);
        }
    }
    fn on_delete(&self, obj: &Deleted<EndpointSlice>) {
        let slice = obj.object();
        if let Some(c) = self.0.upgrade()
            && managed(slice)
            && c.tracker.handle_deleted_slice(slice)
        {
            c.queue_for_slice(slice);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use crate::endpoints::tests::{pod, port, service};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use parking_lot::Mutex;

    /// Records writes and answers as the apiserver would (names, UIDs, versions).
    #[derive(Default)]
    struct FakeWriter {
        next_version: Mutex<u64>,
        writes: Mutex<Vec<String>>,
        /// The last slice the fake apiserver answered with.
        last: Mutex<Option<EndpointSlice>>,
    }

    impl FakeWriter {
        fn stamp(&self, slice: &EndpointSlice) -> EndpointSlice {
            let mut v = self.next_version.lock();
            *v += 1;
            let mut s = slice.clone();
            if s.metadata.name.is_none() {
                let prefix = s.metadata.generate_name.clone().unwrap_or_default();
                s.metadata.name = Some(format!("{prefix}{v}"));
                s.metadata.uid = Some(format!("uid-{v}"));
            }
            s.metadata.resource_version = Some(v.to_string());
            *self.last.lock() = Some(s.clone());
            s
        }
        fn writes(&self) -> Vec<String> {
            std::mem::take(&mut *self.writes.lock())
        }
    }

    impl SliceWriter for FakeWriter {
        fn create_slice<'a>(
            &'a self,
            slice: &'a EndpointSlice,
        ) -> BoxFuture<'a, Result<EndpointSlice, Error>> {
            self.writes.lock().push("create".into());
            let s = self.stamp(slice);
            Box::pin(async move { Ok(s) })
        }
        fn replace_slice<'a>(
            &'a self,
            slice: &'a EndpointSlice,
        ) -> BoxFuture<'a, Result<EndpointSlice, Error>> {
            self.writes.lock().push("update".into());
            let s = self.stamp(slice);
            Box::pin(async move { Ok(s) })
        }
        fn delete_slice<'a>(
            &'a self,
            _slice: &'a EndpointSlice,
        ) -> BoxFuture<'a, Result<(), Error>> {
            self.writes.lock().push("delete".into());
            Box::pin(async move { Ok(()) })
        }
        fn create_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), Error>> {
            self.writes.lock().push(format!(
                "event {}",
                event.reason.clone().unwrap_or_default()
            ));
            Box::pin(async move { Ok(()) })
        }
    }

    struct Harness {
        controller: Arc<EndpointSliceController>,
        writer: Arc<FakeWriter>,
        pods: Indexer<Pod>,
        slices: Indexer<EndpointSlice>,
    }

    fn harness() -> Harness {
        let services = Indexer::new();
        let svc = service(vec![port("http", 80, IntOrString::String("http".into()))]);
        services.upsert("ns/web", Arc::new(svc));
        let pods = Indexer::new();
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let mut p = pod(name, &format!("10.0.0.{}", i + 1), true);
            // No node: published without a zone (see `desired_by_ports`).
            p.spec.as_mut().unwrap().node_name = None;
            pods.upsert(&format!("ns/{name}"), Arc::new(p));
        }
        let slices = Indexer::new();
        let writer = Arc::new(FakeWriter::default());
        let controller = EndpointSliceController::from_parts(Parts {
            services,
            pods: pods.clone(),
            nodes: Indexer::new(),
            slices: slices.clone(),
            writer: writer.clone(),
            max_endpoints_per_slice: DEFAULT_MAX_ENDPOINTS_PER_SLICE,
        });
        Harness {
            controller,
            writer,
            pods,
            slices,
        }
    }

    /// The slice the fake apiserver holds after the last create, as the watch delivers it.
    fn deliver(h: &Harness, created: &EndpointSlice) {
        h.slices.upsert(&key_of(created), Arc::new(created.clone()));
    }

    // Reference: `docs/tricks.md` #27, expectations — the slice controller's tracker.
    #[tokio::test]
    async fn a_sync_on_a_cache_that_has_not_seen_our_create_is_refused_not_repeated() {
        let h = harness();
        h.controller.sync_service("ns/web").await.unwrap();
        assert_eq!(h.writer.writes(), vec!["create"]);

        // A pod event syncs again before the watch brought the slice back: without the
        // tracker this would create a second slice with the same endpoints.
        let err = h.controller.sync_service("ns/web").await.unwrap_err();
        assert!(err.to_string().contains("out of date"), "{err:#}");
        assert!(
            h.writer.writes().is_empty(),
            "nothing written on a stale cache"
        );

        // The watch catches up: the same sync now writes nothing.
        let created = h.writer.last.lock().clone().unwrap();
        deliver(&h, &created);
        h.controller.sync_service("ns/web").await.unwrap();
        assert!(h.writer.writes().is_empty());

        // An older version in the cache than the one we wrote is stale too.
        let mut unready = pod("b", "10.0.0.2", false);
        unready.spec.as_mut().unwrap().node_name = None;
        h.pods.upsert("ns/b", Arc::new(unready));
        h.controller.sync_service("ns/web").await.unwrap();
        assert_eq!(h.writer.writes(), vec!["update"]);
        // The cache still holds version 1 of the slice; we wrote a newer one.
        assert!(h.controller.sync_service("ns/web").await.is_err());
        assert!(h.writer.writes().is_empty());
    }

    #[tokio::test]
    async fn a_deleted_service_is_forgotten_and_a_selectorless_one_ignored() {
        let h = harness();
        h.controller.services.remove("ns/web");
        h.controller.sync_service("ns/web").await.unwrap();
        assert!(h.writer.writes().is_empty());

        let mut manual = service(vec![]);
        manual.spec.as_mut().unwrap().selector = None;
        h.controller.services.upsert("ns/web", Arc::new(manual));
        h.controller.sync_service("ns/web").await.unwrap();
        assert!(h.writer.writes().is_empty());
    }
}
