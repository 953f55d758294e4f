//! Leases (coordination.k8s.io): durations positive, transition counts non-negative.

use serde_json::Value;

use super::{IS_NEGATIVE_MESSAGE, invalid, null};
use crate::Cause;

pub(super) fn validate_lease(obj: &Value, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    if let Some(seconds) = spec.get("leaseDurationSeconds").and_then(Value::as_i64)
        && seconds <= 0
    {
        out.push(invalid(
            "spec.leaseDurationSeconds",
            &Value::from(seconds),
            "must be greater than 0",
        ));
    }
    if let Some(transitions) = spec.get("leaseTransitions").and_then(Value::as_i64)
        && transitions < 0
    {
        out.push(invalid(
            "spec.leaseTransitions",
            &Value::from(transitions),
            IS_NEGATIVE_MESSAGE,
        ));
    }
    let preferred = spec
        .get("preferredHolder")
        .and_then(Value::as_str)
        .unwrap_or("");
    let strategy = spec.get("strategy").and_then(Value::as_str).unwrap_or("");
    if !preferred.is_empty() && strategy.is_empty() {
        out.push(super::forbidden(
            "spec.preferredHolder",
            "may only be specified if `strategy` is defined",
        ));
    }
}
