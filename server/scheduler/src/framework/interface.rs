//! The plugin interfaces (Kubernetes' `framework/interface.go`), reduced to what skerry's
//! in-tree plugins use. SKELETON: fixed.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use super::types::{NodeInfo, PodInfo, Snapshot};

/// The highest score a Score plugin gives a node (after normalization).
pub const MAX_NODE_SCORE: i64 = 100;
/// The lowest.
pub const MIN_NODE_SCORE: i64 = 0;

/// Why a plugin said no (or could not answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Yes.
    Success,
    /// Not on this node, but preemption might help.
    Unschedulable,
    /// Not on this node, and preemption cannot help (e.g. node selector).
    UnschedulableAndUnresolvable,
    /// An internal error.
    Error,
    /// The plugin has nothing to say for this pod (skip its Filter/Score).
    Skip,
}

/// A plugin's answer: a code, the reasons (shown in FailedScheduling events), and the
/// plugin that gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The code.
    pub code: Code,
    /// Human-readable reasons, e.g. `Insufficient cpu`, `node(s) didn't match Pod's node
    /// affinity/selector`.
    pub reasons: Vec<String>,
    /// The plugin's name.
    pub plugin: &'static str,
}

impl Status {
    /// Success.
    pub fn success() -> Status {
        Status {
            code: Code::Success,
            reasons: Vec::new(),
            plugin: "",
        }
    }
    /// A status with one reason.
    pub fn new(code: Code, plugin: &'static str, reason: impl Into<String>) -> Status {
        Status {
            code,
            reasons: vec![reason.into()],
            plugin,
        }
    }
    /// Whether the code is Success.
    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }
    /// Whether the code is Skip.
    pub fn is_skip(&self) -> bool {
        self.code == Code::Skip
    }
    /// Whether the code is Unschedulable or UnschedulableAndUnresolvable.
    pub fn is_rejected(&self) -> bool {
        matches!(
            self.code,
            Code::Unschedulable | Code::UnschedulableAndUnresolvable
        )
    }
}

/// Per-cycle plugin data (PreFilter results used by Filter, PreScore results used by Score).
/// Cloning is cheap (values are shared), which preemption needs: it clones the state and
/// calls the PreFilter extensions' `add_pod` / `remove_pod` on the clone.
#[derive(Clone, Default)]
pub struct CycleState {
    data: HashMap<&'static str, Arc<dyn Any + Send + Sync>>,
}

impl CycleState {
    /// Stores `value` under `key` (one key per plugin and phase).
    pub fn write<T: Any + Send + Sync>(&mut self, key: &'static str, value: T) {
        self.data.insert(key, Arc::new(value));
    }
    /// Reads the value under `key` as a `T`.
    pub fn read<T: Any + Send + Sync>(&self, key: &'static str) -> Option<&T> {
        self.data.get(key)?.downcast_ref::<T>()
    }
    /// Replaces the value under `key` (copy-on-write for clones shared with preemption).
    pub fn read_mut<T: Any + Send + Sync + Clone>(&mut self, key: &'static str) -> Option<&mut T> {
        let arc = self.data.get_mut(key)?;
        if Arc::get_mut(arc).is_none() {
            let copy: T = arc.downcast_ref::<T>()?.clone();
            *arc = Arc::new(copy);
        }
        Arc::get_mut(arc)?.downcast_mut::<T>()
    }
}

/// Every plugin has a name (the one in `kubectl describe pod`'s FailedScheduling message).
pub trait Plugin: Send + Sync + 'static {
    /// E.g. `NodeResourcesFit`.
    fn name(&self) -> &'static str;
}

/// Computes per-pod state once per cycle, before Filter runs on each node.
pub trait PreFilterPlugin: Plugin {
    /// Precomputes for `pod`; a Skip status means the plugin's Filter is skipped for it.
    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot) -> Status;
    /// Preemption: `pod_to_add` is (hypothetically) added to `node`; update `state`.
    fn add_pod(
        &self,
        state: &mut CycleState,
        pod_to_schedule: &PodInfo,
        pod_to_add: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status {
        let _ = (state, pod_to_schedule, pod_to_add, node);
        Status::success()
    }
    /// Preemption: `pod_to_remove` is (hypothetically) removed from `node`; update `state`.
    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod_to_schedule: &PodInfo,
        pod_to_remove: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status {
        let _ = (state, pod_to_schedule, pod_to_remove, node);
        Status::success()
    }
}

/// Whether a pod fits on a node.
pub trait FilterPlugin: Plugin {
    /// Success if `pod` may run on `node`.
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status;
}

/// Computes per-pod state once per cycle before Score runs on each feasible node.
pub trait PreScorePlugin: Plugin {
    /// Precomputes for `pod` over the feasible `nodes`.
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status;
}

/// A node's score from one plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeScore {
    /// The node.
    pub name: String,
    /// Its score.
    pub score: i64,
}

/// Ranks feasible nodes.
pub trait ScorePlugin: Plugin {
    /// The raw score of `node` for `pod`.
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status>;
    /// Normalizes all nodes' raw scores into [MIN_NODE_SCORE, MAX_NODE_SCORE] if needed.
    fn normalize(&self, state: &CycleState, pod: &PodInfo, scores: &mut [NodeScore]) -> Status {
        let _ = (state, pod, scores);
        Status::success()
    }
    /// The plugin's weight in the total (Kubernetes' default profile weights).
    fn weight(&self) -> i64;
}
