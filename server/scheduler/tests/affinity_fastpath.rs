//! Property test for `docs/tricks.md` #4, the inter-pod-affinity hostname fast path: on
//! random small clusters whose affinity terms all use
//! `kubernetes.io/hostname`, InterPodAffinity with the fast path (`PathMode::Auto`) gives
//! exactly the answers of Kubernetes' topology-map algorithm (`PathMode::FullOnly`):
//!
//! - the same Filter status (code and reason) on every node;
//! - the same Filter status on a node after preemption's hypothetical changes (victims
//!   removed with `remove_pod`, a nominated pod added with `add_pod`);
//! - the same normalized scores over a random feasible subset;
//!
//! and Auto really takes the fast path whenever hostname values are unique, and falls back
//! to the full path when two nodes share one. Pods are built as real `Pod` objects with
//! `spec.affinity` and go through `PodInfo::new` and `NodeInfo::add_pod`, as in the cache.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::{
    Affinity, Node, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec,
    WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use skerry_scheduler::framework::{
    CycleState, FilterPlugin, NodeInfo, NodeScore, PodInfo, PreFilterPlugin, PreScorePlugin,
    ScorePlugin, Snapshot, Status,
};
use skerry_scheduler::plugins::interpodaffinity::{
    AffinityPath, HOSTNAME_LABEL, InterPodAffinity, NamespaceLabelsHandle, PathMode,
};

/// Random cases per run: enough to hit every branch many times (the counters below check
/// that), small enough to run in a few seconds in a debug build.
const CASES: u32 = 600;
/// Nodes per cluster: small, so random pods collide on nodes and selectors often match.
const NODES_MAX: usize = 6;
/// Existing pods per cluster.
const PODS_MAX: usize = 14;
/// Label values per key: two values make matches common and misses possible.
const VALUES: u8 = 2;
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const NAMESPACES: [&str; 2] = ["default", "other"];

// ---------------------------------------------------------------------------------------
// Generated specs (small, shrinkable) and their conversion to API objects.

#[derive(Clone, Debug)]
enum SelectorSpec {
    AppIs(u8),
    AppIn(Vec<u8>),
    AppNotIn(u8),
    TierExists,
    TierMissing,
    /// `{}`: selects every pod.
    Everything,
    /// No selector: selects nothing.
    Nil,
}

#[derive(Clone, Debug)]
enum NamespacesSpec {
    /// Neither namespaces nor selector: the pod's own namespace.
    Own,
    /// Both listed.
    Both,
    /// `namespaceSelector: {env: prod}` (only "other" has it).
    Prod,
    /// `namespaceSelector: {}`: every namespace.
    All,
}

#[derive(Clone, Debug)]
struct TermSpec {
    selector: SelectorSpec,
    namespaces: NamespacesSpec,
}

#[derive(Clone, Debug)]
struct PodGen {
    app: Option<u8>,
    tier: Option<u8>,
    other_namespace: bool,
    required_affinity: Vec<TermSpec>,
    required_anti_affinity: Vec<TermSpec>,
    preferred_affinity: Vec<(TermSpec, i32)>,
    preferred_anti_affinity: Vec<(TermSpec, i32)>,
}

#[derive(Clone, Debug)]
struct NodeGen {
    has_hostname: bool,
    zone: Option<u8>,
}

#[derive(Clone, Debug)]
struct ClusterGen {
    nodes: Vec<NodeGen>,
    /// (node index, pod).
    pods: Vec<(usize, PodGen)>,
    incoming: PodGen,
    /// Which nodes are "feasible" for scoring (index into nodes, modulo).
    feasible: Vec<bool>,
    /// Preemption scenario: node index, which of its pods to remove, a nominated pod.
    preempt_node: usize,
    victims: Vec<bool>,
    nominated: Option<PodGen>,
    /// When set, node i (if it exists) carries node j's hostname value.
    duplicate_hostname: Option<(usize, usize)>,
}

fn selector_spec() -> impl Strategy<Value = SelectorSpec> {
    prop_oneof![
        4 => (0..VALUES).prop_map(SelectorSpec::AppIs),
        1 => prop::collection::vec(0..VALUES, 1..=2).prop_map(SelectorSpec::AppIn),
        1 => (0..VALUES).prop_map(SelectorSpec::AppNotIn),
        1 => Just(SelectorSpec::TierExists),
        1 => Just(SelectorSpec::TierMissing),
        1 => Just(SelectorSpec::Everything),
        1 => Just(SelectorSpec::Nil),
    ]
}

fn namespaces_spec() -> impl Strategy<Value = NamespacesSpec> {
    prop_oneof![
        4 => Just(NamespacesSpec::Own),
        1 => Just(NamespacesSpec::Both),
        1 => Just(NamespacesSpec::Prod),
        1 => Just(NamespacesSpec::All),
    ]
}

fn term_spec() -> impl Strategy<Value = TermSpec> {
    (selector_spec(), namespaces_spec()).prop_map(|(selector, namespaces)| TermSpec {
        selector,
        namespaces,
    })
}

fn terms(max: usize) -> impl Strategy<Value = Vec<TermSpec>> {
    prop::collection::vec(term_spec(), 0..=max)
}

fn weighted(max: usize) -> impl Strategy<Value = Vec<(TermSpec, i32)>> {
    prop::collection::vec((term_spec(), 1..=100i32), 0..=max)
}

/// A pod; `terms_likely` raises the chance of terms (for the incoming pod).
fn pod_gen(terms_likely: bool) -> impl Strategy<Value = PodGen> {
    let max = if terms_likely { 2 } else { 1 };
    let gate = if terms_likely { 0.7 } else { 0.3 };
    (
        prop::option::weighted(0.9, 0..VALUES),
        prop::option::weighted(0.5, 0..VALUES),
        prop::bool::weighted(0.2),
        prop::bool::weighted(gate),
        terms(max),
        terms(max),
        weighted(max),
        weighted(max),
    )
        .prop_map(
            move |(app, tier, other_namespace, has_terms, ra, raa, pa, paa)| {
                let keep = |v: Vec<TermSpec>| if has_terms { v } else { Vec::new() };
                let keep_w = |v: Vec<(TermSpec, i32)>| if has_terms { v } else { Vec::new() };
                PodGen {
                    app,
                    tier,
                    other_namespace,
                    required_affinity: keep(ra),
                    required_anti_affinity: keep(raa),
                    preferred_affinity: keep_w(pa),
                    preferred_anti_affinity: keep_w(paa),
                }
            },
        )
}

fn cluster_gen() -> impl Strategy<Value = ClusterGen> {
    let node = (
        prop::bool::weighted(0.9),
        prop::option::weighted(0.8, 0..3u8),
    )
        .prop_map(|(has_hostname, zone)| NodeGen { has_hostname, zone });
    (
        prop::collection::vec(node, 1..=NODES_MAX),
        prop::collection::vec((0..NODES_MAX, pod_gen(false)), 0..=PODS_MAX),
        pod_gen(true),
        prop::collection::vec(any::<bool>(), NODES_MAX),
        0..NODES_MAX,
        prop::collection::vec(prop::bool::weighted(0.4), PODS_MAX),
        prop::option::weighted(0.5, pod_gen(false)),
        prop::option::weighted(0.15, (0..NODES_MAX, 0..NODES_MAX)),
    )
        .prop_map(
            |(nodes, pods, incoming, feasible, preempt_node, victims, nominated, dup)| {
                let n = nodes.len();
                ClusterGen {
                    pods: pods.into_iter().map(|(i, p)| (i % n, p)).collect(),
                    preempt_node: preempt_node % n,
                    duplicate_hostname: dup.map(|(i, j)| (i % n, j % n)).filter(|(i, j)| i != j),
                    nodes,
                    incoming,
                    feasible,
                    victims,
                    nominated,
                }
            },
        )
}

fn api_selector(spec: &SelectorSpec) -> Option<LabelSelector> {
    let expression = |key: &str, operator: &str, values: Option<Vec<String>>| LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values,
        }]),
        match_labels: None,
    };
    match spec {
        SelectorSpec::AppIs(v) => Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_string(), format!("a{v}"))])),
            match_expressions: None,
        }),
        SelectorSpec::AppIn(vs) => Some(expression(
            "app",
            "In",
            Some(vs.iter().map(|v| format!("a{v}")).collect()),
        )),
        SelectorSpec::AppNotIn(v) => Some(expression("app", "NotIn", Some(vec![format!("a{v}")]))),
        SelectorSpec::TierExists => Some(expression("tier", "Exists", None)),
        SelectorSpec::TierMissing => Some(expression("tier", "DoesNotExist", None)),
        SelectorSpec::Everything => Some(LabelSelector::default()),
        SelectorSpec::Nil => None,
    }
}

fn api_term(spec: &TermSpec) -> PodAffinityTerm {
    let (namespaces, namespace_selector) = match spec.namespaces {
        NamespacesSpec::Own => (None, None),
        NamespacesSpec::Both => (
            Some(NAMESPACES.iter().map(|n| n.to_string()).collect()),
            None,
        ),
        NamespacesSpec::Prod => (
            None,
            Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("env".to_string(), "prod".to_string())])),
                match_expressions: None,
            }),
        ),
        NamespacesSpec::All => (None, Some(LabelSelector::default())),
    };
    PodAffinityTerm {
        label_selector: api_selector(&spec.selector),
        namespaces,
        namespace_selector,
        topology_key: HOSTNAME_LABEL.into(),
        ..Default::default()
    }
}

fn api_weighted(terms: &[(TermSpec, i32)]) -> Option<Vec<WeightedPodAffinityTerm>> {
    (!terms.is_empty()).then(|| {
        terms
            .iter()
            .map(|(t, weight)| WeightedPodAffinityTerm {
                pod_affinity_term: api_term(t),
                weight: *weight,
            })
            .collect()
    })
}

fn api_terms(terms: &[TermSpec]) -> Option<Vec<PodAffinityTerm>> {
    (!terms.is_empty()).then(|| terms.iter().map(api_term).collect())
}

fn api_pod(name: &str, spec: &PodGen, node_name: Option<&str>) -> Pod {
    let mut labels = BTreeMap::new();
    if let Some(app) = spec.app {
        labels.insert("app".to_string(), format!("a{app}"));
    }
    if let Some(tier) = spec.tier {
        labels.insert("tier".to_string(), format!("t{tier}"));
    }
    let affinity = Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: api_terms(&spec.required_affinity),
            preferred_during_scheduling_ignored_during_execution: api_weighted(
                &spec.preferred_affinity,
            ),
        }),
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: api_terms(
                &spec.required_anti_affinity,
            ),
            preferred_during_scheduling_ignored_during_execution: api_weighted(
                &spec.preferred_anti_affinity,
            ),
        }),
        node_affinity: None,
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACES[usize::from(spec.other_namespace)].into()),
            uid: Some(format!("uid-{name}")),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node_name.map(str::to_string),
            affinity: Some(affinity),
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct Cluster {
    snapshot: Snapshot,
    incoming: PodInfo,
    hostnames_unique: bool,
}

fn build(case: &ClusterGen) -> Cluster {
    let names: Vec<String> = (0..case.nodes.len()).map(|i| format!("n{i}")).collect();
    let mut infos: Vec<NodeInfo> = case
        .nodes
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let mut labels = BTreeMap::new();
            if spec.has_hostname {
                let hostname = match case.duplicate_hostname {
                    Some((dup, of)) if dup == i => &names[of],
                    _ => &names[i],
                };
                labels.insert(HOSTNAME_LABEL.to_string(), hostname.clone());
            }
            if let Some(zone) = spec.zone {
                labels.insert(ZONE_LABEL.to_string(), format!("z{zone}"));
            }
            NodeInfo::new(Arc::new(Node {
                metadata: ObjectMeta {
                    name: Some(names[i].clone()),
                    labels: Some(labels),
                    ..Default::default()
                },
                ..Default::default()
            }))
        })
        .collect();
    for (k, (node, spec)) in case.pods.iter().enumerate() {
        let pod = api_pod(&format!("p{k}"), spec, Some(&names[*node]));
        infos[*node].add_pod(Arc::new(PodInfo::new(Arc::new(pod))));
    }
    let list: Vec<Arc<NodeInfo>> = infos.into_iter().map(Arc::new).collect();
    // Unique unless the duplicate lands on two nodes that both carry the label.
    let hostnames_unique = match case.duplicate_hostname {
        Some((dup, of)) => !(case.nodes[dup].has_hostname && case.nodes[of].has_hostname),
        None => true,
    };
    Cluster {
        snapshot: Snapshot {
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
            generation: 1,
        },
        incoming: PodInfo::new(Arc::new(api_pod("incoming", &case.incoming, None))),
        hostnames_unique,
    }
}

fn namespace_labels() -> NamespaceLabelsHandle {
    let handle = NamespaceLabelsHandle::default();
    handle.write().insert("default".into(), BTreeMap::new());
    handle.write().insert(
        "other".into(),
        BTreeMap::from([("env".to_string(), "prod".to_string())]),
    );
    handle
}

// ---------------------------------------------------------------------------------------
// Running a plugin as the framework does.

/// What one mode answered for a case.
#[derive(Debug, PartialEq)]
struct Answers {
    /// Per node: (code, reasons); a skipped plugin passes every node.
    filter: Vec<(String, Vec<String>)>,
    /// The preemption node after removals and the nominated add.
    hypothetical: (String, Vec<String>),
    /// Normalized scores of the feasible nodes; a skipped PreScore gives 0 everywhere.
    scores: Vec<i64>,
}

fn outcome(status: &Status) -> (String, Vec<String>) {
    (format!("{:?}", status.code), status.reasons.clone())
}

fn run(
    mode: PathMode,
    case: &ClusterGen,
    cluster: &Cluster,
) -> (Answers, Option<AffinityPath>, Option<AffinityPath>) {
    let plugin = InterPodAffinity::new(namespace_labels()).with_mode(mode);
    let snapshot = &cluster.snapshot;
    let pod = &cluster.incoming;

    let mut state = CycleState::default();
    let pre = plugin.pre_filter(&mut state, pod, snapshot);
    let skipped = pre.is_skip();
    assert!(skipped || pre.is_success(), "PreFilter failed: {pre:?}");
    let filter_path = InterPodAffinity::filter_path(&state);
    let filter_on = |state: &CycleState, node: &NodeInfo| {
        if skipped {
            Status::success()
        } else {
            plugin.filter(state, pod, node)
        }
    };
    let filter = snapshot
        .node_info_list
        .iter()
        .map(|n| outcome(&filter_on(&state, n)))
        .collect();

    // Preemption on one node: remove the chosen victims, add a nominated pod, on clones.
    let original = &snapshot.node_info_list[case.preempt_node];
    let mut node = (**original).clone();
    let mut hypothetical_state = state.clone();
    for (k, victim) in original.pods.iter().enumerate() {
        if case.victims.get(k).copied().unwrap_or(false) {
            assert!(node.remove_pod(&victim.pod));
            if !skipped {
                let status = plugin.remove_pod(&mut hypothetical_state, pod, victim, &node);
                assert!(status.is_success());
            }
        }
    }
    if let Some(nominated) = &case.nominated {
        let info = Arc::new(PodInfo::new(Arc::new(api_pod(
            "nominated",
            nominated,
            Some(node.name()),
        ))));
        node.add_pod(info.clone());
        if !skipped {
            assert!(
                plugin
                    .add_pod(&mut hypothetical_state, pod, &info, &node)
                    .is_success()
            );
        }
    }
    let hypothetical = outcome(&filter_on(&hypothetical_state, &node));

    // Scores over the feasible subset (at least one node).
    let mut feasible: Vec<Arc<NodeInfo>> = snapshot
        .node_info_list
        .iter()
        .enumerate()
        .filter(|(i, _)| case.feasible[*i])
        .map(|(_, n)| n.clone())
        .collect();
    if feasible.is_empty() {
        feasible.push(snapshot.node_info_list[0].clone());
    }
    let mut score_state = CycleState::default();
    let pre = plugin.pre_score(&mut score_state, pod, &feasible, snapshot);
    let mut scores: Vec<NodeScore> = feasible
        .iter()
        .map(|n| NodeScore {
            name: n.name().to_string(),
            score: if pre.is_skip() {
                0
            } else {
                plugin.score(&score_state, pod, n).expect("score")
            },
        })
        .collect();
    if !pre.is_skip() {
        assert!(
            plugin
                .normalize(&score_state, pod, &mut scores)
                .is_success()
        );
    }
    let score_path = InterPodAffinity::score_path(&score_state);
    (
        Answers {
            filter,
            hypothetical,
            scores: scores.into_iter().map(|s| s.score).collect(),
        },
        filter_path,
        score_path,
    )
}

// Counters proving the random cases exercise what matters (checked after the run).
static FAST_FILTER: AtomicUsize = AtomicUsize::new(0);
static FAST_SCORE: AtomicUsize = AtomicUsize::new(0);
static FALLBACK: AtomicUsize = AtomicUsize::new(0);
static REJECTED: AtomicUsize = AtomicUsize::new(0);
static ACCEPTED: AtomicUsize = AtomicUsize::new(0);
static HYPOTHETICAL_CHANGED: AtomicUsize = AtomicUsize::new(0);
static NONZERO_SCORES: AtomicUsize = AtomicUsize::new(0);

fn check(case: ClusterGen) -> Result<(), TestCaseError> {
    let cluster = build(&case);
    let (fast, fast_filter_path, fast_score_path) = run(PathMode::Auto, &case, &cluster);
    let (full, full_filter_path, _) = run(PathMode::FullOnly, &case, &cluster);
    prop_assert_eq!(&fast, &full, "fast path disagrees with the full path");

    // FullOnly never takes the fast path; Auto takes it exactly when hostnames are unique.
    prop_assert_ne!(full_filter_path, Some(AffinityPath::Hostname));
    if let Some(path) = fast_filter_path {
        let expected = if cluster.hostnames_unique {
            AffinityPath::Hostname
        } else {
            AffinityPath::Full
        };
        prop_assert_eq!(path, expected);
        if path == AffinityPath::Hostname {
            FAST_FILTER.fetch_add(1, Ordering::Relaxed);
        } else {
            FALLBACK.fetch_add(1, Ordering::Relaxed);
        }
    }
    if let Some(path) = fast_score_path {
        prop_assert_eq!(path == AffinityPath::Hostname, cluster.hostnames_unique);
        if path == AffinityPath::Hostname {
            FAST_SCORE.fetch_add(1, Ordering::Relaxed);
        }
    }
    let rejected = fast
        .filter
        .iter()
        .filter(|(code, _)| code != "Success")
        .count();
    REJECTED.fetch_add(rejected, Ordering::Relaxed);
    ACCEPTED.fetch_add(fast.filter.len() - rejected, Ordering::Relaxed);
    if fast.hypothetical != fast.filter[case.preempt_node] {
        HYPOTHETICAL_CHANGED.fetch_add(1, Ordering::Relaxed);
    }
    if fast.scores.iter().any(|s| *s != 0) {
        NONZERO_SCORES.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

#[test]
fn hostname_fast_path_matches_full_path() {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        ..Config::default()
    });
    let result = runner.run(&cluster_gen(), check);
    if let Err(e) = result {
        panic!("{e}");
    }
    let fast_filter = FAST_FILTER.load(Ordering::Relaxed);
    let fast_score = FAST_SCORE.load(Ordering::Relaxed);
    let fallback = FALLBACK.load(Ordering::Relaxed);
    let rejected = REJECTED.load(Ordering::Relaxed);
    let accepted = ACCEPTED.load(Ordering::Relaxed);
    let changed = HYPOTHETICAL_CHANGED.load(Ordering::Relaxed);
    let nonzero = NONZERO_SCORES.load(Ordering::Relaxed);
    eprintln!(
        "fast filter {fast_filter}, fast score {fast_score}, fallback {fallback}, rejected \
         {rejected}, accepted {accepted}, preemption changed the verdict {changed}, non-zero \
         scores {nonzero}"
    );
    // The comparison is only meaningful if the cases cover both verdicts and both paths.
    let floor = CASES as usize / 10;
    assert!(
        fast_filter > floor,
        "fast filter path taken only {fast_filter} times"
    );
    assert!(
        fast_score > floor,
        "fast score path taken only {fast_score} times"
    );
    assert!(
        fallback > 0,
        "duplicate hostnames never forced the full path"
    );
    assert!(rejected > floor, "only {rejected} rejections");
    assert!(accepted > floor, "only {accepted} acceptances");
    assert!(changed > 0, "preemption never changed a verdict");
    assert!(nonzero > floor, "only {nonzero} non-zero score lists");
}
