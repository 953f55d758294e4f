//! Preemption by reprieve (`docs/tricks.md` #3), tested on
//! hand-made nodes with the real NodeResourcesFit filter, against Kubernetes 1.32's
//! `defaultpreemption` rules; and the async half against a real apiserver.
//!
//! Reference: kubernetes/pkg/scheduler/framework/plugins/defaultpreemption/
//! default_preemption.go (`SelectVictimsOnNode`, `filterPodsWithPDBViolation`,
//! `PodEligibleToPreemptOthers`) and framework/preemption/preemption.go
//! (`pickOneNodeForPreemption`, `DryRunPreemption`, `prepareCandidate`).

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use skerry_scheduler::framework::runtime::{Diagnosis, Framework};
use skerry_scheduler::framework::{Code, CycleState, NodeInfo, PodInfo, Snapshot, Status};
use skerry_scheduler::plugins::interpodaffinity::{
    InterPodAffinity, REASON_ANTI_AFFINITY_RULES_NOT_MATCH,
};
use skerry_scheduler::plugins::noderesources::Fit;
use skerry_scheduler::preemption::{
    Candidate, FrameworkRunner, MIN_CANDIDATE_NODES_ABSOLUTE, NO_VICTIMS_FOUND,
    NOT_ELIGIBLE_PREEMPT_NEVER, NOT_ELIGIBLE_TERMINATING, PreemptionArgs, Preemptor, Victims,
    pick_one_node_for_preemption,
};

/// "Now" in every test, so pods without a start time compare deterministically.
fn now() -> Timestamp {
    "2026-01-01T12:00:00Z".parse().unwrap()
}

/// A pod spec builder: `cpu` in millicores, `age_s` seconds since it started.
struct P {
    name: &'static str,
    priority: i32,
    cpu_milli: i64,
    age_s: Option<i64>,
    labels: Value,
    extra_status: Value,
}

fn p(name: &'static str, priority: i32, cpu_milli: i64) -> P {
    P {
        name,
        priority,
        cpu_milli,
        age_s: None,
        labels: json!({}),
        extra_status: json!({}),
    }
}

impl P {
    fn started(mut self, age_s: i64) -> P {
        self.age_s = Some(age_s);
        self
    }
    fn labels(mut self, labels: Value) -> P {
        self.labels = labels;
        self
    }
    fn status(mut self, status: Value) -> P {
        self.extra_status = status;
        self
    }
    fn pod(&self) -> Pod {
        let mut status = self.extra_status.clone();
        if let Some(age) = self.age_s {
            let start = now() - Duration::from_secs(age as u64);
            status["startTime"] = json!(start.to_string());
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": self.name,
                "namespace": "default",
                "uid": format!("uid-{}", self.name),
                "labels": self.labels,
            },
            "spec": {
                "priority": self.priority,
                "containers": [{
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": format!("{}m", self.cpu_milli)}},
                }],
            },
            "status": status,
        }))
        .unwrap()
    }
    fn info(&self) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(self.pod())))
    }
}

fn node(name: &str, cpu_milli: i64, pods: &[P]) -> NodeInfo {
    node_in_zone(name, "zone-a", cpu_milli, pods)
}

fn node_in_zone(name: &str, zone: &str, cpu_milli: i64, pods: &[P]) -> NodeInfo {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": zone,
        }},
        "status": {"allocatable": {"cpu": format!("{cpu_milli}m"), "memory": "64Gi", "pods": "110"}},
    }))
    .unwrap();
    let mut info = NodeInfo::new(Arc::new(node));
    for pod in pods {
        info.add_pod(pod.info());
    }
    info
}

fn snapshot(nodes: Vec<NodeInfo>) -> Snapshot {
    let list: Vec<Arc<NodeInfo>> = nodes.into_iter().map(Arc::new).collect();
    Snapshot {
        node_info_map: list
            .iter()
            .map(|n| (n.name().to_string(), n.clone()))
            .collect(),
        node_info_list: list,
        ..Snapshot::default()
    }
}

/// The real NodeResourcesFit as the only PreFilter and Filter plugin.
fn framework() -> Framework {
    let fit = Arc::new(Fit::default());
    Framework::new(
        "default-scheduler",
        vec![fit.clone()],
        vec![fit],
        Vec::new(),
        Vec::new(),
    )
}

/// A failed scheduling attempt as the scheduler makes it: PreFilter, then Filter on every
/// node; the statuses go into the diagnosis preemption reads.
fn attempt(framework: &Framework, pod: &PodInfo, snapshot: &Snapshot) -> (CycleState, Diagnosis) {
    let mut state = CycleState::default();
    let pre = framework.run_pre_filter_plugins(&mut state, pod, snapshot);
    assert!(pre.status.is_success(), "{:?}", pre.status);
    let mut diagnosis = Diagnosis::default();
    for node in &snapshot.node_info_list {
        let status = framework.run_filter_plugins(&state, pod, node);
        assert!(
            !status.is_success(),
            "test pods must fit nowhere; {} fits",
            node.name()
        );
        diagnosis
            .node_to_status
            .insert(node.name().to_string(), status);
    }
    (state, diagnosis)
}

fn names(pods: &[Arc<PodInfo>]) -> Vec<String> {
    pods.iter()
        .map(|p| p.pod.metadata.name.clone().unwrap())
        .collect()
}

/// Runs `select_victims_on_node` for `preemptor` on a one-node snapshot.
fn victims_on(
    node_info: NodeInfo,
    preemptor: &P,
    pdbs: &[Arc<PodDisruptionBudget>],
) -> Result<Victims, Status> {
    let framework = framework();
    let snapshot = snapshot(vec![node_info]);
    let preemptor = preemptor.info();
    let mut state = CycleState::default();
    framework.run_pre_filter_plugins(&mut state, &preemptor, &snapshot);
    let runner = FrameworkRunner::new(&framework);
    let mut node_info = snapshot.node_info_list[0].clone();
    Preemptor::new(&runner, pdbs)
        .with_now(now())
        .select_victims_on_node(&mut state, &preemptor, &mut node_info)
}

fn pdb(name: &str, labels: Value, disruptions_allowed: i32) -> Arc<PodDisruptionBudget> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": labels}, "maxUnavailable": 1},
            "status": {
                "disruptionsAllowed": disruptions_allowed,
                "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0,
            },
        }))
        .unwrap(),
    )
}

// ---------------------------------------------------------------------------------------
// select_victims_on_node: remove everything, then reprieve.

#[test]
fn reprieve_spares_the_most_important_pod_first() {
    // Pods of priority 1, 2, 3 use 1, 2, 3 of the node's 6 CPUs; the preemptor needs 3.
    // Removing all three frees 6. Reprieve tries priority 3 first: 3 used + 3 = 6 fits, so
    // it stays. Priority 2: 5 + 3 > 6, a victim. Priority 1: 4 + 3 > 6, a victim.
    // Evicting only the priority-3 pod would also make room with fewer victims, but
    // reprieve protects importance, not count: the two cheapest pods go.
    let node_info = node(
        "n1",
        6000,
        &[p("p1", 1, 1000), p("p2", 2, 2000), p("p3", 3, 3000)],
    );
    let victims = victims_on(node_info, &p("preemptor", 10, 3000), &[]).unwrap();
    assert_eq!(names(&victims.pods), ["p2", "p1"]);
    assert_eq!(victims.num_pdb_violations, 0);
}

#[test]
fn lowest_priority_pod_alone_suffices() {
    // 4 CPUs, full: priority 1 (1 CPU), 2 (1 CPU), 3 (2 CPUs). The preemptor needs 1 CPU:
    // reprieving 3 then 2 leaves 1 CPU free only until priority 1 comes back.
    let node_info = node(
        "n1",
        4000,
        &[p("p1", 1, 1000), p("p2", 2, 1000), p("p3", 3, 2000)],
    );
    let victims = victims_on(node_info, &p("preemptor", 10, 1000), &[]).unwrap();
    assert_eq!(names(&victims.pods), ["p1"]);
}

#[test]
fn every_victim_is_needed_and_no_victim_could_be_spared() {
    // Six 1-CPU pods of rising priority fill 6 CPUs; the preemptor needs 4. Reprieve keeps the
    // two most important and evicts the four cheapest — and putting any one victim back
    // would make the preemptor not fit (minimality: no victim is superfluous).
    let pods: Vec<P> = ["a", "b", "c", "d", "e", "f"]
        .into_iter()
        .zip(1..)
        .map(|(name, prio)| p(name, prio, 1000))
        .collect();
    let node_info = node("n1", 6000, &pods);
    let preemptor = p("preemptor", 100, 4000);
    let victims = victims_on(node_info.clone(), &preemptor, &[]).unwrap();
    assert_eq!(names(&victims.pods), ["d", "c", "b", "a"]);

    let framework = framework();
    let preemptor_info = preemptor.info();
    let snap = snapshot(vec![node_info.clone()]);
    let mut state = CycleState::default();
    framework.run_pre_filter_plugins(&mut state, &preemptor_info, &snap);
    for spared in &victims.pods {
        let mut trial = node_info.clone();
        for victim in &victims.pods {
            if !Arc::ptr_eq(victim, spared) {
                assert!(trial.remove_pod(&victim.pod));
            }
        }
        let status = framework.run_filter_plugins(&state, &preemptor_info, &trial);
        assert_eq!(
            status.code,
            Code::Unschedulable,
            "sparing {:?}",
            spared.pod.metadata.name
        );
    }
}

#[test]
fn at_equal_priority_the_older_pod_is_spared() {
    let node_info = node(
        "n1",
        2000,
        &[
            p("young", 1, 1000).started(10),
            p("old", 1, 1000).started(3600),
        ],
    );
    let victims = victims_on(node_info, &p("preemptor", 5, 1000), &[]).unwrap();
    assert_eq!(names(&victims.pods), ["young"]);
}

#[test]
fn a_pod_that_has_not_started_is_the_youngest() {
    let node_info = node(
        "n1",
        2000,
        &[p("pending", 1, 1000), p("running", 1, 1000).started(1)],
    );
    let victims = victims_on(node_info, &p("preemptor", 5, 1000), &[]).unwrap();
    assert_eq!(names(&victims.pods), ["pending"]);
}

#[test]
fn equal_or_higher_priority_pods_are_never_victims() {
    // Only the priority-1 pod may go, and 1 free CPU is not enough for 3.
    let node_info = node("n1", 3000, &[p("peer", 10, 2000), p("low", 1, 1000)]);
    let status = victims_on(node_info, &p("preemptor", 10, 3000), &[]).unwrap_err();
    assert_eq!(status.code, Code::Unschedulable);
    assert_eq!(status.reasons, ["Insufficient cpu"]);
}

#[test]
fn a_node_without_lower_priority_pods_has_no_victims() {
    let node_info = node("n1", 1000, &[p("peer", 10, 1000)]);
    let status = victims_on(node_info, &p("preemptor", 10, 1000), &[]).unwrap_err();
    assert_eq!(status.code, Code::UnschedulableAndUnresolvable);
    assert_eq!(status.reasons, [NO_VICTIMS_FOUND]);
}

#[test]
fn pdb_protected_pods_are_reprieved_first() {
    // "old" is more important than "web" (same priority, started earlier). Without a PDB,
    // reprieve keeps "top", then "old", and "web" is the victim.
    let pods = || {
        [
            p("web", 1, 1000).started(60).labels(json!({"app": "web"})),
            p("old", 1, 1000).started(3600),
            p("top", 2, 1000),
        ]
    };
    let preemptor = p("preemptor", 10, 1000);
    let victims = victims_on(node("n1", 3000, &pods()), &preemptor, &[]).unwrap();
    assert_eq!(names(&victims.pods), ["web"]);

    // A PDB with no disruption left makes evicting "web" a violation: it is reprieved before
    // every non-violating pod, so "old" goes instead and nothing is violated.
    let budget = [pdb("web", json!({"app": "web"}), 0)];
    let victims = victims_on(node("n1", 3000, &pods()), &preemptor, &budget).unwrap();
    assert_eq!(names(&victims.pods), ["old"]);
    assert_eq!(victims.num_pdb_violations, 0);

    // With budget to spare, "web" is an ordinary pod again.
    let budget = [pdb("web", json!({"app": "web"}), 1)];
    let victims = victims_on(node("n1", 3000, &pods()), &preemptor, &budget).unwrap();
    assert_eq!(names(&victims.pods), ["web"]);
}

#[test]
fn unavoidable_pdb_violations_are_counted_and_victims_stay_sorted() {
    // Both PDB-protected pods must go with the cheap one: 3 victims, 2 violations, reported
    // most important first across the violating and non-violating runs.
    let pods = [
        p("web-1", 5, 1000).labels(json!({"app": "web"})),
        p("web-2", 3, 1000).labels(json!({"app": "web"})),
        p("cheap", 4, 1000),
    ];
    let budget = [pdb("web", json!({"app": "web"}), 0)];
    let victims = victims_on(node("n1", 3000, &pods), &p("preemptor", 10, 3000), &budget).unwrap();
    assert_eq!(names(&victims.pods), ["web-1", "cheap", "web-2"]);
    assert_eq!(victims.num_pdb_violations, 2);
}

#[test]
fn the_snapshot_is_never_modified() {
    let framework = framework();
    let snap = snapshot(vec![node("n1", 2000, &[p("a", 1, 1000), p("b", 1, 1000)])]);
    let before = snap.node_info_list[0].clone();
    let preemptor = p("preemptor", 10, 2000).info();
    let (state, diagnosis) = attempt(&framework, &preemptor, &snap);
    let runner = FrameworkRunner::new(&framework);
    let result = Preemptor::new(&runner, &[])
        .with_now(now())
        .preempt(
            &state,
            &preemptor,
            &snap,
            &diagnosis,
            &mut StdRng::seed_from_u64(1),
        )
        .unwrap();
    assert_eq!(result.victims.len(), 2);
    let after = &snap.node_info_list[0];
    assert!(Arc::ptr_eq(&before, after));
    assert_eq!(after.pods.len(), 2);
    assert_eq!(after.requested.milli_cpu, 2000);
}

// ---------------------------------------------------------------------------------------
// pickOneNodeForPreemption: the rules one by one.

fn candidate(node: &str, num_pdb_violations: usize, victims: &[P]) -> Candidate {
    Candidate {
        node: node.to_string(),
        victims: Victims {
            pods: victims.iter().map(P::info).collect(),
            num_pdb_violations,
        },
    }
}

fn pick(candidates: &[Candidate]) -> &str {
    let i = pick_one_node_for_preemption(candidates, now()).unwrap();
    &candidates[i].node
}

#[test]
fn rule_1_fewest_pdb_violations() {
    // "b" has the more important victim, but violates no PDB.
    let candidates = [
        candidate("a", 1, &[p("x", 1, 1)]),
        candidate("b", 0, &[p("y", 9, 1)]),
    ];
    assert_eq!(pick(&candidates), "b");
}

#[test]
fn rule_2_lowest_highest_priority_victim() {
    // "a" evicts fewer pods, but its most important victim matters more.
    let candidates = [
        candidate("a", 0, &[p("x", 5, 1)]),
        candidate("b", 0, &[p("y", 4, 1), p("z", 4, 1), p("w", 1, 1)]),
    ];
    assert_eq!(pick(&candidates), "b");
}

#[test]
fn rule_3_smallest_priority_sum() {
    let candidates = [
        candidate("a", 0, &[p("x", 5, 1), p("y", 4, 1)]),
        candidate("b", 0, &[p("z", 5, 1), p("w", 1, 1)]),
    ];
    assert_eq!(pick(&candidates), "b");
}

#[test]
fn rule_3_offsets_negative_priorities() {
    // Summed raw, two priority -5 victims (-10) would look cheaper than one (-5); with every
    // priority offset by 2^31 the node with one victim wins, as in Kubernetes.
    let candidates = [
        candidate("a", 0, &[p("x", -5, 1), p("y", -5, 1)]),
        candidate("b", 0, &[p("z", -5, 1)]),
    ];
    assert_eq!(pick(&candidates), "b");
}

#[test]
fn rule_4_fewest_victims() {
    // With every priority offset by 2^31, a victim of priority i32::MIN adds 0 to the sum, so
    // both nodes tie on rules 2 and 3; the node with one victim wins.
    let candidates = [
        candidate("a", 0, &[p("x", 3, 1), p("y", i32::MIN, 1)]),
        candidate("b", 0, &[p("z", 3, 1)]),
    ];
    assert_eq!(pick(&candidates), "b");
}

#[test]
fn rule_5_latest_start_of_the_highest_priority_victims() {
    // Same priorities and counts; "b"'s priority-3 victims started later (the earliest of
    // them 100 s ago versus 500 s on "a"), so less work is lost there.
    let candidates = [
        candidate(
            "a",
            0,
            &[p("x", 3, 1).started(500), p("y", 1, 1).started(5)],
        ),
        candidate(
            "b",
            0,
            &[p("z", 3, 1).started(100), p("w", 1, 1).started(9000)],
        ),
    ];
    assert_eq!(pick(&candidates), "b");
}

#[test]
fn rule_6_first_candidate_on_a_full_tie() {
    let candidates = [
        candidate("a", 0, &[p("x", 3, 1).started(100)]),
        candidate("b", 0, &[p("y", 3, 1).started(100)]),
    ];
    assert_eq!(pick(&candidates), "a");
    assert_eq!(pick_one_node_for_preemption(&[], now()), None);
}

// ---------------------------------------------------------------------------------------
// Preempt: eligibility, candidates, the choice of node.

fn preempt_on(
    snap: &Snapshot,
    preemptor: &PodInfo,
    pdbs: &[Arc<PodDisruptionBudget>],
) -> Result<
    skerry_scheduler::preemption::PreemptionResult,
    skerry_scheduler::preemption::PreemptionFailure,
> {
    let framework = framework();
    let (state, diagnosis) = attempt(&framework, preemptor, snap);
    let runner = FrameworkRunner::new(&framework);
    Preemptor::new(&runner, pdbs).with_now(now()).preempt(
        &state,
        preemptor,
        snap,
        &diagnosis,
        &mut StdRng::seed_from_u64(7),
    )
}

#[test]
fn preempt_picks_the_node_with_the_least_important_victims() {
    let snap = snapshot(vec![
        node("n1", 2000, &[p("a1", 5, 2000)]),
        node("n2", 2000, &[p("b1", 2, 1000), p("b2", 2, 1000)]),
        node("n3", 2000, &[p("c1", 1, 1000), p("c2", 3, 1000)]),
    ]);
    let result = preempt_on(&snap, &p("preemptor", 10, 2000).info(), &[]).unwrap();
    // Highest victim priority: n1 5, n2 2, n3 3.
    assert_eq!(result.node, "n2");
    let victims: Vec<_> = result
        .victims
        .iter()
        .map(|v| v.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(victims, ["b1", "b2"]);
}

#[test]
fn preempt_with_no_candidate_explains_per_node_and_clears_the_nomination() {
    // n1: no lower-priority pod. n2: even empty, too small. n3 is rejected as unresolvable
    // (made so below), so preemption does not look at it.
    let snap = snapshot(vec![
        node("n1", 4000, &[p("peer", 10, 4000)]),
        node("n2", 1000, &[p("low", 1, 1000)]),
        node("n3", 8000, &[p("low3", 1, 8000)]),
    ]);
    let preemptor = p("preemptor", 10, 2000).info();
    let framework = framework();
    let (state, mut diagnosis) = attempt(&framework, &preemptor, &snap);
    diagnosis.node_to_status.insert(
        "n3".to_string(),
        Status::new(
            Code::UnschedulableAndUnresolvable,
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ),
    );
    let runner = FrameworkRunner::new(&framework);
    let failure = Preemptor::new(&runner, &[])
        .with_now(now())
        .preempt(
            &state,
            &preemptor,
            &snap,
            &diagnosis,
            &mut StdRng::seed_from_u64(7),
        )
        .unwrap_err();
    assert_eq!(failure.status.code, Code::Unschedulable);
    assert!(failure.clear_nominated_node_name);
    assert_eq!(
        failure.status.reasons,
        [
            "preemption: 0/3 nodes are available: 1 Insufficient cpu, 1 No preemption victims \
          found for incoming pod, 1 Preemption is not helpful for scheduling."
        ]
    );
}

#[test]
fn preemption_policy_never_is_not_eligible() {
    let snap = snapshot(vec![node("n1", 1000, &[p("low", 1, 1000)])]);
    let mut pod = p("preemptor", 10, 1000).pod();
    pod.spec.as_mut().unwrap().preemption_policy = Some("Never".to_string());
    let failure = preempt_on(&snap, &PodInfo::new(Arc::new(pod)), &[]).unwrap_err();
    assert_eq!(failure.status.code, Code::Unschedulable);
    assert_eq!(
        failure.status.reasons,
        [format!("preemption: {NOT_ELIGIBLE_PREEMPT_NEVER}")]
    );
    assert!(!failure.clear_nominated_node_name);
}

/// A lower-priority pod on n1 terminating because the scheduler preempted it.
fn terminating_victim() -> P {
    p("dying", 1, 1000).status(json!({
        "conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
        }],
    }))
}

fn nominated_preemptor(node: &str) -> PodInfo {
    let mut pod = p("preemptor", 10, 2000).pod();
    pod.status.as_mut().unwrap().nominated_node_name = Some(node.to_string());
    PodInfo::new(Arc::new(pod))
}

#[test]
fn a_preemptor_waiting_for_its_victims_does_not_preempt_again() {
    let mut dying = terminating_victim().pod();
    dying.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let mut n1 = node("n1", 2000, &[p("other", 1, 1000)]);
    n1.add_pod(Arc::new(PodInfo::new(Arc::new(dying))));
    let snap = snapshot(vec![n1]);
    let failure = preempt_on(&snap, &nominated_preemptor("n1"), &[]).unwrap_err();
    assert_eq!(
        failure.status.reasons,
        [format!("preemption: {NOT_ELIGIBLE_TERMINATING}")]
    );
    assert!(!failure.clear_nominated_node_name);
}

#[test]
fn a_victim_not_yet_deleted_does_not_block_preemption() {
    // The DisruptionTarget condition without a deletion timestamp is not "terminating".
    let snap = snapshot(vec![node(
        "n1",
        2000,
        &[terminating_victim(), p("other", 1, 1000)],
    )]);
    let result = preempt_on(&snap, &nominated_preemptor("n1"), &[]).unwrap();
    assert_eq!(result.node, "n1");
}

#[test]
fn an_unresolvable_nominated_node_allows_preempting_again() {
    let mut dying = terminating_victim().pod();
    dying.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let mut n1 = node("n1", 2000, &[p("other", 1, 1000)]);
    n1.add_pod(Arc::new(PodInfo::new(Arc::new(dying))));
    let snap = snapshot(vec![n1, node("n2", 2000, &[p("low", 1, 2000)])]);
    let preemptor = nominated_preemptor("n1");
    let framework = framework();
    let (state, mut diagnosis) = attempt(&framework, &preemptor, &snap);
    diagnosis.node_to_status.insert(
        "n1".to_string(),
        Status::new(Code::UnschedulableAndUnresolvable, "NodeName", "gone"),
    );
    let runner = FrameworkRunner::new(&framework);
    let result = Preemptor::new(&runner, &[])
        .with_now(now())
        .preempt(
            &state,
            &preemptor,
            &snap,
            &diagnosis,
            &mut StdRng::seed_from_u64(7),
        )
        .unwrap();
    assert_eq!(result.node, "n2");
}

#[test]
fn nominated_pods_of_higher_priority_keep_their_room() {
    // n1 has 4 CPUs: a priority-1 pod uses 2, and a priority-20 pod is nominated there for 3.
    // The preemptor (priority 10, 2 CPUs) must not take the nominated pod's room: even with
    // the low pod evicted, 3 + 2 > 4, so n1 is no candidate although its victim would be the
    // cheapest, and preemption goes to n2.
    let snap = snapshot(vec![
        node("n1", 4000, &[p("low1", 1, 2000)]),
        node("n2", 2000, &[p("low2", 5, 2000)]),
    ]);
    let nominated: HashMap<String, Vec<Arc<PodInfo>>> =
        [("n1".to_string(), vec![p("vip", 20, 3000).info()])].into();
    let lookup = |node: &str| nominated.get(node).cloned().unwrap_or_default();
    let framework = framework();
    let preemptor = p("preemptor", 10, 2000).info();
    let mut state = CycleState::default();
    framework.run_pre_filter_plugins(&mut state, &preemptor, &snap);
    let runner = FrameworkRunner::new(&framework).with_nominated_pods(&lookup);
    let mut diagnosis = Diagnosis::default();
    for node in &snap.node_info_list {
        use skerry_scheduler::preemption::FilterRunner;
        let status = runner.run_filter_plugins_with_nominated_pods(&state, &preemptor, node);
        assert_eq!(status.code, Code::Unschedulable);
        diagnosis
            .node_to_status
            .insert(node.name().to_string(), status);
    }
    let result = Preemptor::new(&runner, &[])
        .with_now(now())
        .preempt(
            &state,
            &preemptor,
            &snap,
            &diagnosis,
            &mut StdRng::seed_from_u64(7),
        )
        .unwrap();
    assert_eq!(result.node, "n2");
    assert_eq!(result.victims[0].metadata.name.as_deref(), Some("low2"));
}

/// A preemptor that must not share `topology_key`'s domain with an `app: db` pod.
fn anti_db_preemptor(topology_key: &str) -> PodInfo {
    let mut pod = p("preemptor", 10, 1000).pod();
    pod.spec.as_mut().unwrap().affinity = Some(
        serde_json::from_value(json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": "db"}},
                "topologyKey": topology_key,
            }],
        }}))
        .unwrap(),
    );
    PodInfo::new(Arc::new(pod))
}

#[test]
fn removing_a_victim_updates_the_prefilter_state_of_inter_pod_anti_affinity() {
    // The preemptor's anti-affinity counts `app: db` pods per zone in PreFilter state. On
    // zone-a the db pod has priority 1, on zone-b priority 5: zone-a is the cheaper eviction,
    // and it works only if removing the victim also decrements the count in the cloned
    // CycleState (InterPodAffinity's RemovePod extension) — the NodeInfo alone is not enough.
    for topology_key in ["topology.kubernetes.io/zone", "kubernetes.io/hostname"] {
        let snap = snapshot(vec![
            node_in_zone(
                "n1",
                "zone-a",
                4000,
                &[p("db", 1, 1000).labels(json!({"app": "db"}))],
            ),
            node_in_zone(
                "n2",
                "zone-b",
                4000,
                &[p("db2", 5, 1000).labels(json!({"app": "db"}))],
            ),
        ]);
        let fit = Arc::new(Fit::default());
        let affinity = Arc::new(InterPodAffinity::default());
        let framework = Framework::new(
            "default-scheduler",
            vec![fit.clone(), affinity.clone()],
            vec![fit, affinity],
            Vec::new(),
            Vec::new(),
        );
        let preemptor = anti_db_preemptor(topology_key);
        let (state, diagnosis) = attempt(&framework, &preemptor, &snap);
        for status in diagnosis.node_to_status.values() {
            assert_eq!(status.reasons, [REASON_ANTI_AFFINITY_RULES_NOT_MATCH]);
        }
        let runner = FrameworkRunner::new(&framework);
        let result = Preemptor::new(&runner, &[])
            .with_now(now())
            .preempt(
                &state,
                &preemptor,
                &snap,
                &diagnosis,
                &mut StdRng::seed_from_u64(3),
            )
            .unwrap();
        assert_eq!(result.node, "n1", "{topology_key}");
        assert_eq!(result.victims.len(), 1);
        assert_eq!(result.victims[0].metadata.name.as_deref(), Some("db"));
    }
}

#[test]
fn dry_run_starts_at_the_offset_and_stops_at_enough_candidates() {
    // 300 identical full nodes: each could take the preemptor. With the defaults,
    // max(10 % of 300, 100) = 100 candidates are enough.
    let nodes: Vec<NodeInfo> = (0..300)
        .map(|i| {
            let mut n = node(&format!("n{i:03}"), 1000, &[]);
            n.add_pod(Arc::new(PodInfo::new(Arc::new({
                let mut pod = p("low", 1, 1000).pod();
                pod.metadata.uid = Some(format!("uid-low-{i}"));
                pod
            }))));
            n
        })
        .collect();
    let snap = snapshot(nodes);
    let framework = framework();
    let preemptor = p("preemptor", 10, 1000).info();
    let mut state = CycleState::default();
    framework.run_pre_filter_plugins(&mut state, &preemptor, &snap);
    let runner = FrameworkRunner::new(&framework);
    let preemptor_engine = Preemptor::new(&runner, &[]).with_now(now());
    let num = skerry_scheduler::preemption::calculate_num_candidates(
        snap.num_nodes(),
        &PreemptionArgs::default(),
    );
    assert_eq!(num, MIN_CANDIDATE_NODES_ABSOLUTE as usize);
    let (candidates, statuses, errors) =
        preemptor_engine.dry_run_preemption(&state, &preemptor, &snap.node_info_list, 250, num);
    assert_eq!(candidates.len(), 100);
    assert!(statuses.is_empty());
    assert!(errors.is_empty());
    // Nodes 250..299, then wrapping to 0..49.
    assert_eq!(candidates[0].node, "n250");
    assert_eq!(candidates[49].node, "n299");
    assert_eq!(candidates[50].node, "n000");
    assert_eq!(candidates[99].node, "n049");
}

#[test]
fn dry_run_keeps_looking_for_a_candidate_without_pdb_violations() {
    // Nodes 0..3 can only preempt a PDB-protected pod; node 4 has a free victim. With
    // num_candidates = 2 the run does not stop at two violating candidates.
    let budget = [pdb("web", json!({"app": "web"}), 0)];
    let mut nodes: Vec<NodeInfo> = (0..4)
        .map(|i| {
            let mut pod = p("web", 1, 1000).labels(json!({"app": "web"})).pod();
            pod.metadata.uid = Some(format!("uid-web-{i}"));
            let mut n = node(&format!("n{i}"), 1000, &[]);
            n.add_pod(Arc::new(PodInfo::new(Arc::new(pod))));
            n
        })
        .collect();
    nodes.push(node("n4", 1000, &[p("free", 1, 1000)]));
    let snap = snapshot(nodes);
    let framework = framework();
    let preemptor = p("preemptor", 10, 1000).info();
    let mut state = CycleState::default();
    framework.run_pre_filter_plugins(&mut state, &preemptor, &snap);
    let runner = FrameworkRunner::new(&framework);
    let engine = Preemptor::new(&runner, &budget).with_now(now());
    let (candidates, _, _) =
        engine.dry_run_preemption(&state, &preemptor, &snap.node_info_list, 0, 2);
    let nodes: Vec<&str> = candidates.iter().map(|c| c.node.as_str()).collect();
    // Non-violating first; violating ones capped at 2.
    assert_eq!(nodes, ["n4", "n0", "n1"]);
    assert_eq!(candidates[1].victims.num_pdb_violations, 1);

    let result = preempt_on(&snap, &preemptor, &budget).unwrap();
    assert_eq!(result.node, "n4");
    assert_eq!(result.num_pdb_violations, 0);
}

// ---------------------------------------------------------------------------------------
// The async half against a real apiserver.

mod live {
    use super::*;
    use skerry_apiserver::testing::TestServer;
    use skerry_client::events::EventRecorder;
    use skerry_client::{Client, Config, Credentials, ListParams, PostParams};
    use skerry_scheduler::preemption::{PreemptionResult, execute};

    async fn client_as(server: &TestServer, user: &str) -> Client {
        let (cert_pem, key_pem) = server.issue_client_cert(user, &[]).unwrap();
        let mut config = Config::new(&server.url());
        config.ca_pem = Some(server.ca_pem().to_string());
        config.credentials = Credentials::ClientCert { cert_pem, key_pem };
        config.qps = 0.0;
        Client::new(config).unwrap()
    }

    async fn create(client: &Client, name: &str, node: Option<&str>) -> Pod {
        let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }))
        .unwrap();
        client
            .api::<Pod>(Some("default"))
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    fn with_priority(mut pod: Pod, priority: i32) -> Pod {
        pod.spec.as_mut().unwrap().priority = Some(priority);
        pod
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn execute_evicts_victims_nominates_and_clears_lower_nominations() {
        let server = TestServer::start().await.unwrap();
        // The scheduler's own identity, so its RBAC role is what is exercised.
        let client = client_as(&server, "system:kube-scheduler").await;
        let admin = {
            let mut config = Config::new(&server.url());
            config.ca_pem = Some(server.ca_pem().to_string());
            config.credentials = Credentials::ClientCert {
                cert_pem: server.admin_cert_pem().to_string(),
                key_pem: server.admin_key_pem().to_string(),
            };
            config.qps = 0.0;
            Client::new(config).unwrap()
        };
        let pods = admin.api::<Pod>(Some("default"));

        let victim = create(&admin, "victim", Some("n1")).await;
        let preemptor = create(&admin, "preemptor", None).await;
        let lower = create(&admin, "lower-nominated", None).await;
        let higher = create(&admin, "higher-nominated", None).await;
        for pod in [&lower, &higher] {
            skerry_scheduler::preemption::set_nominated_node_name(&client, pod, Some("n1"))
                .await
                .unwrap();
        }
        let lower = with_priority(pods.get("lower-nominated").await.unwrap(), 1);
        let higher = with_priority(pods.get("higher-nominated").await.unwrap(), 100);
        let preemptor = with_priority(preemptor, 10);

        let recorder = EventRecorder::new(client.clone(), "default-scheduler");
        let result = PreemptionResult {
            node: "n1".to_string(),
            victims: vec![Arc::new(victim.clone())],
            num_pdb_violations: 0,
        };
        execute(
            &client,
            Some(&recorder),
            &preemptor,
            &result,
            &[Arc::new(lower), Arc::new(higher)],
        )
        .await
        .unwrap();
        recorder.flush().await;

        // The victim is gone or terminating gracefully, marked as preempted by the scheduler.
        if let Some(v) = pods.get_opt("victim").await.unwrap() {
            assert!(v.metadata.deletion_timestamp.is_some());
            let conditions = v.status.unwrap().conditions.unwrap();
            let target = conditions
                .iter()
                .find(|c| c.type_ == "DisruptionTarget")
                .unwrap();
            assert_eq!(target.reason.as_deref(), Some("PreemptionByScheduler"));
            assert_eq!(
                target.message.as_deref(),
                Some("default-scheduler: preempting to accommodate a higher priority pod")
            );
        }
        let nominated = |p: Pod| p.status.and_then(|s| s.nominated_node_name);
        assert_eq!(
            nominated(pods.get("preemptor").await.unwrap()).as_deref(),
            Some("n1")
        );
        assert_eq!(nominated(pods.get("lower-nominated").await.unwrap()), None);
        assert_eq!(
            nominated(pods.get("higher-nominated").await.unwrap()).as_deref(),
            Some("n1")
        );

        let uid = preemptor.metadata.uid.clone().unwrap();
        let events = admin.api::<Event>(Some("default"));
        let mut found = false;
        for _ in 0..50 {
            let list = events.list(&ListParams::default()).await.unwrap();
            found = list.items.iter().any(|e| {
                e.reason.as_deref() == Some("Preempted")
                    && e.involved_object.name.as_deref() == Some("victim")
                    && e.message.as_deref() == Some(&format!("Preempted by pod {uid} on node n1"))
            });
            if found {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(found, "no Preempted event on the victim");

        // Preempting a victim that is already gone is not an error.
        execute(&client, None, &preemptor, &result, &[])
            .await
            .unwrap();
    }
}
