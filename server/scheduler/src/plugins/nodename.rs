//! NodeName (Kubernetes' `plugins/nodename`): a pod that already names its node
//! (`spec.nodeName`) fits only that node.
//!
//! Such pods normally bypass the scheduler (the kubelet runs them directly); the filter
//! exists for pods that reach the queue anyway, and for preemption's dry runs.

use crate::framework::{Code, CycleState, FilterPlugin, NodeInfo, Plugin, PodInfo, Status};

/// The plugin's name, as in Kubernetes' profiles and FailedScheduling messages.
pub const NAME: &str = "NodeName";

/// Kubernetes' `nodename.ErrReason`, shown by `kubectl describe pod`.
pub const ERR_REASON: &str = "node(s) didn't match the requested node name";

/// The NodeName filter.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeName;

/// Whether `pod` may run on `node_info`: it names no node, or names this one.
pub fn fits(pod: &PodInfo, node_info: &NodeInfo) -> bool {
    let wanted = pod
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    wanted.is_empty() || wanted == node_info.name()
}

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl FilterPlugin for NodeName {
    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if fits(pod, node) {
            Status::success()
        } else {
            // Unresolvable: evicting pods from this node never changes its name.
            Status::new(Code::UnschedulableAndUnresolvable, NAME, ERR_REASON)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{node_info, pod_info};
    use serde_json::json;

    // Reference: Kubernetes nodename/node_name_test.go.
    #[test]
    fn filter_matches_requested_node() {
        let node = node_info(json!({"metadata": {"name": "foo"}}), &[]);
        let state = CycleState::default();
        let no_name = pod_info(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        assert!(NodeName.filter(&state, &no_name, &node).is_success());
        let same = pod_info(
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "foo", "containers": []}}),
        );
        assert!(NodeName.filter(&state, &same, &node).is_success());
        let other = pod_info(
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "bar", "containers": []}}),
        );
        let status = NodeName.filter(&state, &other, &node);
        assert_eq!(status.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(status.reasons, vec![ERR_REASON.to_string()]);
        assert_eq!(status.plugin, NAME);
    }
}
