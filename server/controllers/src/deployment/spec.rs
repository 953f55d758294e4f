//! What the Deployment controller reads of Deployments and ReplicaSets: the annotation and
//! condition vocabulary shared with `kubectl`, field accessors that apply the apps/v1 defaults
//! (the apiserver defaults these fields, but an object written before a default existed, or
//! adopted from elsewhere, must not make the controller panic or guess), and the orderings the
//! rollout arithmetic relies on (Kubernetes' `controller.ReplicaSetsBy*`).

use std::cmp::Ordering;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A ReplicaSet's revision, and the Deployment's current one (`kubectl rollout history`
/// lists ReplicaSets by it; `rollout undo` picks the second highest).
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
/// Earlier revisions of a ReplicaSet that was rolled back to (comma-separated).
pub const REVISION_HISTORY_ANNOTATION: &str = "deployment.kubernetes.io/revision-history";
/// The Deployment's replicas when the ReplicaSet was last scaled by it: a difference from the
/// current spec is how a sync recognises a scaling event.
pub const DESIRED_REPLICAS_ANNOTATION: &str = "deployment.kubernetes.io/desired-replicas";
/// The Deployment's replicas + maxSurge when the ReplicaSet was last scaled: the denominator
/// of proportional scaling.
pub const MAX_REPLICAS_ANNOTATION: &str = "deployment.kubernetes.io/max-replicas";
/// kubectl's client-side apply record: never copied from a Deployment to its ReplicaSets.
pub const LAST_APPLIED_CONFIG_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// extensions/v1beta1's server-side rollback request; never copied to ReplicaSets.
pub const DEPRECATED_ROLLBACK_TO_ANNOTATION: &str = "deprecated.deployment.rollback.to";

/// Deployment annotations the controller never copies onto a ReplicaSet (Kubernetes'
/// `annotationsToSkip`): they describe the Deployment's or the ReplicaSet's own bookkeeping.
pub const ANNOTATIONS_TO_SKIP: [&str; 6] = [
    LAST_APPLIED_CONFIG_ANNOTATION,
    REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
    DESIRED_REPLICAS_ANNOTATION,
    MAX_REPLICAS_ANNOTATION,
    DEPRECATED_ROLLBACK_TO_ANNOTATION,
];

/// Condition type: at least `replicas - maxUnavailable` pods are available.
pub const CONDITION_AVAILABLE: &str = "Available";
/// Condition type: the rollout's state (moving, complete, paused or past its deadline).
pub const CONDITION_PROGRESSING: &str = "Progressing";
/// Condition type (copied from a ReplicaSet that failed to create pods).
pub const CONDITION_REPLICA_FAILURE: &str = "ReplicaFailure";

/// `Available=True`: at least replicas - maxUnavailable pods are available.
pub const REASON_MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
/// `Available=False`.
pub const REASON_MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
/// `Progressing=True`: this sync created the new ReplicaSet.
pub const REASON_NEW_REPLICA_SET_CREATED: &str = "NewReplicaSetCreated";
/// `Progressing=True`: the new ReplicaSet already existed.
pub const REASON_FOUND_NEW_REPLICA_SET: &str = "FoundNewReplicaSet";
/// `Progressing=True`: pods moved towards the new template since the last sync.
pub const REASON_REPLICA_SET_UPDATED: &str = "ReplicaSetUpdated";
/// `Progressing=True`: the rollout completed (`kubectl rollout status` stops waiting).
pub const REASON_NEW_REPLICA_SET_AVAILABLE: &str = "NewReplicaSetAvailable";
/// `Progressing=False`: no progress for progressDeadlineSeconds (`rollout status` fails).
pub const REASON_PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
/// `Progressing=False`: creating the new ReplicaSet failed (also the reason of the Warning
/// event recorded then).
pub const REASON_REPLICA_SET_CREATE_ERROR: &str = "ReplicaSetCreateError";
/// `Progressing=Unknown`: `kubectl rollout pause`.
pub const REASON_DEPLOYMENT_PAUSED: &str = "DeploymentPaused";
/// `Progressing=Unknown`: `kubectl rollout resume`.
pub const REASON_DEPLOYMENT_RESUMED: &str = "DeploymentResumed";

/// The reason of the Normal event recorded on a Deployment each time it resizes one of its
/// ReplicaSets ("Scaled up replica set web-x from 0 to 3"), as kube-controller-manager's.
pub const EVENT_REASON_SCALING_REPLICA_SET: &str = "ScalingReplicaSet";
/// The reason of the Warning event recorded on a Deployment whose selector is empty.
pub const EVENT_REASON_SELECTING_ALL: &str = "SelectingAll";

/// Strategy type: replace pods a few at a time (the default).
pub const STRATEGY_ROLLING_UPDATE: &str = "RollingUpdate";
/// Strategy type: remove every old pod before creating a new one.
pub const STRATEGY_RECREATE: &str = "Recreate";

/// apps/v1 default of `spec.replicas` (Deployment and ReplicaSet).
pub const DEFAULT_REPLICAS: i32 = 1;
/// apps/v1 default of `spec.revisionHistoryLimit`: old ReplicaSets kept for rollback.
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;
/// apps/v1 default of `spec.progressDeadlineSeconds`.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i32 = 600;
/// A progress deadline of `MaxInt32` means "none" (Kubernetes' `HasProgressDeadline`; the
/// extensions/v1beta1 default, kept by conversion).
pub const PROGRESS_DEADLINE_NONE: i32 = i32::MAX;
/// apps/v1 default of maxSurge.
pub const DEFAULT_MAX_SURGE: &str = "25%";
/// apps/v1 default of maxUnavailable.
pub const DEFAULT_MAX_UNAVAILABLE: &str = "25%";

fn spec(d: &Deployment) -> Option<&DeploymentSpec> {
    d.spec.as_ref()
}

/// `spec.replicas`, defaulted.
pub fn desired_replicas(d: &Deployment) -> i32 {
    spec(d).and_then(|s| s.replicas).unwrap_or(DEFAULT_REPLICAS)
}

/// `spec.template`, or an empty template for a Deployment without a spec.
pub fn template(d: &Deployment) -> PodTemplateSpec {
    spec(d).map(|s| s.template.clone()).unwrap_or_default()
}

/// `spec.selector`, if the Deployment has a spec.
pub fn selector(d: &Deployment) -> Option<&LabelSelector> {
    spec(d).map(|s| &s.selector)
}

/// `spec.paused`.
pub fn is_paused(d: &Deployment) -> bool {
    spec(d).and_then(|s| s.paused).unwrap_or(false)
}

/// `spec.minReadySeconds`.
pub fn min_ready_seconds(d: &Deployment) -> i32 {
    spec(d).and_then(|s| s.min_ready_seconds).unwrap_or(0)
}

/// `spec.revisionHistoryLimit`, defaulted.
pub fn revision_history_limit(d: &Deployment) -> i32 {
    spec(d)
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT)
}

/// `spec.progressDeadlineSeconds`, defaulted; `None` when the Deployment has no deadline.
pub fn progress_deadline_seconds(d: &Deployment) -> Option<i32> {
    let seconds = spec(d)
        .and_then(|s| s.progress_deadline_seconds)
        .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS);
    (seconds != PROGRESS_DEADLINE_NONE).then_some(seconds)
}

/// Whether the strategy is RollingUpdate (the default).
pub fn is_rolling_update(d: &Deployment) -> bool {
    strategy_type(d) == STRATEGY_ROLLING_UPDATE
}

/// Whether the strategy is Recreate.
pub fn is_recreate(d: &Deployment) -> bool {
    strategy_type(d) == STRATEGY_RECREATE
}

fn strategy_type(d: &Deployment) -> &str {
    spec(d)
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        .unwrap_or(STRATEGY_ROLLING_UPDATE)
}

/// `spec.strategy.rollingUpdate.{maxSurge, maxUnavailable}`, defaulted to 25 % each.
pub fn rolling_parameters(d: &Deployment) -> (IntOrString, IntOrString) {
    let rolling = spec(d)
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    let surge = rolling
        .and_then(|r| r.max_surge.clone())
        .unwrap_or_else(|| IntOrString::String(DEFAULT_MAX_SURGE.into()));
    let unavailable = rolling
        .and_then(|r| r.max_unavailable.clone())
        .unwrap_or_else(|| IntOrString::String(DEFAULT_MAX_UNAVAILABLE.into()));
    (surge, unavailable)
}

/// `status.collisionCount`.
pub fn collision_count(d: &Deployment) -> Option<i32> {
    d.status.as_ref().and_then(|s| s.collision_count)
}

/// A ReplicaSet's `spec.replicas`, defaulted.
pub fn replicas(rs: &ReplicaSet) -> i32 {
    rs.spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(DEFAULT_REPLICAS)
}

/// Sets a ReplicaSet's `spec.replicas`.
pub fn set_replicas(rs: &mut ReplicaSet, n: i32) {
    rs.spec.get_or_insert_with(Default::default).replicas = Some(n);
}

/// A ReplicaSet's `status.replicas` (pods that exist).
pub fn status_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().map(|s| s.replicas).unwrap_or(0)
}

/// A ReplicaSet's `status.availableReplicas`.
pub fn available_replicas(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

/// A ReplicaSet's `status.readyReplicas`.
pub fn ready_replicas(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

/// A ReplicaSet's `spec.template` (empty when missing).
pub fn rs_template(rs: &ReplicaSet) -> PodTemplateSpec {
    rs.spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default()
}

/// The object's uid (empty when missing).
pub fn uid(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.uid.as_deref().unwrap_or_default()
}

/// The object's name (empty when missing).
pub fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// Whether the ReplicaSet is asked for any pods (Kubernetes' `FilterActiveReplicaSets`).
pub fn is_active(rs: &ReplicaSet) -> bool {
    replicas(rs) > 0
}

/// The annotation `key` parsed as an integer.
pub fn int_annotation(rs: &ReplicaSet, key: &str) -> Option<i32> {
    rs.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// Sum of `spec.replicas`.
pub fn sum_replicas<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(replicas).sum()
}

/// Oldest first, ties by name (Kubernetes' `ReplicaSetsByCreationTimestamp`).
pub fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    let t = |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
    t(a).cmp(&t(b))
        .then_with(|| name(&a.metadata).cmp(name(&b.metadata)))
}

/// Largest first, ties oldest first (Kubernetes' `ReplicaSetsBySizeOlder`): scaling down a
/// Deployment takes proportionally from the biggest and, on ties, the oldest first.
pub fn by_size_older(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    replicas(b)
        .cmp(&replicas(a))
        .then_with(|| by_creation(a, b))
}

/// Largest first, ties newest first (Kubernetes' `ReplicaSetsBySizeNewer`): scaling up gives
/// the leftover to the biggest and, on ties, the newest.
pub fn by_size_newer(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    replicas(b)
        .cmp(&replicas(a))
        .then_with(|| by_creation(b, a))
}

/// Whether the selector selects everything (`{}`): the controller refuses to act on such a
/// Deployment rather than adopt every ReplicaSet in the namespace.
pub fn selector_is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty())
}

/// Whether the selector matches the object's labels ([`skerry_api::selector::LabelSelector`],
/// the one matcher; a selector that does not convert matches nothing, and
/// [`checked_selector`] stops the sync before it gets here).
pub fn selects(
    selector: &LabelSelector,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    skerry_api::selector::LabelSelector::from_api(selector)
        .is_ok_and(|s| s.matches_opt(meta.labels.as_ref()))
}

/// The Deployment's selector, converted (Kubernetes' `LabelSelectorAsSelector` in
/// `getReplicaSetsForDeployment`); the error is Kubernetes' `deployment <ns>/<name> has
/// invalid label selector: ...`, and fails the sync before anything is adopted or released.
pub fn checked_selector(d: &Deployment) -> Result<skerry_api::selector::LabelSelector, String> {
    let selector = selector(d).cloned().unwrap_or_default();
    skerry_api::selector::LabelSelector::from_api(&selector).map_err(|e| {
        format!(
            "deployment {}/{} has invalid label selector: {}",
            d.metadata.namespace.as_deref().unwrap_or_default(),
            name(&d.metadata),
            e.message
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn deployment(selector: LabelSelector) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                labels: Some(labels(&[("app", "web")])),
                ..ObjectMeta::default()
            },
            spec: Some(DeploymentSpec {
                selector,
                ..DeploymentSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn empty_selectors_and_what_they_select() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        assert!(!selector_is_empty(&sel));
        assert!(selector_is_empty(&LabelSelector::default()));
        let d = deployment(sel.clone());
        assert!(selects(&sel, &d.metadata));
        assert!(
            checked_selector(&d)
                .unwrap()
                .matches(&labels(&[("app", "web")]))
        );
    }

    // The Deployment controller's own copy of the matcher read `NotIn` without values as
    // "matches everything" and an unknown operator as "matches nothing" (and went on to
    // release the ReplicaSets it owned); Kubernetes refuses the selector and fails the sync.
    #[test]
    fn an_invalid_selector_is_an_error_not_a_match() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: None,
            }]),
        };
        let d = deployment(sel.clone());
        assert!(!selects(&sel, &d.metadata));
        assert_eq!(
            checked_selector(&d).unwrap_err(),
            "deployment ns/web has invalid label selector: values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty"
        );
    }
}
