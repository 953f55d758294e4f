//! Node affinity and node selectors: which nodes a pod may run on (Kubernetes'
//! `k8s.io/component-helpers/scheduling/corev1/nodeaffinity`: `GetRequiredNodeAffinity`,
//! `RequiredNodeAffinity.Match`, `LazyErrorNodeSelector`, `NewPreferredSchedulingTerms`).
//!
//! The scheduler's NodeAffinity filter and score, PodTopologySpread's `nodeAffinityPolicy`,
//! the DaemonSet controller's placement and the kubelet's admission evaluate the same terms;
//! each parses them once ([`RequiredNodeAffinity::from_pod`]) and then matches node after node
//! without allocating.
//!
//! The rules:
//! - `spec.nodeSelector`: every pair must be a label of the node (`SelectorFromSet`, not
//!   validated); it is ANDed with the required affinity.
//! - Required terms are ORed; a required affinity with no terms selects nothing. Within a term
//!   `matchExpressions` (node labels) and `matchFields` (only `metadata.name` exists on a node)
//!   are ANDed. An empty term selects nothing.
//! - `matchExpressions` take `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`, each checked
//!   as `labels.NewRequirement` checks it (`Gt`/`Lt`: exactly one integer value; keys and
//!   values well-formed); `matchFields` take `In` / `NotIn` with exactly one value. A term
//!   with a requirement that does not check out matches nothing, while the other terms still
//!   count (the "lazy error" of `LazyErrorNodeSelector`); its messages are kept for logs.
//! - A node without a name is matched on labels alone (Kubernetes builds the node's field set
//!   only from a non-empty name).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector as ApiNodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm as ApiNodeSelectorTerm, Pod, PodSpec, PreferredSchedulingTerm,
};

use crate::selector::{
    LabelSelector, Operator, aggregate, go_quote, go_string_slice, invalid, new_requirement,
    set_matches,
};

/// The only field a node exposes to `matchFields` (metav1 `ObjectNameField`).
pub const OBJECT_NAME_FIELD: &str = "metadata.name";

/// Node selector operator `In` (also the only ones `matchFields` take, with `NotIn`).
pub const NODE_SELECTOR_OP_IN: &str = "In";
/// Node selector operator `NotIn`.
pub const NODE_SELECTOR_OP_NOT_IN: &str = "NotIn";

/// One `matchFields` requirement, checked: `field == value` or `field != value`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldRequirement {
    field: String,
    value: String,
    equal: bool,
}

impl FieldRequirement {
    fn matches(&self, node_name: &str) -> bool {
        // A node's field set holds only its name; any other field reads as "".
        let actual = if self.field == OBJECT_NAME_FIELD {
            node_name
        } else {
            ""
        };
        (actual == self.value) == self.equal
    }
}

/// A `NodeSelectorTerm`, parsed once (Kubernetes' `nodeSelectorTerm`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSelectorTerm {
    /// `matchExpressions`, when the term has any.
    labels: Option<LabelSelector>,
    /// `matchFields`, when the term has any.
    fields: Option<Vec<FieldRequirement>>,
    /// What did not check out; non-empty means the term matches nothing.
    errors: Vec<String>,
}

impl NodeSelectorTerm {
    /// Parses `term`; `path` roots the error messages (`nodeSelectorTerms[0]`).
    pub fn new(term: &ApiNodeSelectorTerm, path: &str) -> NodeSelectorTerm {
        let mut errors = Vec::new();
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let labels = (!expressions.is_empty()).then(|| {
            let path = format!("{path}.matchExpressions");
            let mut requirements = Vec::with_capacity(expressions.len());
            for (i, expression) in expressions.iter().enumerate() {
                match label_requirement(expression, &format!("{path}[{i}]")) {
                    Ok(requirement) => requirements.push(requirement),
                    Err(e) => errors.push(e),
                }
            }
            LabelSelector { requirements }
        });
        let field_requirements = term.match_fields.as_deref().unwrap_or_default();
        let fields = (!field_requirements.is_empty()).then(|| {
            let path = format!("{path}.matchFields");
            let mut fields = Vec::with_capacity(field_requirements.len());
            for (i, requirement) in field_requirements.iter().enumerate() {
                match field_requirement(requirement, &format!("{path}[{i}]")) {
                    Ok(field) => fields.push(field),
                    Err(e) => errors.push(e),
                }
            }
            fields
        });
        NodeSelectorTerm {
            labels,
            fields,
            errors,
        }
    }

    /// Whether the term selects a node with `labels` and `name` (`nodeSelectorTerm.match`).
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>, name: &str) -> bool {
        if !self.errors.is_empty() || (self.labels.is_none() && self.fields.is_none()) {
            return false;
        }
        if let Some(selector) = &self.labels
            && !selector.matches_opt(labels)
        {
            return false;
        }
        match &self.fields {
            Some(fields) if !name.is_empty() => fields.iter().all(|f| f.matches(name)),
            _ => true,
        }
    }

    /// Why the term matches nothing, if it does not parse.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// Whether the term parsed.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Whether a term has no requirement at all (`isEmptyNodeSelectorTerm`).
fn is_empty_term(term: &ApiNodeSelectorTerm) -> bool {
    term.match_expressions
        .as_deref()
        .unwrap_or_default()
        .is_empty()
        && term.match_fields.as_deref().unwrap_or_default().is_empty()
}

/// One `matchExpressions` requirement (`nodeSelectorRequirementsAsSelector`).
fn label_requirement(
    requirement: &NodeSelectorRequirement,
    path: &str,
) -> Result<(String, crate::selector::LabelOp), String> {
    let operator = match requirement.operator.as_str() {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::GreaterThan,
        "Lt" => Operator::LessThan,
        other => {
            return Err(format!(
                "{path}.operator: Unsupported value: {}",
                go_quote(other)
            ));
        }
    };
    new_requirement(
        &requirement.key,
        operator,
        requirement.values.as_deref(),
        Some(path),
    )
}

/// One `matchFields` requirement (`nodeSelectorRequirementsAsFieldSelector`).
fn field_requirement(
    requirement: &NodeSelectorRequirement,
    path: &str,
) -> Result<FieldRequirement, String> {
    let equal = match requirement.operator.as_str() {
        NODE_SELECTOR_OP_IN => true,
        NODE_SELECTOR_OP_NOT_IN => false,
        other => {
            return Err(format!(
                "{path}.operator: Unsupported value: {}: supported values: \"In\", \"NotIn\"",
                go_quote(other)
            ));
        }
    };
    match requirement.values.as_deref() {
        Some([value]) => Ok(FieldRequirement {
            field: requirement.key.clone(),
            value: value.clone(),
            equal,
        }),
        values => Err(invalid(
            &format!("{path}.values"),
            &go_string_slice(values),
            "must have one element",
        )),
    }
}

/// Required node affinity's terms, parsed once (`LazyErrorNodeSelector`): ORed, parse errors
/// kept per term so that the valid terms still count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSelector {
    terms: Vec<NodeSelectorTerm>,
}

impl NodeSelector {
    /// Parses `selector`; empty terms are dropped (they select nothing).
    pub fn new(selector: &ApiNodeSelector) -> NodeSelector {
        NodeSelector {
            terms: selector
                .node_selector_terms
                .iter()
                .enumerate()
                .filter(|(_, term)| !is_empty_term(term))
                .map(|(i, term)| NodeSelectorTerm::new(term, &format!("nodeSelectorTerms[{i}]")))
                .collect(),
        }
    }

    /// Whether any term selects a node with `labels` and `name`.
    pub fn matches_labels(&self, labels: Option<&BTreeMap<String, String>>, name: &str) -> bool {
        self.terms.iter().any(|t| t.matches(labels, name))
    }

    /// Whether any term selects `node`.
    pub fn matches(&self, node: &Node) -> bool {
        self.matches_labels(node.metadata.labels.as_ref(), node_name(node))
    }

    /// The parse errors of every term, aggregated as Kubernetes reports them when no term
    /// matched; `None` when every term parsed.
    pub fn error(&self) -> Option<String> {
        let errors: Vec<String> = self
            .terms
            .iter()
            .flat_map(|t| t.errors.iter().cloned())
            .collect();
        (!errors.is_empty()).then(|| aggregate(errors))
    }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// A pod's hard node constraints, parsed once: `spec.nodeSelector` AND its required node
/// affinity (`nodeaffinity.RequiredNodeAffinity`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequiredNodeAffinity {
    /// `spec.nodeSelector`, when not empty.
    node_selector: Option<BTreeMap<String, String>>,
    /// `requiredDuringSchedulingIgnoredDuringExecution`, when the pod has it.
    affinity: Option<NodeSelector>,
}

impl RequiredNodeAffinity {
    /// `GetRequiredNodeAffinity(pod)`.
    pub fn from_pod(pod: &Pod) -> RequiredNodeAffinity {
        pod.spec
            .as_ref()
            .map(RequiredNodeAffinity::from_spec)
            .unwrap_or_default()
    }

    /// The same for a pod spec (a template's: the DaemonSet controller asks before the pod
    /// exists).
    pub fn from_spec(spec: &PodSpec) -> RequiredNodeAffinity {
        let node_selector = spec.node_selector.clone().filter(|s| !s.is_empty());
        let affinity = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|na| {
                na.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(NodeSelector::new);
        RequiredNodeAffinity {
            node_selector,
            affinity,
        }
    }

    /// Whether the pod has neither a node selector nor required node affinity (every node
    /// matches).
    pub fn is_empty(&self) -> bool {
        self.node_selector.is_none() && self.affinity.is_none()
    }

    /// Whether a node with `labels` and `name` satisfies both.
    pub fn matches_labels(&self, labels: Option<&BTreeMap<String, String>>, name: &str) -> bool {
        if let Some(selector) = &self.node_selector
            && !set_matches(selector, labels)
        {
            return false;
        }
        self.affinity
            .as_ref()
            .is_none_or(|a| a.matches_labels(labels, name))
    }

    /// Whether `node` satisfies both (`RequiredNodeAffinity.Match`, its parse errors ignored
    /// as the scheduler's filter and the DaemonSet controller ignore them).
    pub fn matches(&self, node: &Node) -> bool {
        self.matches_labels(node.metadata.labels.as_ref(), node_name(node))
    }

    /// The required affinity's parse errors, if any (for logs).
    pub fn error(&self) -> Option<String> {
        self.affinity.as_ref().and_then(NodeSelector::error)
    }
}

/// A pod's preferred node affinity, parsed once (`PreferredSchedulingTerms`): the weights of
/// the terms a node matches add up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreferredSchedulingTerms {
    terms: Vec<(NodeSelectorTerm, i64)>,
}

impl PreferredSchedulingTerms {
    /// `NewPreferredSchedulingTerms`: terms with weight 0 or no requirement are dropped; a
    /// term that does not parse makes the whole list an error (Kubernetes' scheduler then
    /// fails the pod's scoring with it).
    pub fn new(terms: &[PreferredSchedulingTerm]) -> Result<PreferredSchedulingTerms, String> {
        let mut parsed = Vec::new();
        let mut errors = Vec::new();
        for (i, term) in terms.iter().enumerate() {
            if term.weight == 0 || is_empty_term(&term.preference) {
                continue;
            }
            let node_term = NodeSelectorTerm::new(&term.preference, &format!("[{i}]"));
            if node_term.is_valid() {
                parsed.push((node_term, i64::from(term.weight)));
            } else {
                errors.extend(node_term.errors);
            }
        }
        if !errors.is_empty() {
            return Err(aggregate(errors));
        }
        Ok(PreferredSchedulingTerms { terms: parsed })
    }

    /// The pod's preferred terms, `None` when it has none at all
    /// (`getPodPreferredNodeAffinity`).
    pub fn from_pod(pod: &Pod) -> Option<Result<PreferredSchedulingTerms, String>> {
        let preferred = pod
            .spec
            .as_ref()?
            .affinity
            .as_ref()?
            .node_affinity
            .as_ref()?
            .preferred_during_scheduling_ignored_during_execution
            .as_ref()?;
        Some(PreferredSchedulingTerms::new(preferred))
    }

    /// The sum of the weights of the terms `node` matches (`PreferredSchedulingTerms.Score`).
    pub fn score(&self, node: &Node) -> i64 {
        let labels = node.metadata.labels.as_ref();
        let name = node_name(node);
        self.terms
            .iter()
            .filter(|(t, _)| t.matches(labels, name))
            .map(|(_, w)| w)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
            .expect("a node")
    }

    fn selector(terms: Value) -> NodeSelector {
        NodeSelector::new(
            &serde_json::from_value(json!({"nodeSelectorTerms": terms})).expect("a selector"),
        )
    }

    fn pod(spec: Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([]);
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("a pod")
    }

    fn required(terms: Value) -> Value {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}})
    }

    const KEY_ERROR: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

    // Reference: nodeaffinity_test.go TestNodeSelectorMatch: the invalid terms are reported
    // (lazily), and the valid one still matches.
    #[test]
    fn invalid_terms_match_nothing_but_the_others_count() {
        let s = selector(json!([
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host_1", "host_2"]}]},
            {"matchExpressions": [{"key": "label_1", "operator": "In", "values": ["label_1_val"]}],
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host_1"]}]},
            {"matchExpressions": [{"key": "invalid key", "operator": "In", "values": ["label_value"]}]}
        ]));
        assert_eq!(
            s.error().expect("two terms do not parse"),
            format!(
                "[nodeSelectorTerms[0].matchFields[0].values: Invalid value: []string{{\"host_1\", \"host_2\"}}: must have one element, nodeSelectorTerms[2].matchExpressions[0].key: Invalid value: \"invalid key\": {KEY_ERROR}]"
            )
        );
        assert!(s.matches(&node("host_1", json!({"label_1": "label_1_val"}))));
        // The first term would have admitted host_2; it does not parse, so nothing does.
        assert!(!s.matches(&node("host_2", json!({"label_1": "label_1_val"}))));
        assert!(
            !s.matches(&node("host_1", json!({}))),
            "fields but not labels"
        );
        // The second term matches.
        let s = selector(json!([
            {"matchExpressions": [{"key": "label_1", "operator": "In", "values": ["label_1_val"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host_1"]}]}
        ]));
        assert_eq!(s.error(), None);
        assert!(s.matches(&node("host_1", json!({}))));
    }

    // Reference: TestPreferredSchedulingTermsScore.
    #[test]
    fn preferred_terms_score_and_errors() {
        let terms = |v: Value| -> Vec<PreferredSchedulingTerm> {
            serde_json::from_value(v).expect("terms")
        };
        let invalid = terms(json!([
            {"weight": 1, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host_1", "host_2"]}]}},
            {"weight": 1, "preference": {
                "matchExpressions": [{"key": "label_1", "operator": "In", "values": ["label_1_val"]}],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host_1"]}]}},
            {"weight": 1, "preference": {"matchExpressions": [{"key": "invalid key", "operator": "In", "values": ["label_value"]}]}}
        ]));
        assert_eq!(
            PreferredSchedulingTerms::new(&invalid),
            Err(format!(
                "[[0].matchFields[0].values: Invalid value: []string{{\"host_1\", \"host_2\"}}: must have one element, [2].matchExpressions[0].key: Invalid value: \"invalid key\": {KEY_ERROR}]"
            ))
        );
        // A weight of 0 drops the term before it is parsed.
        let weightless = terms(json!([
            {"weight": 0, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host_1", "host_2"]}]}}
        ]));
        let parsed = PreferredSchedulingTerms::new(&weightless).expect("no error reported");
        assert_eq!(parsed.score(&node("host_1", json!({}))), 0);
        let scored = terms(json!([
            {"weight": 5, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host_1"]}]}},
            {"weight": 7, "preference": {"matchExpressions": [{"key": "unknown_label", "operator": "In", "values": ["unknown_label_val"]}]}},
            {"weight": 11, "preference": {"matchExpressions": [{"key": "label_1", "operator": "In", "values": ["label_1_val"]}]}}
        ]));
        let parsed = PreferredSchedulingTerms::new(&scored).expect("valid");
        assert_eq!(
            parsed.score(&node("host_1", json!({"label_1": "label_1_val"}))),
            16
        );
    }

    // Reference: TestPodMatchesNodeSelectorAndAffinityTerms.
    #[test]
    fn pod_node_selector_and_required_affinity() {
        let matches = |spec: Value, labels: Value| {
            RequiredNodeAffinity::from_pod(&pod(spec)).matches(&node("n", labels))
        };
        assert!(matches(json!({}), json!({})));
        assert!(!matches(json!({"nodeSelector": {"foo": "bar"}}), json!({})));
        assert!(matches(
            json!({"nodeSelector": {"foo": "bar"}}),
            json!({"foo": "bar"})
        ));
        assert!(matches(
            json!({"nodeSelector": {"foo": "bar"}}),
            json!({"foo": "bar", "baz": "blah"})
        ));
        assert!(!matches(
            json!({"nodeSelector": {"foo": "bar", "baz": "blah"}}),
            json!({"foo": "bar"})
        ));
        let expression = |key: &str, op: &str, values: Value| {
            required(
                json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]),
            )
        };
        assert!(matches(
            expression("foo", "In", json!(["bar", "value2"])),
            json!({"foo": "bar"})
        ));
        // Two digits of major then two of minor version: "0206" > "0204" as integers.
        assert!(matches(
            expression("kernel-version", "Gt", json!(["0204"])),
            json!({"kernel-version": "0206"})
        ));
        assert!(matches(
            expression("mem-type", "NotIn", json!(["DDR", "DDR2"])),
            json!({"mem-type": "DDR3"})
        ));
        assert!(matches(
            required(json!([{"matchExpressions": [{"key": "GPU", "operator": "Exists"}]}])),
            json!({"GPU": "NVIDIA-GRID-K1"})
        ));
        assert!(!matches(
            expression("foo", "In", json!(["value1", "value2"])),
            json!({"foo": "bar"})
        ));
        // No terms, an empty term, an empty expression list: nothing.
        assert!(!matches(required(json!([])), json!({"foo": "bar"})));
        assert!(!matches(required(json!([{}])), json!({"foo": "bar"})));
        assert!(!matches(
            required(json!([{"matchExpressions": []}])),
            json!({"foo": "bar"})
        ));
        // The node selector and the affinity are ANDed.
        let mut both = expression("foo", "Exists", Value::Null);
        both["nodeSelector"] = json!({"foo": "other"});
        assert!(!matches(both, json!({"foo": "bar"})));
    }

    #[test]
    fn operators_and_their_invalid_input() {
        let n = node("n", json!({"foo": "bar", "gpu": "2"}));
        let term_matches =
            |expression: Value| selector(json!([{"matchExpressions": [expression]}])).matches(&n);
        assert!(term_matches(
            json!({"key": "missing", "operator": "NotIn", "values": ["x"]})
        ));
        assert!(term_matches(
            json!({"key": "bar", "operator": "DoesNotExist"})
        ));
        assert!(!term_matches(
            json!({"key": "gpu", "operator": "Lt", "values": ["2"]})
        ));
        assert!(term_matches(
            json!({"key": "gpu", "operator": "Lt", "values": ["3"]})
        ));
        // Each of these is an error, so the term matches nothing.
        for invalid in [
            json!({"key": "gpu", "operator": "Gt", "values": ["two"]}),
            json!({"key": "gpu", "operator": "Gt", "values": ["1", "0"]}),
            json!({"key": "foo", "operator": "In", "values": []}),
            json!({"key": "foo", "operator": "NotIn"}),
            json!({"key": "foo", "operator": "Exists", "values": ["bar"]}),
            json!({"key": "foo", "operator": "Equals", "values": ["bar"]}),
        ] {
            assert!(!term_matches(invalid.clone()), "{invalid}");
        }
        let s = selector(
            json!([{"matchExpressions": [{"key": "foo", "operator": "Equals", "values": ["bar"]}]}]),
        );
        assert_eq!(
            s.error().as_deref(),
            Some(
                "nodeSelectorTerms[0].matchExpressions[0].operator: Unsupported value: \"Equals\""
            )
        );
        let s = selector(
            json!([{"matchExpressions": [{"key": "foo", "operator": "Exists", "values": ["bar", "baz"]}]}]),
        );
        assert_eq!(
            s.error().as_deref(),
            Some(
                "nodeSelectorTerms[0].matchExpressions[0].values: Invalid value: []string{\"bar\", \"baz\"}: values set must be empty for exists and does not exist"
            )
        );
        let s =
            selector(json!([{"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}]));
        assert_eq!(
            s.error().as_deref(),
            Some(
                "nodeSelectorTerms[0].matchFields[0].operator: Unsupported value: \"Exists\": supported values: \"In\", \"NotIn\""
            )
        );
    }

    #[test]
    fn match_fields_select_by_name() {
        let s = selector(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node1"]}]}]),
        );
        assert!(!s.matches(&node("node1", json!({}))));
        assert!(s.matches(&node("node2", json!({}))));
        // Any other field reads as "" on a node.
        let s = selector(
            json!([{"matchFields": [{"key": "spec.unschedulable", "operator": "In", "values": ["true"]}]}]),
        );
        assert!(!s.matches(&node("node1", json!({}))));
        let s = selector(
            json!([{"matchFields": [{"key": "spec.unschedulable", "operator": "NotIn", "values": ["true"]}]}]),
        );
        assert!(s.matches(&node("node1", json!({}))));
        // A node without a name is judged on its labels alone.
        let s = selector(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node1"]}]}]),
        );
        assert!(s.matches(&node("", json!({}))));
    }
}
