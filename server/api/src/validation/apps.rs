//! The apps group: Deployment, ReplicaSet, DaemonSet and StatefulSet. Each owns pods
//! through a label selector, so the selector is required, non-empty, must match the
//! template's labels, and may not change after creation.

use serde_json::Value;

use super::pod::validate_pod_template;
use super::{
    IMMUTABLE_MESSAGE, child, forbidden, invalid, map_of, names, non_negative, not_supported, null,
    required, selector_is_empty, selector_matches, str_of, validate_label_selector,
};
use crate::Cause;

const SELECTOR_MISMATCH: &str = "`selector` does not match template `labels`";
/// The only restart policy a controller's pods may have (they are replaced, not restarted).
const ALWAYS: &[&str] = &["Always"];

/// Which controller a template belongs to: they differ in wording and in which checks apply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Controller {
    Deployment,
    ReplicaSet,
    DaemonSet,
    StatefulSet,
}

pub(super) fn validate_deployment(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    non_negative(spec, "replicas", "spec", out);
    validate_selector_and_template(spec, Controller::Deployment, out);
    validate_deployment_strategy(spec.get("strategy").unwrap_or(null()), out);
    non_negative(spec, "minReadySeconds", "spec", out);
    non_negative(spec, "revisionHistoryLimit", "spec", out);
    if let Some(deadline) = spec.get("progressDeadlineSeconds").and_then(Value::as_i64) {
        non_negative(spec, "progressDeadlineSeconds", "spec", out);
        let min_ready = spec
            .get("minReadySeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if deadline <= min_ready {
            out.push(invalid(
                "spec.progressDeadlineSeconds",
                &Value::from(deadline),
                "must be greater than minReadySeconds",
            ));
        }
    }
    immutable_selector(obj, old, out);
}

pub(super) fn validate_replica_set(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    non_negative(spec, "replicas", "spec", out);
    non_negative(spec, "minReadySeconds", "spec", out);
    validate_selector_and_template(spec, Controller::ReplicaSet, out);
    immutable_selector(obj, old, out);
}

pub(super) fn validate_daemon_set(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    validate_selector_and_template(spec, Controller::DaemonSet, out);
    non_negative(spec, "minReadySeconds", "spec", out);
    let strategy = spec.get("updateStrategy").unwrap_or(null());
    match str_of(strategy, "type") {
        "OnDelete" => {}
        "RollingUpdate" => {
            let rolling = strategy.get("rollingUpdate").unwrap_or(null());
            let path = "spec.updateStrategy.rollingUpdate";
            validate_int_or_percent(
                rolling.get("maxUnavailable"),
                &child(path, "maxUnavailable"),
                out,
            );
            validate_int_or_percent(rolling.get("maxSurge"), &child(path, "maxSurge"), out);
            if int_or_percent_is_zero(rolling.get("maxUnavailable"))
                && int_or_percent_is_zero(rolling.get("maxSurge"))
            {
                out.push(invalid(
                    &child(path, "maxUnavailable"),
                    rolling.get("maxUnavailable").unwrap_or(null()),
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
        }
        "" => out.push(required("spec.updateStrategy", "")),
        other => out.push(not_supported(
            "spec.updateStrategy",
            &Value::from(other),
            &["OnDelete", "RollingUpdate"],
        )),
    }
    immutable_selector(obj, old, out);
}

pub(super) fn validate_stateful_set(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    match str_of(spec, "podManagementPolicy") {
        "" => out.push(required("spec.podManagementPolicy", "")),
        "OrderedReady" | "Parallel" => {}
        other => out.push(super::invalid_str(
            "spec.podManagementPolicy",
            other,
            "must be 'OrderedReady' or 'Parallel'",
        )),
    }
    let strategy = spec.get("updateStrategy").unwrap_or(null());
    let rolling = strategy.get("rollingUpdate").filter(|v| !v.is_null());
    match str_of(strategy, "type") {
        "" => out.push(required("spec.updateStrategy", "")),
        "OnDelete" => {
            if let Some(rolling) = rolling {
                out.push(invalid(
                    "spec.updateStrategy.rollingUpdate",
                    rolling,
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        "RollingUpdate" => {
            if let Some(rolling) = rolling {
                non_negative(
                    rolling,
                    "partition",
                    "spec.updateStrategy.rollingUpdate",
                    out,
                );
            }
        }
        _ => out.push(invalid(
            "spec.updateStrategy",
            strategy,
            "must be 'RollingUpdate' or 'OnDelete'",
        )),
    }
    non_negative(spec, "replicas", "spec", out);
    non_negative(spec, "minReadySeconds", "spec", out);
    validate_selector_and_template(spec, Controller::StatefulSet, out);
    if let Some(old) = old {
        // Only these spec fields may change after creation (1.32 wording).
        let mut old_spec = old.get("spec").cloned().unwrap_or(Value::Null);
        let new_spec = spec;
        if let Some(o) = old_spec.as_object_mut() {
            for field in [
                "replicas",
                "ordinals",
                "template",
                "updateStrategy",
                "persistentVolumeClaimRetentionPolicy",
                "minReadySeconds",
            ] {
                match new_spec.get(field) {
                    Some(v) => o.insert(field.to_string(), v.clone()),
                    None => o.remove(field),
                };
            }
        }
        if !super::pod::json_equal_ignoring_empty(&old_spec, new_spec) {
            out.push(forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
    }
}

/// Selector presence, form, non-emptiness and agreement with the template's labels; then the
/// template itself with the controller-wide pod rules.
fn validate_selector_and_template(spec: &Value, controller: Controller, out: &mut Vec<Cause>) {
    let selector = spec.get("selector").filter(|s| !s.is_null());
    let template = spec.get("template").unwrap_or(null());
    let template_labels = template.get("metadata").and_then(|m| map_of(m, "labels"));
    match selector {
        None if controller != Controller::DaemonSet => out.push(required("spec.selector", "")),
        None => {}
        Some(selector) => {
            validate_label_selector(selector, "spec.selector", out);
            if selector_is_empty(selector) {
                let what = match controller {
                    // Kubernetes says "deployment" for ReplicaSets too.
                    Controller::Deployment | Controller::ReplicaSet => "deployment",
                    Controller::DaemonSet => "daemonset",
                    Controller::StatefulSet => "statefulset",
                };
                out.push(invalid(
                    "spec.selector",
                    selector,
                    &format!("empty selector is invalid for {what}"),
                ));
            }
        }
    }
    let selects_something = selector.is_some_and(|s| !selector_is_empty(s));
    if (selects_something || controller == Controller::DaemonSet)
        && !selector_matches(selector, template_labels)
    {
        let labels = template_labels
            .cloned()
            .map(Value::Object)
            .unwrap_or(Value::Null);
        out.push(invalid(
            "spec.template.metadata.labels",
            &labels,
            SELECTOR_MISMATCH,
        ));
    }
    if !template.is_object() {
        out.push(required("spec.template", ""));
        return;
    }
    validate_pod_template(template, "spec.template", out);
    let pod_spec = template.get("spec").unwrap_or(null());
    let restart_policy = str_of(pod_spec, "restartPolicy");
    if restart_policy != "Always" {
        out.push(not_supported(
            "spec.template.spec.restartPolicy",
            &Value::from(restart_policy),
            ALWAYS,
        ));
    }
    if let Some(deadline) = pod_spec
        .get("activeDeadlineSeconds")
        .filter(|v| !v.is_null())
    {
        let path = "spec.template.spec.activeDeadlineSeconds";
        match controller {
            Controller::DaemonSet => {
                out.push(invalid(
                    path,
                    deadline,
                    "activeDeadlineSeconds in DaemonSet is not Supported",
                ));
            }
            Controller::StatefulSet => {
                out.push(forbidden(
                    path,
                    "activeDeadlineSeconds in StatefulSet is not Supported",
                ));
            }
            _ => out.push(forbidden(
                path,
                "activeDeadlineSeconds in ReplicaSet is not Supported",
            )),
        }
    }
}

fn validate_deployment_strategy(strategy: &Value, out: &mut Vec<Cause>) {
    let rolling = strategy.get("rollingUpdate").filter(|v| !v.is_null());
    match str_of(strategy, "type") {
        "Recreate" => {
            if rolling.is_some() {
                out.push(forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => {
            let Some(rolling) = rolling else {
                out.push(required(
                    "spec.strategy.rollingUpdate",
                    "this should be defaulted and never be nil",
                ));
                return;
            };
            let path = "spec.strategy.rollingUpdate";
            let max_unavailable = rolling.get("maxUnavailable");
            validate_int_or_percent(max_unavailable, &child(path, "maxUnavailable"), out);
            validate_int_or_percent(rolling.get("maxSurge"), &child(path, "maxSurge"), out);
            if int_or_percent_is_zero(max_unavailable)
                && int_or_percent_is_zero(rolling.get("maxSurge"))
            {
                out.push(invalid(
                    &child(path, "maxUnavailable"),
                    max_unavailable.unwrap_or(null()),
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
            if let Some(Value::String(p)) = max_unavailable {
                let over = p
                    .strip_suffix('%')
                    .and_then(|d| d.parse::<u64>().ok())
                    .is_some_and(|v| v > 100);
                if over {
                    out.push(invalid(
                        &child(path, "maxUnavailable"),
                        &Value::from(p.as_str()),
                        "must not be greater than 100%",
                    ));
                }
            }
        }
        _ => out.push(not_supported(
            "spec.strategy",
            strategy,
            &["Recreate", "RollingUpdate"],
        )),
    }
}

/// An IntOrString that must be a non-negative integer or a `N%` string.
fn validate_int_or_percent(value: Option<&Value>, path: &str, out: &mut Vec<Cause>) {
    match value {
        Some(Value::String(s)) => {
            for message in names::percent(s) {
                out.push(invalid(path, &Value::from(s.as_str()), &message));
            }
        }
        Some(Value::Number(n)) if n.as_i64().is_some_and(|v| v < 0) => {
            out.push(invalid(
                path,
                &Value::Number(n.clone()),
                super::IS_NEGATIVE_MESSAGE,
            ));
        }
        _ => {}
    }
}

fn int_or_percent_is_zero(value: Option<&Value>) -> bool {
    match value {
        Some(Value::Number(n)) => n.as_i64() == Some(0),
        Some(Value::String(s)) => {
            s.strip_suffix('%').and_then(|d| d.parse::<u64>().ok()) == Some(0)
        }
        _ => false,
    }
}

/// `spec.selector` is fixed after creation for every apps/v1 controller.
fn immutable_selector(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let Some(old) = old else { return };
    let old_selector = old
        .get("spec")
        .and_then(|s| s.get("selector"))
        .unwrap_or(null());
    let new_selector = obj
        .get("spec")
        .and_then(|s| s.get("selector"))
        .unwrap_or(null());
    if !super::pod::json_equal_ignoring_empty(old_selector, new_selector) {
        out.push(invalid("spec.selector", new_selector, IMMUTABLE_MESSAGE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn int_or_percent() {
        let mut out = Vec::new();
        validate_int_or_percent(Some(&json!("x%")), "p", &mut out);
        validate_int_or_percent(Some(&json!(-1)), "q", &mut out);
        validate_int_or_percent(Some(&json!("25%")), "r", &mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(int_or_percent_is_zero(Some(&json!("0%"))));
        assert!(!int_or_percent_is_zero(Some(&json!(1))));
    }
}
