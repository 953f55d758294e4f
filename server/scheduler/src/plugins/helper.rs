//! Helpers shared by several plugins (Kubernetes' `framework/plugins/helper` and the taint
//! helpers of `k8s.io/component-helpers/scheduling/corev1`): score normalization and
//! taint/toleration matching.
//!
//! PodTopologySpread (`nodeTaintsPolicy: Honor`) and NodeUnschedulable match tolerations
//! with the same rules as TaintToleration, so the rules live here once.

use k8s_openapi::api::core::v1::{Taint, Toleration};

use crate::framework::{Code, NodeScore, Status};

/// A `Skip` status from `plugin` with no reasons: "nothing to do for this pod", so the
/// framework skips the plugin's Filter (after PreFilter) or Score (after PreScore).
pub fn skip(plugin: &'static str) -> Status {
    Status {
        code: Code::Skip,
        reasons: Vec::new(),
        plugin,
    }
}

/// `NoSchedule`: new pods that do not tolerate the taint are not placed on the node.
pub const TAINT_EFFECT_NO_SCHEDULE: &str = "NoSchedule";
/// `PreferNoSchedule`: a soft `NoSchedule`, only lowers the node's TaintToleration score.
pub const TAINT_EFFECT_PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
/// `NoExecute`: like `NoSchedule`, and running pods are evicted (by the node lifecycle
/// controller); the scheduler treats it as `NoSchedule`.
pub const TAINT_EFFECT_NO_EXECUTE: &str = "NoExecute";

/// Toleration operator `Exists`: matches any value of the key.
const TOLERATION_OP_EXISTS: &str = "Exists";
/// Toleration operator `Equal` (also the meaning of an empty operator).
const TOLERATION_OP_EQUAL: &str = "Equal";

/// Scales `scores` so the highest becomes `max_priority` (Kubernetes'
/// `helper.DefaultNormalizeScore`); with `reverse`, a high raw score becomes a low final
/// score (used for "count of bad things" scores such as intolerable taints). All-zero raw
/// scores stay 0, or become `max_priority` when reversed.
pub fn default_normalize_score(max_priority: i64, reverse: bool, scores: &mut [NodeScore]) {
    let max_count = scores.iter().map(|s| s.score).max().unwrap_or(0).max(0);
    if max_count == 0 {
        if reverse {
            for score in scores.iter_mut() {
                score.score = max_priority;
            }
        }
        return;
    }
    for score in scores.iter_mut() {
        let mut value = max_priority * score.score / max_count;
        if reverse {
            value = max_priority - value;
        }
        score.score = value;
    }
}

/// Whether `toleration` tolerates `taint` (Kubernetes' `Toleration.ToleratesTaint`): an
/// empty effect matches every effect, an empty key (with `Exists`) matches every key, an
/// empty operator means `Equal`.
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

/// Whether any of `tolerations` tolerates `taint`.
pub fn tolerations_tolerate_taint(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates_taint(t, taint))
}

/// Whether the taint's effect keeps untolerating pods off the node (`NoSchedule` or
/// `NoExecute`; Kubernetes' `DoNotScheduleTaintsFilterFunc`).
pub fn is_do_not_schedule_taint(taint: &Taint) -> bool {
    taint.effect == TAINT_EFFECT_NO_SCHEDULE || taint.effect == TAINT_EFFECT_NO_EXECUTE
}

/// The first taint (in the node's order) that passes `filter` and is not tolerated
/// (Kubernetes' `FindMatchingUntoleratedTaint`).
pub fn find_matching_untolerated_taint<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    filter: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|taint| filter(taint) && !tolerations_tolerate_taint(tolerations, taint))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scores(values: &[i64]) -> Vec<NodeScore> {
        values
            .iter()
            .enumerate()
            .map(|(i, &score)| NodeScore {
                name: format!("node{i}"),
                score,
            })
            .collect()
    }

    fn values(scores: &[NodeScore]) -> Vec<i64> {
        scores.iter().map(|s| s.score).collect()
    }

    // Reference: Kubernetes helper/normalize_score_test.go.
    #[test]
    fn normalize_scales_to_max() {
        let mut s = scores(&[10, 20, 30, 40]);
        default_normalize_score(100, false, &mut s);
        assert_eq!(values(&s), vec![25, 50, 75, 100]);
        let mut s = scores(&[10, 20, 30, 40]);
        default_normalize_score(100, true, &mut s);
        assert_eq!(values(&s), vec![75, 50, 25, 0]);
        let mut s = scores(&[1000, 10, 20, 30]);
        default_normalize_score(100, false, &mut s);
        assert_eq!(values(&s), vec![100, 1, 2, 3]);
    }

    #[test]
    fn normalize_all_zero() {
        let mut s = scores(&[0, 0, 0]);
        default_normalize_score(100, false, &mut s);
        assert_eq!(values(&s), vec![0, 0, 0]);
        default_normalize_score(100, true, &mut s);
        assert_eq!(values(&s), vec![100, 100, 100]);
    }

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

    // Reference: Kubernetes core/v1 toleration_test.go (TestTolerationToleratesTaint).
    #[test]
    fn toleration_rules() {
        let t = taint("foo", "bar", TAINT_EFFECT_NO_SCHEDULE);
        assert!(tolerates_taint(
            &toleration("foo", "Equal", "bar", "NoSchedule"),
            &t
        ));
        assert!(tolerates_taint(&toleration("foo", "", "bar", ""), &t));
        assert!(tolerates_taint(&toleration("foo", "Exists", "", ""), &t));
        assert!(tolerates_taint(&toleration("", "Exists", "", ""), &t));
        assert!(!tolerates_taint(&toleration("foo", "Equal", "baz", ""), &t));
        assert!(!tolerates_taint(
            &toleration("foo", "Exists", "", "NoExecute"),
            &t
        ));
        assert!(!tolerates_taint(&toleration("other", "Exists", "", ""), &t));
        assert!(!tolerates_taint(&toleration("foo", "Bogus", "bar", ""), &t));
    }

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
    }
}
