//! Taints and tolerations: whether a pod tolerates a node's taints (Kubernetes'
//! `Toleration.ToleratesTaint` in `k8s.io/api/core/v1/toleration.go`, and
//! `TolerationsTolerateTaint` / `FindMatchingUntoleratedTaint` in
//! `k8s.io/component-helpers/scheduling/corev1/helpers.go`), the three effects, and the taint
//! keys Kubernetes itself puts on nodes (`k8s.io/api/core/v1/well_known_taints.go`).
//!
//! The scheduler's TaintToleration, NodeUnschedulable and PodTopologySpread plugins, the
//! DaemonSet controller's placement, the node lifecycle controller's `NoExecute` evictions and
//! the kubelet's admission all ask these same questions; the answers must not drift apart.

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};

/// `NoSchedule`: new pods that do not tolerate the taint are not placed on the node; running
/// ones stay.
pub const TAINT_EFFECT_NO_SCHEDULE: &str = "NoSchedule";
/// `PreferNoSchedule`: a soft `NoSchedule`; it only lowers the node's TaintToleration score.
pub const TAINT_EFFECT_PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
/// `NoExecute`: like `NoSchedule`, and running pods that do not tolerate it are evicted (by
/// the node lifecycle controller, after their `tolerationSeconds`).
pub const TAINT_EFFECT_NO_EXECUTE: &str = "NoExecute";

/// Toleration operator `Exists`: matches any value of the key (an empty key: any key).
pub const TOLERATION_OP_EXISTS: &str = "Exists";
/// Toleration operator `Equal`: the values must be equal. An empty operator means this.
pub const TOLERATION_OP_EQUAL: &str = "Equal";

/// `node.kubernetes.io/not-ready`: the node's `Ready` condition is `False`.
pub const TAINT_NODE_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// `node.kubernetes.io/unreachable`: the node's `Ready` condition is `Unknown` (nothing
/// heard from its kubelet).
pub const TAINT_NODE_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// `node.kubernetes.io/unschedulable`: `spec.unschedulable` (`kubectl cordon`).
pub const TAINT_NODE_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// `node.kubernetes.io/memory-pressure`: the `MemoryPressure` condition is `True`.
pub const TAINT_NODE_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
/// `node.kubernetes.io/disk-pressure`: the `DiskPressure` condition is `True`.
pub const TAINT_NODE_DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
/// `node.kubernetes.io/network-unavailable`: the `NetworkUnavailable` condition is `True`.
pub const TAINT_NODE_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";
/// `node.kubernetes.io/pid-pressure`: the `PIDPressure` condition is `True`.
pub const TAINT_NODE_PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";

/// Whether `toleration` tolerates `taint` (`Toleration.ToleratesTaint`, API 1.32): an empty
/// effect matches every effect, an empty key (only meaningful with `Exists`) every key; the
/// operator is `Equal` (also when empty: the values must be equal, absent reading as "") or
/// `Exists`; any other operator tolerates nothing.
pub fn tolerates_taint(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | TOLERATION_OP_EQUAL => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        TOLERATION_OP_EXISTS => true,
        _ => false,
    }
}

/// Whether any of `tolerations` tolerates `taint` (`TolerationsTolerateTaint`).
pub fn tolerations_tolerate_taint(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates_taint(t, taint))
}

/// The first of `tolerations` that tolerates `taint`: the one whose `tolerationSeconds`
/// count, as `v1helper.GetMatchingTolerations` picks it for taint-based eviction.
pub fn matching_toleration<'a>(
    tolerations: &'a [Toleration],
    taint: &Taint,
) -> Option<&'a Toleration> {
    tolerations.iter().find(|t| tolerates_taint(t, taint))
}

/// The first taint, in the node's order, that `inclusion` keeps and none of `tolerations`
/// tolerates (`FindMatchingUntoleratedTaint`); `None` when the pod tolerates them all.
pub fn find_matching_untolerated_taint<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    inclusion: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|taint| inclusion(taint) && !tolerations_tolerate_taint(tolerations, taint))
}

/// Whether the taint keeps pods that do not tolerate it off the node: `NoSchedule` or
/// `NoExecute` (the scheduler's `DoNotScheduleTaintsFilterFunc`, and the DaemonSet
/// controller's placement filter).
pub fn is_do_not_schedule_taint(taint: &Taint) -> bool {
    taint.effect == TAINT_EFFECT_NO_SCHEDULE || taint.effect == TAINT_EFFECT_NO_EXECUTE
}

/// Whether the taint evicts running pods that do not tolerate it (`NoExecute`).
pub fn is_no_execute_taint(taint: &Taint) -> bool {
    taint.effect == TAINT_EFFECT_NO_EXECUTE
}

/// The node's taints (empty when it has none).
pub fn taints_of(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// The pod's tolerations (empty when it has none).
pub fn tolerations_of(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: (!value.is_empty()).then(|| value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn toleration(key: &str, op: &str, value: &str, effect: &str) -> Toleration {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Toleration {
            key: opt(key),
            operator: opt(op),
            value: opt(value),
            effect: opt(effect),
            toleration_seconds: None,
        }
    }

    // Reference: Kubernetes core/v1 toleration_test.go, TestTolerationToleratesTaint.
    #[test]
    fn toleration_rules() {
        let t = taint("foo", "bar", TAINT_EFFECT_NO_SCHEDULE);
        let cases = [
            // Same key, value and effect.
            (toleration("foo", "Equal", "bar", "NoSchedule"), true),
            // An empty operator is Equal; an empty effect matches every effect.
            (toleration("foo", "", "bar", ""), true),
            (toleration("foo", "Exists", "", ""), true),
            // An empty key with Exists tolerates every taint.
            (toleration("", "Exists", "", ""), true),
            (toleration("foo", "Equal", "baz", ""), false),
            (toleration("foo", "Exists", "", "NoExecute"), false),
            (toleration("other", "Exists", "", ""), false),
            // An unknown operator tolerates nothing.
            (toleration("foo", "Bogus", "bar", ""), false),
            // Equal with no value does not tolerate a taint with one.
            (toleration("foo", "Equal", "", ""), false),
        ];
        for (toleration, expected) in cases {
            assert_eq!(tolerates_taint(&toleration, &t), expected, "{toleration:?}");
        }
        // A taint without a value is tolerated by Equal without one.
        let bare = taint("foo", "", TAINT_EFFECT_NO_EXECUTE);
        assert!(tolerates_taint(&toleration("foo", "Equal", "", ""), &bare));
        assert!(!tolerates_taint(&toleration("foo", "", "x", ""), &bare));
        assert!(!tolerations_tolerate_taint(&[], &bare));
    }

    // Reference: component-helpers scheduling/corev1 helpers_test.go,
    // TestFindMatchingUntoleratedTaint: the first untolerated taint in the node's order,
    // among those the filter keeps.
    #[test]
    fn first_untolerated_taint_in_node_order() {
        let taints = vec![
            taint("soft", "", TAINT_EFFECT_PREFER_NO_SCHEDULE),
            taint("a", "1", TAINT_EFFECT_NO_SCHEDULE),
            taint("b", "2", TAINT_EFFECT_NO_EXECUTE),
        ];
        let found = find_matching_untolerated_taint(&taints, &[], is_do_not_schedule_taint);
        assert_eq!(found.map(|t| t.key.as_str()), Some("a"));
        let tolerations = vec![toleration("a", "Exists", "", "")];
        let found =
            find_matching_untolerated_taint(&taints, &tolerations, is_do_not_schedule_taint);
        assert_eq!(found.map(|t| t.key.as_str()), Some("b"));
        let found = find_matching_untolerated_taint(&taints, &tolerations, is_no_execute_taint);
        assert_eq!(found.map(|t| t.key.as_str()), Some("b"));
        let everything = vec![toleration("", "Exists", "", "")];
        assert!(find_matching_untolerated_taint(&taints, &everything, |_| true).is_none());
    }

    #[test]
    fn the_first_matching_toleration_is_the_one_that_counts() {
        let t = taint(TAINT_NODE_UNREACHABLE, "", TAINT_EFFECT_NO_EXECUTE);
        let mut short = toleration(TAINT_NODE_UNREACHABLE, "Exists", "", "NoExecute");
        short.toleration_seconds = Some(30);
        let forever = toleration("", "Exists", "", "");
        let tolerations = vec![toleration("other", "Exists", "", ""), short, forever];
        assert_eq!(
            matching_toleration(&tolerations, &t).and_then(|t| t.toleration_seconds),
            Some(30)
        );
    }
}
