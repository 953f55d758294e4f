//! NodeAffinity (Kubernetes' `plugins/nodeaffinity`): `spec.nodeSelector` and
//! `requiredDuringSchedulingIgnoredDuringExecution` node affinity as a filter, the
//! `preferredDuringScheduling...` terms' weights as a score.
//!
//! The pod's selectors are parsed once per cycle in PreFilter ([`RequiredNodeAffinity`]), so
//! Filter on each of thousands of nodes only compares labels. PreFilter also narrows the
//! candidate nodes when every required term pins `metadata.name` with `In` (Kubernetes'
//! `PreFilterResult`): the scheduler reads that set with [`pre_filter_node_names`] and only
//! walks those nodes. Filter checks `matchFields` anyway, so narrowing is an optimization,
//! never needed for correctness.
//!
//! The matching rules are component-helpers' `nodeaffinity`, in
//! [`skerry_api::pod::nodeaffinity`], shared with the DaemonSet controller and the kubelet's
//! admission: terms ORed, `matchExpressions` and `matchFields` ANDed within a term, an empty
//! term matching nothing, a term that does not parse matching nothing while the others still
//! count. A preferred term that does not parse fails the pod's scoring with an `Error`, as in
//! Kubernetes.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
pub use skerry_api::pod::nodeaffinity::{
    OBJECT_NAME_FIELD, PreferredSchedulingTerms, RequiredNodeAffinity,
};

use super::NODE_AFFINITY_WEIGHT;
use super::helper::{default_normalize_score, skip};
use crate::framework::{
    Code, CycleState, FilterPlugin, MAX_NODE_SCORE, NodeInfo, NodeScore, Plugin, PodInfo,
    PreFilterPlugin, PreScorePlugin, ScorePlugin, Snapshot, Status,
};

/// The plugin's name.
pub const NAME: &str = "NodeAffinity";

/// Kubernetes' `ErrReasonPod`, shown by `kubectl describe pod`.
pub const ERR_REASON_POD: &str = "node(s) didn't match Pod's node affinity/selector";

/// Kubernetes' `errReasonConflict`: every required term pins `metadata.name` and the pinned
/// sets do not intersect.
pub const ERR_REASON_CONFLICT: &str = "pod affinity terms conflict";

/// CycleState key of the PreFilter result.
const PRE_FILTER_STATE_KEY: &str = "PreFilterNodeAffinity";
/// CycleState key of the node names PreFilter narrowed the pod to.
const PRE_FILTER_NODE_NAMES_KEY: &str = "PreFilterNodeAffinityNodeNames";
/// CycleState key of the PreScore result.
const PRE_SCORE_STATE_KEY: &str = "PreScoreNodeAffinity";

/// The NodeAffinity filter and score.
#[derive(Clone, Copy, Debug)]
pub struct NodeAffinity {
    /// The score's weight in the profile.
    pub weight: i64,
}

impl Default for NodeAffinity {
    fn default() -> Self {
        NodeAffinity {
            weight: NODE_AFFINITY_WEIGHT,
        }
    }
}

/// The node names PreFilter narrowed the pod to, if it did (every required term pins
/// `metadata.name` with `In`): the scheduler need only run Filter on these nodes
/// (Kubernetes' `PreFilterResult.NodeNames`).
pub fn pre_filter_node_names(state: &CycleState) -> Option<&BTreeSet<String>> {
    state.read::<BTreeSet<String>>(PRE_FILTER_NODE_NAMES_KEY)
}

/// The node names the required terms pin: `None` if any term leaves the name open (terms
/// are ORed), else the union over terms of the intersection of each term's `metadata.name
/// In` values.
fn pinned_node_names(pod: &Pod) -> Option<BTreeSet<String>> {
    let terms = &pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    if terms.is_empty() {
        return None;
    }
    let mut union = BTreeSet::new();
    for term in terms {
        let mut term_names: Option<BTreeSet<String>> = None;
        for requirement in term.match_fields.iter().flatten() {
            if requirement.key == OBJECT_NAME_FIELD && requirement.operator == "In" {
                let values: BTreeSet<String> =
                    requirement.values.iter().flatten().cloned().collect();
                term_names = Some(match term_names {
                    None => values,
                    Some(names) => names.intersection(&values).cloned().collect(),
                });
            }
        }
        // A term without a name pin admits every node.
        union.extend(term_names?);
    }
    Some(union)
}

impl Plugin for NodeAffinity {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for NodeAffinity {
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, _snapshot: &Snapshot) -> Status {
        let required = RequiredNodeAffinity::from_pod(&pod.pod);
        if required.is_empty() {
            return skip(NAME);
        }
        state.write(PRE_FILTER_STATE_KEY, required);
        if let Some(names) = pinned_node_names(&pod.pod) {
            if names.is_empty() {
                return Status::new(
                    Code::UnschedulableAndUnresolvable,
                    NAME,
                    ERR_REASON_CONFLICT,
                );
            }
            state.write(PRE_FILTER_NODE_NAMES_KEY, names);
        }
        Status::success()
    }
}

impl FilterPlugin for NodeAffinity {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(node_object) = node.node.as_ref() else {
            return Status::new(Code::Error, NAME, "node not found");
        };
        let matches = match state.read::<RequiredNodeAffinity>(PRE_FILTER_STATE_KEY) {
            Some(required) => required.matches(node_object),
            // PreFilter did not run (or skipped): parse here.
            None => RequiredNodeAffinity::from_pod(&pod.pod).matches(node_object),
        };
        if matches {
            Status::success()
        } else {
            // Unresolvable: evicting pods does not change the node's labels.
            Status::new(Code::UnschedulableAndUnresolvable, NAME, ERR_REASON_POD)
        }
    }
}

impl PreScorePlugin for NodeAffinity {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
        _snapshot: &Snapshot,
    ) -> Status {
        if nodes.is_empty() {
            return Status::success();
        }
        match PreferredSchedulingTerms::from_pod(&pod.pod) {
            None => skip(NAME),
            Some(Ok(preferred)) => {
                state.write(PRE_SCORE_STATE_KEY, preferred);
                Status::success()
            }
            Some(Err(e)) => Status::new(Code::Error, NAME, e),
        }
    }
}

impl ScorePlugin for NodeAffinity {
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let Some(node_object) = node.node.as_ref() else {
            return Err(Status::new(Code::Error, NAME, "node not found"));
        };
        match state.read::<PreferredSchedulingTerms>(PRE_SCORE_STATE_KEY) {
            Some(preferred) => Ok(preferred.score(node_object)),
            // PreScore did not run (e.g. a dry run): parse here.
            None => match PreferredSchedulingTerms::from_pod(&pod.pod) {
                None => Ok(0),
                Some(Ok(preferred)) => Ok(preferred.score(node_object)),
                Some(Err(e)) => Err(Status::new(Code::Error, NAME, e)),
            },
        }
    }

    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [NodeScore]) -> Status {
        default_normalize_score(MAX_NODE_SCORE, false, scores);
        Status::success()
    }

    fn weight(&self) -> i64 {
        self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{expected_scores, node_info, pod_info, score_nodes, snapshot};
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value) -> NodeInfo {
        node_info(json!({"metadata": {"name": name, "labels": labels}}), &[])
    }

    fn pod(spec: Value) -> PodInfo {
        let mut spec = spec;
        spec["containers"] = json!([]);
        pod_info(json!({"metadata": {"name": "p"}, "spec": spec}))
    }

    fn required(terms: Value) -> Value {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}})
    }

    /// PreFilter then Filter, as the framework runs them.
    fn run(pod: &PodInfo, node: &NodeInfo) -> Status {
        let mut state = CycleState::default();
        let pre = NodeAffinity::default().pre_filter(&mut state, pod, &snapshot(vec![]));
        if pre.is_skip() {
            return Status::success();
        }
        if !pre.is_success() {
            return pre;
        }
        NodeAffinity::default().filter(&state, pod, node)
    }

    // Reference: Kubernetes nodeaffinity/node_affinity_test.go TestNodeAffinity.
    #[test]
    fn node_selector() {
        let foo_bar = node("n", json!({"foo": "bar"}));
        let status = run(&pod(json!({"nodeSelector": {"foo": "bar"}})), &foo_bar);
        assert!(status.is_success());
        let status = run(&pod(json!({"nodeSelector": {"foo": "baz"}})), &foo_bar);
        assert_eq!(status.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(status.reasons, vec![ERR_REASON_POD.to_string()]);
        // No selector at all: PreFilter skips.
        let mut state = CycleState::default();
        assert!(
            NodeAffinity::default()
                .pre_filter(&mut state, &pod(json!({})), &snapshot(vec![]))
                .is_skip()
        );
    }

    #[test]
    fn required_terms_operators() {
        let n = node(
            "n",
            json!({"foo": "bar", "kernel-version": "0206", "gpu": "2"}),
        );
        let ok = |terms: Value| run(&pod(required(terms)), &n).is_success();
        assert!(ok(
            json!([{"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar", "value2"]}]}])
        ));
        assert!(!ok(
            json!([{"matchExpressions": [{"key": "foo", "operator": "In", "values": ["baz"]}]}])
        ));
        assert!(ok(
            json!([{"matchExpressions": [{"key": "foo", "operator": "NotIn", "values": ["baz"]}]}])
        ));
        assert!(ok(
            json!([{"matchExpressions": [{"key": "missing", "operator": "NotIn", "values": ["x"]}]}])
        ));
        assert!(ok(
            json!([{"matchExpressions": [{"key": "foo", "operator": "Exists"}]}])
        ));
        assert!(ok(
            json!([{"matchExpressions": [{"key": "bar", "operator": "DoesNotExist"}]}])
        ));
        // Gt/Lt compare integers: "0206" parses as 206.
        assert!(ok(
            json!([{"matchExpressions": [{"key": "kernel-version", "operator": "Gt", "values": ["0204"]}]}])
        ));
        assert!(!ok(
            json!([{"matchExpressions": [{"key": "gpu", "operator": "Lt", "values": ["2"]}]}])
        ));
        // A term that does not parse matches nothing, but an ORed valid term still counts.
        assert!(!ok(
            json!([{"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["two"]}]}])
        ));
        assert!(ok(json!([
            {"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["two"]}]},
            {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}])));
        // Expressions within a term are ANDed.
        assert!(!ok(json!([{"matchExpressions": [
            {"key": "foo", "operator": "Exists"}, {"key": "bar", "operator": "Exists"}]}])));
        // An empty term matches nothing; an empty term list too.
        assert!(!ok(json!([{}])));
        assert!(!ok(json!([{"matchExpressions": []}])));
        assert!(!ok(json!([])));
    }

    #[test]
    fn node_selector_and_affinity_are_anded() {
        let n = node("n", json!({"foo": "bar"}));
        let mut spec =
            required(json!([{"matchExpressions": [{"key": "foo", "operator": "Exists"}]}]));
        spec["nodeSelector"] = json!({"foo": "other"});
        assert!(!run(&pod(spec), &n).is_success());
    }

    #[test]
    fn match_fields_metadata_name_and_pre_filter_narrowing() {
        let n1 = node("node1", json!({}));
        let n2 = node("node2", json!({}));
        let p = pod(required(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node1"]}]}])));
        assert!(run(&p, &n1).is_success());
        assert!(!run(&p, &n2).is_success());

        let mut state = CycleState::default();
        assert!(
            NodeAffinity::default()
                .pre_filter(&mut state, &p, &snapshot(vec![]))
                .is_success()
        );
        let names: Vec<&str> = pre_filter_node_names(&state)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        assert_eq!(names, vec!["node1"]);

        // Two terms pinning names: the union.
        let p = pod(required(json!([
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node1"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node2"]}]}])));
        let mut state = CycleState::default();
        assert!(
            NodeAffinity::default()
                .pre_filter(&mut state, &p, &snapshot(vec![]))
                .is_success()
        );
        assert_eq!(pre_filter_node_names(&state).map(BTreeSet::len), Some(2));

        // A term without a pin: no narrowing.
        let p = pod(required(json!([
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node1"]}]},
            {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}])));
        let mut state = CycleState::default();
        assert!(
            NodeAffinity::default()
                .pre_filter(&mut state, &p, &snapshot(vec![]))
                .is_success()
        );
        assert!(pre_filter_node_names(&state).is_none());

        // Conflicting pins within a term: unresolvable at PreFilter.
        let p = pod(required(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node1"]},
            {"key": "metadata.name", "operator": "In", "values": ["node2"]}]}])));
        let mut state = CycleState::default();
        let status = NodeAffinity::default().pre_filter(&mut state, &p, &snapshot(vec![]));
        assert_eq!(status.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(status.reasons, vec![ERR_REASON_CONFLICT.to_string()]);

        // NotIn on the name excludes that node; field In needs exactly one value.
        let p = pod(required(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["node1"]}]}])));
        assert!(!run(&p, &n1).is_success());
        assert!(run(&p, &n2).is_success());
    }

    // Reference: Kubernetes TestNodeAffinityPriority "only node1 matches / all match with
    // different weights": weights summed, then normalized to the best node.
    #[test]
    fn score_sums_preferred_weights_normalized() {
        let p = pod(
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 2, "preference": {"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar"]}]}},
                {"weight": 4, "preference": {"matchExpressions": [{"key": "key", "operator": "In", "values": ["value"]}]}},
                {"weight": 5, "preference": {"matchExpressions": [
                    {"key": "foo", "operator": "In", "values": ["bar"]},
                    {"key": "key", "operator": "In", "values": ["value"]},
                    {"key": "az", "operator": "In", "values": ["az1"]}]}},
                {"weight": 0, "preference": {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}}
            ]}}}),
        );
        let nodes = vec![
            node("node1", json!({"foo": "bar"})),
            node("node5", json!({"foo": "bar", "key": "value", "az": "az1"})),
            node("node2", json!({"key": "value"})),
        ];
        let scores = score_nodes(&NodeAffinity::default(), &p, nodes);
        // Raw: node1 2, node5 11, node2 4 → ×100/11.
        assert_eq!(
            scores,
            expected_scores(&[("node1", 18), ("node5", 100), ("node2", 36)])
        );
    }

    // Kubernetes' PreScore returns `NewPreferredSchedulingTerms`' error (`framework.AsStatus`);
    // this plugin's own parser used to drop the term that did not parse and score the rest.
    #[test]
    fn a_preferred_term_that_does_not_parse_is_an_error() {
        let p = pod(
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 2, "preference": {"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar"]}]}},
                {"weight": 4, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Gt", "values": ["two"]}]}}
            ]}}}),
        );
        let nodes = vec![Arc::new(node("n", json!({"foo": "bar"})))];
        let mut state = CycleState::default();
        let status = NodeAffinity::default().pre_score(&mut state, &p, &nodes, &snapshot(vec![]));
        assert_eq!(status.code, Code::Error);
        assert_eq!(
            status.reasons,
            vec![
                "[1].matchExpressions[0].values[0]: Invalid value: \"two\": for 'Gt', 'Lt' operators, the value must be an integer"
                    .to_string()
            ]
        );
        // Score without PreScore says the same.
        let error = NodeAffinity::default()
            .score(&CycleState::default(), &p, &nodes[0])
            .expect_err("does not parse");
        assert_eq!(error.code, Code::Error);
    }

    #[test]
    fn pre_score_skips_pods_without_preferences() {
        let mut state = CycleState::default();
        let nodes = vec![Arc::new(node("n", json!({})))];
        let status = NodeAffinity::default().pre_score(
            &mut state,
            &pod(json!({})),
            &nodes,
            &snapshot(vec![]),
        );
        assert!(status.is_skip());
    }
}
