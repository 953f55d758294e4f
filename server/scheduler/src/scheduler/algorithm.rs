//! One scheduling cycle's decision, with no I/O (Kubernetes' `schedulePod`,
//! `findNodesThatFitPod`, `findNodesThatPassFilters`, `prioritizeNodes`, `selectHost` in
//! `schedule_one.go`): given a snapshot, a pod and the framework, pick a node or explain why
//! none fits.
//!
//! `docs/tricks.md` #2 lives here (percentageOfNodesToScore, 50 - N/125, with a rotating
//! start index): Filter does not walk every node. It stops once
//! [`num_feasible_nodes_to_find`] nodes passed, and it starts where the previous cycle
//! stopped ([`Algorithm::next_start_node_index`]), wrapping around, so over successive
//! cycles every node is looked at and none is starved by always sitting at the end of the
//! list.
//!
//! Filtering runs on `parallelism` threads (Kubernetes: 16 goroutines) pulling chunks of the
//! walk from a shared counter; with `parallelism == 1` it runs on the calling thread. Scoring
//! runs on the calling thread: it sees only the few hundred feasible nodes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::framework::runtime::{Diagnosis, FitError, Framework, NodePluginScores};
use crate::framework::{Code, CycleState, NodeInfo, PodInfo, Snapshot, Status};

/// kube-scheduler's `minFeasibleNodesToFind`: the fewest nodes a cycle looks for, whatever
/// the percentage. A semi-arbitrary value so that enough nodes are checked for feasibility to
/// give a minimum level of spreading; clusters smaller than this are always fully searched.
pub const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;

/// kube-scheduler's `minFeasibleNodesPercentageToFind`: the adaptive percentage never drops
/// below this. Semi-arbitrary, again for a minimum of spreading: at 10,000 nodes the formula
/// alone would give a negative percentage.
pub const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: i64 = 5;

/// The adaptive percentage starts at 50 % for a tiny cluster (kube-scheduler's
/// `int32(50) - numAllNodes/125`): half the nodes are plenty to find a good one...
const ADAPTIVE_PERCENTAGE_BASE: i64 = 50;
/// ... and loses one point per 125 nodes, reaching the 5 % floor at 5,625 nodes.
const ADAPTIVE_NODES_PER_PERCENTAGE_POINT: i64 = 125;

/// `percentageOfNodesToScore` meaning "adaptive" (the default).
pub const PERCENTAGE_ADAPTIVE: u32 = 0;

/// The most threads a cycle filters on. Kubernetes' default parallelism is 16; skerry runs
/// on small machines where more threads than cores only add switching.
pub const PARALLELISM_MAX: usize = 64;

/// How many feasible nodes the cycle looks for before it stops filtering (kube-scheduler's
/// `numFeasibleNodesToFind`).
///
/// - fewer than [`MIN_FEASIBLE_NODES_TO_FIND`] nodes, or `percentage >= 100`: all of them;
/// - `percentage == 0` (adaptive): `50 - n/125` percent, at least
///   [`MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND`];
/// - then `n * percentage / 100`, at least [`MIN_FEASIBLE_NODES_TO_FIND`].
pub fn num_feasible_nodes_to_find(num_all_nodes: usize, percentage: u32) -> usize {
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND || percentage >= 100 {
        return num_all_nodes;
    }
    let n = i64::try_from(num_all_nodes).unwrap_or(i64::MAX);
    let mut pct = i64::from(percentage);
    if percentage == PERCENTAGE_ADAPTIVE {
        pct = (ADAPTIVE_PERCENTAGE_BASE - n / ADAPTIVE_NODES_PER_PERCENTAGE_POINT)
            .max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND);
    }
    let found = usize::try_from(n.saturating_mul(pct) / 100).unwrap_or(num_all_nodes);
    found.max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// Kubernetes' parallelizer chunk size: `sqrt(n)`, at most `n / parallelism + 1`, at least 1.
/// Big enough that pulling a chunk is rare next to filtering it, small enough that the
/// threads finish together and stop soon after enough nodes are found.
fn chunk_size(n: usize, parallelism: usize) -> usize {
    let sqrt = n.isqrt();
    sqrt.min(n / parallelism.max(1) + 1).max(1)
}

/// The pods nominated to each node (preemptors waiting for their victims to leave), read
/// during Filter. Called from the filtering threads.
pub trait NominatedPods: Sync {
    /// The pods nominated to `node`.
    fn nominated_pods_for_node(&self, node: &str) -> Vec<Arc<PodInfo>>;
    /// Whether any pod is nominated anywhere. Asked once per cycle: when none is (the common
    /// case outside preemption), Filter skips the per-node lookup and its lock.
    fn has_nominated_pods(&self) -> bool {
        true
    }
}

/// No nominated pods.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoNominatedPods;

impl NominatedPods for NoNominatedPods {
    fn nominated_pods_for_node(&self, _node: &str) -> Vec<Arc<PodInfo>> {
        Vec::new()
    }
    fn has_nominated_pods(&self) -> bool {
        false
    }
}

/// Where the pod goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleResult {
    /// The chosen node.
    pub suggested_host: String,
    /// Nodes Filter ran on.
    pub evaluated_nodes: usize,
    /// Nodes that passed.
    pub feasible_nodes: usize,
}

/// Why the cycle chose no node.
#[derive(Debug)]
pub enum ScheduleError {
    /// The snapshot has no nodes (Kubernetes' `ErrNoNodesAvailable`).
    NoNodesAvailable,
    /// No node fits; preemption may help. Boxed: the diagnosis holds a status per node.
    Fit(Box<FitError>),
    /// A plugin failed.
    Internal(Status),
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleError::NoNodesAvailable => f.write_str("no nodes available to schedule pods"),
            ScheduleError::Fit(e) => e.fmt(f),
            ScheduleError::Internal(status) => f.write_str(&status.reasons.join(", ")),
        }
    }
}

impl std::error::Error for ScheduleError {}

/// The outcome of Filter over (part of) the node list.
struct Filtered {
    feasible: Vec<Arc<NodeInfo>>,
    /// Nodes Filter ran on (feasible + rejected).
    processed: usize,
}

/// The scheduling algorithm's state across cycles: the snapshot it reads and the rotating
/// start index. Owned by the one task that runs cycles; never shared.
pub struct Algorithm {
    framework: Arc<Framework>,
    percentage_of_nodes_to_score: u32,
    parallelism: usize,
    /// Where the next cycle's Filter starts in `snapshot.node_info_list`.
    next_start_node_index: usize,
    /// The cycle's view of the cache, refreshed by the cache before each cycle.
    snapshot: Snapshot,
    /// Breaks score ties (reservoir sampling).
    rng: StdRng,
}

impl std::fmt::Debug for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Algorithm")
            .field("framework", &self.framework)
            .field(
                "percentage_of_nodes_to_score",
                &self.percentage_of_nodes_to_score,
            )
            .field("parallelism", &self.parallelism)
            .field("next_start_node_index", &self.next_start_node_index)
            .field("nodes", &self.snapshot.num_nodes())
            .finish_non_exhaustive()
    }
}

impl Algorithm {
    /// An algorithm over `framework`. `seed` fixes the tie-breaking (tests); `None` seeds from
    /// the OS.
    ///
    /// # Panics
    /// If `parallelism` is 0.
    pub fn new(
        framework: Arc<Framework>,
        percentage_of_nodes_to_score: u32,
        parallelism: usize,
        seed: Option<u64>,
    ) -> Algorithm {
        assert!(parallelism > 0, "parallelism must be at least 1");
        Algorithm {
            framework,
            percentage_of_nodes_to_score,
            parallelism: parallelism.min(PARALLELISM_MAX),
            next_start_node_index: 0,
            snapshot: Snapshot::default(),
            rng: match seed {
                Some(seed) => StdRng::seed_from_u64(seed),
                None => StdRng::from_os_rng(),
            },
        }
    }

    /// The snapshot, for the cache to bring up to date before a cycle.
    pub fn snapshot_mut(&mut self) -> &mut Snapshot {
        &mut self.snapshot
    }

    /// The snapshot the last cycle read.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The framework.
    pub fn framework(&self) -> &Arc<Framework> {
        &self.framework
    }

    /// Where the next cycle's Filter starts.
    pub fn next_start_node_index(&self) -> usize {
        self.next_start_node_index
    }

    /// Picks a node for `pod` in the current snapshot (Kubernetes' `schedulePod`).
    pub fn schedule_pod(
        &mut self,
        state: &mut CycleState,
        pod: &PodInfo,
        nominated: &dyn NominatedPods,
    ) -> Result<ScheduleResult, ScheduleError> {
        let num_all_nodes = self.snapshot.num_nodes();
        if num_all_nodes == 0 {
            return Err(ScheduleError::NoNodesAvailable);
        }
        let (feasible, diagnosis) = self.find_nodes_that_fit_pod(state, pod, nominated)?;
        if feasible.is_empty() {
            return Err(ScheduleError::Fit(Box::new(FitError {
                num_all_nodes,
                diagnosis,
            })));
        }
        let evaluated_nodes = feasible.len() + diagnosis.node_to_status.len();
        // One feasible node: no need to score it.
        if feasible.len() == 1 {
            return Ok(ScheduleResult {
                suggested_host: feasible[0].name().to_string(),
                evaluated_nodes,
                feasible_nodes: 1,
            });
        }
        let scores = self.prioritize_nodes(state, pod, &feasible)?;
        let host = select_host(&scores, &mut self.rng)
            .ok_or_else(|| {
                ScheduleError::Internal(Status::new(Code::Error, "", "empty priority list"))
            })?
            .to_string();
        Ok(ScheduleResult {
            suggested_host: host,
            evaluated_nodes,
            feasible_nodes: feasible.len(),
        })
    }

    /// PreFilter, then Filter: the nominated node alone first if the pod has one, else the
    /// sampled walk (Kubernetes' `findNodesThatFitPod`).
    fn find_nodes_that_fit_pod(
        &mut self,
        state: &mut CycleState,
        pod: &PodInfo,
        nominated: &dyn NominatedPods,
    ) -> Result<(Vec<Arc<NodeInfo>>, Diagnosis), ScheduleError> {
        let mut diagnosis = Diagnosis::default();
        let pre = self
            .framework
            .run_pre_filter_plugins(state, pod, &self.snapshot);
        diagnosis.unschedulable_plugins = pre.unschedulable_plugins;
        if !pre.status.is_success() {
            if !pre.status.is_rejected() {
                return Err(ScheduleError::Internal(pre.status));
            }
            // Every node has the same answer; preemption reads it per node.
            diagnosis.pre_filter_msg = Some(pre.status.reasons.join(", "));
            diagnosis.absent_nodes_status = Some(pre.status);
            return Ok((Vec::new(), diagnosis));
        }

        // A pod that preempted is most likely to fit the node it was nominated to: try it
        // first, alone.
        let nominated_node = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty());
        if let Some(name) = nominated_node
            && let Some(node) = self.snapshot.get(name).cloned()
        {
            let filtered = self.filter_nodes(
                state,
                pod,
                std::slice::from_ref(&node),
                0,
                1,
                nominated,
                &mut diagnosis,
            )?;
            if !filtered.feasible.is_empty() {
                return Ok((filtered.feasible, diagnosis));
            }
        }

        let nodes = &self.snapshot.node_info_list;
        let num_all_nodes = nodes.len();
        let mut num_to_find =
            num_feasible_nodes_to_find(num_all_nodes, self.percentage_of_nodes_to_score);
        if !self.framework.has_score_plugins() {
            // Nothing to rank them by: the first feasible node is as good as any.
            num_to_find = 1;
        }
        let start = self.next_start_node_index % num_all_nodes;
        let filtered = self.filter_nodes(
            state,
            pod,
            nodes,
            start,
            num_to_find,
            nominated,
            &mut diagnosis,
        );
        // Move the start even when a plugin failed, so every node keeps its chance.
        let processed = match &filtered {
            Ok(f) => f.processed,
            Err(_) => 0,
        };
        self.next_start_node_index = (start + processed) % num_all_nodes;
        Ok((filtered?.feasible, diagnosis))
    }

    /// Runs Filter (with nominated pods) over `nodes` starting at `start`, wrapping, until
    /// `num_to_find` pass or every node was tried (Kubernetes' `findNodesThatPassFilters`).
    /// Rejections go into `diagnosis`.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site; the pieces are distinct"
    )]
    fn filter_nodes(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
        start: usize,
        num_to_find: usize,
        nominated: &dyn NominatedPods,
        diagnosis: &mut Diagnosis,
    ) -> Result<Filtered, ScheduleError> {
        let n = nodes.len();
        if n == 0 || num_to_find == 0 {
            return Ok(Filtered {
                feasible: Vec::new(),
                processed: 0,
            });
        }
        let framework = &self.framework;
        if !framework.has_filter_plugins() {
            let feasible: Vec<_> = (0..num_to_find.min(n))
                .map(|i| nodes[(start + i) % n].clone())
                .collect();
            let processed = feasible.len();
            return Ok(Filtered {
                feasible,
                processed,
            });
        }
        // Resolved once per cycle, not once per node.
        let active = framework.active_filter_plugins(state);
        let any_nominated = nominated.has_nominated_pods();
        let check = |i: usize| -> (usize, Status) {
            let node = &nodes[(start + i) % n];
            let nominated_pods = if any_nominated {
                nominated.nominated_pods_for_node(node.name())
            } else {
                Vec::new()
            };
            let status = if nominated_pods.is_empty() {
                framework.run_active_filter_plugins(&active, state, pod, node)
            } else {
                framework.run_filter_plugins_with_nominated_pods(state, pod, node, &nominated_pods)
            };
            (i, status)
        };

        // Results, each tagged with its offset in the walk.
        let mut feasible: Vec<(usize, Arc<NodeInfo>)> = Vec::new();
        let mut rejected: Vec<(usize, Status)> = Vec::new();
        let mut error: Option<Status> = None;
        if self.parallelism == 1 || n < 2 * MIN_PARALLEL_NODES_PER_THREAD {
            for i in 0..n {
                let (i, status) = check(i);
                if status.is_success() {
                    feasible.push((i, nodes[(start + i) % n].clone()));
                    if feasible.len() >= num_to_find {
                        break;
                    }
                } else if status.is_rejected() {
                    rejected.push((i, status));
                } else {
                    error = Some(status);
                    break;
                }
            }
        } else {
            // Chunks are handed out in walk order and each is filtered to its end once taken;
            // `stop` is only checked between chunks. So every offset below the last chunk
            // handed out was filtered, and cutting the results at the `num_to_find`-th
            // feasible node gives exactly the sequential walk's answer (and start index): a
            // few extra nodes filtered past the cut are the price, at most one chunk per
            // thread.
            let chunk = chunk_size(n, self.parallelism);
            let next = AtomicUsize::new(0);
            let found = AtomicUsize::new(0);
            let stop = AtomicBool::new(false);
            // Per-thread results are merged once at the end; the mutexes are taken once per
            // thread, not per node.
            let feasible_all: Mutex<Vec<(usize, Arc<NodeInfo>)>> = Mutex::new(Vec::new());
            let rejected_all: Mutex<Vec<(usize, Status)>> = Mutex::new(Vec::new());
            let error_first: Mutex<Option<Status>> = Mutex::new(None);
            let worker = || {
                let mut my_feasible = Vec::new();
                let mut my_rejected = Vec::new();
                'chunks: while !stop.load(Ordering::Acquire) {
                    let begin = next.fetch_add(chunk, Ordering::AcqRel);
                    if begin >= n {
                        break;
                    }
                    for i in begin..(begin + chunk).min(n) {
                        let (i, status) = check(i);
                        if status.is_success() {
                            my_feasible.push((i, nodes[(start + i) % n].clone()));
                            if found.fetch_add(1, Ordering::AcqRel) + 1 >= num_to_find {
                                stop.store(true, Ordering::Release);
                            }
                        } else if status.is_rejected() {
                            my_rejected.push((i, status));
                        } else {
                            error_first.lock().get_or_insert(status);
                            stop.store(true, Ordering::Release);
                            break 'chunks;
                        }
                    }
                }
                feasible_all.lock().extend(my_feasible);
                rejected_all.lock().extend(my_rejected);
            };
            std::thread::scope(|scope| {
                for _ in 1..self.parallelism {
                    scope.spawn(worker);
                }
                worker();
            });
            feasible = feasible_all.into_inner();
            rejected = rejected_all.into_inner();
            error = error_first.into_inner();
            feasible.sort_unstable_by_key(|(i, _)| *i);
            if feasible.len() >= num_to_find {
                feasible.truncate(num_to_find);
                let cut = feasible.last().map_or(0, |(i, _)| i + 1);
                rejected.retain(|(i, _)| *i < cut);
            }
        }
        let processed = feasible.len() + rejected.len();
        for (i, status) in rejected {
            diagnosis.add_plugin_status(&status);
            diagnosis
                .node_to_status
                .insert(nodes[(start + i) % n].name().to_string(), status);
        }
        if let Some(status) = error {
            return Err(ScheduleError::Internal(status));
        }
        Ok(Filtered {
            feasible: feasible.into_iter().map(|(_, node)| node).collect(),
            processed,
        })
    }

    /// PreScore and Score over the feasible nodes (Kubernetes' `prioritizeNodes`). Without
    /// Score plugins every node scores 1.
    fn prioritize_nodes(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
    ) -> Result<Vec<NodePluginScores>, ScheduleError> {
        if !self.framework.has_score_plugins() {
            return Ok(nodes
                .iter()
                .map(|n| NodePluginScores {
                    name: n.name().to_string(),
                    total_score: 1,
                })
                .collect());
        }
        let status = self
            .framework
            .run_pre_score_plugins(state, pod, nodes, &self.snapshot);
        if !status.is_success() {
            return Err(ScheduleError::Internal(status));
        }
        self.framework
            .run_score_plugins(state, pod, nodes)
            .map_err(ScheduleError::Internal)
    }
}

/// Below this many nodes per thread, filtering stays on the calling thread: starting a thread
/// (~20-50 µs) costs more than filtering a few dozen nodes (~1 µs each).
pub const MIN_PARALLEL_NODES_PER_THREAD: usize = 64;

/// The node with the highest total score; ties broken uniformly at random by reservoir
/// sampling (Kubernetes' `selectHost`): the k-th node seen with the best score replaces the
/// choice with probability 1/k, so each tied node ends up chosen with probability 1/ties in
/// one pass and no allocation.
pub fn select_host<'a>(scores: &'a [NodePluginScores], rng: &mut impl Rng) -> Option<&'a str> {
    let (first, rest) = scores.split_first()?;
    let mut best = first.total_score;
    let mut selected = first.name.as_str();
    let mut ties: u32 = 1;
    for score in rest {
        if score.total_score > best {
            best = score.total_score;
            selected = &score.name;
            ties = 1;
        } else if score.total_score == best {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                selected = &score.name;
            }
        }
    }
    Some(selected)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use std::collections::{HashMap, HashSet};

    use k8s_openapi::api::core::v1::Node;

    use super::*;
    use crate::framework::{FilterPlugin, Plugin, ScorePlugin};

    #[test]
    fn sampling_formula_at_kubernetes_sizes() {
        // Reference: kube-scheduler numFeasibleNodesToFind with percentageOfNodesToScore 0.
        // 100 nodes: 50 % of 100 = 50, raised to the minimum 100 (all of them).
        assert_eq!(num_feasible_nodes_to_find(100, 0), 100);
        // 1,000 nodes: 50 - 1000/125 = 42 % → 420.
        assert_eq!(num_feasible_nodes_to_find(1_000, 0), 420);
        // 5,000 nodes: 50 - 40 = 10 % → 500.
        assert_eq!(num_feasible_nodes_to_find(5_000, 0), 500);
        // 10,000 nodes: 50 - 80 < 5, so the 5 % floor → 500.
        assert_eq!(num_feasible_nodes_to_find(10_000, 0), 500);
        // Small clusters are searched fully; so is any cluster at 100 %.
        assert_eq!(num_feasible_nodes_to_find(99, 0), 99);
        assert_eq!(num_feasible_nodes_to_find(3, 10), 3);
        assert_eq!(num_feasible_nodes_to_find(5_000, 100), 5_000);
        // An explicit percentage, still at least 100.
        assert_eq!(num_feasible_nodes_to_find(5_000, 30), 1_500);
        assert_eq!(num_feasible_nodes_to_find(1_000, 1), 100);
    }

    #[test]
    fn chunk_size_is_kubernetes() {
        assert_eq!(chunk_size(10_000, 16), 100);
        assert_eq!(chunk_size(100, 16), 7);
        assert_eq!(chunk_size(1, 2), 1);
    }

    /// Passes every node (but `reject`) and, with `record`, notes which it saw.
    #[derive(Default)]
    struct Recorder {
        record: bool,
        seen: Mutex<HashSet<String>>,
        reject: HashSet<String>,
    }
    impl Plugin for Recorder {
        fn name(&self) -> &'static str {
            "Recorder"
        }
    }
    impl FilterPlugin for Recorder {
        fn filter(&self, _: &CycleState, _: &PodInfo, node: &NodeInfo) -> Status {
            if self.record {
                self.seen.lock().insert(node.name().to_string());
            }
            if self.reject.contains(node.name()) {
                Status::new(Code::Unschedulable, "", "Insufficient cpu")
            } else {
                Status::success()
            }
        }
    }
    /// Scores every node the same.
    struct Flat;
    impl Plugin for Flat {
        fn name(&self) -> &'static str {
            "Flat"
        }
    }
    impl ScorePlugin for Flat {
        fn score(&self, _: &CycleState, _: &PodInfo, _: &NodeInfo) -> Result<i64, Status> {
            Ok(50)
        }
        fn weight(&self) -> i64 {
            1
        }
    }

    fn node_info(name: &str) -> Arc<NodeInfo> {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_string());
        Arc::new(NodeInfo {
            node: Some(Arc::new(node)),
            ..NodeInfo::default()
        })
    }

    fn snapshot_of(n: usize) -> Snapshot {
        let list: Vec<Arc<NodeInfo>> = (0..n).map(|i| node_info(&format!("node-{i}"))).collect();
        Snapshot {
            node_info_map: list
                .iter()
                .map(|ni| (ni.name().to_string(), ni.clone()))
                .collect(),
            node_info_list: list,
            ..Snapshot::default()
        }
    }

    fn algorithm(recorder: Arc<Recorder>, n: usize, parallelism: usize) -> Algorithm {
        let framework = Framework::new(
            "default-scheduler",
            Vec::new(),
            vec![recorder],
            Vec::new(),
            vec![Arc::new(Flat)],
        );
        let mut algorithm = Algorithm::new(Arc::new(framework), 0, parallelism, Some(7));
        *algorithm.snapshot_mut() = snapshot_of(n);
        algorithm
    }

    #[test]
    fn rotating_start_index_visits_every_node() {
        for parallelism in [1, 2] {
            let recorder = Arc::new(Recorder {
                record: true,
                ..Recorder::default()
            });
            let mut algorithm = algorithm(recorder.clone(), 1_000, parallelism);
            let pod = PodInfo::default();
            // 1,000 nodes: each cycle stops after 420 feasible; three cycles cover them all.
            let mut starts = Vec::new();
            for _ in 0..3 {
                starts.push(algorithm.next_start_node_index());
                let result = algorithm
                    .schedule_pod(&mut CycleState::default(), &pod, &NoNominatedPods)
                    .unwrap();
                assert_eq!(result.feasible_nodes, 420);
                assert_eq!(result.evaluated_nodes, 420);
            }
            assert_eq!(starts, vec![0, 420, 840]);
            assert_eq!(algorithm.next_start_node_index(), 260);
            assert_eq!(
                recorder.seen.lock().len(),
                1_000,
                "parallelism {parallelism}"
            );
        }
    }

    #[test]
    fn many_pods_spread_over_every_node() {
        // Every node looks identical: over many cycles the rotating start and the random
        // tie-break put pods everywhere, not on the first nodes of the list.
        let recorder = Arc::new(Recorder::default());
        let mut algorithm = algorithm(recorder, 1_000, 1);
        let pod = PodInfo::default();
        let mut chosen: HashMap<String, usize> = HashMap::new();
        for _ in 0..5_000 {
            let result = algorithm
                .schedule_pod(&mut CycleState::default(), &pod, &NoNominatedPods)
                .unwrap();
            *chosen.entry(result.suggested_host).or_default() += 1;
        }
        // 5,000 draws over 1,000 equally good nodes: the chance a given node is never chosen
        // is tiny when every node is a candidate in some cycles.
        assert!(chosen.len() > 950, "only {} nodes chosen", chosen.len());
    }

    #[test]
    fn rejections_are_diagnosed_per_node() {
        let recorder = Arc::new(Recorder {
            reject: (0..5).map(|i| format!("node-{i}")).collect(),
            ..Recorder::default()
        });
        let mut algorithm = algorithm(recorder, 5, 1);
        let err = algorithm
            .schedule_pod(
                &mut CycleState::default(),
                &PodInfo::default(),
                &NoNominatedPods,
            )
            .unwrap_err();
        let ScheduleError::Fit(fit) = err else {
            panic!("expected a FitError, got {err:?}");
        };
        assert_eq!(
            fit.to_string(),
            "0/5 nodes are available: 5 Insufficient cpu."
        );
        assert_eq!(fit.diagnosis.unschedulable_plugins, vec!["Recorder"]);
    }

    #[test]
    fn small_clusters_are_searched_fully_and_sparse_fits_are_found_in_parallel() {
        // 1,000 nodes, only the last 10 of the walk fit: the walk must go all the way.
        let recorder = Arc::new(Recorder {
            reject: (0..990).map(|i| format!("node-{i}")).collect(),
            ..Recorder::default()
        });
        let mut algorithm = algorithm(recorder, 1_000, 2);
        let result = algorithm
            .schedule_pod(
                &mut CycleState::default(),
                &PodInfo::default(),
                &NoNominatedPods,
            )
            .unwrap();
        assert_eq!(result.feasible_nodes, 10);
        assert_eq!(result.evaluated_nodes, 1_000);
        assert!(result.suggested_host.as_str() >= "node-990");
    }

    #[test]
    fn parallel_walk_matches_sequential() {
        // The parallel walk cuts its results where the sequential walk would have stopped:
        // same feasible nodes, same evaluated count, same next start index, same choice.
        let mut rng = StdRng::seed_from_u64(42);
        for round in 0..10 {
            let reject: HashSet<String> = (0..1_000)
                .filter(|_| rng.random_range(0..100) < 20 + round * 8)
                .map(|i| format!("node-{i}"))
                .collect();
            let recorder = |reject: &HashSet<String>| {
                Arc::new(Recorder {
                    reject: reject.clone(),
                    ..Recorder::default()
                })
            };
            let mut sequential = algorithm(recorder(&reject), 1_000, 1);
            let mut parallel = algorithm(recorder(&reject), 1_000, 2);
            for _ in 0..4 {
                let pod = PodInfo::default();
                let a = sequential.schedule_pod(&mut CycleState::default(), &pod, &NoNominatedPods);
                let b = parallel.schedule_pod(&mut CycleState::default(), &pod, &NoNominatedPods);
                assert_eq!(a.unwrap(), b.unwrap(), "round {round}");
                assert_eq!(
                    sequential.next_start_node_index(),
                    parallel.next_start_node_index()
                );
            }
        }
    }

    #[test]
    fn no_nodes_is_its_own_error() {
        let recorder = Arc::new(Recorder::default());
        let mut algorithm = algorithm(recorder, 0, 1);
        let err = algorithm
            .schedule_pod(
                &mut CycleState::default(),
                &PodInfo::default(),
                &NoNominatedPods,
            )
            .unwrap_err();
        assert!(matches!(err, ScheduleError::NoNodesAvailable));
        assert_eq!(err.to_string(), "no nodes available to schedule pods");
    }

    #[test]
    fn select_host_takes_the_best_and_breaks_ties_uniformly() {
        let scores = |values: &[i64]| -> Vec<NodePluginScores> {
            values
                .iter()
                .enumerate()
                .map(|(i, s)| NodePluginScores {
                    name: format!("n{i}"),
                    total_score: *s,
                })
                .collect()
        };
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(select_host(&scores(&[1, 9, 3]), &mut rng), Some("n1"));
        assert_eq!(select_host(&[], &mut rng), None);
        // Three nodes tied at the top, one below: each tied node about a third of the time.
        let tied = scores(&[5, 7, 7, 2, 7]);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let draws = 30_000;
        for _ in 0..draws {
            *counts
                .entry(select_host(&tied, &mut rng).unwrap())
                .or_default() += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        for name in ["n1", "n2", "n4"] {
            let share = counts[name] as f64 / draws as f64;
            assert!((share - 1.0 / 3.0).abs() < 0.02, "{name}: {share}");
        }
    }
}
