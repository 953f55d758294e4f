//! PriorityClasses (scheduling.k8s.io): the value range users may claim, the names reserved
//! for the system classes, and the fields fixed after creation (Kubernetes 1.32
//! `pkg/apis/scheduling/validation`).
//!
//! Uniqueness of `globalDefault` needs the other classes, so it is admission's check
//! (the apiserver's Priority admission), not this pure one.

use serde_json::Value;

use super::{IMMUTABLE_MESSAGE, forbidden, invalid, not_supported, null, required};
use crate::Cause;

/// The highest value a user-defined class may have (scheduling `HighestUserDefinablePriority`):
/// everything above one billion is reserved so that no workload can outrank the system's
/// critical pods.
pub const HIGHEST_USER_DEFINABLE_PRIORITY: i64 = 1_000_000_000;

/// The first value of the system range (scheduling `SystemCriticalPriority`), twice the user
/// maximum so the gap can hold future system tiers.
pub const SYSTEM_CRITICAL_PRIORITY: i64 = 2 * HIGHEST_USER_DEFINABLE_PRIORITY;

/// Names with this prefix belong to the system classes (scheduling `SystemPriorityClassPrefix`).
pub const SYSTEM_PRIORITY_CLASS_PREFIX: &str = "system-";

/// One built-in PriorityClass, as kube-apiserver creates it at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SystemPriorityClass {
    pub name: &'static str,
    pub value: i64,
    pub description: &'static str,
}

/// The built-in classes (scheduling/v1 `systemPriorityClasses`), in Kubernetes' order. Node
/// critical sits 1000 above cluster critical: a node's own agents outrank anything that
/// could merely run elsewhere.
pub const SYSTEM_PRIORITY_CLASSES: [SystemPriorityClass; 2] = [
    SystemPriorityClass {
        name: "system-node-critical",
        value: SYSTEM_CRITICAL_PRIORITY + 1000,
        description: "Used for system critical pods that must not be moved from their current node.",
    },
    SystemPriorityClass {
        name: "system-cluster-critical",
        value: SYSTEM_CRITICAL_PRIORITY,
        description: "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    },
];

/// The preemption policies a class or pod may name (core `PreemptionPolicy`).
pub const PREEMPTION_POLICIES: &[&str] = &["PreemptLowerPriority", "Never"];

/// scheduling/v1 `IsKnownSystemPriorityClass`: `Err` says why a `system-` class is refused.
fn known_system_class(name: &str, value: i64, global_default: bool) -> Result<(), String> {
    let Some(class) = SYSTEM_PRIORITY_CLASSES.iter().find(|c| c.name == name) else {
        return Err(format!("{name} is not a known system priority class"));
    };
    if class.value != value {
        return Err(format!(
            "value of {} PriorityClass must be {}",
            class.name, class.value
        ));
    }
    // No system class is the global default.
    if global_default {
        return Err(format!(
            "globalDefault of {} PriorityClass must be false",
            class.name
        ));
    }
    Ok(())
}

/// core validation `ValidatePreemptionPolicy`, shared with pods.
pub(super) fn validate_preemption_policy(policy: &Value, path: &str, out: &mut Vec<Cause>) {
    match policy.as_str() {
        Some(p) if PREEMPTION_POLICIES.contains(&p) => {}
        Some("") => out.push(required(path, "")),
        _ => out.push(not_supported(path, policy, PREEMPTION_POLICIES)),
    }
}

/// `ValidatePriorityClass`, plus `ValidatePriorityClassUpdate` when `old` is given.
pub(super) fn validate_priority_class(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let value = obj.get("value").and_then(Value::as_i64).unwrap_or(0);
    let global_default = obj
        .get("globalDefault")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if name.starts_with(SYSTEM_PRIORITY_CLASS_PREFIX) {
        if let Err(reason) = known_system_class(name, value, global_default) {
            out.push(forbidden(
                "metadata.name",
                &format!(
                    "priority class names with '{SYSTEM_PRIORITY_CLASS_PREFIX}' prefix are reserved for system use only. error: {reason}"
                ),
            ));
        }
    } else if value > HIGHEST_USER_DEFINABLE_PRIORITY {
        out.push(forbidden(
            "value",
            &format!(
                "maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE_PRIORITY}"
            ),
        ));
    }
    if let Some(policy) = obj.get("preemptionPolicy").filter(|p| !p.is_null()) {
        validate_preemption_policy(policy, "preemptionPolicy", out);
    }
    let Some(old) = old else { return };
    let old_value = old.get("value").and_then(Value::as_i64).unwrap_or(0);
    if value != old_value {
        out.push(forbidden("value", "may not be changed in an update."));
    }
    let policy = obj.get("preemptionPolicy").unwrap_or(null());
    if policy != old.get("preemptionPolicy").unwrap_or(null()) {
        out.push(invalid("preemptionPolicy", policy, IMMUTABLE_MESSAGE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_classes_are_known_only_with_their_own_values() {
        assert_eq!(
            known_system_class("system-node-critical", 2_000_001_000, false),
            Ok(())
        );
        assert_eq!(
            known_system_class("system-cluster-critical", 2_000_000_000, false),
            Ok(())
        );
        assert_eq!(
            known_system_class("system-cluster-critical", 5, false),
            Err("value of system-cluster-critical PriorityClass must be 2000000000".into())
        );
        assert_eq!(
            known_system_class("system-node-critical", 2_000_001_000, true),
            Err("globalDefault of system-node-critical PriorityClass must be false".into())
        );
        assert_eq!(
            known_system_class("system-mine", 1, false),
            Err("system-mine is not a known system priority class".into())
        );
    }

    #[test]
    fn preemption_policy_is_one_of_two() {
        let mut out = Vec::new();
        validate_preemption_policy(&Value::from("Never"), "p", &mut out);
        validate_preemption_policy(&Value::from("PreemptLowerPriority"), "p", &mut out);
        assert!(out.is_empty(), "{out:?}");
        validate_preemption_policy(&Value::from("Sometimes"), "p", &mut out);
        validate_preemption_policy(&Value::from(""), "q", &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0].message,
            "Unsupported value: \"Sometimes\": supported values: \"PreemptLowerPriority\", \"Never\""
        );
        assert_eq!(out[1].reason, "FieldValueRequired");
    }
}
