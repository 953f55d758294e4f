//! Label and field selectors (`?labelSelector=app=web,tier!=db` and
//! `?fieldSelector=spec.nodeName=n1`), parsed as Kubernetes parses them and matched against
//! objects.
//!
//! Label selectors ([`LabelSelector`], in `label.rs` and the `labels.Parse` port `parse.rs`)
//! are the one implementation every component uses: the apiserver's list filters, the
//! controllers' owners and budgets, the scheduler's affinity terms and node affinity.
//!
//! Field selectors are limited per resource to the fields Kubernetes indexes for it
//! ([`field_supported`]); an unsupported field is a 400, as in Kubernetes, so a client never
//! silently gets an unfiltered list.

mod label;
mod parse;

use serde_json::Value;

use crate::status::ApiError;

pub use label::{
    LabelOp, LabelSelector, Operator, SELECTOR_REQUIREMENTS_MAX, labels_of, new_requirement,
    set_matches,
};
pub(crate) use label::{aggregate, go_quote, go_string_slice, invalid};

/// A parsed field selector: `field=value` / `field==value` / `field!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// (field path, value, equal?)
    pub requirements: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses a field selector for `resource`, refusing fields Kubernetes does not select on.
    pub fn parse(text: &str, resource: &str) -> Result<Self, ApiError> {
        Self::parse_fields(text, Some(resource))
    }

    /// Parses a field selector without asking whether the resource selects on its fields,
    /// as `fields.ParseSelector` does for the authorizers' attributes (an unsupported field
    /// is the list's 400 to give, after authorization).
    pub fn parse_any(text: &str) -> Result<Self, ApiError> {
        Self::parse_fields(text, None)
    }

    fn parse_fields(text: &str, resource: Option<&str>) -> Result<Self, ApiError> {
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
            if resource.is_some_and(|resource| !field_supported(resource, field)) {
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
        self.exact("metadata.name")
    }

    /// The value an `=`/`==` requirement on `field` pins, if any (`RequiresExactMatch`).
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|(f, _, eq)| f == field && *eq)
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
mod tests;
