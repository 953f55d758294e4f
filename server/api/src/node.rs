//! What several components read off a Node the same way.

use k8s_openapi::api::core::v1::Node;

/// A Node's `spec.podCIDRs`, or its lone `spec.podCIDR` when the list is empty (a Node
/// written before dual-stack, or by a client that sets only the singular field): what the
/// IPAM controller allocates and the kubelet configures the pod network from.
pub fn pod_cidrs(node: &Node) -> Vec<String> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    match (&spec.pod_cidrs, &spec.pod_cidr) {
        (Some(list), _) if !list.is_empty() => list.clone(),
        (_, Some(one)) if !one.is_empty() => vec![one.clone()],
        _ => Vec::new(),
    }
}
