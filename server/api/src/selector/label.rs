//! Label selectors, one implementation for every component: the apiserver's `?labelSelector=`,
//! the controllers' owners and budgets, the scheduler's affinity terms and spread constraints,
//! node affinity's `matchExpressions`, and (next) the kubelet's admission and the service proxy.
//!
//! apimachinery's semantics exactly (`k8s.io/apimachinery/pkg/labels/selector.go` and
//! `pkg/apis/meta/v1/helpers.go`):
//! - [`LabelSelector::from_api`] is `LabelSelectorAsSelector` for a non-nil selector: `{}`
//!   selects everything, and each requirement is checked as `labels.NewRequirement` checks it
//!   ([`new_requirement`]); [`LabelSelector::from_api_opt`] adds that a *nil* selector selects
//!   nothing ([`LabelSelector::nothing`]);
//! - [`LabelSelector::parse`] is `labels.Parse` (the string syntax of `kubectl -l`), in
//!   `parse.rs`, with its lexer's quirks (`x in ()` is `x` in the set {""});
//! - [`LabelSelector::from_set`] and [`set_matches`] are `SelectorFromSet` (a Service's
//!   selector, a pod's `nodeSelector`): equality on every pair, no validation;
//! - errors carry Kubernetes' messages word for word (`field.Error` formatting, aggregated as
//!   `utilerrors.Aggregate` prints them), so a client sees what kube-apiserver would say.
//!
//! Matching never allocates: the scheduler asks it thousands of times per cycle.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiLabelSelector;
use serde_json::Value;

use crate::status::ApiError;
use crate::validation::names;

/// Requirements in one parsed selector string. Kubernetes has no limit; a bound stops a
/// hostile query string from building an unbounded matcher. Generous: real selectors have a
/// handful. Objects' selectors (`matchLabels` / `matchExpressions`) are not bounded here: they
/// passed the apiserver's size limit and validation when they were stored.
pub const SELECTOR_REQUIREMENTS_MAX: usize = 100;

/// A requirement's operator before its values are checked (apimachinery's
/// `selection.Operator`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    /// `in`: the label is one of the values.
    In,
    /// `notin`: the label is absent or none of the values.
    NotIn,
    /// `=`: the label equals the single value.
    Equals,
    /// `==`: the same as `=`.
    DoubleEquals,
    /// `!=`: the label is absent or differs from the single value.
    NotEquals,
    /// `exists`: the label is present.
    Exists,
    /// `!`: the label is absent.
    DoesNotExist,
    /// `gt`: the label is an integer greater than the single integer value.
    GreaterThan,
    /// `lt`: the label is an integer less than the single integer value.
    LessThan,
}

impl Operator {
    /// The operator's string, as `selection.Operator` spells it (in error messages).
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::In => "in",
            Operator::NotIn => "notin",
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::Exists => "exists",
            Operator::DoesNotExist => "!",
            Operator::GreaterThan => "gt",
            Operator::LessThan => "lt",
        }
    }
}

/// One checked requirement on one label key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelOp {
    /// `=` and `==`.
    Equals(String),
    /// `!=`: also satisfied when the label is absent.
    NotEquals(String),
    /// `in`.
    In(Vec<String>),
    /// `notin`: also satisfied when the label is absent.
    NotIn(Vec<String>),
    /// The label is present, whatever its value.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// `gt`: the label parses as an `i64` greater than this.
    GreaterThan(i64),
    /// `lt`: the label parses as an `i64` less than this.
    LessThan(i64),
}

impl LabelOp {
    /// Whether a label's value (`None`: the label is absent) satisfies this requirement
    /// (`Requirement.Matches`).
    pub fn matches(&self, value: Option<&String>) -> bool {
        match self {
            LabelOp::Equals(v) => value == Some(v),
            LabelOp::NotEquals(v) => value != Some(v),
            LabelOp::In(vs) => value.is_some_and(|x| vs.contains(x)),
            LabelOp::NotIn(vs) => value.is_none_or(|x| !vs.contains(x)),
            LabelOp::Exists => value.is_some(),
            LabelOp::DoesNotExist => value.is_none(),
            // A label that is not a base-10 int64 satisfies neither (Go's `ParseInt`, which
            // Rust's `i64::from_str` agrees with: optional sign, digits, no spaces).
            LabelOp::GreaterThan(bound) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *bound),
            LabelOp::LessThan(bound) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *bound),
        }
    }
}

/// A checked label selector: every requirement must hold. No requirements selects
/// everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<(String, LabelOp)>,
}

impl LabelSelector {
    /// Selects every set of labels (`labels.Everything()`).
    pub fn everything() -> LabelSelector {
        LabelSelector::default()
    }

    /// Selects no set of labels (`labels.Nothing()`, what a nil `metav1.LabelSelector`
    /// becomes): `In` over an empty set, which no value satisfies. Not [`Self::is_empty`].
    pub fn nothing() -> LabelSelector {
        LabelSelector {
            requirements: vec![(String::new(), LabelOp::In(Vec::new()))],
        }
    }

    /// Parses Kubernetes' label selector syntax (`labels.Parse`): a 400 with Kubernetes'
    /// message when it does not parse.
    pub fn parse(text: &str) -> Result<LabelSelector, ApiError> {
        super::parse::parse(text)
            .map(|requirements| LabelSelector { requirements })
            .map_err(ApiError::bad_request)
    }

    /// `metav1.LabelSelectorAsSelector` for a non-nil selector: `matchLabels` as `=`
    /// requirements and `matchExpressions` (`In`, `NotIn`, `Exists`, `DoesNotExist`) checked
    /// as `labels.NewRequirement` checks them; an empty selector selects everything. The
    /// error (a 400) carries Kubernetes' message, e.g. `"Near" is not a valid label selector
    /// operator`.
    pub fn from_api(selector: &ApiLabelSelector) -> Result<LabelSelector, ApiError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(
                new_requirement(
                    key,
                    Operator::Equals,
                    Some(std::slice::from_ref(value)),
                    None,
                )
                .map_err(ApiError::bad_request)?,
            );
        }
        for expression in selector.match_expressions.iter().flatten() {
            let operator = match expression.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "{} is not a valid label selector operator",
                        go_quote(other)
                    )));
                }
            };
            // Kubernetes copies the values into a fresh slice, so an empty list reads as nil.
            let values = expression.values.as_deref().filter(|v| !v.is_empty());
            requirements.push(
                new_requirement(&expression.key, operator, values, None)
                    .map_err(ApiError::bad_request)?,
            );
        }
        Ok(LabelSelector { requirements })
    }

    /// [`Self::from_api`] for an optional selector: `None` (nil) selects nothing.
    pub fn from_api_opt(selector: Option<&ApiLabelSelector>) -> Result<LabelSelector, ApiError> {
        match selector {
            None => Ok(LabelSelector::nothing()),
            Some(selector) => LabelSelector::from_api(selector),
        }
    }

    /// `labels.SelectorFromSet`: every pair must be equal; empty selects everything. Not
    /// validated, as in Kubernetes. [`set_matches`] does the same without building a selector.
    pub fn from_set(set: &BTreeMap<String, String>) -> LabelSelector {
        LabelSelector {
            requirements: set
                .iter()
                .map(|(k, v)| (k.clone(), LabelOp::Equals(v.clone())))
                .collect(),
        }
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|(key, op)| op.matches(labels.get(key)))
    }

    /// [`Self::matches`] for an object's optional labels (`None`: no labels).
    pub fn matches_opt(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
        self.matches(labels.unwrap_or(&NO_LABELS))
    }

    /// Matches a JSON object's `metadata.labels`.
    pub fn matches_object(&self, object: &Value) -> bool {
        if self.requirements.is_empty() {
            return true;
        }
        self.matches(&labels_of(object))
    }

    /// Whether the selector has no requirements, and so selects everything
    /// (`Selector.Empty`). [`Self::nothing`] is not empty.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// `labels.SelectorFromSet(set).Matches(labels)` without building the selector: every pair
/// of `set` is in `labels` (`None`: no labels); an empty set matches everything.
pub fn set_matches(
    set: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    set.iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// An object's `metadata.labels` as a map.
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// `labels.NewRequirement`: checks `key`, the number of `values` for `operator`, Gt/Lt values
/// as integers and every value as a label value, and builds the requirement. `values: None`
/// is Go's nil slice, `Some(&[])` an empty one (they print differently in the message);
/// `path` is the `field.Path` the messages are rooted at (`None`: Kubernetes' nil path, so
/// fields read `key`, `values`, `values[0][app]`). The error is every message, aggregated.
pub fn new_requirement(
    key: &str,
    operator: Operator,
    values: Option<&[String]>,
    path: Option<&str>,
) -> Result<(String, LabelOp), String> {
    let child = |name: &str| match path {
        Some(p) => format!("{p}.{name}"),
        None => name.to_string(),
    };
    let values_path = child("values");
    let list = values.unwrap_or_default();
    let mut errors = Vec::new();
    let key_errors = names::qualified_name(key);
    if !key_errors.is_empty() {
        errors.push(invalid(
            &child("key"),
            &go_quote(key),
            &key_errors.join("; "),
        ));
    }
    let count_error = |errors: &mut Vec<String>, detail: &str| {
        errors.push(invalid(&values_path, &go_string_slice(values), detail));
    };
    match operator {
        Operator::In | Operator::NotIn if list.is_empty() => count_error(
            &mut errors,
            "for 'in', 'notin' operators, values set can't be empty",
        ),
        Operator::Equals | Operator::DoubleEquals | Operator::NotEquals if list.len() != 1 => {
            count_error(
                &mut errors,
                "exact-match compatibility requires one single value",
            );
        }
        Operator::Exists | Operator::DoesNotExist if !list.is_empty() => count_error(
            &mut errors,
            "values set must be empty for exists and does not exist",
        ),
        Operator::GreaterThan | Operator::LessThan => {
            if list.len() != 1 {
                count_error(
                    &mut errors,
                    "for 'Gt', 'Lt' operators, exactly one value is required",
                );
            }
            for (i, value) in list.iter().enumerate() {
                if value.parse::<i64>().is_err() {
                    errors.push(invalid(
                        &format!("{values_path}[{i}]"),
                        &go_quote(value),
                        "for 'Gt', 'Lt' operators, the value must be an integer",
                    ));
                }
            }
        }
        _ => {}
    }
    for (i, value) in list.iter().enumerate() {
        let value_errors = names::label_value(value);
        if !value_errors.is_empty() {
            errors.push(invalid(
                &format!("{values_path}[{i}][{key}]"),
                &go_quote(value),
                &value_errors.join("; "),
            ));
        }
    }
    if !errors.is_empty() {
        return Err(aggregate(errors));
    }
    let single = || list.first().cloned().unwrap_or_default();
    let integer = || {
        list.first()
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or_default()
    };
    let op = match operator {
        Operator::In => LabelOp::In(list.to_vec()),
        Operator::NotIn => LabelOp::NotIn(list.to_vec()),
        Operator::Equals | Operator::DoubleEquals => LabelOp::Equals(single()),
        Operator::NotEquals => LabelOp::NotEquals(single()),
        Operator::Exists => LabelOp::Exists,
        Operator::DoesNotExist => LabelOp::DoesNotExist,
        Operator::GreaterThan => LabelOp::GreaterThan(integer()),
        Operator::LessThan => LabelOp::LessThan(integer()),
    };
    Ok((key.to_string(), op))
}

/// `field.Invalid(path, value, detail).Error()`, `value` already rendered.
pub(crate) fn invalid(path: &str, rendered_value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {rendered_value}: {detail}")
}

/// `utilerrors.NewAggregate(errs).Error()` after `ErrorList.ToAggregate` removed duplicates:
/// one message alone, several as `[a, b]`.
pub(crate) fn aggregate(mut errors: Vec<String>) -> String {
    let mut seen = std::collections::HashSet::new();
    errors.retain(|e| seen.insert(e.clone()));
    match errors.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

pub(crate) use crate::goquote::go_quote;

/// A `[]string` as Go's `%#v` prints it: `[]string(nil)`, `[]string{}`, `[]string{"a", "b"}`.
pub(crate) fn go_string_slice(values: Option<&[String]>) -> String {
    match values {
        None => "[]string(nil)".to_string(),
        Some(values) => format!(
            "[]string{{{}}}",
            values
                .iter()
                .map(|v| go_quote(v))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
