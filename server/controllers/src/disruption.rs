//! The disruption controller (kube-controller-manager's `pkg/controller/disruption/disruption.go`,
//! Kubernetes 1.32): keeps every PodDisruptionBudget's status — how many of its pods are
//! expected, healthy and needed healthy, and so how many may be disrupted now — which the
//! eviction API (`pods/eviction`, `kubectl drain`) spends and the scheduler's preemption reads.
//!
//! Per budget ([`DisruptionController::sync_pdb`]):
//! - its pods are the namespace's pods its `spec.selector` matches — policy/v1 semantics: a
//!   null selector matches no pod, an empty (`{}`) one every pod of the namespace;
//! - `expectedPods` and `desiredHealthy` come from `minAvailable` / `maxUnavailable`
//!   ([`expected_pod_count`]): an integer `minAvailable` counts the pods themselves; a
//!   percentage, or any `maxUnavailable`, needs the sum of the `spec.replicas` of the pods'
//!   controllers, found by walking controller references (Pod -> ReplicaSet -> Deployment,
//!   Pod -> ReplicaSet, Pod -> StatefulSet, then any kind with a `scale` subresource);
//! - `currentHealthy` counts Ready pods that are not being deleted and not in
//!   `status.disruptedPods` (pods the eviction API approved; entries expire after
//!   [`DELETION_TIMEOUT`], and a recheck is queued for the earliest expiry);
//! - `disruptionsAllowed = currentHealthy - desiredHealthy`, floored at 0, and 0 while the
//!   budget expects no pods ([`compute_status`]).
//!
//! Invariant (fail closed): a sync that cannot compute the status writes
//! `disruptionsAllowed: 0` with `DisruptionAllowed=False`, reason `SyncFailed` (Kubernetes'
//! `failSafe`), so the eviction API refuses rather than spends a budget nobody can vouch for.
//! The status is written through `poddisruptionbudgets/status` only when it changed, at the
//! cached resourceVersion: a conflict re-queues the key through the rate limiter.
//!
//! A second queue clears stale `DisruptionTarget=True` pod conditions: a condition set (by an
//! eviction, a preemption, the taint manager) on a pod that then was not deleted is set to
//! False after [`STALE_POD_DISRUPTION_TIMEOUT`] through `pods/status`.
//!
//! Where to start: [`DisruptionController::sync_pdb`]. The decisions are pure functions taking
//! no client: [`expected_pod_count`], [`build_disrupted_pod_map`], [`count_healthy_pods`],
//! [`compute_status`], [`fail_safe_status`], [`stale_disruption_wait`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use skerry_api::selector::LabelSelector;
use skerry_client::api::http_method::Method;
use skerry_client::cache::Indexer;
use skerry_client::events::object_reference;
use skerry_client::informer::SharedInformer;
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, Error, PostParams, key_of};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::Context;
use crate::podcontrol::{EventSink, NoEvents, event_recorder};
use crate::runtime::{self, Reconciler};
use crate::util::{self, Forward, controller_of, is_pod_ready};

/// How long after the eviction API lists a pod in `status.disruptedPods` the pod must show up
/// as deleted (gone, or carrying a `deletionTimestamp`) before the entry is dropped and the
/// pod counts as healthy again — the eviction is then assumed to have failed after approval.
/// Kubernetes' `DeletionTimeout` (2 minutes), sized for an apiserver -> controller latency of a
/// second or two. Longer keeps a failed eviction's pod uncounted (fewer disruptions allowed)
/// for longer; shorter risks counting a pod whose deletion the cache has not seen yet, which
/// allows one disruption too many. The entry is stamped with the apiserver's clock and
/// compared with this member's: the members' clocks must agree to well within it.
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(2 * 60);

/// How long a pod may carry `DisruptionTarget=True` without being deleted before this
/// controller sets the condition back to False (Kubernetes' `stalePodDisruptionTimeout`,
/// 2 minutes): the disruption that set it (an eviction, a preemption) evidently did not go
/// through, and a stale condition would mislead Job pod-failure policies and users. Longer
/// leaves the lie standing longer; shorter races a deletion that is merely slow.
pub const STALE_POD_DISRUPTION_TIMEOUT: Duration = Duration::from_secs(2 * 60);

/// The `source.component` of this controller's events: Kubernetes records them as
/// `controllermanager` (its recorder is built with that component, not the controller's name).
pub const EVENT_COMPONENT: &str = "controllermanager";

/// The budget's status condition (policy/v1 `DisruptionAllowedCondition`).
pub const DISRUPTION_ALLOWED_CONDITION: &str = "DisruptionAllowed";
/// `DisruptionAllowed=True`: at least one disruption is allowed (`SufficientPodsReason`).
pub const SUFFICIENT_PODS_REASON: &str = "SufficientPods";
/// `DisruptionAllowed=False`: none is (`InsufficientPodsReason`).
pub const INSUFFICIENT_PODS_REASON: &str = "InsufficientPods";
/// `DisruptionAllowed=False`: the status could not be computed (`SyncFailedReason`).
pub const SYNC_FAILED_REASON: &str = "SyncFailed";

/// The pod condition a disruption sets before deleting the pod (core/v1 `DisruptionTarget`).
pub const DISRUPTION_TARGET_CONDITION: &str = "DisruptionTarget";
/// The `DisruptionTarget` reason the kubelet sets (`PodReasonTerminationByKubelet`): the
/// kubelet's own terminations may take arbitrarily long, so such a condition is never stale.
pub const TERMINATION_BY_KUBELET_REASON: &str = "TerminationByKubelet";

/// The groups whose `ReplicaSet` and `Deployment` kinds the finders accept in a controller
/// reference (Kubernetes' `verifyGroupKind(.., []string{"apps", "extensions"})`).
const APPS_GROUPS: &[&str] = &["apps", "extensions"];

/// Tunables.
#[derive(Clone, Debug)]
pub struct Config {
    /// See [`STALE_POD_DISRUPTION_TIMEOUT`]; tests shorten it, as Kubernetes' tests do through
    /// `NewDisruptionControllerInternal`.
    pub stale_pod_disruption_timeout: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            stale_pod_disruption_timeout: STALE_POD_DISRUPTION_TIMEOUT,
        }
    }
}

// ---- pure decisions ---------------------------------------------------------------------------

/// Why the expected pod count could not be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExpectedCountError {
    /// A pod's controller reference resolves to no controller with a scale: it is gone,
    /// replaced by a namesake, or of a kind this controller cannot size.
    #[error("found no controllers for pod {pod:?}")]
    NoController {
        /// The pod's name.
        pod: String,
    },
    /// Looking a controller up failed (an unknown kind, a kind without `scale`, a failed
    /// request).
    #[error("{0}")]
    Lookup(String),
    /// `minAvailable` / `maxUnavailable` is a string that is not a percentage.
    #[error("invalid value for IntOrString: {0}")]
    IntOrPercent(String),
}

/// A pod's controller as far as a budget is concerned: its UID and its `spec.replicas`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerScale {
    /// The UID of the object whose scale this is (the Deployment, not its ReplicaSet).
    pub uid: String,
    /// Its `spec.replicas`.
    pub replicas: i32,
}

/// What one controller reference resolves to: its controller's scale, `None` when nothing
/// resolves it.
pub type Resolved = Result<Option<ControllerScale>, ExpectedCountError>;

/// A budget's expected and desired pod counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectedCount {
    /// `status.expectedPods`.
    pub expected_count: i32,
    /// `status.desiredHealthy`.
    pub desired_healthy: i32,
    /// Selected pods with no controller reference: a scale-based count cannot see them
    /// (Kubernetes warns with an `UnmanagedPods` event and carries on).
    pub unmanaged_pods: Vec<String>,
}

/// Kubernetes' `intstr.GetScaledValueFromIntOrPercent`: an integer as is, or `N%` of `total`,
/// rounded up or down.
pub fn scaled_value(
    value: &IntOrString,
    total: i32,
    round_up: bool,
) -> Result<i32, ExpectedCountError> {
    let percent = match value {
        IntOrString::Int(v) => return Ok(*v),
        IntOrString::String(s) => {
            let Some(digits) = s.strip_suffix('%') else {
                return Err(ExpectedCountError::IntOrPercent(
                    "invalid type: string is not a percentage".into(),
                ));
            };
            digits.parse::<i32>().map_err(|e| {
                ExpectedCountError::IntOrPercent(format!("invalid value {s:?}: {e}"))
            })?
        }
    };
    // Exact integer arithmetic: i32 * i32 fits in i64.
    let product = i64::from(percent) * i64::from(total);
    let floor = product.div_euclid(100);
    let scaled = if round_up && product.rem_euclid(100) != 0 {
        floor + 1
    } else {
        floor
    };
    Ok(saturate(scaled))
}

fn saturate(v: i64) -> i32 {
    i32::try_from(v).unwrap_or(if v < 0 { i32::MIN } else { i32::MAX })
}

/// Whether computing the budget needs the scale of the pods' controllers: any
/// `maxUnavailable`, or a percentage `minAvailable`.
pub fn needs_scale(spec: &PodDisruptionBudgetSpec) -> bool {
    spec.max_unavailable.is_some() || matches!(spec.min_available, Some(IntOrString::String(_)))
}

/// Kubernetes' `getExpectedScale`: the sum of the scales of the distinct controllers of
/// `pods`, and the names of the pods without a controller. `resolve` maps a pod's controller
/// reference (and namespace) to its controller's scale, `None` when nothing resolves it — an
/// error for that pod.
pub fn expected_scale(
    pods: &[Arc<Pod>],
    resolve: &mut dyn FnMut(&OwnerReference, &str) -> Resolved,
) -> Result<(i32, Vec<String>), ExpectedCountError> {
    // Controller UID -> replicas: a Deployment reached through two ReplicaSets counts once.
    let mut scales: HashMap<String, i32> = HashMap::new();
    // Controller references already resolved (the ReplicaSet UIDs for a Deployment).
    let mut seen_refs: HashSet<&str> = HashSet::new();
    let mut unmanaged = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(r) = controller_of(&pod.metadata) else {
            unmanaged.push(name);
            continue;
        };
        if !seen_refs.insert(r.uid.as_str()) {
            continue;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        match resolve(r, namespace)? {
            Some(scale) => {
                scales.insert(scale.uid, scale.replicas);
            }
            None => return Err(ExpectedCountError::NoController { pod: name }),
        }
    }
    let total: i64 = scales.values().map(|&r| i64::from(r)).sum();
    Ok((saturate(total), unmanaged))
}

/// Kubernetes' `getExpectedPodCount`: `maxUnavailable` first (from the controllers' scale),
/// else `minAvailable` — an integer against the selected pods, a percentage against the
/// controllers' scale, rounded up. Neither set: nothing expected, nothing desired.
pub fn expected_pod_count(
    spec: &PodDisruptionBudgetSpec,
    pods: &[Arc<Pod>],
    resolve: &mut dyn FnMut(&OwnerReference, &str) -> Resolved,
) -> Result<ExpectedCount, ExpectedCountError> {
    if let Some(max_unavailable) = &spec.max_unavailable {
        let (expected_count, unmanaged_pods) = expected_scale(pods, resolve)?;
        let max_unavailable = scaled_value(max_unavailable, expected_count, true)?;
        return Ok(ExpectedCount {
            expected_count,
            desired_healthy: expected_count.saturating_sub(max_unavailable).max(0),
            unmanaged_pods,
        });
    }
    match &spec.min_available {
        Some(IntOrString::Int(min_available)) => Ok(ExpectedCount {
            expected_count: saturate(i64::try_from(pods.len()).unwrap_or(i64::MAX)),
            desired_healthy: *min_available,
            unmanaged_pods: Vec::new(),
        }),
        Some(percent @ IntOrString::String(_)) => {
            let (expected_count, unmanaged_pods) = expected_scale(pods, resolve)?;
            Ok(ExpectedCount {
                expected_count,
                desired_healthy: scaled_value(percent, expected_count, true)?,
                unmanaged_pods,
            })
        }
        None => Ok(ExpectedCount::default()),
    }
}

fn millis(t: &Time) -> i64 {
    t.0.as_millisecond()
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The surviving `status.disruptedPods` of a budget and what to do about the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DisruptedPods {
    /// The entries kept: pods still present, not being deleted, within [`DELETION_TIMEOUT`].
    pub pods: BTreeMap<String, Time>,
    /// When the earliest kept entry expires, from now: the budget must be looked at again then.
    pub recheck_after: Option<Duration>,
    /// Pods whose entry expired while they were not being deleted: the eviction evidently
    /// failed (Kubernetes records a `NotDeleted` warning on each).
    pub expired: Vec<String>,
}

/// Kubernetes' `buildDisruptedPodMap`: keeps the entries of `disrupted` for pods of `pods`
/// that are not being deleted and whose [`DELETION_TIMEOUT`] has not passed at `now`; entries
/// for pods that are gone or already being deleted are dropped silently.
pub fn build_disrupted_pod_map(
    pods: &[Arc<Pod>],
    disrupted: Option<&BTreeMap<String, Time>>,
    now: &Time,
) -> DisruptedPods {
    let mut result = DisruptedPods::default();
    let Some(disrupted) = disrupted else {
        return result;
    };
    let now_ms = millis(now);
    let mut recheck_at_ms: Option<i64> = None;
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let Some(at) = disrupted.get(name) else {
            continue;
        };
        let expected_deletion_ms = millis(at).saturating_add(duration_ms(DELETION_TIMEOUT));
        if expected_deletion_ms < now_ms {
            result.expired.push(name.to_string());
        } else {
            recheck_at_ms =
                Some(recheck_at_ms.map_or(expected_deletion_ms, |r| r.min(expected_deletion_ms)));
            result.pods.insert(name.to_string(), at.clone());
        }
    }
    // One millisecond past the expiry: the check above is strict, so a recheck landing
    // exactly on it would find the entry still alive and queue itself again at once.
    result.recheck_after = recheck_at_ms.map(|at| {
        Duration::from_millis(
            u64::try_from(at.saturating_sub(now_ms).saturating_add(1)).unwrap_or(0),
        )
    });
    result
}

/// Kubernetes' `countHealthyPods`: Ready pods that are not being deleted and not expected to
/// be (listed in `disrupted` within [`DELETION_TIMEOUT`] at `now`).
pub fn count_healthy_pods(
    pods: &[Arc<Pod>],
    disrupted: &BTreeMap<String, Time>,
    now: &Time,
) -> i32 {
    let now_ms = millis(now);
    let healthy = pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            disrupted
                .get(name)
                .is_none_or(|at| millis(at).saturating_add(duration_ms(DELETION_TIMEOUT)) <= now_ms)
        })
        .filter(|pod| is_pod_ready(pod))
        .count();
    saturate(i64::try_from(healthy).unwrap_or(i64::MAX))
}

/// apimachinery's `meta.SetStatusCondition`: adds `condition`, or updates the one of its type —
/// its transition time moves only when its status does. Returns whether anything changed.
pub fn set_status_condition(conditions: &mut Vec<Condition>, condition: Condition) -> bool {
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == condition.type_) else {
        conditions.push(condition);
        return true;
    };
    let mut changed = false;
    if existing.status != condition.status {
        existing.status = condition.status;
        existing.last_transition_time = condition.last_transition_time;
        changed = true;
    }
    if existing.reason != condition.reason {
        existing.reason = condition.reason;
        changed = true;
    }
    if existing.message != condition.message {
        existing.message = condition.message;
        changed = true;
    }
    if existing.observed_generation != condition.observed_generation {
        existing.observed_generation = condition.observed_generation;
        changed = true;
    }
    changed
}

/// component-helpers' `UpdateDisruptionAllowedCondition`: `DisruptionAllowed` True
/// (`SufficientPods`) when a disruption is allowed, else False (`InsufficientPods`), with no
/// message (clearing a `SyncFailed` one).
pub fn update_disruption_allowed_condition(status: &mut PodDisruptionBudgetStatus, now: &Time) {
    let (value, reason) = if status.disruptions_allowed > 0 {
        ("True", SUFFICIENT_PODS_REASON)
    } else {
        ("False", INSUFFICIENT_PODS_REASON)
    };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    set_status_condition(
        conditions,
        Condition {
            type_: DISRUPTION_ALLOWED_CONDITION.to_string(),
            status: value.to_string(),
            reason: reason.to_string(),
            message: String::new(),
            observed_generation: status.observed_generation,
            last_transition_time: now.clone(),
        },
    );
}

/// component-helpers' `ConditionsAreUpToDate`: the budget's `DisruptionAllowed` condition
/// agrees with its `disruptionsAllowed` and its status with its generation.
pub fn conditions_are_up_to_date(pdb: &PodDisruptionBudget) -> bool {
    let Some(status) = pdb.status.as_ref() else {
        return false;
    };
    let Some(condition) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_ALLOWED_CONDITION)
    else {
        return false;
    };
    if status.observed_generation.unwrap_or(0) != pdb.metadata.generation.unwrap_or(0) {
        return false;
    }
    if status.disruptions_allowed > 0 {
        condition.status == "True" && condition.reason == SUFFICIENT_PODS_REASON
    } else {
        condition.status == "False" && condition.reason == INSUFFICIENT_PODS_REASON
    }
}

/// What one sync decided about a budget's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ComputedStatus {
    /// The status to write; `None` when the budget already has it.
    pub status: Option<PodDisruptionBudgetStatus>,
    /// When to look again (the earliest `disruptedPods` expiry), from now.
    pub recheck_after: Option<Duration>,
    /// Pods whose `disruptedPods` entry expired without a deletion.
    pub expired: Vec<String>,
}

/// Kubernetes' `trySync` after the counts, and `updatePdbStatus`: the budget's status given its
/// selected `pods` and `expected` counts at `now`.
pub fn compute_status(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    expected: &ExpectedCount,
    now: &Time,
) -> ComputedStatus {
    let current = pdb.status.clone().unwrap_or_default();
    let disrupted = build_disrupted_pod_map(pods, current.disrupted_pods.as_ref(), now);
    let current_healthy = count_healthy_pods(pods, &disrupted.pods, now);
    // A budget expecting no pods allows nothing: its first pods may appear before this
    // controller has counted them, and must not be evictable in that window.
    let mut disruptions_allowed = current_healthy.saturating_sub(expected.desired_healthy);
    if expected.expected_count <= 0 || disruptions_allowed <= 0 {
        disruptions_allowed = 0;
    }
    let generation = pdb.metadata.generation;
    // An absent map and an empty one are the same status (`omitempty`).
    let current_disrupted = current.disrupted_pods.clone().unwrap_or_default();
    let up_to_date = current.current_healthy == current_healthy
        && current.desired_healthy == expected.desired_healthy
        && current.expected_pods == expected.expected_count
        && current.disruptions_allowed == disruptions_allowed
        && current_disrupted == disrupted.pods
        && current.observed_generation.unwrap_or(0) == generation.unwrap_or(0)
        && conditions_are_up_to_date(pdb);
    let status = (!up_to_date).then(|| {
        let mut next = PodDisruptionBudgetStatus {
            current_healthy,
            desired_healthy: expected.desired_healthy,
            expected_pods: expected.expected_count,
            disruptions_allowed,
            disrupted_pods: (!disrupted.pods.is_empty()).then(|| disrupted.pods.clone()),
            observed_generation: generation,
            conditions: current.conditions.clone(),
        };
        update_disruption_allowed_condition(&mut next, now);
        next
    });
    ComputedStatus {
        status,
        recheck_after: disrupted.recheck_after,
        expired: disrupted.expired,
    }
}

/// Kubernetes' `failSafe`: the budget's status with no disruption allowed and
/// `DisruptionAllowed=False` reason `SyncFailed` saying why; `None` when it already says so.
pub fn fail_safe_status(
    pdb: &PodDisruptionBudget,
    message: &str,
    now: &Time,
) -> Option<PodDisruptionBudgetStatus> {
    let current = pdb.status.clone().unwrap_or_default();
    let mut next = current.clone();
    next.disruptions_allowed = 0;
    let conditions = next.conditions.get_or_insert_with(Vec::new);
    set_status_condition(
        conditions,
        Condition {
            type_: DISRUPTION_ALLOWED_CONDITION.to_string(),
            status: "False".to_string(),
            reason: SYNC_FAILED_REASON.to_string(),
            message: message.to_string(),
            observed_generation: current.observed_generation,
            last_transition_time: now.clone(),
        },
    );
    (next != current).then_some(next)
}

/// Whether `pdb` selects `pod`: same namespace, and a selector (null: none; empty: all) that
/// matches its labels. A malformed selector selects nothing here; the sync reports it.
pub fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    if pdb.metadata.namespace != pod.metadata.namespace {
        return false;
    }
    let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
    LabelSelector::from_api_opt(selector).is_ok_and(|s| s.matches_opt(pod.metadata.labels.as_ref()))
}

/// Kubernetes' `nonTerminatingPodHasStaleDisruptionCondition`: for a pod not being deleted,
/// not terminal, carrying `DisruptionTarget=True` set by someone other than the kubelet, how
/// long from `now` until the condition is stale (zero: it is); `None` for any other pod.
pub fn stale_disruption_wait(pod: &Pod, timeout: Duration, now: &Time) -> Option<Duration> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let condition = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_TARGET_CONDITION)?;
    if condition.status != "True"
        || condition.reason.as_deref() == Some(TERMINATION_BY_KUBELET_REASON)
        || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
    {
        return None;
    }
    // No transition time is Go's zero time: stale long ago.
    let since_ms = condition
        .last_transition_time
        .as_ref()
        .map_or(i64::MAX, |t| millis(now).saturating_sub(millis(t)));
    let wait_ms = duration_ms(timeout).saturating_sub(since_ms).max(0);
    Some(Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)))
}

/// `pod` with its `DisruptionTarget` condition replaced by `status: False` (no reason or
/// message, transition time `now`) as Kubernetes' `UpdatePodCondition` does; `None` when that
/// changes nothing.
pub fn clear_disruption_target(pod: &Pod, now: &Time) -> Option<Pod> {
    let mut next = pod.clone();
    let conditions = next
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    let mut condition = PodCondition {
        type_: DISRUPTION_TARGET_CONDITION.to_string(),
        status: "False".to_string(),
        last_transition_time: Some(now.clone()),
        ..PodCondition::default()
    };
    match conditions
        .iter_mut()
        .find(|c| c.type_ == DISRUPTION_TARGET_CONDITION)
    {
        None => conditions.push(condition),
        Some(old) => {
            if old.status == condition.status {
                condition.last_transition_time = old.last_transition_time.clone();
            }
            if *old == condition {
                return None;
            }
            *old = condition;
        }
    }
    Some(next)
}

/// Splits an `apiVersion` into group and version (apimachinery's `ParseGroupVersion`).
fn parse_group_version(api_version: &str) -> Result<(&str, &str), ExpectedCountError> {
    match api_version.split('/').collect::<Vec<_>>().as_slice() {
        [""] => Ok(("", "")),
        [version] => Ok(("", version)),
        [group, version] => Ok((group, version)),
        _ => Err(ExpectedCountError::Lookup(format!(
            "unexpected GroupVersion string: {api_version}"
        ))),
    }
}

/// Kubernetes' `verifyGroupKind`: whether `r` is a `kind` in one of `groups`.
fn verify_group_kind(
    r: &OwnerReference,
    kind: &str,
    groups: &[&str],
) -> Result<bool, ExpectedCountError> {
    let (group, _) = parse_group_version(&r.api_version)?;
    Ok(r.kind == kind && groups.contains(&group))
}

// ---- the controller ---------------------------------------------------------------------------

/// Why one sync could not compute a budget's status.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// The budget's selector does not convert (Kubernetes' `LabelSelectorAsSelector`
    /// message).
    #[error("{0}")]
    Selector(String),
    #[error(transparent)]
    ExpectedCount(#[from] ExpectedCountError),
    #[error("{}", crate::podcontrol::error_message(.0))]
    Write(Error),
}

/// The shared informers `run` waits for.
struct Informers {
    pdbs: SharedInformer<PodDisruptionBudget>,
    pods: SharedInformer<Pod>,
    replica_sets: SharedInformer<ReplicaSet>,
    deployments: SharedInformer<Deployment>,
    stateful_sets: SharedInformer<StatefulSet>,
}

/// The disruption controller. Build it with [`DisruptionController::new`], then run it with
/// [`DisruptionController::run`] once the informers are started.
pub struct DisruptionController {
    client: Client,
    config: Config,
    pdbs: Indexer<PodDisruptionBudget>,
    pods: Indexer<Pod>,
    replica_sets: Indexer<ReplicaSet>,
    deployments: Indexer<Deployment>,
    stateful_sets: Indexer<StatefulSet>,
    events: Arc<dyn EventSink>,
    /// Budget keys to sync (Kubernetes' `queue`; its `recheckQueue` is this queue's
    /// `add_after`).
    queue: WorkQueue<String>,
    /// Pod keys whose `DisruptionTarget` condition may be stale (Kubernetes'
    /// `stalePodDisruptionQueue`).
    stale_pod_queue: WorkQueue<String>,
    informers: Informers,
}

impl DisruptionController {
    /// A controller over the context's shared informers with the default [`Config`].
    pub fn new(ctx: &Context) -> Arc<DisruptionController> {
        Self::with_config(ctx, Config::default())
    }

    /// A controller over the context's shared informers, with its event handlers registered,
    /// writing (statuses and events) with `ctx.client`.
    pub fn with_config(ctx: &Context, config: Config) -> Arc<DisruptionController> {
        let informers = Informers {
            pdbs: ctx.informers.informer::<PodDisruptionBudget>(),
            pods: ctx.informers.informer::<Pod>(),
            replica_sets: ctx.informers.informer::<ReplicaSet>(),
            deployments: ctx.informers.informer::<Deployment>(),
            stateful_sets: ctx.informers.informer::<StatefulSet>(),
        };
        let controller = Arc::new(DisruptionController {
            client: ctx.client.clone(),
            config,
            pdbs: informers.pdbs.store(),
            pods: informers.pods.store(),
            replica_sets: informers.replica_sets.store(),
            deployments: informers.deployments.store(),
            stateful_sets: informers.stateful_sets.store(),
            events: event_recorder(&ctx.client, EVENT_COMPONENT)
                .map_or_else(|| Arc::new(NoEvents) as Arc<dyn EventSink>, |r| Arc::new(r)),
            queue: WorkQueue::new("disruption"),
            stale_pod_queue: WorkQueue::new("stale_pod_disruption"),
            informers,
        });
        let informers = &controller.informers;
        informers.pdbs.add_handler(Forward::new(
            &controller,
            |c, pdb| c.enqueue(pdb),
            |c, _, pdb| c.enqueue(pdb),
            |c, pdb| c.enqueue(pdb),
        ));
        informers.pods.add_handler(Forward::new(
            &controller,
            |c, pod| c.add_pod(pod),
            |c, old, cur| c.update_pod(old, cur),
            |c, pod| c.delete_pod(pod),
        ));
        // Scale owners: only a changed scale (or controller) matters; the pods' own events
        // cover everything else.
        informers.replica_sets.add_handler(Forward::new(
            &controller,
            |_, _| {},
            |c, old, cur| c.update_replica_set(old, cur),
            |_, _| {},
        ));
        informers.deployments.add_handler(Forward::new(
            &controller,
            |_, _| {},
            |c, old, cur| c.update_deployment(old, cur),
            |_, _| {},
        ));
        informers.stateful_sets.add_handler(Forward::new(
            &controller,
            |_, _| {},
            |c, old, cur| c.update_stateful_set(old, cur),
            |_, _| {},
        ));
        controller.clone()
    }

    /// The queue of budget keys.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits until the events recorded so far are written (tests and graceful shutdown).
    pub async fn flush_events(&self) {
        self.events.flush().await;
    }

    /// Waits for the informers' first lists, then runs `workers` workers on each of the two
    /// queues until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        let i = &self.informers;
        let synced = i.pdbs.wait_for_sync(&stop).await
            && i.pods.wait_for_sync(&stop).await
            && i.replica_sets.wait_for_sync(&stop).await
            && i.deployments.wait_for_sync(&stop).await
            && i.stateful_sets.wait_for_sync(&stop).await;
        if !synced {
            tracing::info!("disruption controller stopped before its caches synced");
            return;
        }
        tracing::info!(workers, "starting disruption controller");
        let stale = Arc::new(StalePodDisruption {
            controller: self.clone(),
        });
        let queue = self.queue.clone();
        let stale_queue = self.stale_pod_queue.clone();
        tokio::join!(
            runtime::run_workers(self, queue, workers, stop.clone()),
            runtime::run_workers(stale, stale_queue, workers, stop),
        );
    }

    // ---- event handlers -------------------------------------------------------------------

    fn enqueue(&self, pdb: &PodDisruptionBudget) {
        self.queue.add(key_of(pdb));
    }

    /// Queues every budget of `pod`'s namespace that selects it. Kubernetes queues one,
    /// chosen arbitrarily when several match (and warns); syncing all keeps each budget's
    /// status level with its pods.
    fn enqueue_pdbs_of(&self, pod: &Pod) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        for pdb in self.pdbs.list_namespace(namespace) {
            if selects(&pdb, pod) {
                self.enqueue(&pdb);
            }
        }
    }

    fn enqueue_stale_check(&self, pod: &Pod) {
        let now = util::now();
        if let Some(wait) =
            stale_disruption_wait(pod, self.config.stale_pod_disruption_timeout, &now)
        {
            self.stale_pod_queue.add_after(key_of(pod), wait);
        }
    }

    /// A pod appeared.
    pub fn add_pod(&self, pod: &Pod) {
        self.enqueue_pdbs_of(pod);
        self.enqueue_stale_check(pod);
    }

    /// A pod changed (or a resync).
    pub fn update_pod(&self, old: &Pod, cur: &Pod) {
        self.enqueue_pdbs_of(cur);
        if old.metadata.labels != cur.metadata.labels {
            // The budgets it has left must stop counting it.
            self.enqueue_pdbs_of(old);
        }
        self.enqueue_stale_check(cur);
    }

    /// A pod was deleted (or found gone by a relist).
    pub fn delete_pod(&self, pod: &Pod) {
        self.enqueue_pdbs_of(pod);
    }

    /// A ReplicaSet changed: its scale (or its Deployment) may size budgets over its pods.
    pub fn update_replica_set(&self, old: &ReplicaSet, cur: &ReplicaSet) {
        let replicas = |rs: &ReplicaSet| rs.spec.as_ref().and_then(|s| s.replicas);
        if replicas(old) != replicas(cur)
            || controller_of(&old.metadata) != controller_of(&cur.metadata)
        {
            self.enqueue_pdbs_of_owned_pods(&cur.metadata, false);
        }
    }

    /// A Deployment changed: its scale sizes budgets over its ReplicaSets' pods.
    pub fn update_deployment(&self, old: &Deployment, cur: &Deployment) {
        let replicas = |d: &Deployment| d.spec.as_ref().and_then(|s| s.replicas);
        if replicas(old) != replicas(cur) {
            self.enqueue_pdbs_of_owned_pods(&cur.metadata, true);
        }
    }

    /// A StatefulSet changed: its scale sizes budgets over its pods.
    pub fn update_stateful_set(&self, old: &StatefulSet, cur: &StatefulSet) {
        let replicas = |s: &StatefulSet| s.spec.as_ref().and_then(|s| s.replicas);
        if replicas(old) != replicas(cur) {
            self.enqueue_pdbs_of_owned_pods(&cur.metadata, false);
        }
    }

    /// Queues the budgets selecting any pod controlled by `owner` — or, with
    /// `through_replica_sets`, by a ReplicaSet `owner` controls. Kubernetes registers no
    /// owner handlers and waits for the pods' own events (or the resync); a scale change that
    /// creates or deletes no pod (a quota, a paused rollout) would leave `expectedPods` stale
    /// until then.
    fn enqueue_pdbs_of_owned_pods(&self, owner: &ObjectMeta, through_replica_sets: bool) {
        let namespace = owner.namespace.as_deref().unwrap_or_default();
        let Some(uid) = owner.uid.as_deref() else {
            return;
        };
        let pdbs = self.pdbs.list_namespace(namespace);
        if pdbs.is_empty() {
            return;
        }
        let owners: HashSet<String> = if through_replica_sets {
            util::owned_by(&self.replica_sets.list_namespace(namespace), uid)
                .filter_map(|rs| rs.metadata.uid.clone())
                .collect()
        } else {
            HashSet::from([uid.to_string()])
        };
        let mut keys = BTreeSet::new();
        for pod in self.pods.list_namespace(namespace) {
            if controller_of(&pod.metadata).is_none_or(|r| !owners.contains(&r.uid)) {
                continue;
            }
            for pdb in &pdbs {
                if selects(pdb, &pod) {
                    keys.insert(key_of(pdb.as_ref()));
                }
            }
        }
        for key in keys {
            self.queue.add(key);
        }
    }

    // ---- sync -----------------------------------------------------------------------------

    /// Recomputes and writes the status of the budget at `key` (Kubernetes' `sync`): a
    /// conflict is returned (re-queued with backoff); any other failure writes the fail-safe
    /// status instead.
    pub async fn sync_pdb(&self, key: &str) -> anyhow::Result<()> {
        let (namespace, name) = util::split_key(key);
        let Some(pdb) = self.pdbs.get_by(namespace, name) else {
            tracing::debug!(pdb = %key, "poddisruptionbudget gone");
            return Ok(());
        };
        match self.try_sync(key, &pdb).await {
            Ok(()) => Ok(()),
            Err(SyncError::Write(e)) if e.is_conflict() => {
                Err(anyhow::Error::new(e).context("update poddisruptionbudget status"))
            }
            Err(e) => {
                let message = e.to_string();
                tracing::warn!(pdb = %key, error = %message, "sync failed; no disruption allowed");
                self.fail_safe(&pdb, &message).await
            }
        }
    }

    async fn try_sync(&self, key: &str, pdb: &PodDisruptionBudget) -> Result<(), SyncError> {
        let reference = object_reference(pdb);
        let pods = match self.pods_for(pdb) {
            Ok(pods) => pods,
            Err(e) => {
                let message = format!("Failed to get pods: {e}");
                self.events.event(&reference, "Warning", "NoPods", &message);
                return Err(e);
            }
        };
        if pods.is_empty() {
            self.events
                .event(&reference, "Normal", "NoPods", "No matching pods found");
        }
        let spec = pdb.spec.clone().unwrap_or_default();
        let resolved = if needs_scale(&spec) {
            self.resolve_controllers(&pods).await
        } else {
            HashMap::new()
        };
        let mut resolve =
            |r: &OwnerReference, _: &str| resolved.get(&r.uid).cloned().unwrap_or(Ok(None));
        let expected = match expected_pod_count(&spec, &pods, &mut resolve) {
            Ok(expected) => expected,
            Err(e) => {
                let message = format!("Failed to calculate the number of expected pods: {e}");
                self.events.event(
                    &reference,
                    "Warning",
                    "CalculateExpectedPodCountFailed",
                    &message,
                );
                return Err(e.into());
            }
        };
        if !expected.unmanaged_pods.is_empty() {
            tracing::debug!(pdb = %key, pods = ?expected.unmanaged_pods, "unmanaged pods");
            let message = format!(
                "Pods selected by this PodDisruptionBudget (selector: {:?}) were found to be \
                 unmanaged. As a result, the status of the PDB cannot be calculated correctly, \
                 which may result in undefined behavior. To account for these pods please set \
                 \".spec.minAvailable\" field of the PDB to an integer value.",
                spec.selector
            );
            self.events
                .event(&reference, "Warning", "UnmanagedPods", &message);
        }
        let now = util::now();
        let computed = compute_status(pdb, &pods, &expected, &now);
        for name in &computed.expired {
            tracing::info!(pdb = %key, pod = %name, "pod was expected to be deleted but was not");
            if let Some(pod) = pods
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
            {
                let message = format!("Pod was expected by PDB {key} to be deleted but it wasn't");
                self.events.event(
                    &object_reference(pod.as_ref()),
                    "Warning",
                    "NotDeleted",
                    &message,
                );
            }
        }
        if let Some(status) = computed.status {
            tracing::debug!(
                pdb = %key,
                current_healthy = status.current_healthy,
                desired_healthy = status.desired_healthy,
                expected_pods = status.expected_pods,
                disruptions_allowed = status.disruptions_allowed,
                "writing status"
            );
            self.write_status(pdb, status)
                .await
                .map_err(SyncError::Write)?;
        }
        if let Some(delay) = computed.recheck_after {
            self.queue.add_after(key.to_string(), delay);
        }
        Ok(())
    }

    /// The namespace's pods `pdb` selects (Kubernetes' `getPodsForPdb`).
    fn pods_for(&self, pdb: &PodDisruptionBudget) -> Result<Vec<Arc<Pod>>, SyncError> {
        let namespace = pdb.metadata.namespace.as_deref().unwrap_or_default();
        let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
            return Ok(Vec::new());
        };
        let selector =
            LabelSelector::from_api(selector).map_err(|e| SyncError::Selector(e.message))?;
        Ok(self
            .pods
            .list_namespace(namespace)
            .into_iter()
            .filter(|p| selector.matches_opt(p.metadata.labels.as_ref()))
            .collect())
    }

    /// Resolves the controller reference of each of `pods` (once per reference), in pod
    /// order, stopping at the first failed lookup as Kubernetes' finder loop does.
    async fn resolve_controllers(&self, pods: &[Arc<Pod>]) -> HashMap<String, Resolved> {
        let mut resolved = HashMap::new();
        for pod in pods {
            let Some(r) = controller_of(&pod.metadata) else {
                continue;
            };
            if resolved.contains_key(&r.uid) {
                continue;
            }
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            let mut found = self.find_cached(r, namespace);
            if matches!(found, Ok(None)) {
                found = self.find_by_scale(r, namespace).await;
            }
            let failed = found.is_err();
            resolved.insert(r.uid.clone(), found);
            if failed {
                break;
            }
        }
        resolved
    }

    /// Kubernetes' lister-backed finders, in its order: a ReplicaSet's Deployment, a
    /// ReplicaSet no Deployment controls, a StatefulSet. (ReplicationControllers, its first
    /// finder, are not served by skerry.)
    fn find_cached(&self, r: &OwnerReference, namespace: &str) -> Resolved {
        if verify_group_kind(r, "ReplicaSet", APPS_GROUPS)? {
            let Some(rs) = self
                .replica_sets
                .get_by(namespace, &r.name)
                .filter(|rs| rs.metadata.uid.as_deref() == Some(r.uid.as_str()))
            else {
                return Ok(None);
            };
            return match controller_of(&rs.metadata) {
                Some(owner) if owner.kind == "Deployment" => {
                    if !verify_group_kind(owner, "Deployment", APPS_GROUPS)? {
                        return Ok(None);
                    }
                    Ok(self
                        .deployments
                        .get_by(namespace, &owner.name)
                        .filter(|d| d.metadata.uid.as_deref() == Some(owner.uid.as_str()))
                        .map(|d| ControllerScale {
                            uid: owner.uid.clone(),
                            replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                        }))
                }
                _ => Ok(Some(ControllerScale {
                    uid: r.uid.clone(),
                    replicas: rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                })),
            };
        }
        if verify_group_kind(r, "StatefulSet", &["apps"])? {
            return Ok(self
                .stateful_sets
                .get_by(namespace, &r.name)
                .filter(|s| s.metadata.uid.as_deref() == Some(r.uid.as_str()))
                .map(|s| ControllerScale {
                    uid: r.uid.clone(),
                    replicas: s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                }));
        }
        Ok(None)
    }

    /// Kubernetes' `getScaleController`: any served kind with a `scale` subresource, read
    /// live (a GET of `<resource>/<name>/scale`); a kind without one is an error, a missing
    /// object is no controller.
    async fn find_by_scale(&self, r: &OwnerReference, namespace: &str) -> Resolved {
        let (group, version) = parse_group_version(&r.api_version)?;
        let Some(info) = skerry_api::catalogue::by_kind(&r.api_version, &r.kind) else {
            return Err(ExpectedCountError::Lookup(format!(
                "no matches for kind {:?} in version {:?}",
                r.kind, r.api_version
            )));
        };
        if info.subresource("scale").is_none() {
            let group_resource = if group.is_empty() {
                info.resource.to_string()
            } else {
                format!("{}.{group}", info.resource)
            };
            return Err(ExpectedCountError::Lookup(format!(
                "{group_resource} does not implement the scale subresource"
            )));
        }
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = format!(
            "{prefix}/namespaces/{namespace}/{}/{}/scale",
            info.resource, r.name
        );
        let (code, body) = self
            .client
            .request_raw(Method::Get, &path, None)
            .await
            .map_err(|e| ExpectedCountError::Lookup(format!("get {path}: {e}")))?;
        if code == 404 {
            return Ok(None);
        }
        if !(200..300).contains(&code) {
            return Err(ExpectedCountError::Lookup(format!(
                "get {path}: HTTP {code}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        let scale: Scale = serde_json::from_slice(&body)
            .map_err(|e| ExpectedCountError::Lookup(format!("decode {path}: {e}")))?;
        if scale.metadata.uid.as_deref() != Some(r.uid.as_str()) {
            return Ok(None);
        }
        Ok(Some(ControllerScale {
            uid: r.uid.clone(),
            replicas: scale.spec.and_then(|s| s.replicas).unwrap_or(0),
        }))
    }

    /// PUTs `status` on the budget's status subresource at the cached resourceVersion.
    async fn write_status(
        &self,
        pdb: &PodDisruptionBudget,
        status: PodDisruptionBudgetStatus,
    ) -> Result<(), Error> {
        let namespace = pdb.metadata.namespace.as_deref().unwrap_or_default();
        let name = pdb.metadata.name.as_deref().unwrap_or_default();
        let mut next = pdb.clone();
        next.status = Some(status);
        self.client
            .api::<PodDisruptionBudget>(Some(namespace))
            .replace_status(name, &PostParams::default(), &next)
            .await
            .map(|_| ())
    }

    /// Kubernetes' `failSafe`: at least stop evictions under a budget whose status could not
    /// be computed.
    async fn fail_safe(&self, pdb: &PodDisruptionBudget, message: &str) -> anyhow::Result<()> {
        let Some(status) = fail_safe_status(pdb, message, &util::now()) else {
            return Ok(());
        };
        self.write_status(pdb, status)
            .await
            .context("write fail-safe poddisruptionbudget status")
    }

    /// Sets the pod's stale `DisruptionTarget` condition to False, or looks again when it
    /// will be stale (Kubernetes' `syncStalePodDisruption`).
    pub async fn sync_stale_pod_disruption(&self, key: &str) -> anyhow::Result<()> {
        let (namespace, name) = util::split_key(key);
        let Some(pod) = self.pods.get_by(namespace, name) else {
            return Ok(());
        };
        let now = util::now();
        let Some(wait) =
            stale_disruption_wait(&pod, self.config.stale_pod_disruption_timeout, &now)
        else {
            return Ok(());
        };
        if !wait.is_zero() {
            self.stale_pod_queue.add_after(key.to_string(), wait);
            return Ok(());
        }
        let Some(updated) = clear_disruption_target(&pod, &now) else {
            return Ok(());
        };
        self.client
            .api::<Pod>(Some(namespace))
            .replace_status(name, &PostParams::default(), &updated)
            .await
            .context("update pod status")?;
        tracing::info!(pod = %key, "reset stale DisruptionTarget condition to False");
        Ok(())
    }
}

impl Reconciler for DisruptionController {
    fn name(&self) -> &'static str {
        "disruption"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        let span = tracing::debug_span!("sync", pdb = %key);
        self.sync_pdb(key).instrument(span).await
    }
}

/// The controller's second loop, over its stale-pod queue.
struct StalePodDisruption {
    controller: Arc<DisruptionController>,
}

impl Reconciler for StalePodDisruption {
    fn name(&self) -> &'static str {
        "disruption-stale-pod"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        let span = tracing::debug_span!("sync", pod = %key);
        self.controller
            .sync_stale_pod_disruption(key)
            .instrument(span)
            .await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn time(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + seconds).unwrap())
    }

    fn owner(kind: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: format!("{kind}-{uid}").to_lowercase(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    fn pod(name: &str, ready: bool, controller: Option<OwnerReference>) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                owner_references: controller.map(|r| vec![r]),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        })
    }

    fn deleting(pod: Arc<Pod>) -> Arc<Pod> {
        let mut pod = (*pod).clone();
        pod.metadata.deletion_timestamp = Some(time(0));
        Arc::new(pod)
    }

    fn rs_pods(n: usize, ready: usize) -> Vec<Arc<Pod>> {
        (0..n)
            .map(|i| {
                pod(
                    &format!("web-{i}"),
                    i < ready,
                    Some(owner("ReplicaSet", "rs1")),
                )
            })
            .collect()
    }

    /// A resolver knowing ReplicaSet `rs1` (scale `replicas`) and StatefulSet `ss1` (scale 2).
    fn resolver(replicas: i32) -> impl FnMut(&OwnerReference, &str) -> Resolved {
        move |r, _| {
            Ok(match r.uid.as_str() {
                "rs1" => Some(ControllerScale {
                    uid: "rs1".into(),
                    replicas,
                }),
                "ss1" => Some(ControllerScale {
                    uid: "ss1".into(),
                    replicas: 2,
                }),
                _ => None,
            })
        }
    }

    fn spec(min: Option<IntOrString>, max: Option<IntOrString>) -> PodDisruptionBudgetSpec {
        PodDisruptionBudgetSpec {
            min_available: min,
            max_unavailable: max,
            selector: Some(LabelSelector::default()),
            unhealthy_pod_eviction_policy: None,
        }
    }

    fn int(v: i32) -> Option<IntOrString> {
        Some(IntOrString::Int(v))
    }

    fn percent(v: &str) -> Option<IntOrString> {
        Some(IntOrString::String(v.into()))
    }

    fn count(
        spec: &PodDisruptionBudgetSpec,
        pods: &[Arc<Pod>],
        replicas: i32,
    ) -> Result<ExpectedCount, ExpectedCountError> {
        expected_pod_count(spec, pods, &mut resolver(replicas))
    }

    fn pdb(generation: i64, status: Option<PodDisruptionBudgetStatus>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                generation: Some(generation),
                ..ObjectMeta::default()
            },
            spec: Some(spec(int(2), None)),
            status,
        }
    }

    #[test]
    fn scaled_values_round_percentages_up_as_kubernetes() {
        let s = |v: &str| IntOrString::String(v.into());
        assert_eq!(scaled_value(&IntOrString::Int(7), 3, true), Ok(7));
        assert_eq!(scaled_value(&s("50%"), 3, true), Ok(2));
        assert_eq!(scaled_value(&s("50%"), 3, false), Ok(1));
        assert_eq!(scaled_value(&s("33%"), 10, true), Ok(4));
        assert_eq!(scaled_value(&s("30%"), 10, true), Ok(3));
        assert_eq!(scaled_value(&s("0%"), 10, true), Ok(0));
        assert_eq!(scaled_value(&s("100%"), 10, true), Ok(10));
        assert_eq!(scaled_value(&s("1%"), 1, true), Ok(1));
        assert!(matches!(
            scaled_value(&s("5"), 10, true),
            Err(ExpectedCountError::IntOrPercent(_))
        ));
        assert!(matches!(
            scaled_value(&s("x%"), 10, true),
            Err(ExpectedCountError::IntOrPercent(_))
        ));
    }

    #[test]
    fn integer_min_available_counts_the_selected_pods() {
        // Reference: Kubernetes' getExpectedPodCount, minAvailable of type Int.
        let pods = rs_pods(3, 1);
        let c = count(&spec(int(2), None), &pods, 10).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (3, 2));
        // No scale is needed, so an unresolvable controller does not matter.
        let orphaned = vec![pod("x", true, Some(owner("ReplicaSet", "gone")))];
        let c = count(&spec(int(1), None), &orphaned, 10).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (1, 1));
    }

    #[test]
    fn percentages_and_max_unavailable_use_the_controllers_scale() {
        let pods = rs_pods(3, 3);
        // minAvailable 50% of scale 4, rounded up.
        let c = count(&spec(percent("50%"), None), &pods, 4).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (4, 2));
        let c = count(&spec(percent("30%"), None), &pods, 5).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (5, 2));
        // maxUnavailable 1 of 4.
        let c = count(&spec(None, int(1)), &pods, 4).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (4, 3));
        // maxUnavailable 50% of 3: 2 may be unavailable (rounded up), 1 desired.
        let c = count(&spec(None, percent("50%")), &pods, 3).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (3, 1));
        // More unavailable than expected: nothing desired, never negative.
        let c = count(&spec(None, int(5)), &pods, 3).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (3, 0));
        // maxUnavailable wins over minAvailable.
        let c = count(&spec(int(3), int(1)), &pods, 3).unwrap();
        assert_eq!(c.desired_healthy, 2);
        // Neither: nothing expected or desired.
        assert_eq!(
            count(&spec(None, None), &pods, 3).unwrap(),
            ExpectedCount::default()
        );
    }

    #[test]
    fn controllers_are_counted_once_and_summed() {
        let mut pods = rs_pods(3, 3);
        pods.push(pod("db-0", true, Some(owner("StatefulSet", "ss1"))));
        pods.push(pod("db-1", true, Some(owner("StatefulSet", "ss1"))));
        let c = count(&spec(None, int(1)), &pods, 3).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (5, 4));
    }

    #[test]
    fn a_pod_whose_controller_has_no_scale_fails_the_count() {
        let mut pods = rs_pods(2, 2);
        pods.push(pod("odd", true, Some(owner("DaemonSet", "ds1"))));
        assert_eq!(
            count(&spec(None, int(1)), &pods, 2),
            Err(ExpectedCountError::NoController { pod: "odd".into() })
        );
        assert!(count(&spec(percent("50%"), None), &pods, 2).is_err());
        // A lookup error is passed through as is.
        let mut failing = |_: &OwnerReference, _: &str| {
            Err(ExpectedCountError::Lookup(
                "daemonsets.apps does not implement the scale subresource".into(),
            ))
        };
        assert_eq!(
            expected_pod_count(&spec(None, int(1)), &pods, &mut failing),
            Err(ExpectedCountError::Lookup(
                "daemonsets.apps does not implement the scale subresource".into()
            ))
        );
    }

    #[test]
    fn pods_without_a_controller_are_unmanaged_not_an_error() {
        // Reference: Kubernetes 1.32 getExpectedScale collects them and syncs on.
        let mut pods = rs_pods(2, 2);
        pods.push(pod("bare", true, None));
        let c = count(&spec(None, int(1)), &pods, 2).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (2, 1));
        assert_eq!(c.unmanaged_pods, vec!["bare".to_string()]);
        let only_bare = vec![pod("bare", true, None)];
        let c = count(&spec(None, int(1)), &only_bare, 2).unwrap();
        assert_eq!((c.expected_count, c.desired_healthy), (0, 0));
    }

    #[test]
    fn not_ready_terminating_and_disrupted_pods_are_not_healthy() {
        let now = time(1000);
        let mut pods = rs_pods(5, 4); // web-4 is not ready
        pods[0] = deleting(pods[0].clone());
        let disrupted = BTreeMap::from([
            ("web-1".to_string(), time(1000 - 60)),  // fresh: not healthy
            ("web-2".to_string(), time(1000 - 121)), // expired: healthy again
        ]);
        // web-2 and web-3 remain.
        assert_eq!(count_healthy_pods(&pods, &disrupted, &now), 2);
        assert_eq!(count_healthy_pods(&pods, &BTreeMap::new(), &now), 3);
    }

    #[test]
    fn disrupted_pods_expire_after_the_deletion_timeout() {
        let now = time(1000);
        let mut pods = rs_pods(4, 4);
        pods[3] = deleting(pods[3].clone());
        let disrupted = BTreeMap::from([
            ("web-0".to_string(), time(1000 - 121)), // expired
            ("web-1".to_string(), time(1000 - 30)),  // 90 s left
            ("web-2".to_string(), time(1000 - 100)), // 20 s left: the recheck
            ("web-3".to_string(), time(1000 - 10)),  // being deleted: dropped
            ("gone".to_string(), time(1000 - 10)),   // no such pod: dropped
        ]);
        let d = build_disrupted_pod_map(&pods, Some(&disrupted), &now);
        assert_eq!(d.expired, vec!["web-0".to_string()]);
        assert_eq!(
            d.pods.keys().cloned().collect::<Vec<_>>(),
            vec!["web-1".to_string(), "web-2".to_string()]
        );
        assert_eq!(d.recheck_after, Some(Duration::from_millis(20_001)));
        // Exactly at the timeout the entry still stands.
        let edge = BTreeMap::from([("web-0".to_string(), time(1000 - 120))]);
        let d = build_disrupted_pod_map(&pods, Some(&edge), &now);
        assert!(d.pods.contains_key("web-0") && d.expired.is_empty());
        assert_eq!(
            build_disrupted_pod_map(&pods, None, &now),
            DisruptedPods::default()
        );
    }

    #[test]
    fn status_allows_healthy_minus_desired_and_says_so() {
        let now = time(0);
        let pods = rs_pods(3, 3);
        let expected = ExpectedCount {
            expected_count: 3,
            desired_healthy: 2,
            unmanaged_pods: Vec::new(),
        };
        let budget = pdb(4, None);
        let status = compute_status(&budget, &pods, &expected, &now)
            .status
            .unwrap();
        assert_eq!(status.current_healthy, 3);
        assert_eq!(status.desired_healthy, 2);
        assert_eq!(status.expected_pods, 3);
        assert_eq!(status.disruptions_allowed, 1);
        assert_eq!(status.observed_generation, Some(4));
        assert_eq!(status.disrupted_pods, None);
        let c = &status.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("DisruptionAllowed", "True", SUFFICIENT_PODS_REASON)
        );
        assert_eq!(c.observed_generation, Some(4));
        // Written once, it is up to date: nothing to write.
        let written = pdb(4, Some(status.clone()));
        assert_eq!(
            compute_status(&written, &pods, &expected, &time(5)).status,
            None
        );
        // A new generation must be observed even when the numbers stand.
        let bumped = pdb(5, Some(status));
        let next = compute_status(&bumped, &pods, &expected, &time(5))
            .status
            .unwrap();
        assert_eq!(next.observed_generation, Some(5));
        // A pod going not ready: no disruption left, InsufficientPods, transition moves.
        let mut pods = pods;
        pods[2] = pod("web-2", false, Some(owner("ReplicaSet", "rs1")));
        let lower = compute_status(&written, &pods, &expected, &time(9))
            .status
            .unwrap();
        assert_eq!((lower.current_healthy, lower.disruptions_allowed), (2, 0));
        let c = &lower.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", INSUFFICIENT_PODS_REASON)
        );
        assert_eq!(c.last_transition_time, time(9));
    }

    #[test]
    fn nothing_is_allowed_while_no_pod_is_expected_or_too_few_are_healthy() {
        let pods = rs_pods(2, 2);
        let none_expected = ExpectedCount {
            expected_count: 0,
            desired_healthy: 0,
            unmanaged_pods: vec!["a".into(), "b".into()],
        };
        let s = compute_status(&pdb(1, None), &pods, &none_expected, &time(0))
            .status
            .unwrap();
        assert_eq!((s.current_healthy, s.disruptions_allowed), (2, 0));
        let too_many = ExpectedCount {
            expected_count: 2,
            desired_healthy: 5,
            unmanaged_pods: Vec::new(),
        };
        let s = compute_status(&pdb(1, None), &pods, &too_many, &time(0))
            .status
            .unwrap();
        assert_eq!(s.disruptions_allowed, 0);
    }

    #[test]
    fn an_evicted_pod_is_not_healthy_until_its_entry_expires() {
        let pods = rs_pods(3, 3);
        let expected = ExpectedCount {
            expected_count: 3,
            desired_healthy: 2,
            unmanaged_pods: Vec::new(),
        };
        let status = PodDisruptionBudgetStatus {
            disrupted_pods: Some(BTreeMap::from([("web-0".to_string(), time(0))])),
            ..PodDisruptionBudgetStatus::default()
        };
        let budget = pdb(1, Some(status));
        let fresh = compute_status(&budget, &pods, &expected, &time(10));
        let s = fresh.status.unwrap();
        assert_eq!((s.current_healthy, s.disruptions_allowed), (2, 0));
        assert!(s.disrupted_pods.unwrap().contains_key("web-0"));
        assert_eq!(fresh.recheck_after, Some(Duration::from_millis(110_001)));
        let stale = compute_status(&budget, &pods, &expected, &time(121));
        assert_eq!(stale.expired, vec!["web-0".to_string()]);
        let s = stale.status.unwrap();
        assert_eq!((s.current_healthy, s.disruptions_allowed), (3, 1));
        assert_eq!(s.disrupted_pods, None);
        assert_eq!(stale.recheck_after, None);
    }

    #[test]
    fn fail_safe_allows_nothing_once() {
        let ok = PodDisruptionBudgetStatus {
            disruptions_allowed: 2,
            observed_generation: Some(3),
            ..PodDisruptionBudgetStatus::default()
        };
        let budget = pdb(3, Some(ok));
        let failed =
            fail_safe_status(&budget, "found no controllers for pod \"x\"", &time(0)).unwrap();
        assert_eq!(failed.disruptions_allowed, 0);
        let c = &failed.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "False",
                SYNC_FAILED_REASON,
                "found no controllers for pod \"x\""
            )
        );
        assert_eq!(c.observed_generation, Some(3));
        // Already failed for that reason: nothing to write.
        let again = pdb(3, Some(failed.clone()));
        assert_eq!(
            fail_safe_status(&again, "found no controllers for pod \"x\"", &time(9)),
            None
        );
        // A later success clears the message and the reason, not the status's time.
        let expected = ExpectedCount {
            expected_count: 1,
            desired_healthy: 1,
            unmanaged_pods: Vec::new(),
        };
        let s = compute_status(&again, &rs_pods(1, 1), &expected, &time(20))
            .status
            .unwrap();
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.reason.as_str(), c.message.as_str()),
            (INSUFFICIENT_PODS_REASON, "")
        );
        assert_eq!(c.last_transition_time, time(0));
    }

    #[test]
    fn selectors_follow_policy_v1() {
        let web = pod("web-0", true, None);
        let mut budget = pdb(1, None);
        // Empty: every pod of the namespace.
        assert!(selects(&budget, &web));
        // Null: none.
        budget.spec.as_mut().unwrap().selector = None;
        assert!(!selects(&budget, &web));
        budget.spec.as_mut().unwrap().selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "db".into())])),
            match_expressions: None,
        });
        assert!(!selects(&budget, &web));
        budget.spec.as_mut().unwrap().selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
            match_expressions: None,
        });
        assert!(selects(&budget, &web));
        budget.metadata.namespace = Some("other".into());
        assert!(!selects(&budget, &web));
    }

    fn with_disruption_target(reason: &str, at: Time, phase: &str) -> Pod {
        let mut p = (*pod("web-0", true, None)).clone();
        let status = p.status.as_mut().unwrap();
        status.phase = Some(phase.into());
        status.conditions.as_mut().unwrap().push(PodCondition {
            type_: DISRUPTION_TARGET_CONDITION.into(),
            status: "True".into(),
            reason: Some(reason.into()),
            last_transition_time: Some(at),
            ..PodCondition::default()
        });
        p
    }

    #[test]
    fn stale_disruption_targets_are_found_and_cleared() {
        let timeout = STALE_POD_DISRUPTION_TIMEOUT;
        let p = with_disruption_target("EvictionByEvictionAPI", time(0), "Running");
        assert_eq!(
            stale_disruption_wait(&p, timeout, &time(30)),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            stale_disruption_wait(&p, timeout, &time(500)),
            Some(Duration::ZERO)
        );
        let kubelet = with_disruption_target(TERMINATION_BY_KUBELET_REASON, time(0), "Running");
        assert_eq!(stale_disruption_wait(&kubelet, timeout, &time(500)), None);
        let done = with_disruption_target("EvictionByEvictionAPI", time(0), "Failed");
        assert_eq!(stale_disruption_wait(&done, timeout, &time(500)), None);
        let mut going = p.clone();
        going.metadata.deletion_timestamp = Some(time(1));
        assert_eq!(stale_disruption_wait(&going, timeout, &time(500)), None);
        assert_eq!(
            stale_disruption_wait(&pod("x", true, None), timeout, &time(0)),
            None
        );

        let cleared = clear_disruption_target(&p, &time(500)).unwrap();
        let c = cleared
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == DISRUPTION_TARGET_CONDITION)
            .unwrap();
        assert_eq!(c.status, "False");
        assert_eq!(c.reason, None);
        assert_eq!(c.last_transition_time, Some(time(500)));
        assert_eq!(stale_disruption_wait(&cleared, timeout, &time(900)), None);
        assert_eq!(clear_disruption_target(&cleared, &time(900)), None);
    }

    #[test]
    fn group_versions_parse_as_apimachinery() {
        assert_eq!(parse_group_version("apps/v1"), Ok(("apps", "v1")));
        assert_eq!(parse_group_version("v1"), Ok(("", "v1")));
        assert!(parse_group_version("a/b/c").is_err());
        let r = owner("ReplicaSet", "x");
        assert_eq!(verify_group_kind(&r, "ReplicaSet", APPS_GROUPS), Ok(true));
        assert_eq!(verify_group_kind(&r, "StatefulSet", &["apps"]), Ok(false));
    }
}
