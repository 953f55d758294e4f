//! The framework runtime: runs a profile's plugin lists at each extension point, in order
//! (Kubernetes' `framework/runtime/framework.go`), and the diagnosis of a failed cycle
//! ([`Diagnosis`], [`FitError`], whose message is the one `kubectl describe pod` shows).
//!
//! Invariants the runners keep, as Kubernetes':
//! - A PreFilter plugin answering Skip has its Filter skipped for this pod; a PreScore
//!   plugin answering Skip has its Score skipped. The skip sets live in the [`CycleState`],
//!   so preemption's clones of the state see them too.
//! - Filter stops at the first plugin that rejects a node: one status per node, naming the
//!   plugin, so a FitError counts each node once per reason of that plugin.
//! - Scores are normalized per plugin, must land in `[MIN_NODE_SCORE, MAX_NODE_SCORE]`, and
//!   are then multiplied by the plugin's weight and summed.
//! - With nominated pods (pods that preempted and wait for their victims to leave), Filter
//!   runs twice ("run filters with nominated pods"): once as if the nominated pods of equal or
//!   higher priority were already on the node, and, if that passes, once without them, so
//!   the answer holds whether or not they arrive.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use super::interface::{
    Code, CycleState, FilterPlugin, MAX_NODE_SCORE, MIN_NODE_SCORE, NodeScore, PreFilterPlugin,
    PreScorePlugin, ScorePlugin, Status,
};
use super::types::{NodeInfo, PodInfo, Snapshot};

/// The CycleState key of the PreFilter plugins that answered Skip (their Filter is skipped).
pub const SKIP_FILTER_PLUGINS_KEY: &str = "framework/skip-filter-plugins";
/// The CycleState key of the PreScore plugins that answered Skip (their Score is skipped).
pub const SKIP_SCORE_PLUGINS_KEY: &str = "framework/skip-score-plugins";

/// Kubernetes' `NoNodeAvailableMsg`: how every FitError message starts.
pub const NO_NODE_AVAILABLE_MSG: &str = "nodes are available";

/// Plugin names that answered Skip at one extension point.
type SkipSet = HashSet<&'static str>;

/// A pod's priority (`spec.priority`, 0 when unset, as Kubernetes' `corev1helpers.PodPriority`).
pub fn pod_priority(pod: &PodInfo) -> i32 {
    pod.pod
        .spec
        .as_ref()
        .and_then(|spec| spec.priority)
        .unwrap_or(0)
}

/// A pod's UID ("" if unset).
fn pod_uid(pod: &PodInfo) -> &str {
    pod.pod.metadata.uid.as_deref().unwrap_or_default()
}

/// What the PreFilter phase decided.
#[derive(Clone, Debug)]
pub struct PreFilterOutcome {
    /// Success, a rejection (naming the plugin), or an error.
    pub status: Status,
    /// The plugins that rejected the pod (empty on success).
    pub unschedulable_plugins: Vec<&'static str>,
}

/// A node's total score, the weighted sum over the Score plugins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePluginScores {
    /// The node.
    pub name: String,
    /// Σ weight × normalized score.
    pub total_score: i64,
}

/// One scheduling profile: its plugins at each extension point, in the order they run.
#[derive(Clone)]
pub struct Framework {
    profile_name: String,
    pre_filter: Vec<Arc<dyn PreFilterPlugin>>,
    filter: Vec<Arc<dyn FilterPlugin>>,
    pre_score: Vec<Arc<dyn PreScorePlugin>>,
    score: Vec<Arc<dyn ScorePlugin>>,
}

impl fmt::Debug for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |v: Vec<&'static str>| v.join(",");
        f.debug_struct("Framework")
            .field("profile", &self.profile_name)
            .field(
                "pre_filter",
                &names(self.pre_filter.iter().map(|p| p.name()).collect()),
            )
            .field(
                "filter",
                &names(self.filter.iter().map(|p| p.name()).collect()),
            )
            .field(
                "pre_score",
                &names(self.pre_score.iter().map(|p| p.name()).collect()),
            )
            .field(
                "score",
                &names(self.score.iter().map(|p| p.name()).collect()),
            )
            .finish()
    }
}

impl Framework {
    /// A profile named `profile_name` (`default-scheduler`) running these plugins in order.
    pub fn new(
        profile_name: &str,
        pre_filter: Vec<Arc<dyn PreFilterPlugin>>,
        filter: Vec<Arc<dyn FilterPlugin>>,
        pre_score: Vec<Arc<dyn PreScorePlugin>>,
        score: Vec<Arc<dyn ScorePlugin>>,
    ) -> Framework {
        Framework {
            profile_name: profile_name.to_string(),
            pre_filter,
            filter,
            pre_score,
            score,
        }
    }

    /// The profile's name (the `profile` label of the metrics).
    pub fn profile_name(&self) -> &str {
        &self.profile_name
    }
    /// The PreFilter plugins, in order.
    pub fn pre_filter_plugins(&self) -> &[Arc<dyn PreFilterPlugin>] {
        &self.pre_filter
    }
    /// The Filter plugins, in order.
    pub fn filter_plugins(&self) -> &[Arc<dyn FilterPlugin>] {
        &self.filter
    }
    /// Whether any Score plugin is configured (without one, the first feasible node wins).
    pub fn has_score_plugins(&self) -> bool {
        !self.score.is_empty()
    }
    /// Whether any Filter plugin is configured.
    pub fn has_filter_plugins(&self) -> bool {
        !self.filter.is_empty()
    }

    /// Runs every PreFilter plugin (Kubernetes' `RunPreFilterPlugins`). An
    /// UnschedulableAndUnresolvable answer stops at once (preemption cannot help); an
    /// Unschedulable one lets the rest run, so their state is there for preemption; an error
    /// stops at once. Skips are recorded in `state`.
    pub fn run_pre_filter_plugins(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> PreFilterOutcome {
        let mut skip = SkipSet::new();
        let mut rejected: Option<Status> = None;
        let mut unschedulable_plugins = Vec::new();
        for plugin in &self.pre_filter {
            let mut status = plugin.pre_filter(state, pod, snapshot);
            if status.is_skip() {
                skip.insert(plugin.name());
                continue;
            }
            if status.is_success() {
                continue;
            }
            status.plugin = plugin.name();
            match status.code {
                Code::UnschedulableAndUnresolvable => {
                    state.write(SKIP_FILTER_PLUGINS_KEY, skip);
                    return PreFilterOutcome {
                        status,
                        unschedulable_plugins: vec![plugin.name()],
                    };
                }
                Code::Unschedulable => {
                    unschedulable_plugins.push(plugin.name());
                    rejected.get_or_insert(status);
                }
                _ => {
                    state.write(SKIP_FILTER_PLUGINS_KEY, skip);
                    return PreFilterOutcome {
                        status: error_status(
                            plugin.name(),
                            format!(
                                "running PreFilter plugin {:?}: {}",
                                plugin.name(),
                                status.reasons.join(", ")
                            ),
                        ),
                        unschedulable_plugins: Vec::new(),
                    };
                }
            }
        }
        state.write(SKIP_FILTER_PLUGINS_KEY, skip);
        PreFilterOutcome {
            status: rejected.unwrap_or_else(Status::success),
            unschedulable_plugins,
        }
    }

    /// Tells each (non-skipped) PreFilter plugin that `pod_to_add` is hypothetically on
    /// `node` (Kubernetes' `RunPreFilterExtensionAddPod`), for nominated pods and preemption.
    pub fn run_pre_filter_extension_add_pod(
        &self,
        state: &mut CycleState,
        pod_to_schedule: &PodInfo,
        pod_to_add: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status {
        self.run_pre_filter_extension(state, "AddPod", |plugin, state| {
            plugin.add_pod(state, pod_to_schedule, pod_to_add, node)
        })
    }

    /// Tells each (non-skipped) PreFilter plugin that `pod_to_remove` is hypothetically gone
    /// from `node` (Kubernetes' `RunPreFilterExtensionRemovePod`), for preemption.
    pub fn run_pre_filter_extension_remove_pod(
        &self,
        state: &mut CycleState,
        pod_to_schedule: &PodInfo,
        pod_to_remove: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status {
        self.run_pre_filter_extension(state, "RemovePod", |plugin, state| {
            plugin.remove_pod(state, pod_to_schedule, pod_to_remove, node)
        })
    }

    /// Runs `extension` (`AddPod` or `RemovePod`) on every PreFilter plugin whose PreFilter
    /// did not answer Skip; the first failure is an error naming the plugin.
    fn run_pre_filter_extension(
        &self,
        state: &mut CycleState,
        extension: &str,
        mut call: impl FnMut(&dyn PreFilterPlugin, &mut CycleState) -> Status,
    ) -> Status {
        let skip = state.read::<SkipSet>(SKIP_FILTER_PLUGINS_KEY);
        let active: Vec<&Arc<dyn PreFilterPlugin>> = self
            .pre_filter
            .iter()
            .filter(|plugin| !skip.is_some_and(|s| s.contains(plugin.name())))
            .collect();
        for plugin in active {
            let status = call(plugin.as_ref(), state);
            if !status.is_success() {
                return error_status(
                    plugin.name(),
                    format!(
                        "running {extension} on PreFilter plugin {:?}: {}",
                        plugin.name(),
                        status.reasons.join(", ")
                    ),
                );
            }
        }
        Status::success()
    }

    /// Runs the Filter plugins on one node until one rejects it (Kubernetes'
    /// `RunFilterPlugins`). The status names the rejecting plugin.
    pub fn run_filter_plugins(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let skip = state.read::<SkipSet>(SKIP_FILTER_PLUGINS_KEY);
        let active = self
            .filter
            .iter()
            .filter(|plugin| !skip.is_some_and(|s| s.contains(plugin.name())));
        run_filters(active, state, pod, node)
    }

    /// The Filter plugins that run for this cycle's pod: all but those whose PreFilter
    /// answered Skip. The scheduling cycle resolves them once and hands them to
    /// [`Framework::run_active_filter_plugins`] for every node, so the per-node walk neither
    /// looks the skip set up in the CycleState nor compares plugin names.
    pub fn active_filter_plugins(&self, state: &CycleState) -> Vec<&Arc<dyn FilterPlugin>> {
        let skip = state.read::<SkipSet>(SKIP_FILTER_PLUGINS_KEY);
        self.filter
            .iter()
            .filter(|plugin| !skip.is_some_and(|s| s.contains(plugin.name())))
            .collect()
    }

    /// [`Framework::run_filter_plugins`] with the plugins already resolved by
    /// [`Framework::active_filter_plugins`] for the same `state`.
    pub fn run_active_filter_plugins(
        &self,
        active: &[&Arc<dyn FilterPlugin>],
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
    ) -> Status {
        run_filters(active.iter().copied(), state, pod, node)
    }

    /// Filter with nominated pods (Kubernetes' `RunFilterPluginsWithNominatedPods`):
    /// `nominated` are the pods nominated to this node; those of equal or higher priority than
    /// `pod` (and not `pod` itself) are added to a copy of the node and of the state for a
    /// first pass. If they were added and the first pass succeeds, a second pass runs without
    /// them. The first pass keeps `pod` from taking room freed for more important pods; the
    /// second keeps filters such as pod affinity from passing only thanks to pods that may
    /// never arrive.
    pub fn run_filter_plugins_with_nominated_pods(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &Arc<NodeInfo>,
        nominated: &[Arc<PodInfo>],
    ) -> Status {
        let priority = pod_priority(pod);
        let uid = pod_uid(pod);
        let higher: Vec<&Arc<PodInfo>> = nominated
            .iter()
            .filter(|p| pod_priority(p) >= priority && pod_uid(p) != uid)
            .collect();
        if higher.is_empty() {
            return self.run_filter_plugins(state, pod, node);
        }
        let mut node_with_nominated: NodeInfo = (**node).clone();
        let mut state_with_nominated = state.clone();
        for nominated_pod in higher {
            node_with_nominated.add_pod((*nominated_pod).clone());
            let status = self.run_pre_filter_extension_add_pod(
                &mut state_with_nominated,
                pod,
                nominated_pod,
                &node_with_nominated,
            );
            if !status.is_success() {
                return status;
            }
        }
        let first = self.run_filter_plugins(&state_with_nominated, pod, &node_with_nominated);
        if !first.is_success() {
            return first;
        }
        self.run_filter_plugins(state, pod, node)
    }

    /// Runs every PreScore plugin over the feasible nodes; Skips are recorded in `state`.
    pub fn run_pre_score_plugins(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status {
        let mut skip = SkipSet::new();
        for plugin in &self.pre_score {
            let status = plugin.pre_score(state, pod, nodes, snapshot);
            if status.is_skip() {
                skip.insert(plugin.name());
                continue;
            }
            if !status.is_success() {
                state.write(SKIP_SCORE_PLUGINS_KEY, skip);
                return error_status(
                    plugin.name(),
                    format!(
                        "running PreScore plugin {:?}: {}",
                        plugin.name(),
                        status.reasons.join(", ")
                    ),
                );
            }
        }
        state.write(SKIP_SCORE_PLUGINS_KEY, skip);
        Status::success()
    }

    /// Scores the feasible nodes (Kubernetes' `RunScorePlugins`): each non-skipped plugin's
    /// raw scores, normalized, checked to lie in `[MIN_NODE_SCORE, MAX_NODE_SCORE]`, times its
    /// weight, summed per node. The result is in `nodes`' order.
    pub fn run_score_plugins(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
    ) -> Result<Vec<NodePluginScores>, Status> {
        let skip = state.read::<SkipSet>(SKIP_SCORE_PLUGINS_KEY);
        let mut totals: Vec<i64> = vec![0; nodes.len()];
        // One list of (name, score) for all plugins: each plugin overwrites the scores, so
        // each node's name is copied once per cycle, not once per plugin.
        let mut scores: Vec<NodeScore> = nodes
            .iter()
            .map(|n| NodeScore {
                name: n.name().to_string(),
                score: 0,
            })
            .collect();
        for plugin in &self.score {
            if skip.is_some_and(|s| s.contains(plugin.name())) {
                continue;
            }
            for (node, slot) in nodes.iter().zip(scores.iter_mut()) {
                slot.score = plugin.score(state, pod, node).map_err(|status| {
                    error_status(
                        plugin.name(),
                        format!(
                            "running Score plugin {:?} on node {:?}: {}",
                            plugin.name(),
                            node.name(),
                            status.reasons.join(", ")
                        ),
                    )
                })?;
            }
            let status = plugin.normalize(state, pod, &mut scores);
            if !status.is_success() {
                return Err(error_status(
                    plugin.name(),
                    format!(
                        "running Normalize on Score plugin {:?}: {}",
                        plugin.name(),
                        status.reasons.join(", ")
                    ),
                ));
            }
            let weight = plugin.weight();
            for (total, score) in totals.iter_mut().zip(&scores) {
                if !(MIN_NODE_SCORE..=MAX_NODE_SCORE).contains(&score.score) {
                    return Err(error_status(
                        plugin.name(),
                        format!(
                            "plugin {:?} returns an invalid score {}, it should in the range of \
                             [{MIN_NODE_SCORE}, {MAX_NODE_SCORE}] after normalizing",
                            plugin.name(),
                            score.score
                        ),
                    ));
                }
                *total += score.score * weight;
            }
        }
        let totals = scores
            .into_iter()
            .zip(totals)
            .map(|(score, total_score)| NodePluginScores {
                name: score.name,
                total_score,
            })
            .collect();
        Ok(totals)
    }
}

/// An Error status from `plugin`.
/// The body of Kubernetes' `RunFilterPlugins` over the given plugins: the first rejection
/// wins and names its plugin; an error is reported as such.
fn run_filters<'a>(
    plugins: impl Iterator<Item = &'a Arc<dyn FilterPlugin>>,
    state: &CycleState,
    pod: &PodInfo,
    node: &NodeInfo,
) -> Status {
    for plugin in plugins {
        let mut status = plugin.filter(state, pod, node);
        if status.is_success() || status.is_skip() {
            continue;
        }
        if status.is_rejected() {
            status.plugin = plugin.name();
            return status;
        }
        return error_status(
            plugin.name(),
            format!(
                "running {:?} filter plugin: {}",
                plugin.name(),
                status.reasons.join(", ")
            ),
        );
    }
    Status::success()
}

fn error_status(plugin: &'static str, message: String) -> Status {
    Status {
        code: Code::Error,
        reasons: vec![message],
        plugin,
    }
}

/// Why a pod fits nowhere (Kubernetes' `framework.Diagnosis`).
#[derive(Clone, Debug, Default)]
pub struct Diagnosis {
    /// The status of each node Filter rejected.
    pub node_to_status: HashMap<String, Status>,
    /// The status of every node not in `node_to_status`: set when PreFilter rejected the pod
    /// (every node gets the same answer) or narrowed the nodes.
    pub absent_nodes_status: Option<Status>,
    /// The plugins that rejected the pod, for the queue's requeueing on cluster events.
    pub unschedulable_plugins: Vec<&'static str>,
    /// A PreFilter rejection's message (then the per-node reasons are not repeated).
    pub pre_filter_msg: Option<String>,
    /// What PostFilter (preemption) said.
    pub post_filter_msg: Option<String>,
}

impl Diagnosis {
    /// Records a rejection's plugin (Kubernetes' `AddPluginStatus`).
    pub fn add_plugin_status(&mut self, status: &Status) {
        if status.plugin.is_empty() || !status.is_rejected() {
            return;
        }
        if !self.unschedulable_plugins.contains(&status.plugin) {
            self.unschedulable_plugins.push(status.plugin);
        }
    }

    /// The status of `node`: its own, else the absent-nodes status.
    pub fn status_of(&self, node: &str) -> Option<&Status> {
        self.node_to_status
            .get(node)
            .or(self.absent_nodes_status.as_ref())
    }
}

/// No node fits the pod (Kubernetes' `framework.FitError`). Its `Display` is the
/// FailedScheduling message: `0/5 nodes are available: 3 Insufficient cpu, 2 node(s) had
/// untolerated taint {k: v}. preemption: ...`.
#[derive(Clone, Debug)]
pub struct FitError {
    /// Nodes in the snapshot.
    pub num_all_nodes: usize,
    /// Why.
    pub diagnosis: Diagnosis,
}

impl FitError {
    /// Reason → number of nodes, counting each node's reasons once (absent nodes included).
    pub fn reason_counts(&self) -> BTreeMap<String, usize> {
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for status in self.diagnosis.node_to_status.values() {
            for reason in &status.reasons {
                *reasons.entry(reason.clone()).or_default() += 1;
            }
        }
        let explicit = self.diagnosis.node_to_status.len();
        if explicit < self.num_all_nodes
            && let Some(absent) = &self.diagnosis.absent_nodes_status
        {
            for reason in &absent.reasons {
                *reasons.entry(reason.clone()).or_default() += self.num_all_nodes - explicit;
            }
        }
        reasons
    }
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} {NO_NODE_AVAILABLE_MSG}:", self.num_all_nodes)?;
        match &self.diagnosis.pre_filter_msg {
            Some(msg) => write!(f, " {msg}.")?,
            None => {
                // Sorted as strings ("2 x" before "3 y"), as Kubernetes' sort.Strings.
                let mut histogram: Vec<String> = self
                    .reason_counts()
                    .into_iter()
                    .map(|(reason, count)| format!("{count} {reason}"))
                    .collect();
                histogram.sort();
                if !histogram.is_empty() {
                    write!(f, " {}.", histogram.join(", "))?;
                }
            }
        }
        if let Some(msg) = &self.diagnosis.post_filter_msg
            && !msg.is_empty()
        {
            write!(f, " {msg}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FitError {}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use crate::framework::Plugin;

    fn status(code: Code, plugin: &'static str, reasons: &[&str]) -> Status {
        Status {
            code,
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            plugin,
        }
    }

    #[test]
    fn fit_error_message_is_kube_schedulers() {
        let mut diagnosis = Diagnosis::default();
        for n in ["a", "b", "c"] {
            diagnosis.node_to_status.insert(
                n.to_string(),
                status(
                    Code::Unschedulable,
                    "NodeResourcesFit",
                    &["Insufficient cpu"],
                ),
            );
        }
        for n in ["d", "e"] {
            diagnosis.node_to_status.insert(
                n.to_string(),
                status(
                    Code::UnschedulableAndUnresolvable,
                    "TaintToleration",
                    &["node(s) had untolerated taint {dedicated: gpu}"],
                ),
            );
        }
        diagnosis.post_filter_msg = Some(
            "preemption: 0/5 nodes are available: 2 Preemption is not helpful for scheduling, \
             3 No preemption victims found for incoming pod."
                .to_string(),
        );
        let err = FitError {
            num_all_nodes: 5,
            diagnosis,
        };
        assert_eq!(
            err.to_string(),
            "0/5 nodes are available: 2 node(s) had untolerated taint {dedicated: gpu}, \
             3 Insufficient cpu. preemption: 0/5 nodes are available: 2 Preemption is not \
             helpful for scheduling, 3 No preemption victims found for incoming pod."
        );
    }

    #[test]
    fn fit_error_counts_every_reason_of_a_node() {
        let mut diagnosis = Diagnosis::default();
        diagnosis.node_to_status.insert(
            "a".to_string(),
            status(
                Code::Unschedulable,
                "NodeResourcesFit",
                &["Insufficient cpu", "Insufficient memory"],
            ),
        );
        diagnosis.node_to_status.insert(
            "b".to_string(),
            status(
                Code::Unschedulable,
                "NodeResourcesFit",
                &["Insufficient cpu"],
            ),
        );
        let err = FitError {
            num_all_nodes: 2,
            diagnosis,
        };
        assert_eq!(
            err.to_string(),
            "0/2 nodes are available: 1 Insufficient memory, 2 Insufficient cpu."
        );
    }

    #[test]
    fn fit_error_with_pre_filter_message_does_not_repeat_per_node() {
        let absent = status(
            Code::UnschedulableAndUnresolvable,
            "NodeAffinity",
            &["node(s) didn't match Pod's node affinity/selector"],
        );
        let diagnosis = Diagnosis {
            absent_nodes_status: Some(absent),
            pre_filter_msg: Some("node(s) didn't match Pod's node affinity/selector".into()),
            ..Diagnosis::default()
        };
        let err = FitError {
            num_all_nodes: 3,
            diagnosis,
        };
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: node(s) didn't match Pod's node affinity/selector."
        );
        assert_eq!(
            err.reason_counts()
                .get("node(s) didn't match Pod's node affinity/selector"),
            Some(&3)
        );
    }

    struct Reject(&'static str, Code);
    impl Plugin for Reject {
        fn name(&self) -> &'static str {
            self.0
        }
    }
    impl PreFilterPlugin for Reject {
        fn pre_filter(&self, _: &mut CycleState, _: &PodInfo, _: &Snapshot) -> Status {
            Status::new(self.1, "", "no")
        }
    }
    impl FilterPlugin for Reject {
        fn filter(&self, _: &CycleState, _: &PodInfo, _: &NodeInfo) -> Status {
            Status::new(self.1, "", "filtered")
        }
    }

    #[test]
    fn pre_filter_skip_skips_the_filter() {
        let skipper = Arc::new(Reject("Skipper", Code::Skip));
        let fw = Framework::new(
            "p",
            vec![skipper.clone()],
            vec![skipper],
            Vec::new(),
            Vec::new(),
        );
        let mut state = CycleState::default();
        let pod = PodInfo::default();
        let out = fw.run_pre_filter_plugins(&mut state, &pod, &Snapshot::default());
        assert!(out.status.is_success());
        // The filter would answer Skip anyway; check it is not even consulted by making the
        // skip set visible.
        let skip = state.read::<SkipSet>(SKIP_FILTER_PLUGINS_KEY).unwrap();
        assert!(skip.contains("Skipper"));
        assert!(
            fw.run_filter_plugins(&state, &pod, &NodeInfo::default())
                .is_success()
        );
    }

    #[test]
    fn pre_filter_unresolvable_stops_and_unschedulable_continues() {
        let a = Arc::new(Reject("A", Code::Unschedulable));
        let b = Arc::new(Reject("B", Code::Unschedulable));
        let fw = Framework::new("p", vec![a, b], Vec::new(), Vec::new(), Vec::new());
        let mut state = CycleState::default();
        let out = fw.run_pre_filter_plugins(&mut state, &PodInfo::default(), &Snapshot::default());
        assert_eq!(out.status.code, Code::Unschedulable);
        assert_eq!(out.status.plugin, "A");
        assert_eq!(out.unschedulable_plugins, vec!["A", "B"]);

        let c = Arc::new(Reject("C", Code::UnschedulableAndUnresolvable));
        let d = Arc::new(Reject("D", Code::Unschedulable));
        let fw = Framework::new("p", vec![c, d], Vec::new(), Vec::new(), Vec::new());
        let out = fw.run_pre_filter_plugins(&mut state, &PodInfo::default(), &Snapshot::default());
        assert_eq!(out.status.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(out.unschedulable_plugins, vec!["C"]);
    }

    #[test]
    fn filter_names_the_rejecting_plugin_and_stops() {
        let first = Arc::new(Reject("First", Code::Unschedulable));
        let second = Arc::new(Reject("Second", Code::UnschedulableAndUnresolvable));
        let fw = Framework::new("p", Vec::new(), vec![first, second], Vec::new(), Vec::new());
        let status = fw.run_filter_plugins(
            &CycleState::default(),
            &PodInfo::default(),
            &NodeInfo::default(),
        );
        assert_eq!(status.plugin, "First");
        assert_eq!(status.reasons, vec!["filtered".to_string()]);
    }

    struct Fixed(&'static str, i64, Vec<i64>);
    impl Plugin for Fixed {
        fn name(&self) -> &'static str {
            self.0
        }
    }
    impl ScorePlugin for Fixed {
        fn score(&self, _: &CycleState, _: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
            let i: usize = node.name().trim_start_matches('n').parse().unwrap();
            Ok(self.2[i])
        }
        fn weight(&self) -> i64 {
            self.1
        }
    }

    fn named_node(name: &str) -> Arc<NodeInfo> {
        let mut node = k8s_openapi::api::core::v1::Node::default();
        node.metadata.name = Some(name.to_string());
        Arc::new(NodeInfo {
            node: Some(Arc::new(node)),
            ..NodeInfo::default()
        })
    }

    #[test]
    fn scores_are_weighted_and_summed() {
        let fw = Framework::new(
            "p",
            Vec::new(),
            Vec::new(),
            Vec::new(),
            vec![
                Arc::new(Fixed("A", 2, vec![10, 50])),
                Arc::new(Fixed("B", 1, vec![100, 0])),
            ],
        );
        let nodes = vec![named_node("n0"), named_node("n1")];
        let totals = fw
            .run_score_plugins(&CycleState::default(), &PodInfo::default(), &nodes)
            .unwrap();
        assert_eq!(totals[0].total_score, 2 * 10 + 100);
        assert_eq!(totals[1].total_score, 2 * 50);

        let out_of_range = Framework::new(
            "p",
            Vec::new(),
            Vec::new(),
            Vec::new(),
            vec![Arc::new(Fixed("Bad", 1, vec![101, 0]))],
        );
        let err = out_of_range
            .run_score_plugins(&CycleState::default(), &PodInfo::default(), &nodes)
            .unwrap_err();
        assert_eq!(err.code, Code::Error);
        assert_eq!(err.plugin, "Bad");
    }
}
