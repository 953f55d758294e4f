//! Taint-based eviction (Kubernetes' `pkg/controller/tainteviction`): when must a pod on a
//! node with `NoExecute` taints go?
//!
//! - a taint the pod does not tolerate: at once;
//! - tolerated with `tolerationSeconds: n`: `n` seconds after the taint's `timeAdded`
//!   (`n <= 0`: at once);
//! - tolerated without `tolerationSeconds`: never.
//!
//! Across several taints the earliest deadline wins. Each taint is matched by the first
//! toleration that tolerates it, as Kubernetes' `GetMatchingTolerations` does.

use k8s_openapi::api::core::v1::{Pod, Taint};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use skerry_api::pod::taints::{matching_toleration, tolerations_of};

use super::taints::NO_EXECUTE;

/// When a pod is to be evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// It tolerates every `NoExecute` taint forever (or there are none): it stays.
    Never,
    /// At this time (controller clock); at once when it is not in the future.
    At(Timestamp),
}

/// The node's `NoExecute` taints.
pub fn no_execute_taints(taints: &[Taint]) -> Vec<&Taint> {
    taints.iter().filter(|t| t.effect == NO_EXECUTE).collect()
}

/// When `pod` must be evicted from a node with `taints` (only the `NoExecute` ones count).
/// `added_at` gives the time a taint was added: its `timeAdded`, or, for a taint without
/// one, when the controller first saw it. `now` is returned for "at once".
pub fn eviction_time(
    pod: &Pod,
    taints: &[&Taint],
    added_at: impl Fn(&Taint) -> Timestamp,
    now: Timestamp,
) -> Eviction {
    let tolerations = tolerations_of(pod);
    let mut deadline: Option<Timestamp> = None;
    for taint in taints.iter().filter(|t| t.effect == NO_EXECUTE) {
        let Some(toleration) = matching_toleration(tolerations, taint) else {
            return Eviction::At(now);
        };
        let Some(seconds) = toleration.toleration_seconds else {
            continue;
        };
        if seconds <= 0 {
            return Eviction::At(now);
        }
        // A toleration so long it overflows the calendar is forever.
        let Ok(at) = added_at(taint).checked_add(SignedDuration::from_secs(seconds)) else {
            continue;
        };
        deadline = Some(deadline.map_or(at, |d| d.min(at)));
    }
    deadline.map_or(Eviction::Never, Eviction::At)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use crate::nodelifecycle::taints::{NO_SCHEDULE, NOT_READY, UNREACHABLE, taint};
    use k8s_openapi::api::core::v1::{PodSpec, Toleration};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn pod(tolerations: Vec<Toleration>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                tolerations: Some(tolerations),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn tolerate(key: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(NO_EXECUTE.into()),
            toleration_seconds: seconds,
            ..Toleration::default()
        }
    }

    fn added(t: &Taint) -> Timestamp {
        t.time_added.as_ref().map(|t| t.0).unwrap()
    }

    #[test]
    fn not_tolerated_goes_at_once() {
        let t = taint(UNREACHABLE, NO_EXECUTE, Some(Time(at(0))));
        let p = pod(vec![tolerate(NOT_READY, None)]);
        assert_eq!(eviction_time(&p, &[&t], added, at(5)), Eviction::At(at(5)));
    }

    #[test]
    fn toleration_seconds_count_from_time_added() {
        let t = taint(UNREACHABLE, NO_EXECUTE, Some(Time(at(100))));
        let p = pod(vec![tolerate(UNREACHABLE, Some(300))]);
        assert_eq!(
            eviction_time(&p, &[&t], added, at(150)),
            Eviction::At(at(400))
        );
        let zero = pod(vec![tolerate(UNREACHABLE, Some(0))]);
        assert_eq!(
            eviction_time(&zero, &[&t], added, at(150)),
            Eviction::At(at(150))
        );
        let huge = pod(vec![tolerate(UNREACHABLE, Some(i64::MAX))]);
        assert_eq!(eviction_time(&huge, &[&t], added, at(150)), Eviction::Never);
    }

    #[test]
    fn tolerated_forever_stays_and_the_earliest_deadline_wins() {
        let unreachable = taint(UNREACHABLE, NO_EXECUTE, Some(Time(at(0))));
        let custom = taint("example.com/drain", NO_EXECUTE, Some(Time(at(50))));
        let forever = pod(vec![tolerate(UNREACHABLE, None)]);
        assert_eq!(
            eviction_time(&forever, &[&unreachable], added, at(9)),
            Eviction::Never
        );
        let both = pod(vec![
            tolerate(UNREACHABLE, Some(300)),
            tolerate("example.com/drain", Some(60)),
        ]);
        assert_eq!(
            eviction_time(&both, &[&unreachable, &custom], added, at(9)),
            Eviction::At(at(110))
        );
        // NoSchedule taints never evict.
        let soft = taint(UNREACHABLE, NO_SCHEDULE, None);
        assert_eq!(
            eviction_time(&pod(vec![]), &[&soft], added, at(9)),
            Eviction::Never
        );
    }
}
