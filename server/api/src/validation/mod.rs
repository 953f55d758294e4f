//! Validation of objects on create and update, with Kubernetes' field paths, cause reasons
//! and messages (`spec.containers[0].name: Required value`).
//!
//! [`validate_create`] and [`validate_update`] are the two entry points; the apiserver calls
//! them after defaulting and turns a non-empty result into a 422 with [`crate::ApiError::invalid`].
//! Validation runs on the JSON the apiserver stores (`serde_json::Value`), so it sees exactly
//! what will be persisted, unknown fields included.
//!
//! Invariants: validation is pure (no store, no clock), never panics on any JSON a client
//! can send (a field of the wrong type is reported, not unwrapped), and reports every error it
//! finds rather than the first, like Kubernetes' `field.ErrorList`: error accumulation with a
//! cap, as in `docs/tricks.md` #19 (the cap is applied by `ApiError::invalid`).
//!
//! Layout: [`names`] holds the string-format checks, [`quantity`] resource quantities,
//! `meta` object metadata, `pod` pod specs and templates, and one file per API group
//! (`policy`: PodDisruptionBudgets; [`scheduling`]: PriorityClasses and the built-in classes;
//! `authorization`: the access reviews).

mod apps;
mod authorization;
mod coordination;
mod core;
mod discovery;
mod meta;
pub mod names;
mod pod;
mod policy;
pub mod quantity;
mod rbac;
pub mod scheduling;

use serde_json::{Map, Value};

use crate::{Cause, ResourceInfo};

pub use meta::NameRule;

/// Validates an object about to be created (after defaulting).
pub fn validate_create(resource: &ResourceInfo, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if !obj.is_object() {
        causes.push(invalid("", obj, "must be a JSON object"));
        return causes;
    }
    if !is_review(resource) {
        meta::validate_object_meta(resource, obj, &mut causes);
    }
    validate_kind(resource, obj, None, &mut causes);
    causes
}

/// Whether `resource` is one of the reviews: answered, never stored, so their metadata is not
/// an object's (no name; the access reviews want it empty, TokenReview ignores it).
fn is_review(resource: &ResourceInfo) -> bool {
    matches!(
        (resource.group, resource.kind),
        ("authorization.k8s.io", _) | ("authentication.k8s.io", "TokenReview")
    )
}

/// Validates the replacement of `old` by `new` (after defaulting): everything a create checks,
/// plus the fields that may not change.
pub fn validate_update(resource: &ResourceInfo, old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if !new.is_object() {
        causes.push(invalid("", new, "must be a JSON object"));
        return causes;
    }
    meta::validate_object_meta(resource, new, &mut causes);
    meta::validate_object_meta_update(old, new, &mut causes);
    validate_kind(resource, new, Some(old), &mut causes);
    causes
}

/// The per-kind checks; `old` is present on update.
fn validate_kind(resource: &ResourceInfo, obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    match (resource.group, resource.kind) {
        ("", "Pod") => pod::validate_pod(obj, old, out),
        ("", "Service") => core::validate_service(obj, old, out),
        ("", "ConfigMap") => core::validate_config_map(obj, old, out),
        ("", "Secret") => core::validate_secret(obj, old, out),
        ("", "Namespace") => core::validate_namespace(obj, out),
        ("", "Node") => core::validate_node(obj, out),
        ("", "Endpoints") => core::validate_endpoints(obj, out),
        ("", "Event") => core::validate_event(obj, out),
        ("", "ServiceAccount") => {}
        ("apps", "Deployment") => apps::validate_deployment(obj, old, out),
        ("apps", "ReplicaSet") => apps::validate_replica_set(obj, old, out),
        ("apps", "DaemonSet") => apps::validate_daemon_set(obj, old, out),
        ("apps", "StatefulSet") => apps::validate_stateful_set(obj, old, out),
        ("discovery.k8s.io", "EndpointSlice") => discovery::validate_endpoint_slice(obj, old, out),
        ("coordination.k8s.io", "Lease") => coordination::validate_lease(obj, out),
        ("policy", "PodDisruptionBudget") => policy::validate_pod_disruption_budget(obj, old, out),
        ("scheduling.k8s.io", "PriorityClass") => {
            scheduling::validate_priority_class(obj, old, out)
        }
        ("rbac.authorization.k8s.io", "Role") => rbac::validate_role(obj, true, out),
        ("rbac.authorization.k8s.io", "ClusterRole") => rbac::validate_role(obj, false, out),
        ("rbac.authorization.k8s.io", "RoleBinding") => rbac::validate_binding(obj, old, true, out),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            rbac::validate_binding(obj, old, false, out)
        }
        ("authorization.k8s.io", "SubjectAccessReview") => {
            authorization::validate_access_review(obj, authorization::Review::Subject, out)
        }
        ("authorization.k8s.io", "LocalSubjectAccessReview") => {
            authorization::validate_access_review(obj, authorization::Review::Local, out)
        }
        ("authorization.k8s.io", "SelfSubjectAccessReview") => {
            authorization::validate_access_review(obj, authorization::Review::SelfSubject, out)
        }
        _ => {}
    }
}

// ----- field paths -----

/// `parent.child`, or `child` at the root.
pub(crate) fn child(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}.{name}")
    }
}

/// `parent[i]`.
pub(crate) fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

/// `parent[key]` (map entries, as Kubernetes' `Path.Key`).
pub(crate) fn key(parent: &str, key: &str) -> String {
    format!("{parent}[{key}]")
}

// ----- causes, as `k8s.io/apimachinery/pkg/util/validation/field` builds them -----

/// Renders a bad value as `field.Error.ErrorBody` does: strings quoted, numbers and booleans
/// bare, anything else as compact JSON.
pub(crate) fn render(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        other => other.to_string(),
    }
}

pub(crate) fn required(path: &str, detail: &str) -> Cause {
    let message = if detail.is_empty() {
        "Required value".to_string()
    } else {
        format!("Required value: {detail}")
    };
    Cause::new("FieldValueRequired", path, message)
}

pub(crate) fn invalid(path: &str, value: &Value, detail: &str) -> Cause {
    let mut message = format!("Invalid value: {}", render(value));
    if !detail.is_empty() {
        message.push_str(&format!(": {detail}"));
    }
    Cause::new("FieldValueInvalid", path, message)
}

pub(crate) fn invalid_str(path: &str, value: &str, detail: &str) -> Cause {
    invalid(path, &Value::String(value.to_string()), detail)
}

pub(crate) fn not_supported(path: &str, value: &Value, supported: &[&str]) -> Cause {
    let list = supported
        .iter()
        .map(|s| Value::String(s.to_string()).to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Cause::new(
        "FieldValueNotSupported",
        path,
        format!(
            "Unsupported value: {}: supported values: {list}",
            render(value)
        ),
    )
}

pub(crate) fn duplicate(path: &str, value: &Value) -> Cause {
    Cause::new(
        "FieldValueDuplicate",
        path,
        format!("Duplicate value: {}", render(value)),
    )
}

pub(crate) fn forbidden(path: &str, detail: &str) -> Cause {
    Cause::new("FieldValueForbidden", path, format!("Forbidden: {detail}"))
}

pub(crate) fn not_found(path: &str, value: &Value) -> Cause {
    Cause::new(
        "FieldValueNotFound",
        path,
        format!("Not found: {}", render(value)),
    )
}

pub(crate) fn too_long(path: &str, bytes_max: usize) -> Cause {
    Cause::new(
        "FieldValueTooLong",
        path,
        format!("Too long: may not be more than {bytes_max} bytes"),
    )
}

pub(crate) fn too_many(path: &str, actual: usize, max: usize) -> Cause {
    Cause::new(
        "FieldValueTooMany",
        path,
        format!("Too many: {actual}: must have at most {max} items"),
    )
}

/// `must be greater than or equal to 0` (apimachinery `IsNegativeErrorMsg`).
pub(crate) const IS_NEGATIVE_MESSAGE: &str = "must be greater than or equal to 0";
/// apimachinery `FieldImmutableErrorMsg`.
pub(crate) const IMMUTABLE_MESSAGE: &str = "field is immutable";

/// Appends an Invalid cause per message of a string check.
pub(crate) fn each(out: &mut Vec<Cause>, path: &str, value: &str, messages: Vec<String>) {
    for message in messages {
        out.push(invalid_str(path, value, &message));
    }
}

/// `value < 0` → Invalid; missing is fine.
pub(crate) fn non_negative(obj: &Value, field: &str, path: &str, out: &mut Vec<Cause>) {
    match obj.get(field).and_then(Value::as_i64) {
        Some(v) if v < 0 => {
            out.push(invalid(
                &child(path, field),
                &Value::from(v),
                IS_NEGATIVE_MESSAGE,
            ));
        }
        _ => {}
    }
}

/// Reports a field that is present but of the wrong JSON type.
pub(crate) fn type_check(
    obj: &Value,
    field: &str,
    path: &str,
    want: JsonType,
    out: &mut Vec<Cause>,
) {
    let Some(v) = obj.get(field) else { return };
    let ok = match want {
        JsonType::String => v.is_string(),
        JsonType::Integer => v.is_i64() || v.is_u64(),
        JsonType::Object => v.is_object(),
        JsonType::Array => v.is_array(),
        JsonType::Bool => v.is_boolean(),
    };
    if !ok && !v.is_null() {
        out.push(Cause::new(
            "FieldValueTypeInvalid",
            child(path, field),
            format!("Invalid value: {}: expected {}", render(v), want.name()),
        ));
    }
}

/// The JSON types [`type_check`] distinguishes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum JsonType {
    String,
    Integer,
    Object,
    Array,
    Bool,
}

impl JsonType {
    fn name(self) -> &'static str {
        match self {
            JsonType::String => "string",
            JsonType::Integer => "integer",
            JsonType::Object => "object",
            JsonType::Array => "array",
            JsonType::Bool => "boolean",
        }
    }
}

// ----- JSON access that never panics -----

pub(crate) fn str_of<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get(field).and_then(Value::as_str).unwrap_or("")
}

pub(crate) fn array_of<'a>(obj: &'a Value, field: &str) -> &'a [Value] {
    obj.get(field)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(crate) fn map_of<'a>(obj: &'a Value, field: &str) -> Option<&'a Map<String, Value>> {
    obj.get(field).and_then(Value::as_object)
}

pub(crate) fn null() -> &'static Value {
    &Value::Null
}

// ----- label selectors -----

/// Validates a `metav1.LabelSelector` (apimachinery `ValidateLabelSelector`).
pub(crate) fn validate_label_selector(selector: &Value, path: &str, out: &mut Vec<Cause>) {
    if let Some(labels) = map_of(selector, "matchLabels") {
        meta::validate_labels(labels, &child(path, "matchLabels"), out);
    }
    for (i, expr) in array_of(selector, "matchExpressions").iter().enumerate() {
        let expr_path = index(&child(path, "matchExpressions"), i);
        let values = array_of(expr, "values");
        match str_of(expr, "operator") {
            "In" | "NotIn" => {
                if values.is_empty() {
                    out.push(required(
                        &child(&expr_path, "values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    out.push(forbidden(
                        &child(&expr_path, "values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            other => out.push(invalid_str(
                &child(&expr_path, "operator"),
                other,
                "not a valid selector operator",
            )),
        }
        let key_value = str_of(expr, "key");
        each(
            out,
            &child(&expr_path, "key"),
            key_value,
            names::qualified_name(key_value),
        );
        for (j, v) in values.iter().enumerate() {
            let text = v.as_str().unwrap_or("");
            each(
                out,
                &index(&child(&expr_path, "values"), j),
                text,
                names::label_value(text),
            );
        }
    }
}

/// Whether a label selector selects nothing at all (`{}` or missing terms).
pub(crate) fn selector_is_empty(selector: &Value) -> bool {
    map_of(selector, "matchLabels").is_none_or(Map::is_empty)
        && array_of(selector, "matchExpressions").is_empty()
}

/// Whether `labels` satisfies `selector` (metav1 `LabelSelectorAsSelector` + `Matches`, through
/// [`crate::selector::LabelSelector`], the one matcher). A missing selector matches nothing,
/// an empty one everything, one that does not convert nothing (its own errors are reported by
/// `validate_label_selector`).
pub fn selector_matches(selector: Option<&Value>, labels: Option<&Map<String, Value>>) -> bool {
    let Some(selector) = selector.filter(|s| s.is_object()) else {
        return false;
    };
    let Ok(selector) = serde_json::from_value::<
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    >(selector.clone()) else {
        return false;
    };
    let Ok(selector) = crate::selector::LabelSelector::from_api(&selector) else {
        return false;
    };
    let labels: std::collections::BTreeMap<String, String> = labels
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
        .collect();
    selector.matches(&labels)
}

#[cfg(test)]
mod tests;
