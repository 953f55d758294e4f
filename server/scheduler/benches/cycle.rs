//! Criterion micro-benchmarks of the scheduler's in-memory hot path, no apiserver:
//!
//! - `schedule_pod/{500,5000}`: one scheduling cycle ([`Algorithm::schedule_pod`]: PreFilter,
//!   Filter over the sampled nodes from the rotating start, PreScore, Score, select) for a
//!   `pod-default` pod (cpu 100m, memory 500Mi) on a cluster of scheduler_perf's nodes (cpu 4,
//!   memory 32Gi, 110 pods, three zones) holding one pod per node, with Kubernetes' default
//!   plugins as [`Scheduler::new`](skerry_scheduler::scheduler::Scheduler::new) assembles
//!   them and the adaptive `percentageOfNodesToScore` (500 nodes: 230 feasible nodes sought;
//!   5,000 nodes: 500).
//! - `update_snapshot/5000`: `docs/tricks.md` #1, copy-on-write NodeInfo snapshots with
//!   generation stamps. `two_changed` bumps two of 5,000 NodeInfos and brings the cycle's snapshot
//!   up to date (two clones, counted and asserted); `two_node_updates_only` is the cost of the two
//!   bumps alone, to subtract; `full_rebuild` is [`Cache::snapshot`], every NodeInfo cloned — what
//!   a cycle would pay without generations.
//! - `filter_parallelism/{500,5000}/{1,2}`: the same cycle with Filter on one thread and on
//!   two (the machine's cores), so the cost of splitting the walk over threads can be read
//!   against what it saves; both must pick the same node, which is asserted before measuring.
//!
//! Run: `cargo bench -p skerry-scheduler --bench cycle`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use skerry_scheduler::cache::{Cache, DURATION_TO_EXPIRE_ASSUMED_POD};
use skerry_scheduler::framework::runtime::Framework;
use skerry_scheduler::framework::{CycleState, PodInfo, Snapshot};
use skerry_scheduler::plugins::{self, interpodaffinity, podtopologyspread};
use skerry_scheduler::scheduler::{
    Algorithm, DEFAULT_PARALLELISM, DEFAULT_SCHEDULER_NAME, NoNominatedPods, PERCENTAGE_ADAPTIVE,
};

/// The allocator of the shipped `skerry` binary (see `appliance/src/main.rs`).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// scheduler_perf's zone values.
const ZONES: [&str; 3] = ["moon-1", "moon-2", "moon-3"];
/// Cluster sizes of SchedulingBasic.
const CLUSTER_SIZES: [usize; 2] = [500, 5_000];
/// The snapshot benchmark's cluster.
const SNAPSHOT_NODES: usize = 5_000;
/// NodeInfos changed between two cycles in the copy-on-write benchmark.
const CHANGED_NODES: usize = 2;

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn node(i: usize) -> Arc<Node> {
    let name = node_name(i);
    let resources = json!({"cpu": "4", "memory": "32Gi", "pods": "110"});
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": ZONES[i % ZONES.len()],
        }},
        "status": {"capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .expect("a valid node");
    Arc::new(node)
}

/// A `pod-default` pod, bound to `node` if given.
fn pod(i: usize, node: Option<String>) -> Arc<Pod> {
    let resources = json!({"cpu": "100m", "memory": "500Mi"});
    let mut value = json!({
        "metadata": {"name": format!("pod-{i:05}"), "namespace": "sched-0",
            "uid": format!("pod-uid-{i}")},
        "spec": {"containers": [{"name": "pause", "image": "pause:3.10",
            "ports": [{"containerPort": 80}],
            "resources": {"limits": resources, "requests": resources}}]},
    });
    if let Some(node) = node {
        value["spec"]["nodeName"] = Value::String(node);
    }
    Arc::new(serde_json::from_value(value).expect("a valid pod"))
}

/// A cache with `nodes` nodes and one bound pod on each.
fn cluster(nodes: usize) -> Cache {
    let cache = Cache::new(DURATION_TO_EXPIRE_ASSUMED_POD);
    for i in 0..nodes {
        cache.add_node(node(i));
    }
    for i in 0..nodes {
        cache
            .add_pod(pod(i, Some(node_name(i))))
            .expect("add a bound pod");
    }
    cache
}

/// Kubernetes' default profile as `Scheduler::new` builds it.
fn default_framework() -> Arc<Framework> {
    let profile = plugins::default_plugins()
        .with(podtopologyspread::PodTopologySpread::default())
        .with(interpodaffinity::InterPodAffinity::default());
    Arc::new(Framework::new(
        DEFAULT_SCHEDULER_NAME,
        profile.pre_filter,
        profile.filter,
        profile.pre_score,
        profile.score,
    ))
}

fn schedule_pod(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule_pod");
    for nodes in CLUSTER_SIZES {
        let cache = cluster(nodes);
        let mut algorithm = Algorithm::new(
            default_framework(),
            PERCENTAGE_ADAPTIVE,
            DEFAULT_PARALLELISM,
            Some(1),
        );
        cache.update_snapshot(algorithm.snapshot_mut());
        let incoming = PodInfo::new(pod(nodes, None));
        group.bench_with_input(BenchmarkId::from_parameter(nodes), &nodes, |b, _| {
            b.iter(|| {
                let mut state = CycleState::default();
                let result = algorithm
                    .schedule_pod(&mut state, &incoming, &NoNominatedPods)
                    .expect("the pod fits");
                black_box(result)
            });
        });
    }
    group.finish();
}

fn update_snapshot(c: &mut Criterion) {
    let cache = cluster(SNAPSHOT_NODES);
    let mut snapshot = Snapshot::default();
    cache.update_snapshot(&mut snapshot);
    let changed: Vec<Arc<Node>> = (0..CHANGED_NODES)
        .map(|k| node(k * SNAPSHOT_NODES / CHANGED_NODES))
        .collect();
    // The point being measured: two changes, two clones.
    for node in &changed {
        cache.update_node(node.clone());
    }
    assert_eq!(cache.update_snapshot(&mut snapshot), CHANGED_NODES);

    let mut group = c.benchmark_group(format!("update_snapshot/{SNAPSHOT_NODES}"));
    group.bench_function("two_changed", |b| {
        b.iter(|| {
            for node in &changed {
                cache.update_node(node.clone());
            }
            black_box(cache.update_snapshot(&mut snapshot))
        });
    });
    group.bench_function("two_node_updates_only", |b| {
        b.iter(|| {
            for node in &changed {
                cache.update_node(node.clone());
            }
        });
    });
    // Leave the incremental snapshot current so the full rebuild's timing is not mixed
    // with catching up.
    cache.update_snapshot(&mut snapshot);
    group.bench_function("full_rebuild", |b| b.iter(|| black_box(cache.snapshot())));
    group.finish();
}

/// Filter on this many threads: one, and the two cores the appliance's boxes have.
const FILTER_PARALLELISMS: [usize; 2] = [1, 2];

fn filter_parallelism(c: &mut Criterion) {
    let mut group = c.benchmark_group("filter_parallelism");
    for nodes in CLUSTER_SIZES {
        let cache = cluster(nodes);
        let incoming = PodInfo::new(pod(nodes, None));
        let mut choices = Vec::new();
        for parallelism in FILTER_PARALLELISMS {
            let mut algorithm = Algorithm::new(
                default_framework(),
                PERCENTAGE_ADAPTIVE,
                parallelism,
                Some(1),
            );
            cache.update_snapshot(algorithm.snapshot_mut());
            let first = algorithm
                .schedule_pod(&mut CycleState::default(), &incoming, &NoNominatedPods)
                .expect("the pod fits");
            choices.push(first.suggested_host);
            group.bench_with_input(
                BenchmarkId::new(nodes.to_string(), parallelism),
                &parallelism,
                |b, _| {
                    b.iter(|| {
                        let result = algorithm
                            .schedule_pod(&mut CycleState::default(), &incoming, &NoNominatedPods)
                            .expect("the pod fits");
                        black_box(result)
                    });
                },
            );
        }
        assert!(
            choices.windows(2).all(|w| w[0] == w[1]),
            "the same first choice whatever the parallelism: {choices:?}"
        );
    }
    group.finish();
}

criterion_group!(benches, schedule_pod, update_snapshot, filter_parallelism);
criterion_main!(benches);
