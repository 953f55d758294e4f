//! The namespace controller (kube-controller-manager's `pkg/controller/namespace`): empties a
//! namespace that is being deleted, then lets the apiserver remove it.
//!
//! A `DELETE` of a namespace does not remove it. The apiserver sets `deletionTimestamp` and
//! phase `Terminating`, refuses new content in it, and keeps the namespace while its
//! `spec.finalizers` holds `kubernetes` — the token this controller owns. For a namespace in
//! that state, one pass of the controller takes, for every namespaced resource that can be
//! deleted (skerry's discovery is the resource catalogue, [`deletable_resources`]):
//! 1. an estimate of how long graceful deletion may still take — pods only: the longest
//!    `terminationGracePeriodSeconds` of the non-terminal pods, dropped once that long has
//!    passed since the namespace's `deletionTimestamp` ([`pod_grace_estimate`],
//!    [`remaining_estimate`]);
//! 2. a `DELETE` of the whole collection with background propagation, or a LIST and one
//!    `DELETE` per object when the resource has no `deletecollection`;
//! 3. a LIST of what is left, judged by [`judge_remaining`]: objects inside a grace period or
//!    held by their own finalizers (the garbage collector's `foregroundDeletion`, a user's)
//!    are waited for; anything else left over is an error, retried with backoff.
//!
//! The pass writes its outcome into the namespace's conditions with Kubernetes' exact types,
//! reasons and messages ([`ContentReport::conditions`], [`update_conditions`]), so
//! `kubectl describe namespace` reads as it does on Kubernetes. Then it either waits
//! (`add_after` half the estimate plus a second, Kubernetes' arithmetic) or, once nothing is
//! left, removes `kubernetes` from `spec.finalizers` with
//! `PUT /api/v1/namespaces/<ns>/finalize`, and the apiserver removes the namespace.
//!
//! Acting on a cache that lags (`docs/tricks.md`, part 5): the informer only says *which* namespace
//! to look at. Each pass re-reads the namespace live before acting, decides what is left from fresh
//! LISTs rather than from caches, and the first pass after an event waits
//! [`NAMESPACE_DELETION_GRACE_PERIOD`] so every apiserver of the three has seen the deletion (and
//! refuses new content) and every last-moment create is in the store before the controller lists
//! what to delete.
//!
//! One difference from Kubernetes, on purpose: a resource whose objects are all gone after
//! the delete contributes no estimate. Kubernetes keeps the pod grace estimate even when the
//! pods were removed at once (pods not bound to a node are), and so waits up to half a grace
//! period for nothing.
//!
//! Where to start: [`NamespaceController::delete_namespace`]; the decisions are the pure
//! functions below it.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition, NamespaceStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status, Time};
use parking_lot::Mutex;
use skerry_api::catalogue::{self, ResourceInfo};
use skerry_client::api::http_method::Method;
use skerry_client::cache::Indexer;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::retry::{self, Backoff, DEFAULT_RETRY, on_error};
use skerry_client::workqueue::rate_limiter::{
    DEFAULT_ITEM_BASE_DELAY, DEFAULT_OVERALL_BURST, DEFAULT_OVERALL_QPS,
};
use skerry_client::workqueue::{
    BucketRateLimiter, ItemExponentialFailureRateLimiter, MaxOfRateLimiter, WorkQueue,
};
use skerry_client::{ApiResource, Client, DeleteParams, Error, ListParams, PostParams};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::runtime::{self, Reconciler};
use crate::util;

/// The `spec.finalizers` token this controller owns; the apiserver puts it on every new
/// namespace (Kubernetes' `FinalizerKubernetes`).
pub const FINALIZER_KUBERNETES: &str = "kubernetes";

/// How long after a namespace event the controller first looks at it (Kubernetes'
/// `namespaceDeletionGracePeriod`, 5 s). Time for the other apiservers to see the deletion
/// and start refusing new content, and for creates accepted just before it to reach the
/// store, so the controller's LISTs see them. Longer delays every namespace deletion; shorter
/// risks a pass that misses a late object (the next pass still catches it, after a backoff).
pub const NAMESPACE_DELETION_GRACE_PERIOD: Duration = Duration::from_secs(5);

/// The estimate, in seconds, used when what is left is held by finalizers (Kubernetes'
/// `finalizerEstimateSeconds`): the garbage collector usually clears `foregroundDeletion`
/// within seconds, and the wait is half of this plus one, so 8 s between passes.
pub const FINALIZER_ESTIMATE_SECS: i64 = 15;

/// Namespaces emptied at once: kube-controller-manager's `--concurrent-namespace-syncs`
/// default. Each pass is a few requests per resource, paced by the client's QPS limit.
pub const DEFAULT_WORKERS: usize = 10;

/// Cap of the per-namespace retry backoff (Kubernetes' `nsControllerRateLimiter`: "this
/// ensures that we retry namespace deletion at least every minute, never longer"). Lower
/// than the default 1000 s because a namespace stuck on an error is a user waiting on
/// `kubectl delete namespace`.
pub const RETRY_DELAY_MAX: Duration = Duration::from_secs(60);

/// Re-reads and re-writes of the namespace after a 409 Conflict before the pass gives up and
/// is retried with backoff. Kubernetes retries without bound (`retryOnConflictError`); a bound
/// keeps one pass finite when another writer (the other members' controllers during a leader
/// change, a user) keeps winning, and 5 is far past any ordinary race.
const CONFLICT_RETRIES_MAX: u32 = 5;

/// The schedule of those retries: client-go's `DefaultRetry` pauses (10 ms, 10 % jitter),
/// which let the winner's write land before the re-read, over the first write and
/// [`CONFLICT_RETRIES_MAX`] more.
const CONFLICT_RETRY: Backoff = Backoff {
    steps: CONFLICT_RETRIES_MAX + 1,
    ..DEFAULT_RETRY
};

/// The condition types the controller maintains, in the order Kubernetes writes them
/// (`conditionTypes` in `namespace_condition_updater.go`).
pub const CONDITION_TYPES: [&str; 5] = [
    "NamespaceDeletionDiscoveryFailure",
    "NamespaceDeletionGroupVersionParsingFailure",
    "NamespaceDeletionContentFailure",
    "NamespaceContentRemaining",
    "NamespaceFinalizersRemaining",
];

/// The reason and message of each condition type when nothing is wrong (status `False`),
/// Kubernetes' `okReasons` and `okMessages`.
fn ok_condition(type_: &str) -> (&'static str, &'static str) {
    match type_ {
        "NamespaceDeletionDiscoveryFailure" => (
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        "NamespaceDeletionGroupVersionParsingFailure" => (
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        "NamespaceDeletionContentFailure" => (
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        "NamespaceContentRemaining" => ("ContentRemoved", "All content successfully removed"),
        "NamespaceFinalizersRemaining" => (
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished",
        ),
        _ => ("", ""),
    }
}

// ---- pure decisions ------------------------------------------------------------------------

/// The namespaced resources whose objects a terminating namespace must lose: those that can
/// be deleted (Kubernetes filters discovery on the `delete` verb).
pub fn deletable_resources() -> impl Iterator<Item = &'static ResourceInfo> {
    catalogue::RESOURCES
        .iter()
        .filter(|r| r.namespaced && r.has_verb("delete"))
}

/// The client's view of a catalogue resource.
pub fn api_resource(resource: &ResourceInfo) -> ApiResource {
    ApiResource {
        group: resource.group.to_string(),
        version: resource.version.to_string(),
        plural: resource.resource.to_string(),
        kind: resource.kind.to_string(),
        namespaced: resource.namespaced,
    }
}

/// How Go prints a `schema.GroupVersionResource` (`apps/v1, Resource=deployments`,
/// `/v1, Resource=pods`), for messages that read as Kubernetes' do.
fn gvr_string(resource: &ResourceInfo) -> String {
    format!(
        "{}/{}, Resource={}",
        resource.group, resource.version, resource.resource
    )
}

/// The longest `terminationGracePeriodSeconds` of the pods that are not finished (Kubernetes'
/// `estimateGracefulTerminationForPods`): how long their kubelets may take to stop them.
pub fn pod_grace_estimate(pods: &[Pod]) -> i64 {
    pods.iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| p.spec.as_ref()?.termination_grace_period_seconds)
        .max()
        .unwrap_or(0)
        .max(0)
}

/// `estimate_secs`, or 0 once that long has passed since the namespace was deleted
/// (Kubernetes' `estimateGracefulTermination`): past it, what is left is not waiting for a
/// grace period.
pub fn remaining_estimate(estimate_secs: i64, deleted_at: &Time, now: &Time) -> i64 {
    let elapsed_secs = now.0.duration_since(deleted_at.0).as_secs();
    if elapsed_secs >= estimate_secs {
        0
    } else {
        estimate_secs
    }
}

/// What one resource left behind after a pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceOutcome {
    /// Objects still listed after the deletion.
    pub remaining: usize,
    /// How many of those carry each finalizer.
    pub finalizers: BTreeMap<String, usize>,
    /// Seconds the resource may still need: a grace period, or [`FINALIZER_ESTIMATE_SECS`].
    pub estimate_secs: i64,
    /// Why the resource could not be emptied (goes into `NamespaceDeletionContentFailure`).
    pub error: Option<String>,
}

impl ResourceOutcome {
    /// An outcome that failed before anything was counted.
    pub fn failed(estimate_secs: i64, error: String) -> ResourceOutcome {
        ResourceOutcome {
            estimate_secs,
            error: Some(error),
            ..ResourceOutcome::default()
        }
    }
}

/// Judges the objects of `resource` still in `namespace` after the deletion (Kubernetes' tail
/// of `deleteAllContentForGroupVersionResource`): nothing left is done; objects left inside a
/// grace period (`grace_estimate_secs > 0`) or held by finalizers are waited for; objects left
/// with neither should have gone, and are an error.
pub fn judge_remaining(
    resource: &ResourceInfo,
    namespace: &str,
    remaining: &[ObjectMeta],
    grace_estimate_secs: i64,
) -> ResourceOutcome {
    if remaining.is_empty() {
        // Nothing to wait for, whatever the grace estimate was (see the module docs).
        return ResourceOutcome::default();
    }
    let mut finalizers: BTreeMap<String, usize> = BTreeMap::new();
    for meta in remaining {
        for f in meta.finalizers.iter().flatten() {
            *finalizers.entry(f.clone()).or_default() += 1;
        }
    }
    let mut outcome = ResourceOutcome {
        remaining: remaining.len(),
        finalizers,
        estimate_secs: grace_estimate_secs,
        error: None,
    };
    if grace_estimate_secs > 0 {
        return outcome;
    }
    if !outcome.finalizers.is_empty() {
        outcome.estimate_secs = FINALIZER_ESTIMATE_SECS;
        return outcome;
    }
    outcome.error = Some(format!(
        "unexpected items still remain in namespace: {namespace} for gvr: {}",
        gvr_string(resource)
    ));
    outcome
}

/// The totals of one pass over every resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentReport {
    /// Objects left per resource, keyed `resource.group` as Kubernetes prints them
    /// (`pods.`, `deployments.apps`).
    pub remaining: BTreeMap<String, usize>,
    /// Objects left per finalizer.
    pub finalizers: BTreeMap<String, usize>,
    /// Why resources could not be emptied.
    pub errors: Vec<String>,
    /// The longest estimate of any resource, in seconds.
    pub estimate_secs: i64,
}

/// What a pass concludes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing is left: remove the `kubernetes` finalizer.
    Finalize,
    /// Content is on its way out: look again after this long.
    Wait(Duration),
    /// Content could not be deleted: retry with backoff.
    Retry(String),
}

impl ContentReport {
    /// Adds one resource's outcome.
    pub fn add(&mut self, resource: &ResourceInfo, outcome: ResourceOutcome) {
        self.estimate_secs = self.estimate_secs.max(outcome.estimate_secs);
        if outcome.remaining > 0 {
            *self
                .remaining
                .entry(format!("{}.{}", resource.resource, resource.group))
                .or_default() += outcome.remaining;
            for (f, n) in outcome.finalizers {
                *self.finalizers.entry(f).or_default() += n;
            }
        }
        if let Some(e) = outcome.error {
            self.errors.push(e);
        }
    }

    /// The conditions that are `True` after this pass, with Kubernetes' reasons and messages
    /// (`ProcessContentTotals` and `makeDeleteContentCondition`); [`update_conditions`] fills
    /// in the `False` ones.
    pub fn conditions(&self, now: &Time) -> Vec<NamespaceCondition> {
        let condition = |type_: &str, reason: &str, message: String| NamespaceCondition {
            type_: type_.to_string(),
            status: "True".to_string(),
            last_transition_time: Some(now.clone()),
            reason: Some(reason.to_string()),
            message: Some(message),
        };
        let mut conditions = Vec::new();
        if !self.errors.is_empty() {
            let mut errors = self.errors.clone();
            errors.sort();
            conditions.push(condition(
                "NamespaceDeletionContentFailure",
                "ContentDeletionFailed",
                format!(
                    "Failed to delete all resource types, {} remaining: {}",
                    errors.len(),
                    errors.join(", ")
                ),
            ));
        }
        let mut resources: Vec<String> = self
            .remaining
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| format!("{r} has {n} resource instances"))
            .collect();
        if !resources.is_empty() {
            resources.sort();
            conditions.push(condition(
                "NamespaceContentRemaining",
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", resources.join(", ")),
            ));
        }
        let mut finalizers: Vec<String> = self
            .finalizers
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(f, n)| format!("{f} in {n} resource instances"))
            .collect();
        if !finalizers.is_empty() {
            finalizers.sort();
            conditions.push(condition(
                "NamespaceFinalizersRemaining",
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    finalizers.join(", ")
                ),
            ));
        }
        conditions
    }

    /// What to do next: errors first (Kubernetes returns the error before looking at the
    /// estimate), then wait while anything is estimated to go, else finalize.
    pub fn verdict(&self) -> Verdict {
        if !self.errors.is_empty() {
            let mut errors = self.errors.clone();
            errors.sort();
            return Verdict::Retry(errors.join(", "));
        }
        if self.estimate_secs > 0 {
            return Verdict::Wait(requeue_after(self.estimate_secs));
        }
        Verdict::Finalize
    }
}

/// How long to wait before looking again at a namespace whose content is estimated to take
/// `estimate_secs` more: half of it plus a second (Kubernetes' `estimate/2 + 1`), so a long
/// grace period is checked a few times rather than once at its very end.
pub fn requeue_after(estimate_secs: i64) -> Duration {
    let secs = u64::try_from(estimate_secs.max(0)).unwrap_or(0) / 2 + 1;
    Duration::from_secs(secs)
}

/// Writes `new` (the `True` conditions of a pass) over `status`, every other maintained type
/// set to its `False` "ok" variant (Kubernetes' `updateConditions`). A condition whose
/// status, reason and message are unchanged keeps its `lastTransitionTime`. Returns whether
/// anything changed, so an unchanged pass writes nothing.
pub fn update_conditions(
    status: &mut NamespaceStatus,
    new: &[NamespaceCondition],
    now: &Time,
) -> bool {
    let mut changed = false;
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for type_ in CONDITION_TYPES {
        let wanted = new.iter().find(|c| c.type_ == type_).cloned();
        let wanted = wanted.unwrap_or_else(|| {
            let (reason, message) = ok_condition(type_);
            NamespaceCondition {
                type_: type_.to_string(),
                status: "False".to_string(),
                last_transition_time: Some(now.clone()),
                reason: Some(reason.to_string()),
                message: Some(message.to_string()),
            }
        });
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            None => {
                conditions.push(wanted);
                changed = true;
            }
            Some(old)
                if old.status == wanted.status
                    && old.reason == wanted.reason
                    && old.message == wanted.message => {}
            Some(old) => {
                *old = wanted;
                changed = true;
            }
        }
    }
    changed
}

/// Whether a namespace has no finalizer left in `spec.finalizers` (Kubernetes' `finalized`):
/// the apiserver removes it, nothing is left for this controller to do.
pub fn finalized(namespace: &Namespace) -> bool {
    namespace
        .spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .is_none_or(Vec::is_empty)
}

/// `spec.finalizers` without this controller's token, sorted and without duplicates
/// (Kubernetes builds it through a string set).
pub fn finalizers_after_finalize(namespace: &Namespace) -> Vec<String> {
    let mut left: Vec<String> = namespace
        .spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .into_iter()
        .flatten()
        .filter(|f| *f != FINALIZER_KUBERNETES)
        .cloned()
        .collect();
    left.sort();
    left.dedup();
    left
}

/// Whether a namespace event is one this controller acts on: the namespace is being deleted.
fn is_deleting(namespace: &Namespace) -> bool {
    namespace.metadata.deletion_timestamp.is_some()
}

// ---- the controller ------------------------------------------------------------------------

/// A collection operation a resource may turn out not to support.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Operation {
    DeleteCollection,
    List,
}

/// How a pass over one namespace ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The namespace no longer exists.
    Gone,
    /// The namespace is not being deleted.
    NotDeleting,
    /// The namespace's `spec.finalizers` is empty; the apiserver removes it.
    Finalized,
    /// Content is on its way out; look again after this long.
    Waiting(Duration),
}

/// The namespace controller. Build it with [`NamespaceController::new`], then run it with
/// [`NamespaceController::run`] once the informers are started.
pub struct NamespaceController {
    client: Client,
    namespaces: Indexer<Namespace>,
    queue: WorkQueue<String>,
    informer: SharedInformer<Namespace>,
    /// Operations each resource (group, plural) does not support: pre-filled from the
    /// catalogue's verbs, and extended when the server answers 404 or 405 (Kubernetes'
    /// `operationNotSupportedCache`). A `parking_lot::Mutex`: a lookup or an insert, never
    /// held across an `.await`.
    unsupported: Mutex<HashSet<(&'static str, &'static str, Operation)>>,
}

impl NamespaceController {
    /// A controller over the context's shared Namespace informer, with its handler registered.
    pub fn new(ctx: &Context) -> Arc<NamespaceController> {
        let informer = ctx.informers.informer::<Namespace>();
        let controller = Arc::new(NamespaceController::build(
            ctx.client.clone(),
            informer.clone(),
        ));
        informer.add_handler(NamespaceHandler {
            controller: Arc::downgrade(&controller),
            runtime: tokio::runtime::Handle::try_current().ok(),
        });
        controller
    }

    fn build(client: Client, informer: SharedInformer<Namespace>) -> NamespaceController {
        let limiter = MaxOfRateLimiter::new(vec![
            Box::new(ItemExponentialFailureRateLimiter::new(
                DEFAULT_ITEM_BASE_DELAY,
                RETRY_DELAY_MAX,
            )),
            Box::new(BucketRateLimiter::new(
                DEFAULT_OVERALL_QPS,
                DEFAULT_OVERALL_BURST,
            )),
        ]);
        let mut unsupported = HashSet::new();
        for r in deletable_resources() {
            if !r.has_verb("deletecollection") {
                unsupported.insert((r.group, r.resource, Operation::DeleteCollection));
            }
            if !r.has_verb("list") {
                unsupported.insert((r.group, r.resource, Operation::List));
            }
        }
        NamespaceController {
            client,
            namespaces: informer.store(),
            queue: WorkQueue::with_rate_limiter("namespace", limiter),
            informer,
            unsupported: Mutex::new(unsupported),
        }
    }

    /// The controller's work queue of namespace names.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits for the namespace informer's first list, then runs `workers` workers until
    /// `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        if !self.informer.wait_for_sync(&stop).await {
            tracing::info!("namespace controller stopped before its cache synced");
            return;
        }
        tracing::info!(workers, "starting namespace controller");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }

    /// Queues a namespace being deleted, after [`NAMESPACE_DELETION_GRACE_PERIOD`].
    fn enqueue(&self, namespace: &Namespace) {
        if !is_deleting(namespace) {
            return;
        }
        let name = util::key(&namespace.metadata);
        self.queue.add_after(name, NAMESPACE_DELETION_GRACE_PERIOD);
    }

    /// One pass over the namespace `name` (Kubernetes' `namespacedResourcesDeleter.Delete`):
    /// re-read it live, make sure its phase says `Terminating`, delete its content, record the
    /// outcome in its conditions, and finalize it once nothing is left. An error means the
    /// pass should be retried with backoff.
    pub async fn delete_namespace(&self, name: &str) -> anyhow::Result<Pass> {
        let api = self.client.api::<Namespace>(None);
        // Several writers edit a terminating namespace; act on its latest state only.
        let Some(namespace) = api.get_opt(name).await.context("get the namespace")? else {
            return Ok(Pass::Gone);
        };
        if !is_deleting(&namespace) {
            return Ok(Pass::NotDeleting);
        }
        let Some(namespace) = self.ensure_terminating(namespace).await? else {
            return Ok(Pass::Gone);
        };
        if finalized(&namespace) {
            return Ok(Pass::Finalized);
        }
        let Some(deleted_at) = namespace.metadata.deletion_timestamp.clone() else {
            return Ok(Pass::NotDeleting);
        };
        let report = self.delete_all_content(name, &deleted_at).await;
        let namespace = self.write_conditions(namespace, &report).await;
        match report.verdict() {
            Verdict::Retry(errors) => Err(anyhow!(
                "deleting the content of namespace {name}: {errors}"
            )),
            Verdict::Wait(after) => {
                tracing::debug!(
                    namespace = name,
                    estimate_secs = report.estimate_secs,
                    ?after,
                    "content remaining"
                );
                Ok(Pass::Waiting(after))
            }
            Verdict::Finalize => {
                self.finalize(namespace).await?;
                tracing::info!(namespace = name, "namespace emptied and finalized");
                Ok(Pass::Finalized)
            }
        }
    }

    /// Sets phase `Terminating` if the apiserver has not (Kubernetes'
    /// `updateNamespaceStatusFunc`), re-reading on conflict. `None`: the namespace is gone.
    async fn ensure_terminating(&self, namespace: Namespace) -> anyhow::Result<Option<Namespace>> {
        let api = &self.client.api::<Namespace>(None);
        let name = &util::key(&namespace.metadata);
        let namespace = &namespace;
        let mut runs = 0;
        on_error(CONFLICT_RETRY, retry::is_conflict, || {
            runs += 1;
            let fresh = runs > 1;
            async move {
                let Some(current) = self.latest(namespace, fresh).await? else {
                    return Ok(None);
                };
                let phase = current.status.as_ref().and_then(|s| s.phase.as_deref());
                if phase == Some("Terminating") {
                    return Ok(Some(current));
                }
                let mut updated = current;
                updated
                    .status
                    .get_or_insert_with(NamespaceStatus::default)
                    .phase = Some("Terminating".to_string());
                match api
                    .replace_status(name, &PostParams::default(), &updated)
                    .await
                {
                    Ok(stored) => Ok(Some(stored)),
                    Err(e) if e.is_not_found() => Ok(None),
                    Err(e) => Err(anyhow::Error::new(e)),
                }
            }
        })
        .await
        .map_err(|e| {
            if retry::is_conflict(&e) {
                anyhow!(
                    "setting namespace {name} Terminating conflicted {CONFLICT_RETRIES_MAX} times"
                )
            } else {
                e.context("set the namespace's phase to Terminating")
            }
        })
    }

    /// The namespace one run of a conflict retry writes over: the pass's copy on the first
    /// run (`fresh` false), the latest ([`Self::reread`]) on every later one.
    async fn latest(
        &self,
        namespace: &Namespace,
        fresh: bool,
    ) -> anyhow::Result<Option<Namespace>> {
        if fresh {
            self.reread(namespace).await
        } else {
            Ok(Some(namespace.clone()))
        }
    }

    /// The namespace's latest state after a conflict; an error if it was deleted and
    /// re-created meanwhile (Kubernetes: "namespace uid has changed across retries").
    async fn reread(&self, namespace: &Namespace) -> anyhow::Result<Option<Namespace>> {
        let name = util::key(&namespace.metadata);
        let Some(fresh) = self
            .client
            .api::<Namespace>(None)
            .get_opt(&name)
            .await
            .context("re-read the namespace")?
        else {
            return Ok(None);
        };
        if fresh.metadata.uid != namespace.metadata.uid {
            return Err(anyhow!("namespace {name}: uid has changed across retries"));
        }
        Ok(Some(fresh))
    }

    /// Deletes everything in `namespace`, resource by resource; errors of one resource are
    /// recorded and the others still processed (Kubernetes' `deleteAllContent`).
    async fn delete_all_content(&self, namespace: &str, deleted_at: &Time) -> ContentReport {
        let mut report = ContentReport::default();
        for resource in deletable_resources() {
            let outcome = self.delete_resource(resource, namespace, deleted_at).await;
            if let Some(e) = &outcome.error {
                tracing::debug!(namespace, resource = resource.resource, error = %e, "content deletion failed");
            }
            report.add(resource, outcome);
        }
        report
    }

    /// Deletes the objects of one resource in `namespace` and judges what is left (Kubernetes'
    /// `deleteAllContentForGroupVersionResource`).
    async fn delete_resource(
        &self,
        resource: &'static ResourceInfo,
        namespace: &str,
        deleted_at: &Time,
    ) -> ResourceOutcome {
        let estimate_secs = if resource.group.is_empty() && resource.resource == "pods" {
            match self
                .client
                .api::<Pod>(Some(namespace))
                .list(&ListParams::default())
                .await
            {
                Ok(pods) => {
                    remaining_estimate(pod_grace_estimate(&pods.items), deleted_at, &util::now())
                }
                Err(e) => return ResourceOutcome::failed(0, e.to_string()),
            }
        } else {
            0
        };
        let deleted = match self.delete_collection(resource, namespace).await {
            Ok(true) => Ok(()),
            Ok(false) => self.delete_each(resource, namespace).await,
            Err(e) => Err(e),
        };
        if let Err(e) = deleted {
            return ResourceOutcome::failed(estimate_secs, e.to_string());
        }
        match self.list(resource, namespace).await {
            Ok(Some(left)) => judge_remaining(resource, namespace, &left, estimate_secs),
            Ok(None) => ResourceOutcome {
                estimate_secs,
                ..ResourceOutcome::default()
            },
            Err(e) => ResourceOutcome::failed(estimate_secs, e.to_string()),
        }
    }

    fn supports(&self, resource: &ResourceInfo, operation: Operation) -> bool {
        !self
            .unsupported
            .lock()
            .contains(&(resource.group, resource.resource, operation))
    }

    fn set_unsupported(&self, resource: &'static ResourceInfo, operation: Operation) {
        self.unsupported
            .lock()
            .insert((resource.group, resource.resource, operation));
    }

    /// `DELETE` of the whole collection in `namespace`, background propagation (dependents
    /// elsewhere are the garbage collector's; this controller lists again until everything
    /// here is gone). `Ok(false)`: the resource does not support it (404 or 405, remembered).
    async fn delete_collection(
        &self,
        resource: &'static ResourceInfo,
        namespace: &str,
    ) -> Result<bool, Error> {
        if !self.supports(resource, Operation::DeleteCollection) {
            return Ok(false);
        }
        let path = api_resource(resource).collection_path(Some(namespace));
        let options = DeleteParams::background().to_delete_options();
        let body = serde_json::to_vec(&options)
            .map_err(|e| Error::Decode(format!("encoding DeleteOptions: {e}")))?;
        let (code, answer) = self
            .client
            .request_raw(Method::Delete, &path, Some(("application/json", body)))
            .await?;
        match code {
            200..=299 => Ok(true),
            // A resource listed in discovery without collection verbs answers 404 rather than
            // 405 (Kubernetes issue 22413); both mean "not supported".
            404 | 405 => {
                self.set_unsupported(resource, Operation::DeleteCollection);
                Ok(false)
            }
            _ => Err(status_error(code, &answer)),
        }
    }

    /// LIST (metadata only) of the objects of `resource` in `namespace`; `None` when the
    /// resource cannot be listed (remembered).
    async fn list(
        &self,
        resource: &'static ResourceInfo,
        namespace: &str,
    ) -> Result<Option<Vec<ObjectMeta>>, Error> {
        if !self.supports(resource, Operation::List) {
            return Ok(None);
        }
        let api = self
            .client
            .metadata(api_resource(resource), Some(namespace));
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(Some(list.items.into_iter().map(|o| o.metadata).collect())),
            Err(e) if matches!(e.code(), Some(404 | 405)) => {
                self.set_unsupported(resource, Operation::List);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Lists the objects and deletes them one by one, for a resource without
    /// `deletecollection` (Kubernetes' `deleteEachItem`).
    async fn delete_each(
        &self,
        resource: &'static ResourceInfo,
        namespace: &str,
    ) -> Result<(), Error> {
        let Some(items) = self.list(resource, namespace).await? else {
            return Ok(());
        };
        let api = self
            .client
            .metadata(api_resource(resource), Some(namespace));
        for meta in items {
            let name = meta.name.unwrap_or_default();
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(()) => {}
                Err(e) if matches!(e.code(), Some(404 | 405)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Records a pass's outcome in the namespace's conditions through the status subresource,
    /// when they changed. A failed write is only logged (as Kubernetes does): the conditions
    /// are a report, the next pass writes them again. Returns the namespace to act on next.
    async fn write_conditions(&self, namespace: Namespace, report: &ContentReport) -> Namespace {
        let now = util::now();
        let mut updated = namespace.clone();
        let status = updated.status.get_or_insert_with(NamespaceStatus::default);
        if !update_conditions(status, &report.conditions(&now), &now) {
            return namespace;
        }
        let name = util::key(&namespace.metadata);
        match self
            .client
            .api::<Namespace>(None)
            .replace_status(&name, &PostParams::default(), &updated)
            .await
        {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(namespace = %name, error = %e, "couldn't update the namespace's status conditions");
                namespace
            }
        }
    }

    /// Removes [`FINALIZER_KUBERNETES`] from `spec.finalizers` through the `finalize`
    /// subresource, re-reading on conflict (Kubernetes' `finalizeNamespace`). With no
    /// finalizer left, the apiserver removes the namespace.
    async fn finalize(&self, namespace: Namespace) -> anyhow::Result<()> {
        let api = &self.client.api::<Namespace>(None);
        let name = &util::key(&namespace.metadata);
        let namespace = &namespace;
        let mut runs = 0;
        on_error(CONFLICT_RETRY, retry::is_conflict, || {
            runs += 1;
            let fresh = runs > 1;
            async move {
                let current = match self.latest(namespace, fresh).await? {
                    Some(current) if !finalized(&current) => current,
                    // Gone, or finalized by someone else: done.
                    _ => return Ok(()),
                };
                let mut finalize = Namespace {
                    metadata: current.metadata.clone(),
                    spec: current.spec.clone(),
                    status: None,
                };
                finalize
                    .spec
                    .get_or_insert_with(Default::default)
                    .finalizers = Some(finalizers_after_finalize(&current));
                let body = serde_json::to_value(&finalize).context("encode the namespace")?;
                match api
                    .subresource(Method::Put, name, "finalize", Some(&body))
                    .await
                {
                    Ok(_) => Ok(()),
                    // Someone else finished the deletion.
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(anyhow::Error::new(e)),
                }
            }
        })
        .await
        .map_err(|e| {
            if retry::is_conflict(&e) {
                anyhow!("finalizing namespace {name} conflicted {CONFLICT_RETRIES_MAX} times")
            } else {
                e.context("finalize the namespace")
            }
        })
    }
}

/// Characters of a non-Status error body kept in the error: enough to recognise a proxy's
/// error page in the namespace's `NamespaceDeletionContentFailure` message, short enough not
/// to flood it (the client library quotes the same 512).
const ERROR_BODY_QUOTE_CHARS_MAX: usize = 512;

/// The error of a non-2xx raw answer: the server's `Status`, or one made from the code.
fn status_error(code: u16, body: &[u8]) -> Error {
    let status = serde_json::from_slice::<Status>(body).unwrap_or_else(|_| Status {
        code: Some(i32::from(code)),
        message: Some(
            String::from_utf8_lossy(body)
                .chars()
                .take(ERROR_BODY_QUOTE_CHARS_MAX)
                .collect(),
        ),
        status: Some("Failure".to_string()),
        ..Status::default()
    });
    Error::Api(Box::new(status))
}

impl Reconciler for NamespaceController {
    fn name(&self) -> &'static str {
        "namespace"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        // The cache only decides whether to look at all; the pass itself reads live.
        if self.namespaces.get(key).is_none() {
            tracing::debug!(namespace = key, "namespace has been deleted");
            return Ok(());
        }
        if let Pass::Waiting(after) = self.delete_namespace(key).await? {
            self.queue.add_after(key.to_string(), after);
        }
        Ok(())
    }
}

/// Feeds namespace events to the controller.
struct NamespaceHandler {
    /// Held weakly: the informer outlives the controller.
    controller: Weak<NamespaceController>,
    /// The runtime the controller was built on. Informer handlers run on plain threads, and
    /// the queue's delay timer (started by the first `add_after`) must be spawned on a
    /// runtime; without one `add_after` adds at once, and the deletion grace period would be
    /// skipped.
    runtime: Option<tokio::runtime::Handle>,
}

impl NamespaceHandler {
    fn enqueue(&self, namespace: &Namespace) {
        let Some(c) = self.controller.upgrade() else {
            return;
        };
        let _entered = self.runtime.as_ref().map(tokio::runtime::Handle::enter);
        c.enqueue(namespace);
    }
}

impl EventHandler<Namespace> for NamespaceHandler {
    fn on_add(&self, obj: &Arc<Namespace>, _is_initial_list: bool) {
        self.enqueue(obj);
    }
    fn on_update(&self, _old: &Arc<Namespace>, new: &Arc<Namespace>) {
        self.enqueue(new);
    }
    fn on_delete(&self, _obj: &Deleted<Namespace>) {}
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NamespaceSpec, PodSpec, PodStatus};
    use k8s_openapi::jiff::SignedDuration;

    fn resource(group: &str, plural: &str) -> &'static ResourceInfo {
        catalogue::RESOURCES
            .iter()
            .find(|r| r.group == group && r.resource == plural)
            .unwrap()
    }

    fn at(secs: i64) -> Time {
        let base = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
        Time(base + SignedDuration::from_secs(secs))
    }

    fn pod(grace: Option<i64>, phase: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                termination_grace_period_seconds: grace,
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: phase.map(str::to_string),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn meta(name: &str, finalizers: &[&str]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            finalizers: (!finalizers.is_empty())
                .then(|| finalizers.iter().map(|f| f.to_string()).collect()),
            ..ObjectMeta::default()
        }
    }

    fn namespace(finalizers: &[&str]) -> Namespace {
        Namespace {
            spec: Some(NamespaceSpec {
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
            }),
            ..Namespace::default()
        }
    }

    fn condition<'a>(status: &'a NamespaceStatus, type_: &str) -> &'a NamespaceCondition {
        status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap()
    }

    #[test]
    fn deletes_every_namespaced_deletable_resource_and_nothing_cluster_scoped() {
        let names: Vec<(&str, &str)> = deletable_resources()
            .map(|r| (r.group, r.resource))
            .collect();
        for wanted in [
            ("", "pods"),
            ("", "configmaps"),
            ("", "secrets"),
            ("", "serviceaccounts"),
            ("", "events"),
            ("apps", "deployments"),
            ("apps", "replicasets"),
            ("coordination.k8s.io", "leases"),
        ] {
            assert!(names.contains(&wanted), "{wanted:?} missing from {names:?}");
        }
        for unwanted in [
            ("", "namespaces"),
            ("", "nodes"),
            ("rbac.authorization.k8s.io", "clusterroles"),
            ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ] {
            assert!(
                !names.contains(&unwanted),
                "{unwanted:?} must not be deleted"
            );
        }
    }

    #[test]
    fn api_resource_builds_the_namespaced_collection_path() {
        let path = api_resource(resource("apps", "deployments")).collection_path(Some("team-a"));
        assert_eq!(path, "/apis/apps/v1/namespaces/team-a/deployments");
        let path = api_resource(resource("", "configmaps")).collection_path(Some("team-a"));
        assert_eq!(path, "/api/v1/namespaces/team-a/configmaps");
    }

    #[test]
    fn pod_estimate_is_the_longest_grace_period_of_unfinished_pods() {
        let pods = [
            pod(Some(30), Some("Running")),
            pod(Some(90), None),
            // Finished pods have nothing to stop.
            pod(Some(600), Some("Succeeded")),
            pod(Some(600), Some("Failed")),
            pod(None, Some("Pending")),
        ];
        assert_eq!(pod_grace_estimate(&pods), 90);
        assert_eq!(pod_grace_estimate(&[]), 0);
        assert_eq!(pod_grace_estimate(&[pod(Some(-5), None)]), 0);
    }

    #[test]
    fn estimate_is_dropped_once_the_grace_period_has_passed_since_deletion() {
        let deleted_at = at(0);
        assert_eq!(remaining_estimate(30, &deleted_at, &at(10)), 30);
        assert_eq!(remaining_estimate(30, &deleted_at, &at(29)), 30);
        assert_eq!(remaining_estimate(30, &deleted_at, &at(30)), 0);
        assert_eq!(remaining_estimate(0, &deleted_at, &at(0)), 0);
    }

    #[test]
    fn nothing_left_is_done_even_with_a_grace_estimate() {
        let outcome = judge_remaining(resource("", "pods"), "ns", &[], 30);
        assert_eq!(outcome, ResourceOutcome::default());
    }

    #[test]
    fn objects_inside_a_grace_period_are_waited_for() {
        let left = [meta("a", &[]), meta("b", &[])];
        let outcome = judge_remaining(resource("", "pods"), "ns", &left, 30);
        assert_eq!(outcome.remaining, 2);
        assert_eq!(outcome.estimate_secs, 30);
        assert_eq!(outcome.error, None);
    }

    #[test]
    fn objects_held_by_finalizers_are_waited_for_with_the_finalizer_estimate() {
        let left = [
            meta("a", &["foregroundDeletion"]),
            meta("b", &["foregroundDeletion", "example.com/hold"]),
            meta("c", &[]),
        ];
        let outcome = judge_remaining(resource("apps", "replicasets"), "ns", &left, 0);
        assert_eq!(outcome.remaining, 3);
        assert_eq!(outcome.estimate_secs, FINALIZER_ESTIMATE_SECS);
        assert_eq!(outcome.error, None);
        assert_eq!(
            outcome.finalizers,
            BTreeMap::from([
                ("example.com/hold".to_string(), 1),
                ("foregroundDeletion".to_string(), 2)
            ])
        );
    }

    #[test]
    fn objects_left_with_no_reason_are_an_error() {
        let outcome = judge_remaining(resource("", "configmaps"), "team-a", &[meta("a", &[])], 0);
        assert_eq!(outcome.remaining, 1);
        assert_eq!(outcome.estimate_secs, 0);
        assert_eq!(
            outcome.error.as_deref(),
            Some(
                "unexpected items still remain in namespace: team-a for gvr: /v1, Resource=configmaps"
            )
        );
    }

    #[test]
    fn an_empty_report_finalizes_and_writes_only_ok_conditions() {
        let report = ContentReport::default();
        assert_eq!(report.verdict(), Verdict::Finalize);
        let now = at(0);
        assert!(report.conditions(&now).is_empty());
        let mut status = NamespaceStatus::default();
        assert!(update_conditions(
            &mut status,
            &report.conditions(&now),
            &now
        ));
        let conditions = status.conditions.as_ref().unwrap();
        let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, CONDITION_TYPES);
        assert!(conditions.iter().all(|c| c.status == "False"));
        let remaining = condition(&status, "NamespaceContentRemaining");
        assert_eq!(remaining.reason.as_deref(), Some("ContentRemoved"));
        assert_eq!(
            remaining.message.as_deref(),
            Some("All content successfully removed")
        );
        // The same outcome again changes nothing, so nothing is written.
        assert!(!update_conditions(&mut status, &[], &at(60)));
        assert_eq!(
            condition(&status, "NamespaceContentRemaining").last_transition_time,
            Some(at(0))
        );
    }

    #[test]
    fn remaining_content_and_finalizers_are_reported_as_kubernetes_words_them() {
        let mut report = ContentReport::default();
        report.add(
            resource("", "configmaps"),
            judge_remaining(
                resource("", "configmaps"),
                "ns",
                &[meta("a", &["example.com/hold"])],
                0,
            ),
        );
        report.add(
            resource("apps", "replicasets"),
            judge_remaining(
                resource("apps", "replicasets"),
                "ns",
                &[
                    meta("a", &["foregroundDeletion"]),
                    meta("b", &["foregroundDeletion"]),
                ],
                0,
            ),
        );
        report.add(resource("", "secrets"), ResourceOutcome::default());
        assert_eq!(report.estimate_secs, FINALIZER_ESTIMATE_SECS);
        assert_eq!(report.verdict(), Verdict::Wait(Duration::from_secs(8)));

        let now = at(0);
        let mut status = NamespaceStatus::default();
        assert!(update_conditions(
            &mut status,
            &report.conditions(&now),
            &now
        ));
        let remaining = condition(&status, "NamespaceContentRemaining");
        assert_eq!(remaining.status, "True");
        assert_eq!(remaining.reason.as_deref(), Some("SomeResourcesRemain"));
        assert_eq!(
            remaining.message.as_deref(),
            Some(
                "Some resources are remaining: configmaps. has 1 resource instances, replicasets.apps has 2 resource instances"
            )
        );
        let finalizers = condition(&status, "NamespaceFinalizersRemaining");
        assert_eq!(finalizers.status, "True");
        assert_eq!(finalizers.reason.as_deref(), Some("SomeFinalizersRemain"));
        assert_eq!(
            finalizers.message.as_deref(),
            Some(
                "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances, foregroundDeletion in 2 resource instances"
            )
        );
        assert_eq!(
            condition(&status, "NamespaceDeletionContentFailure").status,
            "False"
        );

        // Once the content is gone the same conditions flip back to their ok variants, with a
        // new transition time.
        assert!(update_conditions(&mut status, &[], &at(20)));
        let remaining = condition(&status, "NamespaceContentRemaining");
        assert_eq!(remaining.status, "False");
        assert_eq!(remaining.last_transition_time, Some(at(20)));
        assert_eq!(
            condition(&status, "NamespaceFinalizersRemaining")
                .reason
                .as_deref(),
            Some("ContentHasNoFinalizers")
        );
    }

    #[test]
    fn errors_are_retried_before_any_estimate_and_reported_sorted() {
        let mut report = ContentReport::default();
        report.add(
            resource("", "pods"),
            ResourceOutcome::failed(30, "b went wrong".into()),
        );
        report.add(
            resource("", "secrets"),
            ResourceOutcome::failed(0, "a went wrong".into()),
        );
        assert_eq!(
            report.verdict(),
            Verdict::Retry("a went wrong, b went wrong".into())
        );
        let conditions = report.conditions(&at(0));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, "NamespaceDeletionContentFailure");
        assert_eq!(
            conditions[0].reason.as_deref(),
            Some("ContentDeletionFailed")
        );
        assert_eq!(
            conditions[0].message.as_deref(),
            Some("Failed to delete all resource types, 2 remaining: a went wrong, b went wrong")
        );
    }

    #[test]
    fn a_grace_period_waits_half_of_it_plus_a_second() {
        let mut report = ContentReport::default();
        report.add(
            resource("", "pods"),
            judge_remaining(resource("", "pods"), "ns", &[meta("p", &[])], 30),
        );
        assert_eq!(report.verdict(), Verdict::Wait(Duration::from_secs(16)));
        assert_eq!(requeue_after(0), Duration::from_secs(1));
        assert_eq!(requeue_after(1), Duration::from_secs(1));
        assert_eq!(requeue_after(-3), Duration::from_secs(1));
    }

    #[test]
    fn finalize_removes_only_the_kubernetes_token() {
        let ns = namespace(&[
            "z.example.com/x",
            "kubernetes",
            "a.example.com/y",
            "a.example.com/y",
        ]);
        assert!(!finalized(&ns));
        assert_eq!(
            finalizers_after_finalize(&ns),
            ["a.example.com/y", "z.example.com/x"]
        );
        assert!(finalizers_after_finalize(&namespace(&["kubernetes"])).is_empty());
        assert!(finalized(&namespace(&[])));
        assert!(finalized(&Namespace::default()));
    }

    #[test]
    fn only_namespaces_being_deleted_are_queued() {
        let mut ns = namespace(&["kubernetes"]);
        assert!(!is_deleting(&ns));
        ns.metadata.deletion_timestamp = Some(at(0));
        assert!(is_deleting(&ns));
    }

    #[test]
    fn a_non_status_error_body_still_becomes_an_api_error() {
        let e = status_error(500, b"upstream exploded");
        assert_eq!(e.code(), Some(500));
        assert!(e.to_string().contains("upstream exploded"), "{e}");
        let e = status_error(
            403,
            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"no"}"#,
        );
        assert_eq!(e.code(), Some(403));
    }
}
