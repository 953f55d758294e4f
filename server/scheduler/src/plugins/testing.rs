//! Test helpers: pods, nodes and snapshots from JSON, and a score run as the framework does
//! it (PreScore, Score per node, Normalize).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::Value;

use crate::framework::{
    CycleState, NodeInfo, NodeScore, PodInfo, PreScorePlugin, ScorePlugin, Snapshot,
};

/// Gives each test pod without a UID a unique one (NodeInfo keys pods by UID).
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// A Pod from JSON; a missing `metadata.uid` is filled in.
pub fn pod(mut value: Value) -> Pod {
    if value["metadata"]["uid"].is_null() {
        value["metadata"]["uid"] =
            format!("test-uid-{}", NEXT_UID.fetch_add(1, Ordering::Relaxed)).into();
    }
    serde_json::from_value(value).expect("test pod JSON is a Pod")
}

/// A PodInfo from JSON.
pub fn pod_info(value: Value) -> PodInfo {
    PodInfo::new(Arc::new(pod(value)))
}

/// A NodeInfo for the node JSON with `pods` on it.
pub fn node_info(node: Value, pods: &[Value]) -> NodeInfo {
    let node: Node = serde_json::from_value(node).expect("test node JSON is a Node");
    let mut info = NodeInfo::new(Arc::new(node));
    for p in pods {
        info.add_pod(Arc::new(pod_info(p.clone())));
    }
    info
}

/// A snapshot holding `nodes`, in order.
pub fn snapshot(nodes: Vec<NodeInfo>) -> Snapshot {
    let list: Vec<Arc<NodeInfo>> = nodes.into_iter().map(Arc::new).collect();
    Snapshot {
        node_info_map: list
            .iter()
            .map(|n| (n.name().to_string(), n.clone()))
            .collect::<HashMap<_, _>>(),
        have_pods_with_affinity_list: list
            .iter()
            .filter(|n| !n.pods_with_affinity.is_empty())
            .cloned()
            .collect(),
        have_pods_with_required_anti_affinity_list: list
            .iter()
            .filter(|n| !n.pods_with_required_anti_affinity.is_empty())
            .cloned()
            .collect(),
        node_info_list: list,
        generation: 0,
    }
}

/// Runs PreScore over all `nodes`, then Score on each and Normalize, as the framework does
/// (a Skip from PreScore gives every node 0). Returns (node name, final score) in order.
pub fn score_nodes<P: PreScorePlugin + ScorePlugin>(
    plugin: &P,
    pod: &PodInfo,
    nodes: Vec<NodeInfo>,
) -> Vec<(String, i64)> {
    let snapshot = snapshot(nodes);
    let mut state = CycleState::default();
    let status = plugin.pre_score(&mut state, pod, &snapshot.node_info_list, &snapshot);
    let mut scores: Vec<NodeScore> = snapshot
        .node_info_list
        .iter()
        .map(|n| NodeScore {
            name: n.name().to_string(),
            score: if status.is_skip() {
                0
            } else {
                plugin.score(&state, pod, n).expect("score succeeds")
            },
        })
        .collect();
    if !status.is_skip() {
        let normalized = plugin.normalize(&state, pod, &mut scores);
        assert!(normalized.is_success(), "normalize failed: {normalized:?}");
    }
    scores.into_iter().map(|s| (s.name, s.score)).collect()
}

/// `[("node1", 10)]` as [`score_nodes`] returns it.
pub fn expected_scores(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    pairs.iter().map(|(n, s)| (n.to_string(), *s)).collect()
}
