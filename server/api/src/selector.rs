//! Label and field selectors (`?labelSelector=app=web,tier!=db` and
//! `?fieldSelector=spec.nodeName=n1`), parsed as Kubernetes parses them and matched against
//! JSON objects.
//!
//! Field selectors are limited per resource to the fields Kubernetes indexes for it
//! ([`field_supported`]); an unsupported field is a 400, as in Kubernetes, so a client never
//! silently gets an unfiltered list.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::status::ApiError;

/// Requirements in one selector. Kubernetes has no limit; a bound stops a hostile query
/// string from building an unbounded matcher. Generous: real selectors have a handful.
pub const SELECTOR_REQUIREMENTS_MAX: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

/// A parsed label selector; empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<(String, LabelOp)>,
}

impl LabelSelector {
    /// Parses Kubernetes' label selector syntax.
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let bad =
            |msg: String| ApiError::bad_request(format!("unable to parse requirement: {msg}"));
        let mut requirements = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            if requirements.len() >= SELECTOR_REQUIREMENTS_MAX {
                return Err(bad(format!(
                    "more than {SELECTOR_REQUIREMENTS_MAX} requirements"
                )));
            }
            // One requirement ends at a comma outside parentheses.
            let mut depth = 0i32;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    ',' if depth == 0 => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let part = rest[..end].trim();
            rest = rest.get(end + 1..).unwrap_or("").trim_start();
            if part.is_empty() {
                return Err(bad("found ',', expected: identifier".into()));
            }
            requirements.push(parse_requirement(part).map_err(bad)?);
        }
        Ok(Self { requirements })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|(key, op)| {
            let value = labels.get(key);
            match op {
                LabelOp::Equals(v) => value == Some(v),
                LabelOp::NotEquals(v) => value != Some(v),
                LabelOp::In(vs) => value.is_some_and(|x| vs.contains(x)),
                LabelOp::NotIn(vs) => value.is_none_or(|x| !vs.contains(x)),
                LabelOp::Exists => value.is_some(),
                LabelOp::DoesNotExist => value.is_none(),
            }
        })
    }

    /// Matches an object's `metadata.labels`.
    pub fn matches_object(&self, object: &Value) -> bool {
        if self.requirements.is_empty() {
            return true;
        }
        self.matches(&labels_of(object))
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Converts a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions`), as
    /// Kubernetes' `LabelSelectorAsSelector` does for a non-nil selector: an empty selector
    /// selects everything. (A *nil* selector selects nothing in Kubernetes; the caller, which
    /// holds the `Option`, decides that case.)
    ///
    /// Errors (400) mirror Kubernetes' `labels.NewRequirement`: an unknown operator, values
    /// given to `Exists`/`DoesNotExist`, no values for `In`/`NotIn`, a bad key or value.
    pub fn from_api(
        selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<Self, ApiError> {
        let bad = |msg: String| ApiError::bad_request(format!("invalid label selector: {msg}"));
        let labels = selector.match_labels.iter().flatten();
        let expressions = selector.match_expressions.iter().flatten();
        if labels.clone().count() + expressions.clone().count() > SELECTOR_REQUIREMENTS_MAX {
            return Err(bad(format!(
                "more than {SELECTOR_REQUIREMENTS_MAX} requirements"
            )));
        }
        let mut requirements = Vec::new();
        for (key, value) in labels {
            if !valid_key(key) {
                return Err(bad(format!("invalid label key {key:?}")));
            }
            if !valid_value(value) {
                return Err(bad(format!("invalid label value: {value:?}")));
            }
            requirements.push((key.clone(), LabelOp::Equals(value.clone())));
        }
        for expression in expressions {
            let key = &expression.key;
            if !valid_key(key) {
                return Err(bad(format!("invalid label key {key:?}")));
            }
            let values = expression.values.clone().unwrap_or_default();
            if let Some(v) = values.iter().find(|v| !valid_value(v)) {
                return Err(bad(format!("invalid label value: {v:?}")));
            }
            let op = match expression.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(bad(
                        "for 'in', 'notin' operators, values set can't be empty".into(),
                    ));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(bad(
                        "values set must be empty for exists and does not exist".into(),
                    ));
                }
                "In" => LabelOp::In(values),
                "NotIn" => LabelOp::NotIn(values),
                "Exists" => LabelOp::Exists,
                "DoesNotExist" => LabelOp::DoesNotExist,
                other => {
                    return Err(bad(format!(
                        "{other:?} is not a valid label selector operator"
                    )));
                }
            };
            requirements.push((key.clone(), op));
        }
        Ok(Self { requirements })
    }
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

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_requirement(part: &str) -> Result<(String, LabelOp), String> {
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        return if valid_key(key) {
            Ok((key.to_string(), LabelOp::DoesNotExist))
        } else {
            Err(format!("invalid label key {key:?}"))
        };
    }
    let set = |key: &str, rest: &str, negate: bool| -> Result<(String, LabelOp), String> {
        let rest = rest.trim();
        let inner = rest
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| format!("found {rest:?}, expected: '('"))?;
        let values: Vec<String> = inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err("for 'in', 'notin' operators, values set can't be empty".into());
        }
        if let Some(v) = values.iter().find(|v| !valid_value(v)) {
            return Err(format!("invalid label value: {v:?}"));
        }
        let key = key.trim();
        if !valid_key(key) {
            return Err(format!("invalid label key {key:?}"));
        }
        Ok((
            key.to_string(),
            if negate {
                LabelOp::NotIn(values)
            } else {
                LabelOp::In(values)
            },
        ))
    };
    for (op, negate) in [(" notin ", true), (" in ", false)] {
        if let Some(i) = part.find(op) {
            return set(&part[..i], &part[i + op.len()..], negate);
        }
    }
    for (op, ctor) in [
        ("!=", LabelOp::NotEquals as fn(String) -> LabelOp),
        ("==", LabelOp::Equals),
        ("=", LabelOp::Equals),
    ] {
        if let Some(i) = part.find(op) {
            let key = part[..i].trim();
            let value = part[i + op.len()..].trim();
            if !valid_key(key) {
                return Err(format!("invalid label key {key:?}"));
            }
            if !valid_value(value) {
                return Err(format!("invalid label value: {value:?}"));
            }
            return Ok((key.to_string(), ctor(value.to_string())));
        }
    }
    if valid_key(part) {
        Ok((part.to_string(), LabelOp::Exists))
    } else {
        Err(format!("invalid label key {part:?}"))
    }
}

/// A parsed field selector: `field=value` / `field==value` / `field!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// (field path, value, equal?)
    pub requirements: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses a field selector for `resource`, refusing fields Kubernetes does not select on.
    pub fn parse(text: &str, resource: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if requirements.len() >= SELECTOR_REQUIREMENTS_MAX {
                return Err(ApiError::bad_request(
                    "too many field selector requirements",
                ));
            }
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if !field_supported(resource, field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            requirements.push((field.to_string(), value.trim().to_string(), equal));
        }
        Ok(Self { requirements })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|(field, value, equal)| {
            let actual = field_value(object, field);
            (actual == *value) == *equal
        })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The name a `metadata.name=X` requirement pins, if any (a get-like list).
    pub fn exact_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|(f, _, eq)| f == "metadata.name" && *eq)
            .map(|(_, v, _)| v.as_str())
    }
}

/// Fields Kubernetes supports in field selectors, per resource (the conversion functions
/// registered by each API group); `metadata.name` and `metadata.namespace` work everywhere.
pub fn field_supported(resource: &str, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    let extra: &[&str] = match resource {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "secrets" => &["type"],
        "namespaces" => &["status.phase"],
        "nodes" => &["spec.unschedulable"],
        "replicasets" => &["status.replicas"],
        _ => &[],
    };
    extra.contains(&field)
}

/// The string value of `field` in `object` as field selectors compare it ("" when absent;
/// booleans as "true"/"false", numbers in decimal).
pub fn field_value(object: &Value, field: &str) -> String {
    let field = if field == "source" {
        "source.component"
    } else {
        field
    };
    let mut current = object;
    for part in field.split('.') {
        match current.get(part) {
            Some(v) => current = v,
            None => return String::new(),
        }
    }
    match current {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors_parse_and_match() {
        let s = LabelSelector::parse("app=web,tier!=db,env in (prod, staging),!canary,team")
            .expect("valid");
        assert_eq!(s.requirements.len(), 5);
        assert!(s.matches(&labels(&[("app", "web"), ("env", "prod"), ("team", "a")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "dev"), ("team", "a")])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("team", "a"),
            ("canary", "1")
        ])));
        let s = LabelSelector::parse("x notin (a,b)").expect("valid");
        assert!(s.matches(&labels(&[])));
        assert!(!s.matches(&labels(&[("x", "a")])));
        assert!(
            LabelSelector::parse("")
                .expect("empty")
                .matches(&labels(&[]))
        );
    }

    #[test]
    fn bad_label_selectors_are_bad_requests() {
        for bad in ["a=b,,c", "x in ()", "x in a", "a=b c", "k=v!"] {
            let e = LabelSelector::parse(bad).expect_err(bad);
            assert_eq!(e.code, 400, "{bad}");
        }
    }

    #[test]
    fn api_label_selectors_convert_and_match() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
            LabelSelector as ApiSelector, LabelSelectorRequirement,
        };
        let requirement = |key: &str, operator: &str, values: &[&str]| LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        };
        let api = ApiSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                requirement("env", "In", &["prod", "staging"]),
                requirement("tier", "NotIn", &["db"]),
                requirement("team", "Exists", &[]),
                requirement("canary", "DoesNotExist", &[]),
            ]),
        };
        let s = LabelSelector::from_api(&api).expect("valid");
        assert_eq!(s.requirements.len(), 5);
        assert!(s.matches(&labels(&[("app", "web"), ("env", "prod"), ("team", "a")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "dev"), ("team", "a")])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("tier", "db"),
            ("team", "a")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("team", "a"),
            ("canary", "1")
        ])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("team", "a")])));
        // An empty (non-nil) selector selects everything.
        assert!(
            LabelSelector::from_api(&ApiSelector::default())
                .expect("empty")
                .matches(&labels(&[]))
        );
        for bad in [
            requirement("a", "In", &[]),
            requirement("a", "Exists", &["x"]),
            requirement("a", "Equals", &["x"]),
            requirement("bad key", "Exists", &[]),
        ] {
            let api = ApiSelector {
                match_labels: None,
                match_expressions: Some(vec![bad]),
            };
            assert_eq!(
                LabelSelector::from_api(&api).expect_err("invalid").code,
                400
            );
        }
    }

    #[test]
    fn field_selectors_match_supported_fields_only() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "hostNetwork": true}, "status": {"phase": "Running"}});
        let s =
            FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed", "pods").expect("valid");
        assert!(s.matches(&pod));
        let s = FieldSelector::parse("spec.nodeName=", "pods").expect("valid");
        assert!(!s.matches(&pod));
        assert!(
            FieldSelector::parse("spec.hostNetwork=true", "pods")
                .expect("valid")
                .matches(&pod)
        );
        let e = FieldSelector::parse("spec.nodeName=n1", "configmaps").expect_err("unsupported");
        assert_eq!(e.message, "field label not supported: spec.nodeName");
        assert_eq!(
            FieldSelector::parse("metadata.name=web", "deployments")
                .expect("valid")
                .exact_name(),
            Some("web")
        );
    }
}
