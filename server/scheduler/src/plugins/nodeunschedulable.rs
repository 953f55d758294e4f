//! NodeUnschedulable (Kubernetes' `plugins/nodeunschedulable`): a cordoned node
//! (`spec.unschedulable: true`, `kubectl cordon`) takes no new pods, except pods that
//! tolerate the `node.kubernetes.io/unschedulable:NoSchedule` taint (DaemonSet pods get
//! that toleration automatically).

use k8s_openapi::api::core::v1::Taint;
use skerry_api::pod::taints::{
    TAINT_EFFECT_NO_SCHEDULE, tolerations_of, tolerations_tolerate_taint,
};

use crate::framework::{Code, CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, Status};

/// The plugin's name.
pub const NAME: &str = "NodeUnschedulable";

/// Kubernetes' `ErrReasonUnschedulable`.
pub const ERR_REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";

/// The taint key the node controller puts on cordoned nodes; tolerating it (with effect
/// `NoSchedule`) also tolerates `spec.unschedulable` (Kubernetes' `v1.TaintNodeUnschedulable`).
pub use skerry_api::pod::taints::TAINT_NODE_UNSCHEDULABLE;

/// The NodeUnschedulable filter.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeUnschedulable;

impl Plugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for NodeUnschedulable {
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(node_object) = node.node.as_ref() else {
            return Status::new(Code::Error, NAME, "node not found");
        };
        let unschedulable = node_object
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if !unschedulable {
            return Status::success();
        }
        let taint = Taint {
            key: TAINT_NODE_UNSCHEDULABLE.to_string(),
            effect: TAINT_EFFECT_NO_SCHEDULE.to_string(),
            value: None,
            time_added: None,
        };
        if tolerations_tolerate_taint(tolerations_of(&pod.pod), &taint) {
            return Status::success();
        }
        // Unresolvable: evicting pods does not uncordon the node.
        Status::new(
            Code::UnschedulableAndUnresolvable,
            NAME,
            ERR_REASON_UNSCHEDULABLE,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{node_info, pod_info};
    use serde_json::json;

    // Reference: Kubernetes nodeunschedulable/node_unschedulable_test.go.
    #[test]
    fn cordoned_node_rejects_pods_without_the_toleration() {
        let state = CycleState::default();
        let plain = pod_info(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        let tolerating = pod_info(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
            "tolerations": [{"key": TAINT_NODE_UNSCHEDULABLE, "operator": "Exists", "effect": "NoSchedule"}]}}));

        let schedulable = node_info(
            json!({"metadata": {"name": "n"}, "spec": {"unschedulable": false}}),
            &[],
        );
        assert!(
            NodeUnschedulable
                .filter(&state, &plain, &schedulable)
                .is_success()
        );
        let unset = node_info(json!({"metadata": {"name": "n"}}), &[]);
        assert!(
            NodeUnschedulable
                .filter(&state, &plain, &unset)
                .is_success()
        );

        let cordoned = node_info(
            json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}}),
            &[],
        );
        let status = NodeUnschedulable.filter(&state, &plain, &cordoned);
        assert_eq!(status.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(status.reasons, vec![ERR_REASON_UNSCHEDULABLE.to_string()]);
        assert!(
            NodeUnschedulable
                .filter(&state, &tolerating, &cordoned)
                .is_success()
        );
    }
}
