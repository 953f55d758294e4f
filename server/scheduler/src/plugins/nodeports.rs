//! NodePorts (Kubernetes' `plugins/nodeports`): a pod asking for host ports fits only a node
//! where none of them is taken, by (ip, protocol, port), with `0.0.0.0` conflicting with
//! every address.
//!
//! PreFilter collects the pod's host ports once; a pod without any is skipped (its Filter
//! never runs), which is most pods. The port bookkeeping and the conflict rule
//! (Kubernetes' `HostPortInfo.CheckConflict`) live with the NodeInfo
//! ([`crate::framework::host_port_conflicts`]) so the cache and this filter agree on them.

use k8s_openapi::api::core::v1::Pod;

use super::helper::skip;

use crate::framework::{
    Code, CycleState, FilterPlugin, HostPort, NodeInfo, Plugin, PodInfo, PreFilterPlugin, Snapshot,
    Status, host_ports,
};

/// The plugin's name.
pub const NAME: &str = "NodePorts";

/// Kubernetes' `nodeports.ErrReason`.
pub const ERR_REASON: &str = "node(s) didn't have free ports for the requested pod ports";

/// CycleState key of the PreFilter result.
const PRE_FILTER_STATE_KEY: &str = "PreFilterNodePorts";

/// The NodePorts filter.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodePorts;

/// The pod's wanted host ports, normalized, computed once per cycle in PreFilter.
#[derive(Clone, Debug)]
struct PreFilterState(Vec<HostPort>);

/// Whether every host port of `pod` is free on `node` (no CycleState needed; for preemption
/// and queueing hints).
pub fn fits(pod: &Pod, node: &NodeInfo) -> bool {
    host_ports(pod)
        .iter()
        .all(|port| !node.host_port_conflicts(port))
}

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for NodePorts {
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, _snapshot: &Snapshot) -> Status {
        // Ports of app containers and sidecars, as the cache counts them on nodes
        // (`NodeInfo::used_ports`), with Kubernetes' empty-IP / empty-protocol defaults.
        let ports = host_ports(&pod.pod);
        if ports.is_empty() {
            return skip(NAME);
        }
        state.write(PRE_FILTER_STATE_KEY, PreFilterState(ports));
        Status::success()
    }
}

impl FilterPlugin for NodePorts {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let conflict = match state.read::<PreFilterState>(PRE_FILTER_STATE_KEY) {
            Some(PreFilterState(ports)) => ports.iter().any(|p| node.host_port_conflicts(p)),
            // PreFilter did not run (or skipped: then there is nothing to check).
            None => !fits(&pod.pod, node),
        };
        if conflict {
            // Resolvable: evicting the pod holding the port frees it.
            return Status::new(Code::Unschedulable, NAME, ERR_REASON);
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{node_info, pod_info, snapshot};
    use serde_json::{Value, json};

    fn pod_with_ports(ports: &[(&str, &str, i32)]) -> Value {
        let ports: Vec<Value> = ports
            .iter()
            .map(|(ip, protocol, port)| {
                json!({"containerPort": 8080, "hostIP": ip, "protocol": protocol, "hostPort": port})
            })
            .collect();
        json!({"metadata": {"name": "p", "uid": format!("uid-{ports:?}")},
               "spec": {"containers": [{"name": "c", "ports": ports}]}})
    }

    fn run(incoming: &[(&str, &str, i32)], existing: &[(&str, &str, i32)]) -> Status {
        let node = node_info(
            json!({"metadata": {"name": "n"}}),
            &[pod_with_ports(existing)],
        );
        let pod = pod_info(pod_with_ports(incoming));
        let mut state = CycleState::default();
        let pre = NodePorts.pre_filter(&mut state, &pod, &snapshot(vec![]));
        if pre.is_skip() {
            return Status::success();
        }
        NodePorts.filter(&state, &pod, &node)
    }

    #[test]
    fn pod_without_host_ports_is_skipped() {
        let pod = pod_info(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "ports": [{"containerPort": 80}]}]}}));
        let mut state = CycleState::default();
        assert!(
            NodePorts
                .pre_filter(&mut state, &pod, &snapshot(vec![]))
                .is_skip()
        );
    }

    // Reference: Kubernetes nodeports/node_ports_test.go TestNodePorts.
    #[test]
    fn conflicts_follow_ip_protocol_and_wildcard_rules() {
        // Same (ip, protocol, port) conflicts.
        let status = run(&[("127.0.0.1", "UDP", 8080)], &[("127.0.0.1", "UDP", 8080)]);
        assert_eq!(status.code, Code::Unschedulable);
        assert_eq!(status.reasons, vec![ERR_REASON.to_string()]);
        // Different port, protocol or address: no conflict.
        assert!(run(&[("127.0.0.1", "UDP", 8080)], &[("127.0.0.1", "UDP", 9090)]).is_success());
        assert!(run(&[("127.0.0.1", "TCP", 8080)], &[("127.0.0.1", "UDP", 8080)]).is_success());
        assert!(run(&[("127.0.0.2", "UDP", 8080)], &[("127.0.0.1", "UDP", 8080)]).is_success());
        // 0.0.0.0 on either side conflicts with any address.
        assert!(!run(&[("0.0.0.0", "TCP", 8001)], &[("127.0.0.1", "TCP", 8001)]).is_success());
        assert!(!run(&[("10.0.10.10", "TCP", 8001)], &[("0.0.0.0", "TCP", 8001)]).is_success());
        // Empty hostIP means 0.0.0.0, empty protocol means TCP.
        assert!(!run(&[("", "", 8001)], &[("127.0.0.1", "TCP", 8001)]).is_success());
        assert!(run(&[("", "UDP", 8001)], &[("127.0.0.1", "TCP", 8001)]).is_success());
    }

    #[test]
    fn sidecar_ports_count_plain_init_container_ports_do_not() {
        let node = node_info(
            json!({"metadata": {"name": "n"}}),
            &[pod_with_ports(&[("", "TCP", 9000)])],
        );
        let with_init = |restart_policy: Option<&str>| {
            let mut init =
                json!({"name": "init", "ports": [{"containerPort": 1, "hostPort": 9000}]});
            if let Some(policy) = restart_policy {
                init["restartPolicy"] = json!(policy);
            }
            pod_info(json!({"metadata": {"name": "p"}, "spec": {
                "initContainers": [init], "containers": [{"name": "c"}]}}))
        };
        let mut state = CycleState::default();
        let sidecar = with_init(Some("Always"));
        assert!(
            NodePorts
                .pre_filter(&mut state, &sidecar, &snapshot(vec![]))
                .is_success()
        );
        assert_eq!(
            NodePorts.filter(&state, &sidecar, &node).code,
            Code::Unschedulable
        );
        let mut state = CycleState::default();
        assert!(
            NodePorts
                .pre_filter(&mut state, &with_init(None), &snapshot(vec![]))
                .is_skip()
        );
    }
}
