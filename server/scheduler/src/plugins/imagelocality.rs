//! ImageLocality (Kubernetes' `plugins/imagelocality`): prefer nodes that already hold the
//! pod's container images, weighted by image size and scaled down by how many nodes have
//! the image, so one popular image does not pile every pod onto the few nodes that pulled
//! it first (the "node heating" problem).
//!
//! Score per node = `MAX_NODE_SCORE * (clamp(sum) - MIN) / (MAX * containers - MIN)` where
//! `sum` adds, for each container (init and regular) whose image is on the node,
//! `size * nodes_with_image / total_nodes`. The thresholds make small images (< 23 MiB)
//! count for nothing and cap each container's contribution at 1000 MiB.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::IMAGE_LOCALITY_WEIGHT;
use crate::framework::{
    Code, CycleState, ImageStateSummary, MAX_NODE_SCORE, NodeInfo, Plugin, PodInfo, PreScorePlugin,
    ScorePlugin, Snapshot, Status,
};

/// The plugin's name.
pub const NAME: &str = "ImageLocality";

/// One mebibyte (Kubernetes' `mb`, which is 1024 * 1024).
const MIB: i64 = 1024 * 1024;
/// Images smaller than this score nothing: pulling them is cheap, and counting them would
/// let tiny images decide placement (Kubernetes' `minThreshold`, 23 MB).
pub const MIN_THRESHOLD_BYTES: i64 = 23 * MIB;
/// The most one container's image can add: past 1000 MB the pull cost no longer
/// differentiates nodes (Kubernetes' `maxContainerThreshold`).
pub const MAX_CONTAINER_THRESHOLD_BYTES: i64 = 1000 * MIB;

/// CycleState key of the PreScore result (the snapshot's node count).
const PRE_SCORE_STATE_KEY: &str = "PreScoreImageLocality";

/// The ImageLocality score.
#[derive(Clone, Copy, Debug)]
pub struct ImageLocality {
    /// The score's weight in the profile.
    pub weight: i64,
}

impl Default for ImageLocality {
    fn default() -> Self {
        ImageLocality {
            weight: IMAGE_LOCALITY_WEIGHT,
        }
    }
}

/// Computed once per cycle in PreScore: the snapshot's node count (the spread denominator;
/// Kubernetes' Score reads it from the snapshot lister, ours sees only the node) and the
/// pod's normalized image names (so Score does not rebuild strings per node).
#[derive(Clone, Debug)]
struct PreScoreState {
    total_nodes: usize,
    images: Vec<String>,
}

/// The image name as the CRI reports it: a name without a tag gets `:latest` (Kubernetes'
/// `normalizedImageName`; a `:` before the last `/` is a registry port, not a tag).
pub fn normalized_image_name(name: &str) -> String {
    // `None < Some(_)`, as Go's -1 for "not found".
    if name.rfind(':') <= name.rfind('/') {
        format!("{name}:latest")
    } else {
        name.to_string()
    }
}

/// The image's size scaled by the fraction of nodes that have it.
fn scaled_image_score(state: &ImageStateSummary, total_nodes: usize) -> i64 {
    if total_nodes == 0 {
        return 0;
    }
    let spread = state.num_nodes as f64 / total_nodes as f64;
    (state.size as f64 * spread) as i64
}

fn container_images(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec.iter().flat_map(|spec| {
        spec.init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .map(|c| c.image.as_deref().unwrap_or_default())
    })
}

fn sum_image_scores(node: &NodeInfo, images: &[String], total_nodes: usize) -> i64 {
    if node.image_states.is_empty() {
        return 0;
    }
    images
        .iter()
        .filter_map(|image| node.image_states.get(image))
        .map(|state| scaled_image_score(state, total_nodes))
        .sum()
}

/// Maps the summed image bytes to [0, MAX_NODE_SCORE] (Kubernetes' `calculatePriority`).
fn calculate_priority(sum_scores: i64, num_containers: usize) -> i64 {
    let containers = i64::try_from(num_containers).unwrap_or(i64::MAX).max(1);
    let max_threshold = MAX_CONTAINER_THRESHOLD_BYTES.saturating_mul(containers);
    let clamped = sum_scores.clamp(MIN_THRESHOLD_BYTES, max_threshold);
    MAX_NODE_SCORE * (clamped - MIN_THRESHOLD_BYTES) / (max_threshold - MIN_THRESHOLD_BYTES)
}

impl Plugin for ImageLocality {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreScorePlugin for ImageLocality {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status {
        state.write(
            PRE_SCORE_STATE_KEY,
            PreScoreState {
                total_nodes: snapshot.num_nodes(),
                images: container_images(&pod.pod)
                    .map(normalized_image_name)
                    .collect(),
            },
        );
        Status::success()
    }
}

impl ScorePlugin for ImageLocality {
    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let Some(pre_score) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Err(Status::new(
                Code::Error,
                NAME,
                format!("reading {PRE_SCORE_STATE_KEY:?} from cycleState: not found"),
            ));
        };
        Ok(calculate_priority(
            sum_image_scores(node, &pre_score.images, pre_score.total_nodes),
            pre_score.images.len(),
        ))
    }

    fn weight(&self) -> i64 {
        self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{expected_scores, pod_info, score_nodes};
    use serde_json::json;
    use std::collections::HashMap;

    const MB: i64 = MIB;

    fn node(name: &str, images: &[(&str, i64, usize)]) -> NodeInfo {
        let mut info = crate::plugins::testing::node_info(json!({"metadata": {"name": name}}), &[]);
        info.image_states = images
            .iter()
            .map(|(image, size, num_nodes)| {
                (
                    image.to_string(),
                    ImageStateSummary {
                        size: *size,
                        num_nodes: *num_nodes,
                    },
                )
            })
            .collect::<HashMap<_, _>>();
        info
    }

    #[test]
    fn image_names_get_latest_unless_tagged() {
        assert_eq!(normalized_image_name("nginx"), "nginx:latest");
        assert_eq!(normalized_image_name("nginx:1.2"), "nginx:1.2");
        assert_eq!(
            normalized_image_name("registry:5000/nginx"),
            "registry:5000/nginx:latest"
        );
        assert_eq!(
            normalized_image_name("registry:5000/nginx:v1"),
            "registry:5000/nginx:v1"
        );
    }

    // Reference: Kubernetes imagelocality/image_locality_test.go "two images spread on two
    // nodes, prefer the larger image one": node1 has img/40 (40 MB) and img/300
    // (300 MB, elsewhere too), node2 has img/250 (250 MB); the pod wants 40 and 300.
    //   node1: 40 MB * 1/2 + 300 MB * 2/2 = 320 MB → 100 * (320 - 23) / (2000 - 23) = 15
    //   node2: 250 MB is not wanted → 0
    #[test]
    fn scores_by_size_and_spread() {
        let p = pod_info(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "img/40"}, {"name": "b", "image": "img/300"}]}}));
        let nodes = vec![
            node(
                "node1",
                &[
                    ("img/40:latest", 40 * MB, 1),
                    ("img/300:latest", 300 * MB, 2),
                ],
            ),
            node(
                "node2",
                &[
                    ("img/300:latest", 300 * MB, 2),
                    ("img/250:latest", 250 * MB, 1),
                ],
            ),
        ];
        let scores = score_nodes(&ImageLocality::default(), &p, nodes);
        // node2: 300 MB * 2/2 = 300 MB → 100 * (300 - 23) / (2000 - 23) = 14.
        assert_eq!(scores, expected_scores(&[("node1", 15), ("node2", 14)]));
    }

    #[test]
    fn thresholds_clamp() {
        // Below 23 MB: nothing; above 1000 MB per container: capped at 100.
        assert_eq!(calculate_priority(10 * MB, 1), 0);
        assert_eq!(calculate_priority(5000 * MB, 1), 100);
        assert_eq!(calculate_priority(1000 * MB, 2), 49);
        // No containers: treated as one, no division by zero.
        assert_eq!(calculate_priority(0, 0), 0);
    }
}
