//! Preemption (Kubernetes 1.32's `framework/preemption` and `plugins/defaultpreemption`):
//! when a pod fits on no node, find the node where evicting the fewest and least important
//! lower-priority pods makes room, nominate the pod there and delete those victims with
//! their graceful termination.
//!
//! It carries `docs/tricks.md` #3, preemption by removing all lower-priority victims then
//! reprieving. Choosing the smallest set of pods to evict is a
//! subset search, exponential in the pods on a node; Kubernetes does not search. On a copy of
//! the node ([`Preemptor::select_victims_on_node`]) it
//! 1. removes *every* pod with lower priority than the preemptor and asks the Filter plugins
//!    once whether the preemptor fits now; if not, no eviction on this node can help;
//! 2. otherwise re-adds ("reprieves") those pods one at a time, most important first
//!    ([`more_important_pod`]: higher priority, then longer running), the ones whose eviction
//!    would break a PodDisruptionBudget before the others, keeping each pod whose return still
//!    lets the preemptor fit; the pods that could not come back are the victims.
//!
//! That is one Filter run per lower-priority pod. The set it finds is minimal, not minimum:
//! no single victim could be spared (for filters where an extra pod on the node never helps
//! the preemptor — resources, ports, anti-affinity — a victim that failed its reprieve fails
//! again next to the pods reprieved after it), but a smaller set of more important pods may
//! exist; importance, not count, decides who is spared.
//!
//! # Layout
//! - The pure half, no I/O: [`Preemptor::preempt`] = eligibility
//!   ([`Preemptor::pod_eligible_to_preempt_others`]) → candidate nodes (those that failed with
//!   `Unschedulable`, sampled from a random offset: [`calculate_num_candidates`]) → the dry run
//!   on each ([`Preemptor::select_victims_on_node`]) → the best node
//!   ([`pick_one_node_for_preemption`]). The Filter plugins are reached through
//!   [`FilterRunner`]; [`FrameworkRunner`] implements it over the scheduler's `Framework`.
//! - The async half: [`execute`] = [`prepare_candidate`] (DisruptionTarget condition, graceful
//!   DELETE, `Preempted` event per victim; lower-priority pods nominated to the node lose their
//!   nomination) then [`set_nominated_node_name`] on the preemptor.
//!
//! Invariants: the snapshot's NodeInfos and the cycle's [`CycleState`] are never modified —
//! every dry run works on clones; a candidate always has at least one victim; victims are
//! reported most important first. The dry run checks nodes one after another on the calling
//! thread (Kubernetes uses 16 goroutines): on skerry's 2-core machines the scheduling
//! cycle already owns a core, and the order makes the early stop exact.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiLabelSelector;
use k8s_openapi::jiff::Timestamp;
use rand::Rng;
use serde_json::json;
use skerry_api::selector::LabelSelector;
use skerry_client::events::{EVENT_TYPE_NORMAL, EventRecorder, object_reference};
use skerry_client::{Api, Client, DeleteParams, Patch, PatchParams};
use tracing::{debug, info, warn};

use crate::framework::runtime::{Diagnosis, FitError, Framework};
use crate::framework::{Code, CycleState, NodeInfo, PodInfo, Snapshot, Status};

/// The plugin name in statuses and logs (Kubernetes' `names.DefaultPreemption`).
pub const PLUGIN_NAME: &str = "DefaultPreemption";

/// Default share of the potential nodes to dry-run before stopping (Kubernetes'
/// `DefaultPreemptionArgs.MinCandidateNodesPercentage = 10`). A dry run clones a NodeInfo and
/// runs the Filter plugins once per lower-priority pod, so on 5,000 nodes checking them all
/// would cost more than the scheduling cycle it rescues; more candidates only buy a slightly
/// better choice among nodes that all work.
pub const MIN_CANDIDATE_NODES_PERCENTAGE: u32 = 10;

/// Default floor on the candidates to find (Kubernetes' `MinCandidateNodesAbsolute = 100`):
/// on small clusters 10 % would be a handful of nodes and the choice would be poor, while
/// 100 dry runs are still cheap.
pub const MIN_CANDIDATE_NODES_ABSOLUTE: u32 = 100;

/// Victims deleted concurrently by [`prepare_candidate`] (Kubernetes runs the deletions
/// through its parallelizer, whose default parallelism is 16). Victims are few — reprieve
/// keeps every pod it can — so this bounds the burst on the apiserver, not the latency.
pub const VICTIM_DELETE_PARALLELISM: usize = 16;

/// Added to each victim priority before summing (Kubernetes' `math.MaxInt32 + 1`), so every
/// term is positive: without it, a node with a few negative-priority victims would look
/// cheaper than a node with fewer victims of the same negative priority.
const PRIORITY_SUM_OFFSET: i64 = i32::MAX as i64 + 1;

/// `spec.preemptionPolicy` of a pod that never preempts (`v1.PreemptNever`).
pub const PREEMPT_NEVER: &str = "Never";

/// The pod condition set on a victim before it is deleted (`v1.DisruptionTarget`).
pub const DISRUPTION_TARGET_CONDITION: &str = "DisruptionTarget";

/// The DisruptionTarget reason of a pod preempted by the scheduler
/// (`v1.PodReasonPreemptionByScheduler`).
pub const REASON_PREEMPTION_BY_SCHEDULER: &str = "PreemptionByScheduler";

/// The reason of the event on each victim (`kubectl describe pod` shows it).
pub const PREEMPTED_EVENT_REASON: &str = "Preempted";

/// The scheduler name used in the DisruptionTarget message of a pod without one.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// Prefix of every message of this plugin (Kubernetes' `DefaultPreemption.PostFilter`).
pub const MESSAGE_PREFIX: &str = "preemption: ";

/// Why a pod with `preemptionPolicy: Never` is not eligible.
pub const NOT_ELIGIBLE_PREEMPT_NEVER: &str = "not eligible due to preemptionPolicy=Never.";

/// Why a pod whose earlier victims are still terminating is not eligible.
pub const NOT_ELIGIBLE_TERMINATING: &str =
    "not eligible due to a terminating pod on the nominated node.";

/// A node's status when it has no lower-priority pod at all.
pub const NO_VICTIMS_FOUND: &str = "No preemption victims found for incoming pod";

/// The status of nodes the dry run did not look at (filtered out as unresolvable, or not
/// reached because enough candidates were found elsewhere).
pub const PREEMPTION_NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";

/// The tunables of DefaultPreemption (Kubernetes' `DefaultPreemptionArgs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptionArgs {
    /// See [`MIN_CANDIDATE_NODES_PERCENTAGE`]; 0..=100.
    pub min_candidate_nodes_percentage: u32,
    /// See [`MIN_CANDIDATE_NODES_ABSOLUTE`].
    pub min_candidate_nodes_absolute: u32,
}

impl Default for PreemptionArgs {
    fn default() -> Self {
        PreemptionArgs {
            min_candidate_nodes_percentage: MIN_CANDIDATE_NODES_PERCENTAGE,
            min_candidate_nodes_absolute: MIN_CANDIDATE_NODES_ABSOLUTE,
        }
    }
}

impl PreemptionArgs {
    /// Kubernetes' `ValidateDefaultPreemptionArgs`: the percentage is at most 100 and the two
    /// are not both 0 (which would find no candidate ever).
    pub fn validate(&self) -> Result<(), String> {
        if self.min_candidate_nodes_percentage > 100 {
            return Err(format!(
                "minCandidateNodesPercentage: {} is not in [0, 100]",
                self.min_candidate_nodes_percentage
            ));
        }
        if self.min_candidate_nodes_percentage == 0 && self.min_candidate_nodes_absolute == 0 {
            return Err(
                "minCandidateNodesPercentage and minCandidateNodesAbsolute cannot both be zero"
                    .to_string(),
            );
        }
        Ok(())
    }
}

/// How many candidates the dry run looks for among `num_nodes` potential nodes (Kubernetes'
/// `calculateNumCandidates`): the percentage, at least the absolute floor, at most all.
pub fn calculate_num_candidates(num_nodes: usize, args: &PreemptionArgs) -> usize {
    let by_percentage =
        num_nodes.saturating_mul(args.min_candidate_nodes_percentage as usize) / 100;
    by_percentage
        .max(args.min_candidate_nodes_absolute as usize)
        .min(num_nodes)
}

/// A pod's priority (`corev1helpers.PodPriority`): `spec.priority`, 0 when unset (the
/// Priority admission plugin fills it on create).
pub fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// When `pod` started (`util.GetPodStartTime`); a pod that has not started yet (assumed, or
/// bound but not running) counts as starting `now`.
pub fn pod_start_time(pod: &Pod, now: Timestamp) -> Timestamp {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(now, |t| t.0)
}

/// Kubernetes' `util.MoreImportantPod`: higher priority first; at equal priority the pod that
/// started earlier (it has more work to lose).
pub fn more_important_pod(a: &Pod, b: &Pod, now: Timestamp) -> bool {
    let (pa, pb) = (pod_priority(a), pod_priority(b));
    if pa != pb {
        return pa > pb;
    }
    pod_start_time(a, now) < pod_start_time(b, now)
}

/// [`more_important_pod`] as an ordering for sorting, most important first.
fn importance_order(a: &Pod, b: &Pod, now: Timestamp) -> Ordering {
    if more_important_pod(a, b, now) {
        Ordering::Less
    } else if more_important_pod(b, a, now) {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

/// Whether `pod` is being deleted because the scheduler preempted it (Kubernetes'
/// `podTerminatingByPreemption`): a deletion timestamp and a true DisruptionTarget condition
/// with reason PreemptionByScheduler.
pub fn pod_terminating_by_preemption(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions
        .and_then(|cs| cs.iter().find(|c| c.type_ == DISRUPTION_TARGET_CONDITION))
        .is_some_and(|c| {
            c.status == "True" && c.reason.as_deref() == Some(REASON_PREEMPTION_BY_SCHEDULER)
        })
}

/// The pods among `nominated` (pods nominated to one node) whose priority is lower than the
/// preemptor's (Kubernetes' `getLowerPriorityNominatedPods`): once the preemptor takes the
/// room on that node they may no longer fit, so their nomination is cleared and they look
/// again.
pub fn lower_priority_nominated_pods(preemptor: &Pod, nominated: &[Arc<Pod>]) -> Vec<Arc<Pod>> {
    let priority = pod_priority(preemptor);
    nominated
        .iter()
        .filter(|p| pod_priority(p) < priority)
        .cloned()
        .collect()
}

/// A PDB's selector as Kubernetes' preemption reads it (`filterPodsWithPDBViolation`:
/// `LabelSelectorAsSelector`, then "a PDB with a nil or empty selector matches nothing"):
/// `None` when the selector is invalid, absent or empty.
fn pdb_selector(selector: Option<&ApiLabelSelector>) -> Option<LabelSelector> {
    LabelSelector::from_api(selector?)
        .ok()
        .filter(|s| !s.is_empty())
}

/// Splits `pods` (kept in their order) into those whose eviction would violate a PDB and
/// those whose would not (Kubernetes' `filterPodsWithPDBViolation`). Each PDB's budget is
/// `status.disruptionsAllowed`, spent by every matching pod in order, so with a budget of 1
/// and three matching pods the first is non-violating and the next two violate. A pod already
/// in the PDB's `status.disruptedPods` was counted by the apiserver and spends nothing.
pub fn filter_pods_with_pdb_violation(
    pods: &[Arc<PodInfo>],
    pdbs: &[Arc<PodDisruptionBudget>],
) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let selectors: Vec<Option<LabelSelector>> = pdbs
        .iter()
        .map(|pdb| pdb_selector(pdb.spec.as_ref().and_then(|s| s.selector.as_ref())))
        .collect();
    let mut allowed: Vec<i64> = pdbs
        .iter()
        .map(|pdb| {
            pdb.status
                .as_ref()
                .map_or(0, |s| i64::from(s.disruptions_allowed))
        })
        .collect();
    let empty = BTreeMap::new();
    let (mut violating, mut non_violating) = (Vec::new(), Vec::new());
    for pod_info in pods {
        let pod = &pod_info.pod;
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let mut violated = false;
        // A pod with no labels matches no PDB.
        if !labels.is_empty() {
            for (i, pdb) in pdbs.iter().enumerate() {
                if pdb.metadata.namespace != pod.metadata.namespace {
                    continue;
                }
                let Some(selector) = &selectors[i] else {
                    continue;
                };
                if !selector.matches(labels) {
                    continue;
                }
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                let already_disrupted = pdb
                    .status
                    .as_ref()
                    .and_then(|s| s.disrupted_pods.as_ref())
                    .is_some_and(|d| d.contains_key(name));
                if already_disrupted {
                    continue;
                }
                allowed[i] -= 1;
                if allowed[i] < 0 {
                    violated = true;
                }
            }
        }
        if violated {
            violating.push(pod_info.clone());
        } else {
            non_violating.push(pod_info.clone());
        }
    }
    (violating, non_violating)
}

/// What preemption needs from the scheduling framework: the Filter plugins (with nominated
/// pods accounted for) and the PreFilter extensions that keep the cycle state in step when a
/// pod is hypothetically added to or removed from a node. [`FrameworkRunner`] implements it
/// over the scheduler's [`Framework`]; tests may implement it directly.
pub trait FilterRunner {
    /// Whether `pod` fits on `node` (Kubernetes' `RunFilterPluginsWithNominatedPods`).
    fn run_filter_plugins_with_nominated_pods(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &Arc<NodeInfo>,
    ) -> Status;
    /// `pod_to_add` was added to `node`: every PreFilter extension updates `state`.
    fn run_pre_filter_extension_add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        pod_to_add: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status;
    /// `pod_to_remove` was removed from `node`: every PreFilter extension updates `state`.
    fn run_pre_filter_extension_remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        pod_to_remove: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status;
}

/// The pods nominated to a node, by node name (the scheduling queue's nominator).
pub type NominatedPodsForNode<'a> = &'a (dyn Fn(&str) -> Vec<Arc<PodInfo>> + Sync);

/// A [`FilterRunner`] over the scheduler's [`Framework`] (its plugin lists, the skip sets
/// in the [`CycleState`]) and the pods nominated to each node.
pub struct FrameworkRunner<'a> {
    /// The profile whose plugins run.
    pub framework: &'a Framework,
    /// The nominated pods of a node.
    pub nominated_pods: NominatedPodsForNode<'a>,
}

impl<'a> FrameworkRunner<'a> {
    /// A runner over `framework` with no nominated pods.
    pub fn new(framework: &'a Framework) -> Self {
        FrameworkRunner {
            framework,
            nominated_pods: &|_| Vec::new(),
        }
    }

    /// With the nominated pods of each node.
    pub fn with_nominated_pods(mut self, nominated_pods: NominatedPodsForNode<'a>) -> Self {
        self.nominated_pods = nominated_pods;
        self
    }
}

impl FilterRunner for FrameworkRunner<'_> {
    fn run_filter_plugins_with_nominated_pods(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &Arc<NodeInfo>,
    ) -> Status {
        let nominated = (self.nominated_pods)(node.name());
        self.framework
            .run_filter_plugins_with_nominated_pods(state, pod, node, &nominated)
    }

    fn run_pre_filter_extension_add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        pod_to_add: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status {
        self.framework
            .run_pre_filter_extension_add_pod(state, pod, pod_to_add, node)
    }

    fn run_pre_filter_extension_remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        pod_to_remove: &Arc<PodInfo>,
        node: &NodeInfo,
    ) -> Status {
        self.framework
            .run_pre_filter_extension_remove_pod(state, pod, pod_to_remove, node)
    }
}

/// The pods to evict on one node (Kubernetes' `extenderv1.Victims`).
#[derive(Clone, Debug, Default)]
pub struct Victims {
    /// Most important first.
    pub pods: Vec<Arc<PodInfo>>,
    /// How many of them are evicted in violation of a PDB.
    pub num_pdb_violations: usize,
}

/// A node where the preemptor fits once its victims are gone.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The node.
    pub node: String,
    /// Its victims (never empty).
    pub victims: Victims,
}

/// The outcome of a successful [`Preemptor::preempt`]: nominate the preemptor to `node` and
/// delete `victims` there.
#[derive(Clone, Debug)]
pub struct PreemptionResult {
    /// The nominated node.
    pub node: String,
    /// The pods to delete, most important first.
    pub victims: Vec<Arc<Pod>>,
    /// How many victims are evicted in violation of a PDB.
    pub num_pdb_violations: usize,
}

/// Why [`Preemptor::preempt`] did not find a node, and what to do with the pod's nomination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreemptionFailure {
    /// Unschedulable (with the `preemption: ...` message appended to the FitError) or Error.
    pub status: Status,
    /// Whether the pod's `status.nominatedNodeName` must be cleared: preemption ran and no
    /// node can take the pod, so an old nomination is stale. False when the pod was not
    /// eligible (it keeps waiting for its earlier victims) or on an error.
    pub clear_nominated_node_name: bool,
}

/// The code of `node` in a failed attempt's diagnosis; a node without a status of its own
/// and no absent-nodes status is UnschedulableAndUnresolvable, as Kubernetes'
/// `NewDefaultNodeToStatus` says of nodes it did not evaluate.
fn status_code_of(diagnosis: &Diagnosis, node: &str) -> Code {
    diagnosis
        .status_of(node)
        .map_or(Code::UnschedulableAndUnresolvable, |s| s.code)
}

/// The snapshot's nodes (in its order) whose status in `diagnosis` is `code` (Kubernetes'
/// `NodeToStatus.NodesForStatusCode`).
pub fn nodes_for_status_code(
    diagnosis: &Diagnosis,
    snapshot: &Snapshot,
    code: Code,
) -> Vec<Arc<NodeInfo>> {
    snapshot
        .node_info_list
        .iter()
        .filter(|n| status_code_of(diagnosis, n.name()) == code)
        .cloned()
        .collect()
}

/// A status of this plugin with the `preemption: ` prefix.
fn preemption_status(code: Code, message: &str) -> Status {
    Status::new(code, PLUGIN_NAME, format!("{MESSAGE_PREFIX}{message}"))
}

/// The synchronous half of preemption: decides where to preempt and whom, on the cycle's
/// snapshot, without touching it or the API.
pub struct Preemptor<'a> {
    runner: &'a dyn FilterRunner,
    pdbs: &'a [Arc<PodDisruptionBudget>],
    args: PreemptionArgs,
    now: Timestamp,
}

impl<'a> Preemptor<'a> {
    /// A preemptor running the filters through `runner` and honouring `pdbs` (all PDBs in
    /// the cluster, from the informer), with the default [`PreemptionArgs`].
    pub fn new(runner: &'a dyn FilterRunner, pdbs: &'a [Arc<PodDisruptionBudget>]) -> Self {
        Preemptor {
            runner,
            pdbs,
            args: PreemptionArgs::default(),
            now: Timestamp::now(),
        }
    }

    /// Replaces the tunables (validate them with [`PreemptionArgs::validate`] first).
    pub fn with_args(mut self, args: PreemptionArgs) -> Self {
        self.args = args;
        self
    }

    /// Fixes "now", the start time of pods that have not started (deterministic tests).
    pub fn with_now(mut self, now: Timestamp) -> Self {
        self.now = now;
        self
    }

    /// Kubernetes' `Evaluator.Preempt` up to the choice of node: eligibility, candidates,
    /// dry run, choice. `diagnosis` holds the Filter statuses of the failed attempt;
    /// `offset_rng` picks where in the potential nodes the dry run starts, so that repeated
    /// preemptions on a large cluster do not all land on its first nodes.
    pub fn preempt<R: Rng + ?Sized>(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        diagnosis: &Diagnosis,
        offset_rng: &mut R,
    ) -> Result<PreemptionResult, PreemptionFailure> {
        let nominated_node = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .unwrap_or_default();
        let nominated_node_code = status_code_of(diagnosis, nominated_node);
        if let Err(reason) =
            self.pod_eligible_to_preempt_others(&pod.pod, snapshot, nominated_node_code)
        {
            debug!(pod = %pod_key(&pod.pod), reason, "pod is not eligible for preemption");
            return Err(PreemptionFailure {
                status: preemption_status(Code::Unschedulable, reason),
                clear_nominated_node_name: false,
            });
        }

        let num_all_nodes = snapshot.num_nodes();
        if num_all_nodes == 0 {
            return Err(PreemptionFailure {
                status: preemption_status(Code::Error, "no nodes available"),
                clear_nominated_node_name: false,
            });
        }
        let potential_nodes = nodes_for_status_code(diagnosis, snapshot, Code::Unschedulable);
        let (candidates, node_to_status, errors) = if potential_nodes.is_empty() {
            debug!(pod = %pod_key(&pod.pod), "preemption will not help schedule pod on any node");
            (Vec::new(), HashMap::new(), Vec::new())
        } else {
            let offset = offset_rng.random_range(0..potential_nodes.len());
            let num_candidates = calculate_num_candidates(potential_nodes.len(), &self.args);
            self.dry_run_preemption(state, pod, &potential_nodes, offset, num_candidates)
        };

        if candidates.is_empty() {
            if let Some(error) = errors.into_iter().next() {
                return Err(PreemptionFailure {
                    status: preemption_status(Code::Error, &error.reasons.join(", ")),
                    clear_nominated_node_name: false,
                });
            }
            let fit_error = FitError {
                num_all_nodes,
                diagnosis: Diagnosis {
                    node_to_status,
                    absent_nodes_status: Some(Status::new(
                        Code::UnschedulableAndUnresolvable,
                        PLUGIN_NAME,
                        PREEMPTION_NOT_HELPFUL,
                    )),
                    ..Diagnosis::default()
                },
            };
            return Err(PreemptionFailure {
                status: preemption_status(Code::Unschedulable, &fit_error.to_string()),
                clear_nominated_node_name: true,
            });
        }

        let Some(best) = select_candidate(&candidates, self.now) else {
            return Err(PreemptionFailure {
                status: preemption_status(Code::Unschedulable, "no candidate node for preemption"),
                clear_nominated_node_name: false,
            });
        };
        info!(
            pod = %pod_key(&pod.pod),
            node = %best.node,
            victims = best.victims.pods.len(),
            pdb_violations = best.victims.num_pdb_violations,
            "chose the node to preempt on"
        );
        Ok(PreemptionResult {
            node: best.node.clone(),
            victims: best.victims.pods.iter().map(|p| p.pod.clone()).collect(),
            num_pdb_violations: best.victims.num_pdb_violations,
        })
    }

    /// Kubernetes' `PodEligibleToPreemptOthers`. `Err` with the reason when the pod must not
    /// preempt: its `preemptionPolicy` is `Never`, or it already preempted on its nominated
    /// node and a lower-priority pod there is still terminating because of it (preempting
    /// again would evict more pods for the room already being freed). A nominated node the
    /// filters now find UnschedulableAndUnresolvable no longer counts.
    pub fn pod_eligible_to_preempt_others(
        &self,
        pod: &Pod,
        snapshot: &Snapshot,
        nominated_node_code: Code,
    ) -> Result<(), &'static str> {
        let policy = pod
            .spec
            .as_ref()
            .and_then(|s| s.preemption_policy.as_deref());
        if policy == Some(PREEMPT_NEVER) {
            return Err(NOT_ELIGIBLE_PREEMPT_NEVER);
        }
        let nominated = pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .unwrap_or_default();
        if nominated.is_empty() {
            return Ok(());
        }
        if nominated_node_code == Code::UnschedulableAndUnresolvable {
            return Ok(());
        }
        if let Some(node) = snapshot.get(nominated) {
            let priority = pod_priority(pod);
            let terminating = node
                .pods
                .iter()
                .any(|p| pod_priority(&p.pod) < priority && pod_terminating_by_preemption(&p.pod));
            if terminating {
                return Err(NOT_ELIGIBLE_TERMINATING);
            }
        }
        Ok(())
    }

    /// Kubernetes' `DryRunPreemption`: runs [`Self::select_victims_on_node`] on the potential
    /// nodes starting at `offset` (wrapping), until `num_candidates` candidates are found of
    /// which at least one violates no PDB. Returns the candidates (PDB-respecting ones first,
    /// each kind capped at `num_candidates`), the status of each node that is not a candidate,
    /// and the Error statuses met.
    ///
    /// Kubernetes checks nodes on 16 goroutines; this runs them in order on the calling
    /// thread, so the early stop is exact and the result deterministic for a given offset.
    pub fn dry_run_preemption(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        potential_nodes: &[Arc<NodeInfo>],
        offset: usize,
        num_candidates: usize,
    ) -> (Vec<Candidate>, HashMap<String, Status>, Vec<Status>) {
        let mut non_violating = Vec::new();
        let mut violating = Vec::new();
        let mut node_statuses = HashMap::new();
        let mut errors = Vec::new();
        let n = potential_nodes.len();
        for i in 0..n {
            let original = &potential_nodes[(offset + i) % n];
            // Shared with the snapshot: the first change copies it (`Arc::make_mut`).
            let mut node_info = Arc::clone(original);
            let mut state_copy = state.clone();
            let node = original.name().to_string();
            let status = match self.select_victims_on_node(&mut state_copy, pod, &mut node_info) {
                Ok(victims) if !victims.pods.is_empty() => {
                    let list = if victims.num_pdb_violations == 0 {
                        &mut non_violating
                    } else {
                        &mut violating
                    };
                    if list.len() < num_candidates {
                        list.push(Candidate { node, victims });
                    }
                    if !non_violating.is_empty()
                        && non_violating.len() + violating.len() >= num_candidates
                    {
                        break;
                    }
                    continue;
                }
                Ok(_) => Status::new(
                    Code::Error,
                    PLUGIN_NAME,
                    format!("expected at least one victim pod on node {node:?}"),
                ),
                Err(status) => status,
            };
            if status.code == Code::Error {
                errors.push(status.clone());
            }
            node_statuses.insert(node, status);
        }
        non_violating.extend(violating);
        (non_violating, node_statuses, errors)
    }

    /// `docs/tricks.md` #3 (Kubernetes' `SelectVictimsOnNode`). `state` is the caller's copy;
    /// `node_info` is copied on its first change if it is shared (so a snapshot's NodeInfo
    /// is never modified). Both are left with the victims removed.
    ///
    /// Remove every pod of lower priority than the preemptor; if it still does not fit, `Err`
    /// with the filters' status. Otherwise sort the removed pods most important first, split
    /// them into PDB-violating and non-violating (each keeping that order), and reprieve them
    /// one by one — violating ones first, as evicting them is the costlier mistake — keeping a
    /// pod on the node whenever the preemptor still fits with it. The pods not reprieved are
    /// the victims; `num_pdb_violations` counts the violating ones among them.
    ///
    /// A node with no lower-priority pod is `Err` UnschedulableAndUnresolvable
    /// ([`NO_VICTIMS_FOUND`]). Affinity of the preemptor *to* a lower-priority pod is not
    /// considered (removing it makes the preemptor not fit), as in Kubernetes: such affinity
    /// between pods that may preempt each other is not a supported configuration.
    pub fn select_victims_on_node(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        node_info: &mut Arc<NodeInfo>,
    ) -> Result<Victims, Status> {
        let priority = pod_priority(&pod.pod);
        let mut potential_victims: Vec<Arc<PodInfo>> = node_info
            .pods
            .iter()
            .filter(|p| pod_priority(&p.pod) < priority)
            .cloned()
            .collect();
        if potential_victims.is_empty() {
            return Err(Status::new(
                Code::UnschedulableAndUnresolvable,
                PLUGIN_NAME,
                NO_VICTIMS_FOUND,
            ));
        }
        for victim in &potential_victims {
            self.remove_pod(state, pod, victim, node_info)?;
        }

        let status = self
            .runner
            .run_filter_plugins_with_nominated_pods(state, pod, node_info);
        if !status.is_success() {
            return Err(status);
        }

        let now = self.now;
        potential_victims.sort_by(|a, b| importance_order(&a.pod, &b.pod, now));
        let (violating, non_violating) =
            filter_pods_with_pdb_violation(&potential_victims, self.pdbs);

        let mut victims = Vec::new();
        let mut num_pdb_violations = 0;
        for candidate in &violating {
            if !self.reprieve(state, pod, candidate, node_info)? {
                victims.push(candidate.clone());
                num_pdb_violations += 1;
            }
        }
        for candidate in &non_violating {
            if !self.reprieve(state, pod, candidate, node_info)? {
                victims.push(candidate.clone());
            }
        }
        // Two sorted runs were concatenated: restore importance order across them.
        if !violating.is_empty() && !non_violating.is_empty() {
            victims.sort_by(|a, b| importance_order(&a.pod, &b.pod, now));
        }
        Ok(Victims {
            pods: victims,
            num_pdb_violations,
        })
    }

    /// Puts `victim` back on the node; keeps it there (`Ok(true)`) if the preemptor still
    /// fits, else takes it off again (`Ok(false)`: it is a victim).
    fn reprieve(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        victim: &Arc<PodInfo>,
        node_info: &mut Arc<NodeInfo>,
    ) -> Result<bool, Status> {
        Arc::make_mut(node_info).add_pod(victim.clone());
        let status = self
            .runner
            .run_pre_filter_extension_add_pod(state, pod, victim, node_info);
        if !status.is_success() {
            return Err(status);
        }
        let fits = self
            .runner
            .run_filter_plugins_with_nominated_pods(state, pod, node_info)
            .is_success();
        if !fits {
            self.remove_pod(state, pod, victim, node_info)?;
        }
        Ok(fits)
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        victim: &Arc<PodInfo>,
        node_info: &mut Arc<NodeInfo>,
    ) -> Result<(), Status> {
        if !Arc::make_mut(node_info).remove_pod(&victim.pod) {
            return Err(Status::new(
                Code::Error,
                PLUGIN_NAME,
                format!(
                    "pod {} is not on node {:?}",
                    pod_key(&victim.pod),
                    node_info.name()
                ),
            ));
        }
        let status = self
            .runner
            .run_pre_filter_extension_remove_pod(state, pod, victim, node_info);
        if status.is_success() {
            Ok(())
        } else {
            Err(status)
        }
    }
}

/// Kubernetes' `SelectCandidate`: the one candidate, or the best by
/// [`pick_one_node_for_preemption`].
pub fn select_candidate(candidates: &[Candidate], now: Timestamp) -> Option<&Candidate> {
    match candidates {
        [] => None,
        [only] => Some(only),
        _ => pick_one_node_for_preemption(candidates, now).map(|i| &candidates[i]),
    }
}

/// A preference among candidates: higher is better.
type CandidateScore = fn(&Candidate, Timestamp) -> i128;

/// Fewest PDB violations.
fn score_min_pdb_violations(c: &Candidate, _: Timestamp) -> i128 {
    -(c.victims.num_pdb_violations as i128)
}

/// Lowest priority of the most important victim (victims are sorted, so it is the first).
fn score_min_highest_priority(c: &Candidate, _: Timestamp) -> i128 {
    let highest = c.victims.pods.first().map_or(0, |p| pod_priority(&p.pod));
    -i128::from(highest)
}

/// Smallest sum of victim priorities (each offset by [`PRIORITY_SUM_OFFSET`]).
fn score_min_sum_priorities(c: &Candidate, _: Timestamp) -> i128 {
    let sum: i128 = c
        .victims
        .pods
        .iter()
        .map(|p| i128::from(i64::from(pod_priority(&p.pod)) + PRIORITY_SUM_OFFSET))
        .sum();
    -sum
}

/// Fewest victims.
fn score_min_num_pods(c: &Candidate, _: Timestamp) -> i128 {
    -(c.victims.pods.len() as i128)
}

/// Latest "earliest start time among the highest-priority victims": the node whose most
/// important victims have run the shortest loses the least work.
fn score_latest_start_time(c: &Candidate, now: Timestamp) -> i128 {
    earliest_start_time_of_highest_priority(&c.victims.pods, now)
        .map_or(i128::MIN, |t| t.as_nanosecond())
}

/// The earliest start time among the victims of the highest priority (Kubernetes'
/// `GetEarliestPodStartTime`); `None` without victims.
pub fn earliest_start_time_of_highest_priority(
    victims: &[Arc<PodInfo>],
    now: Timestamp,
) -> Option<Timestamp> {
    let highest = victims.iter().map(|p| pod_priority(&p.pod)).max()?;
    victims
        .iter()
        .filter(|p| pod_priority(&p.pod) == highest)
        .map(|p| pod_start_time(&p.pod, now))
        .min()
}

/// Kubernetes' `pickOneNodeForPreemption`: the index of the best candidate. Each rule in
/// turn keeps only the candidates with its best score, stopping as soon as one is left:
/// 1. fewest PDB violations;
/// 2. lowest priority of the most important victim;
/// 3. smallest sum of victim priorities;
/// 4. fewest victims;
/// 5. latest start time of the highest-priority victims;
/// 6. then the first remaining candidate (Kubernetes iterates a map, so its tie-break is
///    random; the candidates' order here already starts at a random node).
pub fn pick_one_node_for_preemption(candidates: &[Candidate], now: Timestamp) -> Option<usize> {
    const RULES: [CandidateScore; 5] = [
        score_min_pdb_violations,
        score_min_highest_priority,
        score_min_sum_priorities,
        score_min_num_pods,
        score_latest_start_time,
    ];
    let mut remaining: Vec<usize> = (0..candidates.len()).collect();
    for rule in RULES {
        let scores: Vec<i128> = remaining
            .iter()
            .map(|&i| rule(&candidates[i], now))
            .collect();
        let &best = scores.iter().max()?;
        remaining = remaining
            .into_iter()
            .zip(scores)
            .filter(|&(_, score)| score == best)
            .map(|(i, _)| i)
            .collect();
        if remaining.len() == 1 {
            break;
        }
    }
    remaining.first().copied()
}

/// `namespace/name` of a pod, for logs and errors.
fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Why the async half of preemption failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PreemptError {
    /// Adding the DisruptionTarget condition to a victim failed.
    #[error("adding the DisruptionTarget condition to victim {pod}")]
    Condition {
        /// `namespace/name` of the victim.
        pod: String,
        /// The API error.
        #[source]
        source: skerry_client::Error,
    },
    /// Deleting a victim failed.
    #[error("deleting victim {pod}")]
    Delete {
        /// `namespace/name` of the victim.
        pod: String,
        /// The API error.
        #[source]
        source: skerry_client::Error,
    },
    /// Setting the preemptor's `status.nominatedNodeName` failed.
    #[error("nominating {pod} to node {node}")]
    Nominate {
        /// `namespace/name` of the preemptor.
        pod: String,
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: skerry_client::Error,
    },
}

fn pods_api(client: &Client, pod: &Pod) -> Api<Pod> {
    client.api::<Pod>(pod.metadata.namespace.as_deref())
}

/// Evicts one victim as Kubernetes' `PreemptPod` does: a DisruptionTarget condition first
/// (so the kubelet, the victim's controller and `kubectl describe` know why it dies), then a
/// DELETE with the pod's own grace period, then a `Preempted` event. A victim already gone
/// (404, or 409 because a new pod took its name) is not an error.
async fn preempt_victim(
    client: &Client,
    recorder: Option<&EventRecorder>,
    preemptor: &Pod,
    node: &str,
    victim: &Pod,
) -> Result<(), PreemptError> {
    let api = pods_api(client, victim);
    let name = victim.metadata.name.as_deref().unwrap_or_default();
    let gone = |e: &skerry_client::Error| e.is_not_found() || e.is_conflict();
    let scheduler_name = preemptor
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or(DEFAULT_SCHEDULER_NAME);
    let already_marked = victim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == DISRUPTION_TARGET_CONDITION))
        .is_some_and(|c| {
            c.status == "True" && c.reason.as_deref() == Some(REASON_PREEMPTION_BY_SCHEDULER)
        });
    if !already_marked {
        // Strategic merge: `conditions` merge by `type`, so the pod's other conditions stay.
        let patch = Patch::Strategic(json!({
            "status": {"conditions": [{
                "type": DISRUPTION_TARGET_CONDITION,
                "status": "True",
                "reason": REASON_PREEMPTION_BY_SCHEDULER,
                "message": format!("{scheduler_name}: preempting to accommodate a higher priority pod"),
                "lastTransitionTime": Timestamp::now().to_string(),
            }]}
        }));
        match api
            .patch_status(name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {}
            Err(e) if gone(&e) => {
                debug!(victim = %pod_key(victim), "victim already deleted");
                return Ok(());
            }
            Err(source) => {
                return Err(PreemptError::Condition {
                    pod: pod_key(victim),
                    source,
                });
            }
        }
    }
    // The UID precondition makes sure we delete the pod we chose, not a successor that took
    // its name (a StatefulSet's) since the snapshot was taken; Kubernetes deletes by name.
    let params = DeleteParams {
        precondition_uid: victim.metadata.uid.clone(),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(e) if gone(&e) => {
            debug!(victim = %pod_key(victim), "victim already deleted");
            return Ok(());
        }
        Err(source) => {
            return Err(PreemptError::Delete {
                pod: pod_key(victim),
                source,
            });
        }
    }
    info!(preemptor = %pod_key(preemptor), victim = %pod_key(victim), node, "preempted victim pod");
    if let Some(recorder) = recorder {
        let uid = preemptor.metadata.uid.as_deref().unwrap_or_default();
        recorder.event(
            &object_reference(victim),
            EVENT_TYPE_NORMAL,
            PREEMPTED_EVENT_REASON,
            &format!("Preempted by pod {uid} on node {node}"),
        );
    }
    Ok(())
}

/// Kubernetes' `prepareCandidate`: evicts every victim of `result` (at most
/// [`VICTIM_DELETE_PARALLELISM`] at once; a victim already terminating is left alone), then
/// clears the nomination of the pods in `nominated_to_node` (the pods nominated to
/// `result.node`) whose priority is lower than the preemptor's, so they look elsewhere.
/// Clearing nominations is best-effort, as in Kubernetes; the first eviction error is
/// returned.
pub async fn prepare_candidate(
    client: &Client,
    recorder: Option<&EventRecorder>,
    preemptor: &Pod,
    result: &PreemptionResult,
    nominated_to_node: &[Arc<Pod>],
) -> Result<(), PreemptError> {
    // Plain loops rather than stream combinators over closures: the future must stay `Send`
    // for every lifetime so the scheduler can spawn it.
    let mut victims = Vec::with_capacity(result.victims.len());
    for victim in &result.victims {
        // Graceful deletion has already started: another call would change nothing.
        if victim.metadata.deletion_timestamp.is_none() {
            victims.push(victim);
        }
    }
    let mut victims = victims.into_iter();
    let mut in_flight = FuturesUnordered::new();
    let mut first_error = None;
    loop {
        // After an error no new eviction starts (Kubernetes cancels the rest); those in
        // flight finish.
        while first_error.is_none() && in_flight.len() < VICTIM_DELETE_PARALLELISM {
            let Some(victim) = victims.next() else {
                break;
            };
            in_flight.push(preempt_victim(
                client,
                recorder,
                preemptor,
                &result.node,
                victim,
            ));
        }
        match in_flight.next().await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                first_error.get_or_insert(e);
            }
            None => break,
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }

    for pod in lower_priority_nominated_pods(preemptor, nominated_to_node) {
        if let Err(e) = set_nominated_node_name(client, &pod, None).await {
            warn!(pod = %pod_key(&pod), error = %e, "cannot clear nominatedNodeName");
        }
    }
    Ok(())
}

/// Sets (or, with `None`, clears) `status.nominatedNodeName` of `pod` through the status
/// subresource. Clearing a pod that has no nomination sends nothing.
pub async fn set_nominated_node_name(
    client: &Client,
    pod: &Pod,
    node: Option<&str>,
) -> Result<(), PreemptError> {
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref())
        .filter(|n| !n.is_empty());
    if node.is_none() && current.is_none() {
        return Ok(());
    }
    let patch = Patch::Strategic(json!({"status": {"nominatedNodeName": node}}));
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    match pods_api(client, pod)
        .patch_status(name, &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => Ok(()),
        // A preemptor deleted meanwhile needs no nomination.
        Err(e) if e.is_not_found() => Ok(()),
        Err(source) => Err(PreemptError::Nominate {
            pod: pod_key(pod),
            node: node.unwrap_or_default().to_string(),
            source,
        }),
    }
}

/// The async half in Kubernetes' order: [`prepare_candidate`], then the preemptor's
/// `status.nominatedNodeName` set to `result.node` (which the scheduling queue's nominator
/// should also learn, so later cycles keep the room free for it).
pub async fn execute(
    client: &Client,
    recorder: Option<&EventRecorder>,
    preemptor: &Pod,
    result: &PreemptionResult,
    nominated_to_node: &[Arc<Pod>],
) -> Result<(), PreemptError> {
    prepare_candidate(client, recorder, preemptor, result, nominated_to_node).await?;
    set_nominated_node_name(client, preemptor, Some(&result.node)).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelectorRequirement, ObjectMeta, Time,
    };

    fn pod(name: &str, priority: i32, labels: &[(&str, &str)]) -> Arc<PodInfo> {
        Arc::new(PodInfo {
            pod: Arc::new(Pod {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some("default".to_string()),
                    labels: Some(
                        labels
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    priority: Some(priority),
                    ..PodSpec::default()
                }),
                ..Pod::default()
            }),
            ..PodInfo::default()
        })
    }

    fn pdb(selector: Option<ApiLabelSelector>, allowed: i32) -> Arc<PodDisruptionBudget> {
        Arc::new(PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some("pdb".to_string()),
                namespace: Some("default".to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector,
                ..PodDisruptionBudgetSpec::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: allowed,
                ..PodDisruptionBudgetStatus::default()
            }),
        })
    }

    fn match_labels(k: &str, v: &str) -> Option<ApiLabelSelector> {
        Some(ApiLabelSelector {
            match_labels: Some([(k.to_string(), v.to_string())].into()),
            ..ApiLabelSelector::default()
        })
    }

    fn names(pods: &[Arc<PodInfo>]) -> Vec<&str> {
        pods.iter()
            .map(|p| p.pod.metadata.name.as_deref().unwrap_or_default())
            .collect()
    }

    #[test]
    fn num_candidates_is_ten_percent_at_least_one_hundred_at_most_all() {
        let args = PreemptionArgs::default();
        assert_eq!(calculate_num_candidates(3, &args), 3);
        assert_eq!(calculate_num_candidates(100, &args), 100);
        assert_eq!(calculate_num_candidates(999, &args), 100);
        assert_eq!(calculate_num_candidates(5_000, &args), 500);
        let args = PreemptionArgs {
            min_candidate_nodes_percentage: 50,
            min_candidate_nodes_absolute: 1,
        };
        assert_eq!(calculate_num_candidates(10, &args), 5);
        assert!(args.validate().is_ok());
        let both_zero = PreemptionArgs {
            min_candidate_nodes_percentage: 0,
            min_candidate_nodes_absolute: 0,
        };
        assert!(both_zero.validate().is_err());
    }

    #[test]
    fn pdb_budget_is_spent_in_order() {
        let pods = vec![
            pod("a", 1, &[("app", "web")]),
            pod("b", 1, &[("app", "web")]),
            pod("c", 1, &[("app", "db")]),
            pod("d", 1, &[("app", "web")]),
        ];
        let (violating, non_violating) =
            filter_pods_with_pdb_violation(&pods, &[pdb(match_labels("app", "web"), 1)]);
        assert_eq!(names(&violating), ["b", "d"]);
        assert_eq!(names(&non_violating), ["a", "c"]);
    }

    #[test]
    fn pdb_with_empty_or_invalid_selector_or_other_namespace_protects_nothing() {
        let pods = vec![pod("a", 1, &[("app", "web")])];
        let empty = pdb(Some(ApiLabelSelector::default()), 0);
        let none = pdb(None, 0);
        let invalid = pdb(
            Some(ApiLabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "app".to_string(),
                    operator: "In".to_string(),
                    values: None,
                }]),
                ..ApiLabelSelector::default()
            }),
            0,
        );
        let mut other_namespace = PodDisruptionBudget::clone(&pdb(match_labels("app", "web"), 0));
        other_namespace.metadata.namespace = Some("other".to_string());
        for budget in [empty, none, invalid, Arc::new(other_namespace)] {
            let (violating, _) = filter_pods_with_pdb_violation(&pods, &[budget]);
            assert!(violating.is_empty());
        }
    }

    #[test]
    fn already_disrupted_pods_spend_no_budget() {
        let pods = vec![pod("a", 1, &[("app", "web")])];
        let mut budget = PodDisruptionBudget::clone(&pdb(match_labels("app", "web"), 0));
        if let Some(status) = budget.status.as_mut() {
            status.disrupted_pods = Some([("a".to_string(), Time(Timestamp::now()))].into());
        }
        let (violating, _) = filter_pods_with_pdb_violation(&pods, &[Arc::new(budget)]);
        assert!(violating.is_empty());
    }

    #[test]
    fn more_important_is_higher_priority_then_older() {
        let now = Timestamp::now();
        let older = Time(now - std::time::Duration::from_secs(60));
        let mut a = Pod::clone(&pod("a", 5, &[]).pod);
        let mut b = Pod::clone(&pod("b", 5, &[]).pod);
        a.status = Some(PodStatus {
            start_time: Some(older),
            ..PodStatus::default()
        });
        assert!(more_important_pod(&a, &b, now));
        assert!(!more_important_pod(&b, &a, now));
        if let Some(spec) = b.spec.as_mut() {
            spec.priority = Some(6);
        }
        assert!(more_important_pod(&b, &a, now));
    }

    #[test]
    fn terminating_by_preemption_needs_deletion_and_condition() {
        let mut victim = Pod::clone(&pod("v", 1, &[]).pod);
        victim.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: DISRUPTION_TARGET_CONDITION.to_string(),
                status: "True".to_string(),
                reason: Some(REASON_PREEMPTION_BY_SCHEDULER.to_string()),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        assert!(!pod_terminating_by_preemption(&victim));
        victim.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert!(pod_terminating_by_preemption(&victim));
    }
}
