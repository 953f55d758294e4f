//! Helpers shared by several plugins (Kubernetes' `framework/plugins/helper`): the Skip
//! status and score normalization.
//!
//! Taint/toleration matching, which TaintToleration, NodeUnschedulable and PodTopologySpread
//! (`nodeTaintsPolicy: Honor`) share with the DaemonSet and node lifecycle controllers and
//! the kubelet, is `skerry_api::pod::taints`.

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
}
