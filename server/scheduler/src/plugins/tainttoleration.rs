//! TaintToleration (Kubernetes' `plugins/tainttoleration`): a node's `NoSchedule` and
//! `NoExecute` taints keep off every pod that does not tolerate them (Filter), and its
//! `PreferNoSchedule` taints make the node less attractive, one step per taint the pod does
//! not tolerate (Score, reverse-normalized so the fewest intolerable taints scores highest).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Toleration};

use skerry_api::pod::taints::{
    TAINT_EFFECT_PREFER_NO_SCHEDULE, find_matching_untolerated_taint, is_do_not_schedule_taint,
    taints_of, tolerations_of, tolerations_tolerate_taint,
};

use super::TAINT_TOLERATION_WEIGHT;
use super::helper::default_normalize_score;
use crate::framework::{
    Code, CycleState, FilterPlugin, MAX_NODE_SCORE, NodeInfo, NodeScore, Plugin, PodInfo,
    PreScorePlugin, ScorePlugin, Snapshot, Status,
};

/// The plugin's name.
pub const NAME: &str = "TaintToleration";

/// CycleState key of the PreScore result.
const PRE_SCORE_STATE_KEY: &str = "PreScoreTaintToleration";

/// The TaintToleration filter and score.
#[derive(Clone, Copy, Debug)]
pub struct TaintToleration {
    /// The score's weight in the profile.
    pub weight: i64,
}

impl Default for TaintToleration {
    fn default() -> Self {
        TaintToleration {
            weight: TAINT_TOLERATION_WEIGHT,
        }
    }
}

/// The pod's tolerations that can tolerate a `PreferNoSchedule` taint (effect empty or
/// `PreferNoSchedule`), computed once per cycle.
#[derive(Clone, Debug, Default)]
struct PreScoreState {
    tolerations_prefer_no_schedule: Vec<Toleration>,
}

fn tolerations_prefer_no_schedule(pod: &Pod) -> Vec<Toleration> {
    tolerations_of(pod)
        .iter()
        .filter(|t| {
            let effect = t.effect.as_deref().unwrap_or_default();
            effect.is_empty() || effect == TAINT_EFFECT_PREFER_NO_SCHEDULE
        })
        .cloned()
        .collect()
}

/// The node's `PreferNoSchedule` taints that none of `tolerations` tolerates.
fn count_intolerable_taints_prefer_no_schedule(node: &NodeInfo, tolerations: &[Toleration]) -> i64 {
    let taints = node.node.as_deref().map(taints_of).unwrap_or_default();
    let count = taints
        .iter()
        .filter(|taint| {
            taint.effect == TAINT_EFFECT_PREFER_NO_SCHEDULE
                && !tolerations_tolerate_taint(tolerations, taint)
        })
        .count();
    i64::try_from(count).unwrap_or(i64::MAX)
}

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for TaintToleration {
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(node_object) = node.node.as_ref() else {
            return Status::new(Code::Error, NAME, "invalid nodeInfo");
        };
        match find_matching_untolerated_taint(
            taints_of(node_object),
            tolerations_of(&pod.pod),
            is_do_not_schedule_taint,
        ) {
            None => Status::success(),
            // Unresolvable: evicting pods does not remove the node's taints.
            Some(taint) => Status::new(
                Code::UnschedulableAndUnresolvable,
                NAME,
                format!(
                    "node(s) had untolerated taint {{{}: {}}}",
                    taint.key,
                    taint.value.as_deref().unwrap_or_default()
                ),
            ),
        }
    }
}

impl PreScorePlugin for TaintToleration {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        state.write(
            PRE_SCORE_STATE_KEY,
            PreScoreState {
                tolerations_prefer_no_schedule: tolerations_prefer_no_schedule(&pod.pod),
            },
        );
        Status::success()
    }
}

impl ScorePlugin for TaintToleration {
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        if node.node.is_none() {
            return Err(Status::new(Code::Error, NAME, "node not found"));
        }
        let count = match state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) {
            Some(s) => {
                count_intolerable_taints_prefer_no_schedule(node, &s.tolerations_prefer_no_schedule)
            }
            // PreScore did not run (e.g. a dry run): compute here.
            None => count_intolerable_taints_prefer_no_schedule(
                node,
                &tolerations_prefer_no_schedule(&pod.pod),
            ),
        };
        Ok(count)
    }

    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [NodeScore]) -> Status {
        // More intolerable PreferNoSchedule taints → lower score.
        default_normalize_score(MAX_NODE_SCORE, true, scores);
        Status::success()
    }

    fn weight(&self) -> i64 {
        self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{expected_scores, node_info, pod_info, score_nodes};
    use serde_json::{Value, json};

    fn node(name: &str, taints: Value) -> NodeInfo {
        node_info(
            json!({"metadata": {"name": name}, "spec": {"taints": taints}}),
            &[],
        )
    }

    fn pod(tolerations: Value) -> PodInfo {
        pod_info(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [], "tolerations": tolerations}}),
        )
    }

    // Reference: Kubernetes tainttoleration/taint_toleration_test.go TestTaintTolerationFilter.
    #[test]
    fn filter_reports_the_first_untolerated_taint() {
        let state = CycleState::default();
        let tainted = node(
            "n",
            json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]),
        );

        let status = TaintToleration::default().filter(&state, &pod(json!([])), &tainted);
        assert_eq!(status.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(
            status.reasons,
            vec!["node(s) had untolerated taint {dedicated: user1}".to_string()]
        );

        let tolerating =
            pod(json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]));
        assert!(
            TaintToleration::default()
                .filter(&state, &tolerating, &tainted)
                .is_success()
        );

        let wrong_value = pod(
            json!([{"key": "dedicated", "operator": "Equal", "value": "user2", "effect": "NoSchedule"}]),
        );
        assert!(
            !TaintToleration::default()
                .filter(&state, &wrong_value, &tainted)
                .is_success()
        );

        let exists =
            pod(json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]));
        assert!(
            TaintToleration::default()
                .filter(&state, &exists, &tainted)
                .is_success()
        );

        // PreferNoSchedule never filters.
        let soft = node(
            "n",
            json!([{"key": "dedicated", "value": "user1", "effect": "PreferNoSchedule"}]),
        );
        assert!(
            TaintToleration::default()
                .filter(&state, &pod(json!([])), &soft)
                .is_success()
        );

        // NoExecute does.
        let exec = node("n", json!([{"key": "k", "effect": "NoExecute"}]));
        let status = TaintToleration::default().filter(&state, &pod(json!([])), &exec);
        assert_eq!(
            status.reasons,
            vec!["node(s) had untolerated taint {k: }".to_string()]
        );
    }

    // Reference: Kubernetes TestTaintTolerationScore "the more intolerable taints a node
    // has, the lower score it gets".
    #[test]
    fn score_counts_intolerable_prefer_no_schedule_taints_reversed() {
        let incoming = pod(
            json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "PreferNoSchedule"}]),
        );
        let nodes = vec![
            node("nodeA", json!([])),
            node(
                "nodeB",
                json!([{"key": "cpu-type", "value": "arm64", "effect": "PreferNoSchedule"}]),
            ),
            node(
                "nodeC",
                json!([
                {"key": "cpu-type", "value": "arm64", "effect": "PreferNoSchedule"},
                {"key": "disk-type", "value": "ssd", "effect": "PreferNoSchedule"}]),
            ),
        ];
        let scores = score_nodes(&TaintToleration::default(), &incoming, nodes);
        assert_eq!(
            scores,
            expected_scores(&[("nodeA", 100), ("nodeB", 50), ("nodeC", 0)])
        );
    }

    // Reference: TestTaintTolerationScore "only taints and tolerations that have effect
    // PreferNoSchedule are checked".
    #[test]
    fn score_ignores_other_effects() {
        let incoming = pod(
            json!([{"key": "cpu-type", "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}]),
        );
        let nodes = vec![
            node("nodeA", json!([])),
            node(
                "nodeB",
                json!([{"key": "cpu-type", "value": "arm64", "effect": "NoSchedule"}]),
            ),
            node(
                "nodeC",
                json!([{"key": "cpu-type", "value": "arm64", "effect": "PreferNoSchedule"}]),
            ),
        ];
        let scores = score_nodes(&TaintToleration::default(), &incoming, nodes);
        assert_eq!(
            scores,
            expected_scores(&[("nodeA", 100), ("nodeB", 100), ("nodeC", 0)])
        );
    }
}
