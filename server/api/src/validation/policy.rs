//! PodDisruptionBudgets (policy/v1): a budget is either a floor (`minAvailable`) or a
//! ceiling on disruption (`maxUnavailable`), never both, each an integer or a percentage of
//! at most 100 %, over a valid label selector (Kubernetes 1.32
//! `pkg/apis/policy/validation`). The spec is mutable in policy/v1.

use serde_json::Value;

use super::{
    IS_NEGATIVE_MESSAGE, child, invalid, names, non_negative, not_supported, null,
    validate_label_selector,
};
use crate::Cause;

/// The `unhealthyPodEvictionPolicy` values (policy/v1 `UnhealthyPodEvictionPolicyType`),
/// sorted as Kubernetes' `sets.List()` prints them.
const UNHEALTHY_POD_EVICTION_POLICIES: &[&str] = &["AlwaysAllow", "IfHealthyBudget"];

/// The largest percentage a budget may name: a budget over more than every pod is
/// meaningless (apps validation `IsNotMoreThan100Percent`).
const PERCENT_MAX: u64 = 100;

pub(super) fn validate_pod_disruption_budget(
    obj: &Value,
    old: Option<&Value>,
    out: &mut Vec<Cause>,
) {
    let spec = obj.get("spec").unwrap_or(null());
    let present = |field: &str| spec.get(field).is_some_and(|v| !v.is_null());
    if present("minAvailable") && present("maxUnavailable") {
        out.push(invalid(
            "spec",
            spec,
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for field in ["minAvailable", "maxUnavailable"] {
        if let Some(value) = spec.get(field).filter(|v| !v.is_null()) {
            validate_positive_int_or_percent(value, &child("spec", field), out);
        }
    }
    if let Some(selector) = spec.get("selector").filter(|s| !s.is_null()) {
        validate_label_selector(selector, "spec.selector", out);
    }
    if let Some(policy) = spec
        .get("unhealthyPodEvictionPolicy")
        .filter(|p| !p.is_null())
        && !policy
            .as_str()
            .is_some_and(|p| UNHEALTHY_POD_EVICTION_POLICIES.contains(&p))
    {
        out.push(not_supported(
            "spec.unhealthyPodEvictionPolicy",
            policy,
            UNHEALTHY_POD_EVICTION_POLICIES,
        ));
    }
    // `ValidatePodDisruptionBudgetStatusUpdate`: a create's status is dropped, so only an
    // update (the disruption controller's status write) can carry one.
    if old.is_some() {
        let status = obj.get("status").unwrap_or(null());
        for field in [
            "disruptionsAllowed",
            "currentHealthy",
            "desiredHealthy",
            "expectedPods",
        ] {
            non_negative(status, field, "status", out);
        }
    }
}

/// apps validation `ValidatePositiveIntOrPercent` + `IsNotMoreThan100Percent`.
fn validate_positive_int_or_percent(value: &Value, path: &str, out: &mut Vec<Cause>) {
    match value {
        Value::String(s) => {
            let messages = names::percent(s);
            if messages.is_empty() {
                let percent = s
                    .strip_suffix('%')
                    .and_then(|digits| digits.parse::<u64>().ok());
                // Digits too many for u64 are certainly more than 100.
                if percent.is_none_or(|p| p > PERCENT_MAX) {
                    out.push(invalid(path, value, "must not be greater than 100%"));
                }
            }
            for message in messages {
                out.push(invalid(path, value, &message));
            }
        }
        Value::Number(n) if n.as_i64().is_some_and(|v| v < 0) => {
            out.push(invalid(path, value, IS_NEGATIVE_MESSAGE));
        }
        Value::Number(_) => {}
        other => out.push(invalid(
            path,
            other,
            "must be an integer or percentage (e.g '5%')",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(spec: Value) -> Vec<String> {
        let mut out = Vec::new();
        validate_pod_disruption_budget(&json!({"spec": spec}), None, &mut out);
        out.iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn a_budget_is_a_floor_or_a_ceiling() {
        assert!(
            check(json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}))
                .is_empty()
        );
        assert!(check(json!({"maxUnavailable": "25%", "selector": {}})).is_empty());
        assert!(check(json!({"minAvailable": 0})).is_empty());
        let both = check(json!({"minAvailable": 1, "maxUnavailable": 1}));
        assert_eq!(both.len(), 1, "{both:?}");
        assert!(
            both[0].ends_with("minAvailable and maxUnavailable cannot be both set"),
            "{both:?}"
        );
    }

    #[test]
    fn amounts_are_non_negative_integers_or_percentages_up_to_100() {
        assert_eq!(
            check(json!({"minAvailable": -1})),
            vec!["spec.minAvailable: Invalid value: -1: must be greater than or equal to 0"]
        );
        assert_eq!(
            check(json!({"maxUnavailable": "150%"})),
            vec!["spec.maxUnavailable: Invalid value: \"150%\": must not be greater than 100%"]
        );
        let bad = check(json!({"maxUnavailable": "half"}));
        assert_eq!(bad.len(), 1);
        assert!(
            bad[0].starts_with(
                "spec.maxUnavailable: Invalid value: \"half\": a valid percent string must be"
            ),
            "{bad:?}"
        );
        assert_eq!(
            check(json!({"minAvailable": true})),
            vec![
                "spec.minAvailable: Invalid value: true: must be an integer or percentage (e.g '5%')"
            ]
        );
    }

    #[test]
    fn selector_and_eviction_policy_are_checked() {
        let bad = check(json!({
            "minAvailable": 1,
            "selector": {"matchExpressions": [{"key": "app", "operator": "Near"}]},
            "unhealthyPodEvictionPolicy": "Sometimes",
        }));
        assert_eq!(
            bad,
            vec![
                "spec.selector.matchExpressions[0].operator: Invalid value: \"Near\": not a valid selector operator",
                "spec.unhealthyPodEvictionPolicy: Unsupported value: \"Sometimes\": supported values: \"AlwaysAllow\", \"IfHealthyBudget\"",
            ]
        );
    }

    #[test]
    fn status_counts_are_non_negative_on_update() {
        let old = json!({"spec": {"minAvailable": 1}});
        let new = json!({"spec": {"minAvailable": 1}, "status": {"disruptionsAllowed": -1, "currentHealthy": 2}});
        let mut out = Vec::new();
        validate_pod_disruption_budget(&new, Some(&old), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].field, "status.disruptionsAllowed");
    }
}
