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
//! Matching rules (Kubernetes' `component-helpers/scheduling/corev1/nodeaffinity`): terms
//! are ORed; within a term `matchExpressions` and `matchFields` are ANDed; an empty term
//! matches nothing; a term that does not parse (e.g. `Gt` with a non-integer) matches
//! nothing while the other terms still count; `matchFields` supports only `metadata.name`
//! with `In`/`NotIn` and exactly one value.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Pod};

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

/// The only field `matchFields` may select on (Kubernetes' `metav1.ObjectNameField`).
pub const OBJECT_NAME_FIELD: &str = "metadata.name";

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

/// One parsed `matchExpressions` requirement on node labels.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelRequirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
    Gt(String, i64),
    Lt(String, i64),
}

impl LabelRequirement {
    fn parse(requirement: &NodeSelectorRequirement) -> Option<LabelRequirement> {
        let key = requirement.key.clone();
        let values = requirement.values.as_deref().unwrap_or_default();
        let single_integer = || match values {
            [value] => value.parse::<i64>().ok(),
            _ => None,
        };
        Some(match requirement.operator.as_str() {
            "In" if !values.is_empty() => LabelRequirement::In(key, values.to_vec()),
            "NotIn" if !values.is_empty() => LabelRequirement::NotIn(key, values.to_vec()),
            "Exists" if values.is_empty() => LabelRequirement::Exists(key),
            "DoesNotExist" if values.is_empty() => LabelRequirement::DoesNotExist(key),
            "Gt" => LabelRequirement::Gt(key, single_integer()?),
            "Lt" => LabelRequirement::Lt(key, single_integer()?),
            _ => return None,
        })
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            LabelRequirement::In(key, values) => {
                labels.get(key).is_some_and(|v| values.contains(v))
            }
            LabelRequirement::NotIn(key, values) => {
                labels.get(key).is_none_or(|v| !values.contains(v))
            }
            LabelRequirement::Exists(key) => labels.contains_key(key),
            LabelRequirement::DoesNotExist(key) => !labels.contains_key(key),
            LabelRequirement::Gt(key, bound) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *bound),
            LabelRequirement::Lt(key, bound) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *bound),
        }
    }
}

/// One parsed `matchFields` requirement: `field == value` or `field != value`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldRequirement {
    field: String,
    value: String,
    equal: bool,
}

impl FieldRequirement {
    fn parse(requirement: &NodeSelectorRequirement) -> Option<FieldRequirement> {
        let [value] = requirement.values.as_deref().unwrap_or_default() else {
            return None;
        };
        let equal = match requirement.operator.as_str() {
            "In" => true,
            "NotIn" => false,
            _ => return None,
        };
        Some(FieldRequirement {
            field: requirement.key.clone(),
            value: value.clone(),
            equal,
        })
    }

    fn matches(&self, node_name: &str) -> bool {
        // Nodes expose only metadata.name as a field; any other field reads as "".
        let actual = if self.field == OBJECT_NAME_FIELD {
            node_name
        } else {
            ""
        };
        (actual == self.value) == self.equal
    }
}

/// A parsed `NodeSelectorTerm`; `None` parts mean "absent", a parse error makes the whole
/// term match nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ParsedTerm {
    /// `None` if the term is empty or did not parse: it matches no node.
    requirements: Option<(Vec<LabelRequirement>, Vec<FieldRequirement>)>,
}

impl ParsedTerm {
    fn parse(term: &NodeSelectorTerm) -> ParsedTerm {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if expressions.is_empty() && fields.is_empty() {
            return ParsedTerm { requirements: None };
        }
        let labels: Option<Vec<_>> = expressions.iter().map(LabelRequirement::parse).collect();
        let fields: Option<Vec<_>> = fields.iter().map(FieldRequirement::parse).collect();
        ParsedTerm {
            requirements: labels.zip(fields),
        }
    }

    fn matches(&self, labels: &BTreeMap<String, String>, node_name: &str) -> bool {
        let Some((label_requirements, field_requirements)) = &self.requirements else {
            return false;
        };
        label_requirements.iter().all(|r| r.matches(labels))
            && field_requirements.iter().all(|r| r.matches(node_name))
    }
}

fn node_labels(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// The pod's hard node constraints, parsed once: `spec.nodeSelector` AND any of the
/// required node affinity terms (Kubernetes' `nodeaffinity.RequiredNodeAffinity`).
/// PodTopologySpread's `nodeAffinityPolicy: Honor` uses it too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequiredNodeAffinity {
    /// `spec.nodeSelector` (every key must equal).
    node_selector: Option<BTreeMap<String, String>>,
    /// The required terms, ORed; `None` when the pod has no required node affinity.
    terms: Option<Vec<ParsedTerm>>,
}

impl RequiredNodeAffinity {
    /// Parses `pod`'s node selector and required node affinity.
    pub fn from_pod(pod: &Pod) -> RequiredNodeAffinity {
        let Some(spec) = pod.spec.as_ref() else {
            return RequiredNodeAffinity::default();
        };
        let node_selector = spec.node_selector.clone().filter(|s| !s.is_empty());
        let terms = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|na| {
                na.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|selector| {
                selector
                    .node_selector_terms
                    .iter()
                    .map(ParsedTerm::parse)
                    .collect()
            });
        RequiredNodeAffinity {
            node_selector,
            terms,
        }
    }

    /// Whether the pod has neither a node selector nor required node affinity (matches
    /// every node).
    pub fn is_empty(&self) -> bool {
        self.node_selector.is_none() && self.terms.is_none()
    }

    /// Whether `node` satisfies the pod's node selector and required node affinity.
    pub fn matches(&self, node: &Node) -> bool {
        let labels = node_labels(node);
        if let Some(selector) = &self.node_selector
            && !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        {
            return false;
        }
        match &self.terms {
            None => true,
            Some(terms) => terms.iter().any(|t| t.matches(labels, node_name(node))),
        }
    }
}

/// The pod's preferred terms, parsed once (Kubernetes' `PreferredSchedulingTerms`): terms
/// with weight 0 or no requirements are dropped.
#[derive(Clone, Debug, Default)]
struct PreferredSchedulingTerms {
    terms: Vec<(ParsedTerm, i64)>,
}

impl PreferredSchedulingTerms {
    fn from_pod(pod: &Pod) -> Option<PreferredSchedulingTerms> {
        let preferred = pod
            .spec
            .as_ref()?
            .affinity
            .as_ref()?
            .node_affinity
            .as_ref()?
            .preferred_during_scheduling_ignored_during_execution
            .as_ref()?;
        let terms = preferred
            .iter()
            .filter(|t| t.weight != 0)
            .map(|t| (ParsedTerm::parse(&t.preference), i64::from(t.weight)))
            .filter(|(t, _)| t.requirements.is_some())
            .collect();
        Some(PreferredSchedulingTerms { terms })
    }

    /// Sum of the weights of the terms `node` matches.
    fn score(&self, node: &Node) -> i64 {
        let labels = node_labels(node);
        self.terms
            .iter()
            .filter(|(t, _)| t.matches(labels, node_name(node)))
            .map(|(_, w)| w)
            .sum()
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
            Some(preferred) => {
                state.write(PRE_SCORE_STATE_KEY, preferred);
                Status::success()
            }
        }
    }
}

impl ScorePlugin for NodeAffinity {
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let Some(node_object) = node.node.as_ref() else {
            return Err(Status::new(Code::Error, NAME, "node not found"));
        };
        Ok(
            match state.read::<PreferredSchedulingTerms>(PRE_SCORE_STATE_KEY) {
                Some(preferred) => preferred.score(node_object),
                None => PreferredSchedulingTerms::from_pod(&pod.pod)
                    .map(|p| p.score(node_object))
                    .unwrap_or(0),
            },
        )
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
