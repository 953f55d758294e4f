//! A Deployment's status as `kubectl rollout status` reads it (Kubernetes'
//! `deployment/progress.go` and the condition helpers of `deploymentutil`): the replica
//! counts summed over its ReplicaSets, the `Available` condition, and the `Progressing`
//! condition with its deadline.
//!
//! `kubectl rollout status` waits for `observedGeneration >= generation`, then for
//! `updatedReplicas == replicas == availableReplicas`, and fails on
//! `Progressing=False/ProgressDeadlineExceeded`. The deadline has no timer of its own: a sync
//! that sees no progress asks to be re-queued when the deadline would pass
//! ([`requeue_after`]), so the condition flips even if nothing else happens.
//!
//! Invariant: a condition's `lastTransitionTime` moves only when its status changes, and its
//! `lastUpdateTime` only when status or reason does (or when progress is made) — the deadline
//! is measured from `lastUpdateTime`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;

use super::rolling::max_unavailable;
use super::spec::{
    CONDITION_AVAILABLE, CONDITION_PROGRESSING, CONDITION_REPLICA_FAILURE,
    REASON_MINIMUM_REPLICAS_AVAILABLE, REASON_MINIMUM_REPLICAS_UNAVAILABLE,
    REASON_NEW_REPLICA_SET_AVAILABLE, REASON_PROGRESS_DEADLINE_EXCEEDED, available_replicas,
    desired_replicas, progress_deadline_seconds, ready_replicas, replicas, status_replicas,
};

/// A re-check closer than this to the deadline is rounded up to it, and every re-check lands
/// this long after the deadline (Kubernetes' `requeueStuckDeployment` adds one second so the
/// sync runs after the deadline has passed, not a hair before).
pub const DEADLINE_RECHECK_SLACK: Duration = Duration::from_secs(1);

/// A condition stamped `now` (Kubernetes' `NewDeploymentCondition`).
pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: &Time,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// The condition of `type_`.
pub fn get_condition<'a>(
    status: &'a DeploymentStatus,
    type_: &str,
) -> Option<&'a DeploymentCondition> {
    status
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// Kubernetes' `SetDeploymentCondition`: no change if status and reason are the same; keeps
/// `lastTransitionTime` if only the reason changed.
pub fn set_condition(status: &mut DeploymentStatus, mut condition: DeploymentCondition) {
    if let Some(current) = get_condition(status, &condition.type_) {
        if current.status == condition.status && current.reason == condition.reason {
            return;
        }
        if current.status == condition.status {
            condition.last_transition_time = current.last_transition_time.clone();
        }
    }
    remove_condition(status, &condition.type_.clone());
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(condition);
}

/// Removes the condition of `type_`.
pub fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(conditions) = status.conditions.as_mut() {
        conditions.retain(|c| c.type_ != type_);
    }
}

/// The status the ReplicaSets add up to (Kubernetes' `calculateStatus`), with the
/// `Available` condition set and every other condition carried over.
pub fn calculate_status(
    d: &Deployment,
    all: &[&ReplicaSet],
    new_rs: Option<&ReplicaSet>,
    now: &Time,
) -> DeploymentStatus {
    let available: i32 = all.iter().map(|rs| available_replicas(rs)).sum();
    let total: i32 = all.iter().map(|rs| replicas(rs)).sum();
    let unavailable = (total - available).max(0);
    let current = d.status.clone().unwrap_or_default();
    let mut status = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: Some(all.iter().map(|rs| status_replicas(rs)).sum()),
        updated_replicas: Some(new_rs.map(status_replicas).unwrap_or(0)),
        ready_replicas: Some(all.iter().map(|rs| ready_replicas(rs)).sum()),
        available_replicas: Some(available),
        unavailable_replicas: Some(unavailable),
        collision_count: current.collision_count,
        conditions: current.conditions.clone(),
    };
    if available >= desired_replicas(d) - max_unavailable(d) {
        set_condition(
            &mut status,
            new_condition(
                CONDITION_AVAILABLE,
                "True",
                REASON_MINIMUM_REPLICAS_AVAILABLE,
                "Deployment has minimum availability.".into(),
                now,
            ),
        );
    } else {
        set_condition(
            &mut status,
            new_condition(
                CONDITION_AVAILABLE,
                "False",
                REASON_MINIMUM_REPLICAS_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
                now,
            ),
        );
    }
    status
}

fn count(v: Option<i32>) -> i32 {
    v.unwrap_or(0)
}

/// Whether the rollout is complete: every replica updated and available, and the status is
/// about the current generation (Kubernetes' `DeploymentComplete`).
pub fn deployment_complete(d: &Deployment, status: &DeploymentStatus) -> bool {
    let desired = desired_replicas(d);
    count(status.updated_replicas) == desired
        && count(status.replicas) == desired
        && count(status.available_replicas) == desired
        && status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
}

/// Whether `new` shows progress over the Deployment's current status: more updated, ready or
/// available pods, or fewer old ones (Kubernetes' `DeploymentProgressing`).
pub fn deployment_progressing(d: &Deployment, new: &DeploymentStatus) -> bool {
    let old = d.status.clone().unwrap_or_default();
    let old_old_replicas = count(old.replicas) - count(old.updated_replicas);
    let new_old_replicas = count(new.replicas) - count(new.updated_replicas);
    count(new.updated_replicas) > count(old.updated_replicas)
        || new_old_replicas < old_old_replicas
        || count(new.ready_replicas) > count(old.ready_replicas)
        || count(new.available_replicas) > count(old.available_replicas)
}

/// Whether the rollout has made no progress for `progressDeadlineSeconds` since the
/// `Progressing` condition was last updated (Kubernetes' `DeploymentTimedOut`).
pub fn deployment_timed_out(d: &Deployment, status: &DeploymentStatus, now: &Time) -> bool {
    let Some(deadline_s) = progress_deadline_seconds(d) else {
        return false;
    };
    let Some(condition) = get_condition(status, CONDITION_PROGRESSING) else {
        return false;
    };
    match condition.reason.as_deref() {
        // A completed rollout cannot time out; a timed-out one stays so.
        Some(REASON_NEW_REPLICA_SET_AVAILABLE) => return false,
        Some(REASON_PROGRESS_DEADLINE_EXCEEDED) => return true,
        _ => {}
    }
    let Some(from) = condition.last_update_time.as_ref() else {
        return false;
    };
    // Kubernetes: `lastUpdateTime + deadline` is before `now`.
    now.0.duration_since(from.0) > SignedDuration::from_secs(i64::from(deadline_s))
}

/// When to look at a Deployment again to see whether its rollout has timed out (Kubernetes'
/// `requeueStuckDeployment`): `None` when there is no deadline, no `Progressing` condition,
/// the rollout is complete or already timed out; else the time left until
/// `lastUpdateTime + progressDeadlineSeconds`, plus [`DEADLINE_RECHECK_SLACK`].
pub fn requeue_after(d: &Deployment, new: &DeploymentStatus, now: &Time) -> Option<Duration> {
    let deadline_s = progress_deadline_seconds(d)?;
    let current = d
        .status
        .as_ref()
        .and_then(|s| get_condition(s, CONDITION_PROGRESSING))?;
    if deployment_complete(d, new)
        || current.reason.as_deref() == Some(REASON_PROGRESS_DEADLINE_EXCEEDED)
    {
        return None;
    }
    let from = current.last_update_time.as_ref()?;
    let elapsed_ms = now.0.duration_since(from.0).as_millis();
    let left_ms = i128::from(deadline_s) * 1000 - elapsed_ms;
    let left = Duration::from_millis(u64::try_from(left_ms.max(0)).unwrap_or(u64::MAX));
    Some(left.max(DEADLINE_RECHECK_SLACK) + DEADLINE_RECHECK_SLACK)
}

/// A ReplicaSet's `ReplicaFailure` conditions as Deployment conditions, the new ReplicaSet's
/// first (Kubernetes' `getReplicaFailures` + `ReplicaSetToDeploymentCondition`).
pub fn replica_failures(
    all: &[&ReplicaSet],
    new_rs: Option<&ReplicaSet>,
) -> Vec<DeploymentCondition> {
    let failures = |rs: &ReplicaSet| -> Vec<DeploymentCondition> {
        rs.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.type_ == CONDITION_REPLICA_FAILURE)
            .map(|c| DeploymentCondition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                last_update_time: c.last_transition_time.clone(),
                last_transition_time: c.last_transition_time.clone(),
            })
            .collect()
    };
    if let Some(new_rs) = new_rs {
        let from_new = failures(new_rs);
        if !from_new.is_empty() {
            return from_new;
        }
    }
    all.iter().flat_map(|rs| failures(rs)).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::jiff::Timestamp;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(1_700_000_000 + s).unwrap())
    }

    fn deployment(replicas: i32, deadline: i32) -> Deployment {
        let mut d = Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                progress_deadline_seconds: Some(deadline),
                ..Default::default()
            }),
            ..Default::default()
        };
        d.metadata.generation = Some(2);
        d
    }

    #[test]
    fn set_condition_keeps_transition_time_on_same_status() {
        let mut status = DeploymentStatus::default();
        set_condition(
            &mut status,
            new_condition("Progressing", "True", "A", "a".into(), &at(0)),
        );
        set_condition(
            &mut status,
            new_condition("Progressing", "True", "A", "again".into(), &at(5)),
        );
        let c = get_condition(&status, "Progressing").unwrap();
        assert_eq!(
            c.message.as_deref(),
            Some("a"),
            "same status and reason: untouched"
        );
        set_condition(
            &mut status,
            new_condition("Progressing", "True", "B", "b".into(), &at(10)),
        );
        let c = get_condition(&status, "Progressing").unwrap();
        assert_eq!(c.reason.as_deref(), Some("B"));
        assert_eq!(c.last_transition_time, Some(at(0)));
        assert_eq!(c.last_update_time, Some(at(10)));
        set_condition(
            &mut status,
            new_condition("Progressing", "False", "C", "c".into(), &at(20)),
        );
        let c = get_condition(&status, "Progressing").unwrap();
        assert_eq!(c.last_transition_time, Some(at(20)));
        assert_eq!(status.conditions.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn complete_needs_every_count_and_the_generation() {
        let d = deployment(3, 600);
        let mut s = DeploymentStatus {
            observed_generation: Some(2),
            replicas: Some(3),
            updated_replicas: Some(3),
            available_replicas: Some(3),
            ..Default::default()
        };
        assert!(deployment_complete(&d, &s));
        s.observed_generation = Some(1);
        assert!(!deployment_complete(&d, &s));
        s.observed_generation = Some(2);
        s.replicas = Some(4);
        assert!(!deployment_complete(&d, &s), "an old pod is still there");
    }

    #[test]
    fn deadline_times_out_from_last_update_and_requeues_before() {
        let mut d = deployment(3, 600);
        let mut status = DeploymentStatus::default();
        set_condition(
            &mut status,
            new_condition(
                "Progressing",
                "True",
                "ReplicaSetUpdated",
                "m".into(),
                &at(0),
            ),
        );
        d.status = Some(status.clone());
        assert!(!deployment_timed_out(&d, &status, &at(600)));
        assert!(deployment_timed_out(&d, &status, &at(601)));
        // 180 s in: look again 420 s + 1 s later.
        assert_eq!(
            requeue_after(&d, &status, &at(180)),
            Some(Duration::from_secs(421))
        );
        // Past the deadline: soon (rounded up to the slack).
        assert_eq!(
            requeue_after(&d, &status, &at(900)),
            Some(Duration::from_secs(2))
        );
        // No deadline: never.
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(i32::MAX);
        assert!(!deployment_timed_out(&d, &status, &at(10_000)));
        assert_eq!(requeue_after(&d, &status, &at(180)), None);
    }

    #[test]
    fn available_condition_follows_max_unavailable() {
        // 4 replicas, 25 %: at least 3 available.
        let d = deployment(4, 600);
        let mut rs = ReplicaSet::default();
        crate::deployment::spec::set_replicas(&mut rs, 4);
        rs.status = Some(k8s_openapi::api::apps::v1::ReplicaSetStatus {
            replicas: 4,
            available_replicas: Some(3),
            ready_replicas: Some(3),
            ..Default::default()
        });
        let s = calculate_status(&d, &[&rs], Some(&rs), &at(0));
        assert_eq!(get_condition(&s, "Available").unwrap().status, "True");
        assert_eq!(s.unavailable_replicas, Some(1));
        assert_eq!(s.updated_replicas, Some(4));
        assert_eq!(s.observed_generation, Some(2));
        rs.status.as_mut().unwrap().available_replicas = Some(2);
        let s = calculate_status(&d, &[&rs], Some(&rs), &at(0));
        let c = get_condition(&s, "Available").unwrap();
        assert_eq!(c.status, "False");
        assert_eq!(c.reason.as_deref(), Some("MinimumReplicasUnavailable"));
    }
}
