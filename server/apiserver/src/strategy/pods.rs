//! Pods (`pkg/registry/core/pod/strategy.go`): a new pod starts `Pending` with its QoS class
//! (`PrepareForCreate`), and a pod bound to a node is deleted gracefully: it stays, marked,
//! until its kubelet has stopped its containers (`CheckGracefulDelete`).

use serde_json::Value;

use super::{Ctx, Strategy};

/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;

/// The Pod strategy.
pub struct Pods;

impl Strategy for Pods {
    fn prepare_for_create(&self, _ctx: &Ctx<'_>, object: &mut Value) {
        object["status"] = skerry_api::defaults::initial_pod_status(object);
    }

    /// Only pods bound to a node wait for their kubelet: Kubernetes deletes unscheduled and
    /// finished pods at once (grace 0). Otherwise the request's grace period, else the pod's
    /// own, else the default.
    fn check_graceful_delete(&self, object: &Value, options: &Value) -> Option<i64> {
        let bound = object
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let terminal = matches!(
            object.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        if !bound || terminal {
            return Some(0);
        }
        let requested = options.get("gracePeriodSeconds").and_then(Value::as_i64);
        let spec = object
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64);
        Some(
            requested
                .or(spec)
                .unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS)
                .max(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_a_running_bound_pod_waits_and_the_request_decides_how_long() {
        let options = json!({});
        let unbound = json!({"spec": {}});
        assert_eq!(Pods.check_graceful_delete(&unbound, &options), Some(0));
        let done = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}});
        assert_eq!(Pods.check_graceful_delete(&done, &options), Some(0));
        let running = json!({"spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 5}});
        assert_eq!(Pods.check_graceful_delete(&running, &options), Some(5));
        let now = json!({"gracePeriodSeconds": 0});
        assert_eq!(Pods.check_graceful_delete(&running, &now), Some(0));
        let defaulted = json!({"spec": {"nodeName": "n1"}});
        assert_eq!(
            Pods.check_graceful_delete(&defaulted, &options),
            Some(DEFAULT_TERMINATION_GRACE_SECONDS)
        );
    }
}
