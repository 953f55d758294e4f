//! The StatefulSet controller (kube-controller-manager's `pkg/controller/statefulset`), basic
//! form: pods with stable names `<set>-<ordinal>`, created in order and removed in reverse
//! order, each with its own PersistentVolumeClaims.
//!
//! - Identity: pod `web-2` of set `web` carries the labels
//!   `statefulset.kubernetes.io/pod-name: web-2` and `apps.kubernetes.io/pod-index: "2"`,
//!   hostname `web-2` and subdomain `spec.serviceName`, so the headless Service gives it the
//!   DNS name `web-2.<service>`.
//! - `podManagementPolicy: OrderedReady` (the default): ordinal `i` is created only once
//!   `0..i` are all Running and Ready (and available for `minReadySeconds`); a scale-down
//!   deletes the highest ordinal first, one at a time, waiting for each to be gone.
//!   `Parallel`: everything missing is created and everything condemned is deleted at once.
//! - Storage: each `volumeClaimTemplates` entry `data` becomes the PVC `data-web-2`, created
//!   before the pod and mounted as the pod's volume `data` — if the apiserver serves PVCs at
//!   all (skerry's catalogue decides; without them the pod still names its claims).
//! - Rolling update, basic form: once every pod is healthy, the highest-ordinal pod (at or
//!   above `partition`) whose `controller-revision-hash` is not the update revision is
//!   deleted; the ordered creation above brings it back from the current template. The
//!   revision is `<set>-<hash>` with [`crate::hash::compute_hash`] of the template; no
//!   ControllerRevision objects are written (skerry's apiserver does not serve them), so new
//!   pods are always created from the current template, even below a `partition`.
//!
//! Why no expectations here, unlike the ReplicaSet and DaemonSet controllers (`docs/tricks.md`
//! #27): the other answer to a lagging cache is a name that is a function of the desired
//! state (as the Deployment hash is, #28). A sync that runs before its own `web-1` reached the
//! cache tries to create `web-1` again and gets `AlreadyExists`, never a second pod; the error
//! re-queues the set and the pod's ADDED event wakes it anyway.
//!
//! Where to start: [`StatefulSetController::sync_stateful_set`]; the decision is the pure
//! [`plan`], and the status [`calculate_status`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use skerry_api::selector::LabelSelector;
use skerry_client::cache::Indexer;
use skerry_client::informer::SharedInformer;
use skerry_client::retry::{Backoff, DEFAULT_RETRY, retry_on_conflict};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, Error, PostParams, key_of};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::Context;
use crate::daemonset::{CONTROLLER_REVISION_HASH_LABEL, claim_pods};
use crate::hash::compute_hash;
use crate::podcontrol::{CreatePodError, PodControl, pod_from_template};
use crate::runtime::{self, Reconciler};
use crate::util::{
    self, Forward, controller_of, is_pod_available, is_pod_ready, resolve_controller_ref,
};

/// The label naming a StatefulSet pod (apps/v1 `StatefulSetPodNameLabel`): a Service can
/// select one member by it.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

/// The label carrying a StatefulSet pod's ordinal (apps/v1 `PodIndexLabel`, Kubernetes 1.28+).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// `podManagementPolicy` that creates and deletes all pods at once.
pub const PARALLEL: &str = "Parallel";

/// The update strategy that replaces pods only when a user deletes them.
pub const ON_DELETE: &str = "OnDelete";

/// Workers syncing StatefulSets at once: kube-controller-manager's
/// `--concurrent-statefulset-syncs` default.
pub const DEFAULT_WORKERS: usize = 5;

/// The retries of a status write that hit a conflict, each on a fresh GET: client-go's
/// `retry.DefaultRetry` (five runs 10 ms apart), which Kubernetes' StatefulSet status
/// updater (`realStatefulSetStatusUpdater`) wraps its write in.
pub const STATUS_UPDATE_RETRY: Backoff = DEFAULT_RETRY;

/// The longest revision-name prefix: a ControllerRevision name is a DNS subdomain (253) and
/// the hash suffix needs the rest (Kubernetes' `ControllerRevisionName` truncates at 223).
pub const REVISION_NAME_PREFIX_MAX: usize = 223;

/// The kind and apiVersion in a pod's controller reference to its StatefulSet.
const KIND: &str = "StatefulSet";
const API_VERSION: &str = "apps/v1";

// ---- identity -----------------------------------------------------------------------------

/// The name of the pod with `ordinal` in set `set_name`.
pub fn pod_name(set_name: &str, ordinal: i32) -> String {
    format!("{set_name}-{ordinal}")
}

/// The ordinal of `pod_name` if it is a member of set `set_name` (Kubernetes'
/// `getParentNameAndOrdinal`: the name is `<parent>-<digits>` and the parent is the set).
pub fn parse_ordinal(set_name: &str, pod_name: &str) -> Option<i32> {
    let (parent, digits) = pod_name.rsplit_once('-')?;
    if parent != set_name || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The name of the PVC for `claim` of `set_name`'s pod `ordinal`.
pub fn claim_name(claim: &str, set_name: &str, ordinal: i32) -> String {
    format!("{claim}-{set_name}-{ordinal}")
}

fn set_name(set: &StatefulSet) -> &str {
    set.metadata.name.as_deref().unwrap_or_default()
}

/// The first ordinal (`spec.ordinals.start`, default 0).
pub fn start_ordinal(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0)
}

/// `spec.replicas` (default 1, never negative).
pub fn replicas(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1)
        .max(0)
}

fn min_ready_seconds(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
}

/// Whether pods are created and deleted in order (not `Parallel`).
pub fn is_ordered(set: &StatefulSet) -> bool {
    set.spec
        .as_ref()
        .and_then(|s| s.pod_management_policy.as_deref())
        != Some(PARALLEL)
}

/// The update revision of `set`: `<set>-<hash of the template and collision count>`, the
/// value of its pods' `controller-revision-hash` label.
pub fn update_revision(set: &StatefulSet) -> String {
    let template = set
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let collision_count = set.status.as_ref().and_then(|s| s.collision_count);
    let name = set_name(set);
    let prefix = name.get(..REVISION_NAME_PREFIX_MAX).unwrap_or(name);
    format!("{prefix}-{}", compute_hash(&template, collision_count))
}

/// The current revision: the one the status names, else the update revision (a new set).
pub fn current_revision(set: &StatefulSet, update_revision: &str) -> String {
    set.status
        .as_ref()
        .and_then(|s| s.current_revision.clone())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| update_revision.to_string())
}

/// The PVCs pod `ordinal` of `set` uses, by template name (Kubernetes'
/// `getPersistentVolumeClaims`): named `<claim>-<set>-<ordinal>`, in the set's namespace,
/// labelled with the template's labels and the set's `matchLabels`.
pub fn persistent_volume_claims(
    set: &StatefulSet,
    ordinal: i32,
) -> BTreeMap<String, PersistentVolumeClaim> {
    let Some(spec) = set.spec.as_ref() else {
        return BTreeMap::new();
    };
    let match_labels = spec.selector.match_labels.clone().unwrap_or_default();
    let mut claims = BTreeMap::new();
    for template in spec.volume_claim_templates.iter().flatten() {
        let template_name = template.metadata.name.clone().unwrap_or_default();
        let mut claim = template.clone();
        let mut labels = claim.metadata.labels.take().unwrap_or_default();
        labels.extend(match_labels.clone());
        claim.metadata = ObjectMeta {
            name: Some(claim_name(&template_name, set_name(set), ordinal)),
            namespace: set.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: claim.metadata.annotations,
            ..ObjectMeta::default()
        };
        claim.status = None;
        claims.insert(template_name, claim);
    }
    claims
}

/// The pod with `ordinal` of `set` at `revision` (Kubernetes' `newStatefulSetPod` +
/// `initIdentity` + `updateStorage`): the template's pod, named, labelled, with hostname and
/// subdomain, and a volume per claim template that replaces any template volume of that name.
pub fn new_stateful_pod(
    set: &StatefulSet,
    ordinal: i32,
    revision: &str,
) -> Result<Pod, CreatePodError> {
    let template = set
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let controller_ref = util::controller_ref(API_VERSION, KIND, &set.metadata);
    let mut pod = pod_from_template(&template, &set.metadata, Some(controller_ref))?;
    let name = pod_name(set_name(set), ordinal);
    pod.metadata.generate_name = None;
    pod.metadata.name = Some(name.clone());
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(POD_NAME_LABEL.to_string(), name.clone());
    labels.insert(POD_INDEX_LABEL.to_string(), ordinal.to_string());
    labels.insert(
        CONTROLLER_REVISION_HASH_LABEL.to_string(),
        revision.to_string(),
    );
    let service_name = set.spec.as_ref().and_then(|s| s.service_name.clone());
    let claims = persistent_volume_claims(set, ordinal);
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.hostname = Some(name);
    spec.subdomain = service_name.filter(|s| !s.is_empty());
    if !claims.is_empty() {
        let mut volumes: Vec<Volume> = claims
            .iter()
            .map(|(volume, claim)| Volume {
                name: volume.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.metadata.name.clone().unwrap_or_default(),
                    read_only: None,
                }),
                ..Volume::default()
            })
            .collect();
        volumes.extend(
            spec.volumes
                .take()
                .into_iter()
                .flatten()
                .filter(|v| !claims.contains_key(&v.name)),
        );
        spec.volumes = Some(volumes);
    }
    Ok(pod)
}

// ---- decisions ----------------------------------------------------------------------------

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn is_running_and_ready(pod: &Pod) -> bool {
    phase(pod) == Some("Running") && is_pod_ready(pod)
}

fn is_running_and_available(pod: &Pod, min_ready_seconds: i32, now: &Time) -> bool {
    phase(pod) == Some("Running") && is_pod_available(pod, min_ready_seconds, now.clone())
}

fn is_healthy(pod: &Pod) -> bool {
    is_running_and_ready(pod) && !is_terminating(pod)
}

/// The pod's revision label.
pub fn pod_revision(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(CONTROLLER_REVISION_HASH_LABEL)
        .map(String::as_str)
}

/// Why a pod is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// It finished (Failed or Succeeded); the next sync re-creates it.
    Finished,
    /// Its ordinal is beyond `replicas`.
    ScaleDown,
    /// It is of an old revision.
    Update,
}

/// One write a sync makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the claims, then the pod, of this ordinal.
    Create(i32),
    /// Delete this pod.
    Delete {
        /// The pod's name.
        name: String,
        /// Why.
        reason: DeleteReason,
    },
}

fn delete(pod: &Pod, reason: DeleteReason) -> Action {
    Action::Delete {
        name: pod.metadata.name.clone().unwrap_or_default(),
        reason,
    }
}

/// What one sync of `set` does, given its member pods (Kubernetes'
/// `defaultStatefulSetControl.updateStatefulSet`, basic form):
///
/// 1. each ordinal in `[start, start + replicas)` in ascending order: a finished pod is
///    deleted, a missing one created; under OrderedReady the pass stops at the first pod
///    created, deleted, terminating, or not yet Running + Ready (+ available);
/// 2. pods beyond the range ("condemned"), highest ordinal first: deleted; under OrderedReady
///    only one, and not while the one above is still terminating;
/// 3. with the RollingUpdate strategy, from the highest ordinal down to `partition`: the
///    first pod of an old revision is deleted, and the pass stops at any pod that is not
///    healthy, so one pod is replaced at a time.
///
/// Under OrderedReady the pass reaches step 2 only when every wanted pod is healthy, and
/// step 3 only when nothing is condemned.
pub fn plan(
    set: &StatefulSet,
    pods: &[Arc<Pod>],
    update_revision: &str,
    now: &Time,
) -> Vec<Action> {
    let mut actions = Vec::new();
    if set.metadata.deletion_timestamp.is_some() {
        return actions;
    }
    let name = set_name(set);
    let start = start_ordinal(set);
    let wanted = replicas(set);
    let ordered = is_ordered(set);
    let min_ready = min_ready_seconds(set);
    let mut slots: Vec<Option<&Arc<Pod>>> = vec![None; usize::try_from(wanted).unwrap_or(0)];
    let mut condemned: Vec<(i32, &Arc<Pod>)> = Vec::new();
    for pod in pods {
        let Some(ordinal) = parse_ordinal(name, pod.metadata.name.as_deref().unwrap_or_default())
        else {
            continue;
        };
        match usize::try_from(ordinal - start)
            .ok()
            .filter(|&i| i < slots.len())
        {
            Some(i) => slots[i] = Some(pod),
            None => condemned.push((ordinal, pod)),
        }
    }
    condemned.sort_by_key(|c| std::cmp::Reverse(c.0));

    // 1. The wanted ordinals, ascending.
    for (i, slot) in slots.iter().enumerate() {
        let ordinal = start + i32::try_from(i).unwrap_or(i32::MAX);
        let Some(pod) = slot else {
            actions.push(Action::Create(ordinal));
            if ordered {
                return actions;
            }
            continue;
        };
        if matches!(phase(pod), Some("Failed" | "Succeeded")) {
            if !is_terminating(pod) {
                actions.push(delete(pod, DeleteReason::Finished));
            }
            if ordered {
                return actions;
            }
            continue;
        }
        if ordered
            && (is_terminating(pod)
                || !is_running_and_ready(pod)
                || !is_running_and_available(pod, min_ready, now))
        {
            return actions;
        }
    }

    // 2. The condemned, highest ordinal first.
    for (_, pod) in &condemned {
        if is_terminating(pod) {
            if ordered {
                return actions;
            }
            continue;
        }
        actions.push(delete(pod, DeleteReason::ScaleDown));
        if ordered {
            return actions;
        }
    }

    // 3. The rolling update, highest ordinal first, one pod at a time.
    let strategy = set.spec.as_ref().and_then(|s| s.update_strategy.as_ref());
    if strategy.and_then(|u| u.type_.as_deref()) == Some(ON_DELETE) {
        return actions;
    }
    let partition = strategy
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
        .max(0);
    let partition = usize::try_from(partition).unwrap_or(0);
    for slot in slots.iter().skip(partition).rev() {
        // A pod created (or to be created) in this pass is of the update revision and not
        // yet healthy: wait for it.
        let Some(pod) = slot else {
            return actions;
        };
        if pod_revision(pod) != Some(update_revision) && !is_terminating(pod) {
            actions.push(delete(pod, DeleteReason::Update));
            return actions;
        }
        if !is_healthy(pod) {
            return actions;
        }
    }
    actions
}

/// The status `set` should have with its member `pods` (Kubernetes' `computeReplicaStatus` +
/// `completeRollingUpdate`): counts, the revisions, and — once every pod is of the update
/// revision and ready — the update revision made current. Conditions and the collision count
/// are carried over.
pub fn calculate_status(
    set: &StatefulSet,
    pods: &[Arc<Pod>],
    current_revision: &str,
    update_revision: &str,
    now: &Time,
) -> StatefulSetStatus {
    let min_ready = min_ready_seconds(set);
    let mut status = set.status.clone().unwrap_or_default();
    let (mut count, mut ready, mut available, mut current, mut updated) = (0, 0, 0, 0, 0);
    for pod in pods {
        count += 1;
        if is_running_and_ready(pod) {
            ready += 1;
            if is_running_and_available(pod, min_ready, now) {
                available += 1;
            }
        }
        if !is_terminating(pod) {
            let revision = pod_revision(pod);
            if revision == Some(current_revision) {
                current += 1;
            }
            if revision == Some(update_revision) {
                updated += 1;
            }
        }
    }
    status.observed_generation = set.metadata.generation;
    status.replicas = count;
    status.ready_replicas = Some(ready);
    status.available_replicas = Some(available);
    status.current_replicas = Some(current);
    status.updated_replicas = Some(updated);
    status.current_revision = Some(current_revision.to_string());
    status.update_revision = Some(update_revision.to_string());
    let rolling = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        != Some(ON_DELETE);
    if rolling && updated == count && ready == count {
        status.current_replicas = Some(updated);
        status.current_revision = Some(update_revision.to_string());
    }
    status
}

// ---- the controller -----------------------------------------------------------------------

/// The StatefulSet and PVC reads and writes the controller makes. Object-safe so tests
/// substitute a fake; [`Client`] implements it.
pub trait StatefulSetClient: Send + Sync + 'static {
    /// GET `namespace/name`.
    fn get_stateful_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<StatefulSet, Error>>;
    /// PUT the status subresource (409 on a stale resourceVersion).
    fn replace_stateful_set_status<'a>(
        &'a self,
        set: &'a StatefulSet,
    ) -> BoxFuture<'a, Result<StatefulSet, Error>>;
    /// Creates a PVC (AlreadyExists when it is there).
    fn create_claim<'a>(
        &'a self,
        namespace: &'a str,
        claim: &'a PersistentVolumeClaim,
    ) -> BoxFuture<'a, Result<(), Error>>;
}

impl StatefulSetClient for Client {
    fn get_stateful_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<StatefulSet, Error>> {
        Box::pin(async move { self.api::<StatefulSet>(Some(namespace)).get(name).await })
    }

    fn replace_stateful_set_status<'a>(
        &'a self,
        set: &'a StatefulSet,
    ) -> BoxFuture<'a, Result<StatefulSet, Error>> {
        Box::pin(async move {
            let namespace = set.metadata.namespace.as_deref().unwrap_or_default();
            let name = set.metadata.name.as_deref().unwrap_or_default();
            self.api::<StatefulSet>(Some(namespace))
                .replace_status(name, &PostParams::default(), set)
                .await
        })
    }

    fn create_claim<'a>(
        &'a self,
        namespace: &'a str,
        claim: &'a PersistentVolumeClaim,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.api::<PersistentVolumeClaim>(Some(namespace))
                .create(&PostParams::default(), claim)
                .await
                .map(|_| ())
        })
    }
}

/// Whether the apiserver this build talks to serves PersistentVolumeClaims (skerry's
/// catalogue). Without them the controller skips creating claims.
pub fn claims_served() -> bool {
    skerry_api::catalogue::lookup("", "v1", "persistentvolumeclaims").is_some()
}

/// What a [`StatefulSetController`] is built from, for tests.
pub struct Parts {
    /// The StatefulSet lister's store.
    pub stateful_sets: Indexer<StatefulSet>,
    /// The pod lister's store.
    pub pods: Indexer<Pod>,
    /// Pod writes.
    pub pod_control: Arc<dyn PodControl>,
    /// StatefulSet GET and status writes, PVC creation.
    pub stateful_set_client: Arc<dyn StatefulSetClient>,
    /// Whether to create PVCs for `volumeClaimTemplates` (see [`claims_served`]).
    pub claims_served: bool,
}

/// The StatefulSet controller. Build it with [`StatefulSetController::new`], then run it with
/// [`StatefulSetController::run`] once the informers are started.
pub struct StatefulSetController {
    stateful_sets: Indexer<StatefulSet>,
    pods: Indexer<Pod>,
    pod_control: Arc<dyn PodControl>,
    stateful_set_client: Arc<dyn StatefulSetClient>,
    claims_served: bool,
    queue: WorkQueue<String>,
    /// The shared informers `run` waits for (none when built from [`Parts`]).
    informers: Option<(SharedInformer<StatefulSet>, SharedInformer<Pod>)>,
}

impl StatefulSetController {
    /// A controller over the context's shared StatefulSet and Pod informers, with its event
    /// handlers registered.
    pub fn new(ctx: &Context) -> Arc<StatefulSetController> {
        let set_informer = ctx.informers.informer::<StatefulSet>();
        let pod_informer = ctx.informers.informer::<Pod>();
        let parts = Parts {
            stateful_sets: set_informer.store(),
            pods: pod_informer.store(),
            pod_control: Arc::new(ctx.client.clone()),
            stateful_set_client: Arc::new(ctx.client.clone()),
            claims_served: claims_served(),
        };
        let controller = Arc::new(Self::build(
            parts,
            Some((set_informer.clone(), pod_informer.clone())),
        ));
        // Every StatefulSet change, deletion included, just queues its key.
        set_informer.add_handler(Forward::new(
            &controller,
            |c, set| c.add_stateful_set(set),
            |c, _old, new| c.add_stateful_set(new),
            |c, set| c.add_stateful_set(set),
        ));
        pod_informer.add_handler(Forward::new(
            &controller,
            |c, pod| c.add_pod(pod),
            |c, old, new| c.update_pod(old, new),
            |c, pod| c.delete_pod(pod),
        ));
        controller
    }

    /// A controller over caches and writers the caller provides; no handlers are registered.
    pub fn from_parts(parts: Parts) -> Arc<StatefulSetController> {
        Arc::new(Self::build(parts, None))
    }

    fn build(
        parts: Parts,
        informers: Option<(SharedInformer<StatefulSet>, SharedInformer<Pod>)>,
    ) -> StatefulSetController {
        StatefulSetController {
            stateful_sets: parts.stateful_sets,
            pods: parts.pods,
            pod_control: parts.pod_control,
            stateful_set_client: parts.stateful_set_client,
            claims_served: parts.claims_served,
            queue: WorkQueue::new("statefulset"),
            informers,
        }
    }

    /// The controller's work queue of StatefulSet keys.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits for the informers' first lists, then runs `workers` workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        if let Some((sets, pods)) = &self.informers
            && (!sets.wait_for_sync(&stop).await || !pods.wait_for_sync(&stop).await)
        {
            tracing::info!("statefulset controller stopped before its caches synced");
            return;
        }
        tracing::info!(workers, "starting statefulset controller");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }

    // ---- event handlers -------------------------------------------------------------------

    fn enqueue(&self, set: &StatefulSet) {
        self.queue.add(key_of(set));
    }

    /// The StatefulSets that select an orphan `pod` and whose member it would be.
    fn pod_stateful_sets(&self, pod: &Pod) -> Vec<Arc<StatefulSet>> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        self.stateful_sets
            .list_namespace(namespace)
            .into_iter()
            .filter(|set| {
                parse_ordinal(set_name(set), pod_name).is_some()
                    && set.spec.as_ref().is_some_and(|s| {
                        LabelSelector::from_api(&s.selector).is_ok_and(|sel| {
                            !sel.is_empty() && sel.matches_opt(pod.metadata.labels.as_ref())
                        })
                    })
            })
            .collect()
    }

    /// A StatefulSet appeared or changed.
    pub fn add_stateful_set(&self, set: &StatefulSet) {
        self.enqueue(set);
    }

    /// A pod appeared.
    pub fn add_pod(&self, pod: &Pod) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        match controller_of(&pod.metadata) {
            Some(r) => {
                if let Some(set) = resolve_controller_ref(&self.stateful_sets, namespace, r) {
                    self.enqueue(&set);
                }
            }
            None => {
                for set in self.pod_stateful_sets(pod) {
                    self.enqueue(&set);
                }
            }
        }
    }

    /// A pod changed: its owner (old and new, if that changed) looks again.
    pub fn update_pod(&self, old: &Pod, cur: &Pod) {
        if old.metadata.resource_version == cur.metadata.resource_version {
            return; // A resync.
        }
        let namespace = cur.metadata.namespace.as_deref().unwrap_or_default();
        let (old_ref, cur_ref) = (controller_of(&old.metadata), controller_of(&cur.metadata));
        if old_ref != cur_ref
            && let Some(set) =
                old_ref.and_then(|r| resolve_controller_ref(&self.stateful_sets, namespace, r))
        {
            self.enqueue(&set);
        }
        match cur_ref {
            Some(r) => {
                let Some(set) = resolve_controller_ref(&self.stateful_sets, namespace, r) else {
                    return;
                };
                self.enqueue(&set);
                // Ready now, available minReadySeconds later: the next ordinal waits for it.
                let min_ready = min_ready_seconds(&set);
                if !is_pod_ready(old) && is_pod_ready(cur) && min_ready > 0 {
                    let delay = Duration::from_secs(u64::from(min_ready.unsigned_abs()) + 1);
                    self.queue.add_after(key_of(set.as_ref()), delay);
                }
            }
            None => {
                if old.metadata.labels != cur.metadata.labels || old_ref.is_some() {
                    for set in self.pod_stateful_sets(cur) {
                        self.enqueue(&set);
                    }
                }
            }
        }
    }

    /// A pod was deleted: under OrderedReady, the next step may now proceed.
    pub fn delete_pod(&self, pod: &Pod) {
        let Some(r) = controller_of(&pod.metadata) else {
            return;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        if let Some(set) = resolve_controller_ref(&self.stateful_sets, namespace, r) {
            self.enqueue(&set);
        }
    }

    // ---- sync -------------------------------------------------------------------------------

    /// Takes the StatefulSet at `key` one step (or, under `Parallel`, all steps) towards its
    /// desired pods, and writes its status.
    pub async fn sync_stateful_set(&self, key: &str) -> anyhow::Result<()> {
        let (namespace, name) = util::split_key(key);
        let Some(set) = self.stateful_sets.get_by(namespace, name) else {
            tracing::debug!(statefulset = %key, "statefulset gone");
            return Ok(());
        };
        let selector = match set
            .spec
            .as_ref()
            .map(|s| LabelSelector::from_api(&s.selector).map_err(|e| e.message))
        {
            Some(Ok(s)) if !s.is_empty() => s,
            // Retrying cannot fix a selector; the next update of the set will.
            other => {
                tracing::warn!(statefulset = %key, selector = ?other, "empty or invalid selector; nothing to do");
                return Ok(());
            }
        };
        let update_revision = update_revision(&set);
        let current_revision = current_revision(&set, &update_revision);
        let pods = self.claim(&set, &selector, namespace).await?;

        let actions = plan(&set, &pods, &update_revision, &util::now());
        let result = self.execute(&set, &actions, &update_revision).await;
        let status = calculate_status(
            &set,
            &pods,
            &current_revision,
            &update_revision,
            &util::now(),
        );
        let min_ready = min_ready_seconds(&set);
        if min_ready > 0 && status.ready_replicas != status.available_replicas {
            let delay = Duration::from_secs(u64::from(min_ready.unsigned_abs()));
            self.queue.add_after(key.to_string(), delay);
        }
        let status_result = self.update_status(&set, status).await;
        result.and(status_result)
    }

    async fn claim(
        &self,
        set: &StatefulSet,
        selector: &LabelSelector,
        namespace: &str,
    ) -> anyhow::Result<Vec<Arc<Pod>>> {
        let controller_ref = util::controller_ref(API_VERSION, KIND, &set.metadata);
        let name = set_name(set);
        let recheck = async || {
            let fresh = self
                .stateful_set_client
                .get_stateful_set(namespace, name)
                .await
                .map_err(|e| e.to_string())?;
            if fresh.metadata.uid != set.metadata.uid {
                return Err(format!("original {namespace}/{name} is gone"));
            }
            if fresh.metadata.deletion_timestamp.is_some() {
                return Err(format!("{namespace}/{name} has just been deleted"));
            }
            Ok(())
        };
        claim_pods(
            self.pod_control.as_ref(),
            &set.metadata,
            &controller_ref,
            selector,
            self.pods.list_namespace(namespace),
            |pod| parse_ordinal(name, pod.metadata.name.as_deref().unwrap_or_default()).is_some(),
            recheck,
        )
        .await
    }

    /// Carries out `actions` in order, stopping at the first that fails.
    async fn execute(
        &self,
        set: &StatefulSet,
        actions: &[Action],
        update_revision: &str,
    ) -> anyhow::Result<()> {
        let namespace = set.metadata.namespace.as_deref().unwrap_or_default();
        let name = set_name(set);
        for action in actions {
            match action {
                Action::Create(ordinal) => {
                    if self.claims_served {
                        for claim in persistent_volume_claims(set, *ordinal).values() {
                            match self
                                .stateful_set_client
                                .create_claim(namespace, claim)
                                .await
                            {
                                // A claim outlives its pod on purpose: the next pod of this
                                // ordinal gets the same data.
                                Ok(()) => {}
                                Err(e) if e.is_already_exists() => {}
                                Err(e) => {
                                    let claim = claim.metadata.name.clone().unwrap_or_default();
                                    return Err(anyhow::Error::new(e)
                                        .context(format!("create claim {claim}")));
                                }
                            }
                        }
                    }
                    let pod = new_stateful_pod(set, *ordinal, update_revision)?;
                    let pod_name = pod.metadata.name.clone().unwrap_or_default();
                    self.pod_control
                        .create_pod(namespace, &pod)
                        .await
                        .with_context(|| format!("create pod {pod_name}"))?;
                    tracing::info!(statefulset = name, pod = %pod_name, "created pod");
                }
                Action::Delete {
                    name: pod_name,
                    reason,
                } => match self.pod_control.delete_pod(namespace, pod_name).await {
                    Ok(()) => {
                        tracing::info!(statefulset = name, pod = %pod_name, ?reason, "deleted pod")
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        return Err(anyhow::Error::new(e).context(format!("delete pod {pod_name}")));
                    }
                },
            }
        }
        Ok(())
    }

    /// Writes `status` if it changed, retrying conflicts on a fresh copy.
    async fn update_status(
        &self,
        set: &StatefulSet,
        status: StatefulSetStatus,
    ) -> anyhow::Result<()> {
        if set.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let namespace = set.metadata.namespace.as_deref().unwrap_or_default();
        let name = set_name(set);
        let client = &self.stateful_set_client;
        let status = &status;
        let mut runs = 0;
        retry_on_conflict(STATUS_UPDATE_RETRY, || {
            runs += 1;
            // The cached copy first; after a conflict, the winner's.
            let fresh = runs > 1;
            async move {
                let mut target = if fresh {
                    tracing::debug!(
                        statefulset = name,
                        "status update conflicted; retrying on a fresh copy"
                    );
                    client.get_stateful_set(namespace, name).await?
                } else {
                    set.clone()
                };
                target.status = Some(status.clone());
                client
                    .replace_stateful_set_status(&target)
                    .await
                    .map(|_| ())
            }
        })
        .await
        .context("update statefulset status")
    }
}

impl Reconciler for StatefulSetController {
    fn name(&self) -> &'static str {
        "statefulset"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        let span = tracing::debug_span!("sync", statefulset = %key);
        self.sync_stateful_set(key).instrument(span).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{
        RollingUpdateStatefulSetStrategy, StatefulSetOrdinals, StatefulSetSpec,
        StatefulSetUpdateStrategy,
    };
    use k8s_openapi::api::core::v1::{
        Container, EmptyDirVolumeSource, PersistentVolumeClaimSpec, PodCondition, PodSpec,
        PodStatus, PodTemplateSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Status};
    use parking_lot::Mutex;
    use serde_json::Value;

    const NS: &str = "default";

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn stateful_set(name: &str, replicas: i32) -> StatefulSet {
        let selector = labels(&[("app", name)]);
        StatefulSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                uid: Some(format!("sts-uid-{name}")),
                generation: Some(1),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                service_name: Some("web-svc".into()),
                selector: LabelSelector {
                    match_labels: Some(selector.clone()),
                    match_expressions: None,
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(selector),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "web".into(),
                            image: Some("nginx:1.27".into()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..StatefulSetSpec::default()
            }),
            status: None,
        }
    }

    fn parallel(mut set: StatefulSet) -> StatefulSet {
        set.spec.as_mut().unwrap().pod_management_policy = Some(PARALLEL.into());
        set
    }

    /// Pod `ordinal` of `set`, as the controller makes it, Pending.
    fn member(set: &StatefulSet, ordinal: i32, revision: &str) -> Pod {
        let mut pod = new_stateful_pod(set, ordinal, revision).unwrap();
        pod.metadata.uid = Some(format!("uid-{ordinal}"));
        pod.metadata.resource_version = Some("1".into());
        pod.status = Some(PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        });
        pod
    }

    fn ready(mut pod: Pod) -> Pod {
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_transition_time: Some(util::now()),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    fn terminating(mut pod: Pod) -> Pod {
        pod.metadata.deletion_timestamp = Some(util::now());
        pod
    }

    fn deleted(name: &str, reason: DeleteReason) -> Action {
        Action::Delete {
            name: name.into(),
            reason,
        }
    }

    fn plan_of(set: &StatefulSet, pods: Vec<Pod>) -> Vec<Action> {
        let revision = update_revision(set);
        let pods: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
        plan(set, &pods, &revision, &util::now())
    }

    // ---- identity ---------------------------------------------------------------------------

    #[test]
    fn ordinals_parse_only_for_members() {
        assert_eq!(parse_ordinal("web", "web-0"), Some(0));
        assert_eq!(parse_ordinal("web", "web-12"), Some(12));
        assert_eq!(parse_ordinal("web-1", "web-1-3"), Some(3));
        assert_eq!(
            parse_ordinal("web", "web-1-3"),
            None,
            "member of web-1, not web"
        );
        assert_eq!(parse_ordinal("web", "web-"), None);
        assert_eq!(parse_ordinal("web", "web-x1"), None);
        assert_eq!(parse_ordinal("web", "web-+1"), None);
        assert_eq!(parse_ordinal("web", "webby-1"), None);
        assert_eq!(parse_ordinal("web", "web-99999999999"), None, "beyond i32");
    }

    #[test]
    fn pods_carry_their_identity_and_claims() {
        let mut set = stateful_set("web", 3);
        let spec = set.spec.as_mut().unwrap();
        spec.volume_claim_templates = Some(vec![PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                labels: Some(labels(&[("tier", "db")])),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: None,
        }]);
        // A template volume named like a claim is replaced; others are kept.
        spec.template.spec.as_mut().unwrap().volumes = Some(vec![
            Volume {
                name: "data".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
            Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
        ]);
        let pod = new_stateful_pod(&set, 2, "web-abc").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-2"));
        assert_eq!(pod.metadata.generate_name, None);
        let l = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(l.get(POD_NAME_LABEL).map(String::as_str), Some("web-2"));
        assert_eq!(l.get(POD_INDEX_LABEL).map(String::as_str), Some("2"));
        assert_eq!(
            l.get(CONTROLLER_REVISION_HASH_LABEL).map(String::as_str),
            Some("web-abc")
        );
        assert_eq!(l.get("app").map(String::as_str), Some("web"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("web-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("web-svc"));
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(volumes[0].name, "data");
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "data-web-2"
        );
        assert!(volumes[0].empty_dir.is_none());
        assert_eq!(volumes[1].name, "scratch");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("StatefulSet", "sts-uid-web")
        );

        let claims = persistent_volume_claims(&set, 2);
        let claim = &claims["data"];
        assert_eq!(claim.metadata.name.as_deref(), Some("data-web-2"));
        assert_eq!(claim.metadata.namespace.as_deref(), Some(NS));
        assert_eq!(
            claim.metadata.labels.as_ref().unwrap(),
            &labels(&[("app", "web"), ("tier", "db")])
        );
    }

    #[test]
    fn revisions_follow_the_template() {
        let set = stateful_set("web", 1);
        let revision = update_revision(&set);
        assert!(revision.starts_with("web-"), "{revision}");
        assert_eq!(current_revision(&set, &revision), revision, "a new set");
        let mut changed = set.clone();
        changed
            .spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = Some("nginx:1.28".into());
        assert_ne!(update_revision(&changed), revision);
    }

    // ---- OrderedReady -----------------------------------------------------------------------

    #[test]
    fn ordered_ready_creates_the_next_ordinal_only_after_the_previous_is_ready() {
        let set = stateful_set("web", 3);
        let rev = update_revision(&set);
        let m = |i| member(&set, i, &rev);
        assert_eq!(plan_of(&set, vec![]), vec![Action::Create(0)]);
        // web-0 exists but is Pending: wait.
        assert_eq!(plan_of(&set, vec![m(0)]), vec![]);
        assert_eq!(plan_of(&set, vec![ready(m(0))]), vec![Action::Create(1)]);
        // web-1 is not ready: web-2 waits, even though web-0 is.
        assert_eq!(plan_of(&set, vec![ready(m(0)), m(1)]), vec![]);
        assert_eq!(
            plan_of(&set, vec![ready(m(0)), ready(m(1))]),
            vec![Action::Create(2)]
        );
        // A gap is filled first, before anything above it is looked at.
        assert_eq!(
            plan_of(&set, vec![ready(m(0)), ready(m(2))]),
            vec![Action::Create(1)]
        );
        // web-1 going away blocks the pass until it is gone.
        assert_eq!(
            plan_of(&set, vec![ready(m(0)), terminating(ready(m(1)))]),
            vec![]
        );
        assert_eq!(
            plan_of(&set, vec![ready(m(0)), ready(m(1)), ready(m(2))]),
            vec![]
        );
    }

    #[test]
    fn a_finished_pod_is_deleted_and_blocks_the_pass() {
        let set = stateful_set("web", 2);
        let rev = update_revision(&set);
        let mut failed = member(&set, 0, &rev);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(
            plan_of(&set, vec![failed.clone()]),
            vec![deleted("web-0", DeleteReason::Finished)]
        );
        // Once being deleted, wait for it to go (the next sync re-creates it).
        assert_eq!(plan_of(&set, vec![terminating(failed)]), vec![]);
    }

    #[test]
    fn ordered_scale_down_removes_the_highest_ordinal_one_at_a_time() {
        let set = stateful_set("web", 1);
        let rev = update_revision(&set);
        let m = |i| ready(member(&set, i, &rev));
        assert_eq!(
            plan_of(&set, vec![m(0), m(1), m(2)]),
            vec![deleted("web-2", DeleteReason::ScaleDown)]
        );
        // web-2 is terminating: web-1 waits for it.
        assert_eq!(plan_of(&set, vec![m(0), m(1), terminating(m(2))]), vec![]);
        assert_eq!(
            plan_of(&set, vec![m(0), m(1)]),
            vec![deleted("web-1", DeleteReason::ScaleDown)]
        );
        // No scale-down while a wanted pod is unhealthy.
        let pending0 = member(&set, 0, &rev);
        assert_eq!(plan_of(&set, vec![pending0, m(1)]), vec![]);
        // A condemned pod that is not ready is still removed (it is the first unhealthy).
        assert_eq!(
            plan_of(&set, vec![m(0), member(&set, 1, &rev)]),
            vec![deleted("web-1", DeleteReason::ScaleDown)]
        );
    }

    #[test]
    fn start_ordinal_shifts_the_range() {
        let mut set = stateful_set("web", 2);
        set.spec.as_mut().unwrap().ordinals = Some(StatefulSetOrdinals { start: Some(5) });
        let rev = update_revision(&set);
        assert_eq!(plan_of(&set, vec![]), vec![Action::Create(5)]);
        let m = |i| ready(member(&set, i, &rev));
        assert_eq!(
            plan_of(&set, vec![m(0), m(5)]),
            vec![Action::Create(6)],
            "web-0 is condemned, but the wanted range comes first"
        );
        assert_eq!(
            plan_of(&set, vec![m(0), m(5), m(6)]),
            vec![deleted("web-0", DeleteReason::ScaleDown)]
        );
    }

    // ---- Parallel ---------------------------------------------------------------------------

    #[test]
    fn parallel_creates_and_deletes_everything_at_once() {
        let set = parallel(stateful_set("web", 3));
        let rev = update_revision(&set);
        assert_eq!(
            plan_of(&set, vec![]),
            vec![Action::Create(0), Action::Create(1), Action::Create(2)]
        );
        assert_eq!(
            plan_of(&set, vec![member(&set, 1, &rev)]),
            vec![Action::Create(0), Action::Create(2)]
        );
        let down = parallel(stateful_set("web", 1));
        let m = |i| member(&down, i, &rev);
        assert_eq!(
            plan_of(&down, vec![m(0), m(1), m(2), terminating(m(3))]),
            vec![
                deleted("web-2", DeleteReason::ScaleDown),
                deleted("web-1", DeleteReason::ScaleDown)
            ]
        );
    }

    // ---- rolling update ---------------------------------------------------------------------

    #[test]
    fn rolling_update_replaces_from_the_highest_ordinal_one_at_a_time() {
        let set = stateful_set("web", 3);
        let rev = update_revision(&set);
        let old = |i| ready(member(&set, i, "web-old"));
        let new = |i| ready(member(&set, i, &rev));
        assert_eq!(
            plan_of(&set, vec![old(0), old(1), old(2)]),
            vec![deleted("web-2", DeleteReason::Update)]
        );
        // web-2 is back at the new revision but not ready: wait.
        let pending2 = member(&set, 2, &rev);
        assert_eq!(plan_of(&set, vec![old(0), old(1), pending2]), vec![]);
        assert_eq!(
            plan_of(&set, vec![old(0), old(1), new(2)]),
            vec![deleted("web-1", DeleteReason::Update)]
        );
        assert_eq!(plan_of(&set, vec![new(0), new(1), new(2)]), vec![]);

        // A partition keeps the ordinals below it.
        let mut partitioned = set.clone();
        partitioned.spec.as_mut().unwrap().update_strategy = Some(StatefulSetUpdateStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateStatefulSetStrategy {
                partition: Some(2),
                max_unavailable: None,
            }),
        });
        assert_eq!(plan_of(&partitioned, vec![old(0), old(1), new(2)]), vec![]);

        // OnDelete never deletes for an update.
        let mut on_delete = set.clone();
        on_delete.spec.as_mut().unwrap().update_strategy = Some(StatefulSetUpdateStrategy {
            type_: Some(ON_DELETE.into()),
            rolling_update: None,
        });
        assert_eq!(plan_of(&on_delete, vec![old(0), old(1), old(2)]), vec![]);
    }

    #[test]
    fn a_set_being_deleted_does_nothing() {
        let mut set = stateful_set("web", 3);
        set.metadata.deletion_timestamp = Some(util::now());
        assert_eq!(plan_of(&set, vec![]), vec![]);
    }

    #[test]
    fn status_counts_and_completes_the_rolling_update() {
        let set = stateful_set("web", 3);
        let rev = update_revision(&set);
        let pods: Vec<Arc<Pod>> = vec![
            ready(member(&set, 0, "web-old")),
            ready(member(&set, 1, &rev)),
            member(&set, 2, &rev),
            terminating(ready(member(&set, 3, "web-old"))),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let status = calculate_status(&set, &pods, "web-old", &rev, &util::now());
        assert_eq!(status.replicas, 4);
        assert_eq!(status.ready_replicas, Some(3));
        assert_eq!(status.available_replicas, Some(3));
        assert_eq!(
            status.current_replicas,
            Some(1),
            "terminating pods are not counted"
        );
        assert_eq!(status.updated_replicas, Some(2));
        assert_eq!(status.current_revision.as_deref(), Some("web-old"));
        assert_eq!(status.update_revision.as_deref(), Some(rev.as_str()));
        assert_eq!(status.observed_generation, Some(1));

        let done: Vec<Arc<Pod>> = (0..3)
            .map(|i| Arc::new(ready(member(&set, i, &rev))))
            .collect();
        let status = calculate_status(&set, &done, "web-old", &rev, &util::now());
        assert_eq!(status.current_revision.as_deref(), Some(rev.as_str()));
        assert_eq!(status.current_replicas, Some(3));
    }

    // ---- the controller over fakes ----------------------------------------------------------

    fn api_error(code: i32, reason: &str) -> Error {
        Error::Api(Box::new(Status {
            code: Some(code),
            reason: Some(reason.to_string()),
            ..Status::default()
        }))
    }

    /// A pretend apiserver: pod and claim writes land in the caches at once (the watch is
    /// instant), and creating an existing name answers AlreadyExists.
    struct Fake {
        pods: Indexer<Pod>,
        sets: Indexer<StatefulSet>,
        /// Every write, in order: "create claim X", "create pod X", "delete pod X".
        log: Mutex<Vec<String>>,
        /// Status writes still to answer with 409 Conflict (another writer keeps winning).
        status_conflicts: Mutex<usize>,
        /// Status writes and live GETs made, in order: "put status", "get".
        status_calls: Mutex<Vec<&'static str>>,
    }

    impl PodControl for Fake {
        fn create_pod<'a>(
            &'a self,
            _namespace: &'a str,
            pod: &'a Pod,
        ) -> BoxFuture<'a, Result<Pod, Error>> {
            Box::pin(async move {
                let key = key_of(pod);
                if self.pods.get(&key).is_some() {
                    return Err(api_error(409, "AlreadyExists"));
                }
                let mut pod = pod.clone();
                pod.metadata.uid = Some(format!("uid-{key}"));
                pod.metadata.resource_version = Some("1".into());
                pod.status = Some(PodStatus {
                    phase: Some("Pending".into()),
                    ..PodStatus::default()
                });
                self.log.lock().push(format!(
                    "create pod {}",
                    pod.metadata.name.as_deref().unwrap()
                ));
                self.pods.upsert(&key, Arc::new(pod.clone()));
                Ok(pod)
            })
        }
        fn delete_pod<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async move {
                self.log.lock().push(format!("delete pod {name}"));
                self.pods
                    .remove(&format!("{namespace}/{name}"))
                    .map(|_| ())
                    .ok_or_else(|| api_error(404, "NotFound"))
            })
        }
        fn patch_pod<'a>(
            &'a self,
            _namespace: &'a str,
            _name: &'a str,
            _patch: &'a Value,
        ) -> BoxFuture<'a, Result<Pod, Error>> {
            Box::pin(async move { Err(api_error(404, "NotFound")) })
        }
    }

    impl StatefulSetClient for Fake {
        fn get_stateful_set<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<StatefulSet, Error>> {
            Box::pin(async move {
                self.status_calls.lock().push("get");
                self.sets
                    .get_by(namespace, name)
                    .map(|s| (*s).clone())
                    .ok_or_else(|| api_error(404, "NotFound"))
            })
        }
        fn replace_stateful_set_status<'a>(
            &'a self,
            set: &'a StatefulSet,
        ) -> BoxFuture<'a, Result<StatefulSet, Error>> {
            Box::pin(async move {
                self.status_calls.lock().push("put status");
                let mut conflicts = self.status_conflicts.lock();
                if *conflicts > 0 {
                    *conflicts -= 1;
                    return Err(api_error(409, "Conflict"));
                }
                self.sets.upsert(&key_of(set), Arc::new(set.clone()));
                Ok(set.clone())
            })
        }
        fn create_claim<'a>(
            &'a self,
            _namespace: &'a str,
            claim: &'a PersistentVolumeClaim,
        ) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async move {
                self.log.lock().push(format!(
                    "create claim {}",
                    claim.metadata.name.as_deref().unwrap()
                ));
                Ok(())
            })
        }
    }

    fn harness(set: StatefulSet, claims: bool) -> (Arc<StatefulSetController>, Arc<Fake>) {
        let fake = Arc::new(Fake {
            pods: Indexer::new(),
            sets: Indexer::new(),
            log: Mutex::new(Vec::new()),
            status_conflicts: Mutex::new(0),
            status_calls: Mutex::new(Vec::new()),
        });
        fake.sets.upsert(&key_of(&set), Arc::new(set));
        let controller = StatefulSetController::from_parts(Parts {
            stateful_sets: fake.sets.clone(),
            pods: fake.pods.clone(),
            pod_control: fake.clone(),
            stateful_set_client: fake.clone(),
            claims_served: claims,
        });
        (controller, fake)
    }

    // The status write is client-go's `RetryOnConflict(DefaultRetry)`: a conflict is
    // retried on a fresh GET, 10 ms later, up to five runs in all; then the conflict is the
    // sync's error (and the key goes back to the queue with backoff).
    #[tokio::test(start_paused = true)]
    async fn status_writes_retry_conflicts_on_a_fresh_copy_five_times_at_most() {
        let set = stateful_set("web", 1);
        let status = StatefulSetStatus {
            replicas: 1,
            ..StatefulSetStatus::default()
        };
        let (c, fake) = harness(set.clone(), false);
        *fake.status_conflicts.lock() = 2;
        c.update_status(&set, status.clone()).await.unwrap();
        assert_eq!(
            *fake.status_calls.lock(),
            vec!["put status", "get", "put status", "get", "put status"]
        );
        assert_eq!(
            fake.sets.get_by(NS, "web").unwrap().status.as_ref(),
            Some(&status)
        );

        let (c, fake) = harness(set.clone(), false);
        *fake.status_conflicts.lock() = usize::MAX;
        let start = tokio::time::Instant::now();
        let e = c.update_status(&set, status).await.unwrap_err();
        assert!(skerry_client::retry::is_conflict(&e), "{e:#}");
        let puts = fake
            .status_calls
            .lock()
            .iter()
            .filter(|c| **c == "put status")
            .count();
        assert_eq!(puts, 5);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(40) && waited <= Duration::from_millis(44),
            "{waited:?}"
        );
    }

    fn make_ready(fake: &Fake, name: &str) {
        let key = format!("{NS}/{name}");
        let pod = fake.pods.get(&key).unwrap();
        fake.pods.upsert(&key, Arc::new(ready((*pod).clone())));
    }

    #[tokio::test]
    async fn sync_walks_the_ordinals_and_creates_claims_first() {
        let mut set = stateful_set("web", 2);
        set.spec.as_mut().unwrap().volume_claim_templates = Some(vec![PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        }]);
        let (c, fake) = harness(set, true);
        let key = "default/web";
        c.sync_stateful_set(key).await.unwrap();
        c.sync_stateful_set(key).await.unwrap();
        assert_eq!(
            *fake.log.lock(),
            vec!["create claim data-web-0", "create pod web-0"],
            "the second sync waits for web-0"
        );
        make_ready(&fake, "web-0");
        c.sync_stateful_set(key).await.unwrap();
        make_ready(&fake, "web-1");
        c.sync_stateful_set(key).await.unwrap();
        assert_eq!(
            *fake.log.lock(),
            vec![
                "create claim data-web-0",
                "create pod web-0",
                "create claim data-web-1",
                "create pod web-1"
            ]
        );
        let status = fake.sets.get(key).unwrap().status.clone().unwrap();
        assert_eq!(status.replicas, 2);
        assert_eq!(status.ready_replicas, Some(2));
        assert_eq!(status.updated_replicas, Some(2));
    }

    #[tokio::test]
    async fn a_create_the_cache_has_not_seen_fails_already_exists_not_twice() {
        let (c, fake) = harness(stateful_set("web", 1), false);
        // The pod exists in the apiserver but the controller's cache lags.
        let rev = update_revision(&fake.sets.get("default/web").unwrap());
        let pod = member(&fake.sets.get("default/web").unwrap(), 0, &rev);
        let lagging: Indexer<Pod> = Indexer::new();
        let c2 = StatefulSetController::from_parts(Parts {
            stateful_sets: fake.sets.clone(),
            pods: lagging,
            pod_control: fake.clone(),
            stateful_set_client: fake.clone(),
            claims_served: false,
        });
        fake.pods.upsert(&key_of(&pod), Arc::new(pod));
        let err = c2.sync_stateful_set("default/web").await.unwrap_err();
        assert!(format!("{err:#}").contains("AlreadyExists"), "{err:#}");
        assert_eq!(fake.pods.len(), 1);
        // The controller whose cache is current makes no write at all.
        c.sync_stateful_set("default/web").await.unwrap();
        assert!(fake.log.lock().is_empty());
    }
}
