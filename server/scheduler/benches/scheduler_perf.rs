//! The scheduler benchmark, in the style of Kubernetes' scheduler_perf
//! (`test/integration/scheduler_perf`, workloads from its `config/performance-config.yaml`):
//! fake nodes and pods created through a real apiserver (`TestServer`, in process, TLS, RBAC,
//! admission, the watch cache), no kubelet. Each run:
//!
//! 1. starts a fresh server; creates `N` nodes as scheduler_perf's `node-default.yaml`
//!    (capacity = allocatable: cpu 4, memory 32Gi, pods 110; a Ready condition), labelled
//!    with their hostname and one of three zones (`moon-1..3`, scheduler_perf's
//!    `labelNodePrepareStrategy` values);
//! 2. creates the init pods **already bound** (`spec.nodeName` set at create) so setting up
//!    is not a scheduling run of its own (scheduler_perf schedules its init pods, or skips
//!    waiting for them with `skipWaitToCompletion`);
//! 3. starts the scheduler with its real identity (`system:kube-scheduler`) and waits until
//!    its cache holds every node and init pod;
//! 4. starts the clock at the first create of the `M` measured pods (created 48 at a time by
//!    an unthrottled client, as scheduler_perf creates them while it measures) and stops it
//!    when a watch on their namespace has seen every one of them with `spec.nodeName` set.
//!
//! Reported per run: pods/s (`M` over the measured time), the per-second throughput samples'
//! average / p50 / p90 / p99 as scheduler_perf's `SchedulingThroughput` (one sample per full
//! second), the scheduling **attempt** latency p50 / p99 from the scheduler's attempt
//! observer (Kubernetes' `scheduler_scheduling_attempt_duration_seconds`: the cycle plus the
//! bind's round trip), the mean time of the algorithm alone (`scheduling_algorithm_duration`),
//! and when the last create returned (if it is close to the end, creating the pods was the
//! bound). Each workload's result is checked (anti-affinity: one pod per node; spread: zone
//! skew within `maxSkew`; preemption: the high-priority pods evicted low-priority ones).
//!
//! The scheduler's client runs in one of two modes:
//! - `unlimited`: no client-side rate limit — what the scheduler and the apiserver can do.
//!   scheduler_perf itself runs the scheduler with QPS 5,000 / burst 5,000
//!   (`mustSetupCluster` in `test/integration/scheduler_perf/util.go`), far above any rate
//!   reached here, so this is its setting;
//! - `kube-scheduler-default`: QPS 50 / burst 100, kube-scheduler's own `clientConnection`
//!   defaults (`pkg/scheduler/apis/config/v1/defaults.go`): every bind is a request, so
//!   once the burst is spent binds go at 50/s (the event writer shares the limiter but is one
//!   request at a time against up to `BINDS_IN_FLIGHT_MAX` waiting binds), and an attempt's
//!   latency becomes the wait for a token.
//!
//! Workloads (scheduler_perf's names and templates):
//! - `SchedulingBasic/500Nodes` (500 init, 1,000 measured) and `SchedulingBasic/5000Nodes`
//!   (1,000 init, 5,000 measured — issue 7's size; scheduler_perf measures 1,000): `pod-default`,
//!   requests = limits = cpu 100m / memory 500Mi;
//! - `SchedulingPodAntiAffinity/500Nodes` (100 init in `sched-0`, 400 measured in `sched-1`)
//!   and `/5000Nodes` (1,000 + 1,000): label `color: green`, required anti-affinity to
//!   `color: green` on `kubernetes.io/hostname` across both namespaces;
//! - `TopologySpreading/500Nodes` (1,000 default init, 1,000 measured) and `/5000Nodes`
//!   (5,000 + 2,000): `color: blue`, `maxSkew: 5` on `topology.kubernetes.io/zone`,
//!   `DoNotSchedule` (scheduler_perf's `pod-with-topology-spreading.yaml`);
//! - `PreemptionBasic/500Nodes`: 2,000 low-priority init pods (cpu 900m, grace 0: four fill a
//!   node to 3.6 of 4 CPUs), then 500 high-priority pods (PriorityClass value 10, cpu 3) that
//!   each must evict three of them.
//!
//! Run: `cargo bench -p skerry-scheduler --bench scheduler_perf` (the default plan, ~4-5 min
//! on 2 cores). `SCHED_PERF_CASES` (comma list of workload names), `SCHED_PERF_MODES`
//! (default `unlimited`) and `SCHED_PERF_RUNS` (default 1) replace the plan;
//! `SCHED_PERF_TIMEOUT_SECS` (default 600) bounds a run, which then reports what is stuck.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config as ClientConfig, Credentials};
use skerry_client::{Api, Client, ListParams, PostParams, WatchEvent, WatchParams};
use skerry_scheduler::metrics::{self, AttemptResult};
use skerry_scheduler::scheduler::{self, Attempt, AttemptObserver, Scheduler};
use tokio_util::sync::CancellationToken;

/// The allocator of the shipped `skerry` binary (see `appliance/src/main.rs`): the apiserver,
/// the scheduler and the clients here run in one process, as they do in `skerry server`, and
/// glibc's malloc would charge them ~20 % of the run's CPU that skerry does not pay.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Creates in flight at once while setting up and while measuring: enough to keep both cores
/// of the apiserver busy, few enough not to queue hundreds of requests behind each other.
const CREATE_CONCURRENCY: usize = 48;

/// scheduler_perf's `node-default.yaml` capacity (used as allocatable too, as Kubernetes'
/// defaulting copies capacity into an empty allocatable).
const NODE_CPU: &str = "4";
/// See [`NODE_CPU`].
const NODE_MEMORY: &str = "32Gi";
/// See [`NODE_CPU`].
const NODE_PODS: &str = "110";
/// scheduler_perf's zone values for `topology.kubernetes.io/zone`.
const ZONES: [&str; 3] = ["moon-1", "moon-2", "moon-3"];

/// `pod-default.yaml`'s requests (= limits).
const POD_CPU: &str = "100m";
/// See [`POD_CPU`]; every template asks for this much memory.
const POD_MEMORY: &str = "500Mi";
/// `pod-low-priority.yaml`: four of these fill a 4-CPU node to 3.6.
const LOW_PRIORITY_CPU: &str = "900m";
/// `pod-high-priority.yaml`: needs three low-priority pods gone from a node.
const HIGH_PRIORITY_CPU: &str = "3000m";
/// `pod-high-priority.yaml`'s `priority: 10`, here through a PriorityClass (skerry's
/// Priority admission, like Kubernetes', refuses a raw `spec.priority`).
const HIGH_PRIORITY_VALUE: i32 = 10;
/// The class the high-priority pods name.
const HIGH_PRIORITY_CLASS: &str = "scheduler-perf-high";
/// `pod-with-topology-spreading.yaml`'s `maxSkew`.
const SPREAD_MAX_SKEW: usize = 5;
/// The templates' image (never pulled: there is no kubelet).
const PAUSE_IMAGE: &str = "pause:3.10";

/// Where init pods live (scheduler_perf's `createNamespaces` with prefix `sched`).
const NS_INIT: &str = "sched-0";
/// Where the measured pods live; the watch counts only these.
const NS_MEASURE: &str = "sched-1";

/// kube-scheduler's `clientConnection.qps` default.
const KUBE_SCHEDULER_QPS: f64 = 50.0;
/// kube-scheduler's `clientConnection.burst` default.
const KUBE_SCHEDULER_BURST: u32 = 100;

/// scheduler_perf's `throughputSampleInterval`: one throughput sample per second.
const THROUGHPUT_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// A run whose pods are not all bound by then has failed (at 50 QPS, 5,000 pods need about
/// 200 s of requests).
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest the scheduler may take to take in the nodes and init pods.
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the bench checks the scheduler's cache while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Server-side timeout of the bench's watch; it is re-opened from the last version seen.
const WATCH_TIMEOUT_SECONDS: u32 = 300;

/// The scheduler's identity in `skerry server`.
const SCHEDULER_USER: &str = "system:kube-scheduler";

/// What a pod looks like (one scheduler_perf template each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodKind {
    /// `pod-default.yaml`.
    Default,
    /// `pod-with-pod-anti-affinity.yaml`.
    AntiAffinity,
    /// `pod-with-topology-spreading.yaml`.
    Spreading,
    /// `pod-low-priority.yaml`.
    LowPriority,
    /// `pod-high-priority.yaml`.
    HighPriority,
}

/// One scheduler_perf workload.
#[derive(Clone, Copy, Debug)]
struct Workload {
    name: &'static str,
    nodes: usize,
    init_pods: usize,
    init_kind: PodKind,
    measure_pods: usize,
    measure_kind: PodKind,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "SchedulingBasic/500Nodes",
        nodes: 500,
        init_pods: 500,
        init_kind: PodKind::Default,
        measure_pods: 1_000,
        measure_kind: PodKind::Default,
    },
    Workload {
        name: "SchedulingBasic/5000Nodes",
        nodes: 5_000,
        init_pods: 1_000,
        init_kind: PodKind::Default,
        measure_pods: 5_000,
        measure_kind: PodKind::Default,
    },
    Workload {
        name: "SchedulingPodAntiAffinity/500Nodes",
        nodes: 500,
        init_pods: 100,
        init_kind: PodKind::AntiAffinity,
        measure_pods: 400,
        measure_kind: PodKind::AntiAffinity,
    },
    Workload {
        name: "SchedulingPodAntiAffinity/5000Nodes",
        nodes: 5_000,
        init_pods: 1_000,
        init_kind: PodKind::AntiAffinity,
        measure_pods: 1_000,
        measure_kind: PodKind::AntiAffinity,
    },
    Workload {
        name: "TopologySpreading/500Nodes",
        nodes: 500,
        init_pods: 1_000,
        init_kind: PodKind::Default,
        measure_pods: 1_000,
        measure_kind: PodKind::Spreading,
    },
    Workload {
        name: "TopologySpreading/5000Nodes",
        nodes: 5_000,
        init_pods: 5_000,
        init_kind: PodKind::Default,
        measure_pods: 2_000,
        measure_kind: PodKind::Spreading,
    },
    Workload {
        name: "PreemptionBasic/500Nodes",
        nodes: 500,
        init_pods: 2_000,
        init_kind: PodKind::LowPriority,
        measure_pods: 500,
        measure_kind: PodKind::HighPriority,
    },
];

/// The scheduler client's rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Unlimited,
    KubeSchedulerDefault,
}

impl Mode {
    fn parse(s: &str) -> Result<Mode> {
        match s {
            "unlimited" => Ok(Mode::Unlimited),
            "kube-scheduler-default" => Ok(Mode::KubeSchedulerDefault),
            other => bail!("unknown mode {other:?} (unlimited, kube-scheduler-default)"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Unlimited => "unlimited",
            Mode::KubeSchedulerDefault => "kube-scheduler-default",
        }
    }

    /// (QPS, burst); QPS 0 is unlimited.
    fn limits(self) -> (f64, u32) {
        match self {
            Mode::Unlimited => (0.0, 1),
            Mode::KubeSchedulerDefault => (KUBE_SCHEDULER_QPS, KUBE_SCHEDULER_BURST),
        }
    }
}

/// The default plan: (workload, mode, runs). Medians of 3 for SchedulingBasic; one run of the
/// rest; the QPS-50 rows once each (a 5,000-pod run at 50 QPS takes minutes).
const DEFAULT_PLAN: &[(&str, Mode, usize)] = &[
    ("SchedulingBasic/500Nodes", Mode::Unlimited, 3),
    ("SchedulingBasic/5000Nodes", Mode::Unlimited, 3),
    ("SchedulingPodAntiAffinity/500Nodes", Mode::Unlimited, 1),
    ("TopologySpreading/500Nodes", Mode::Unlimited, 1),
    ("PreemptionBasic/500Nodes", Mode::Unlimited, 1),
    ("SchedulingBasic/500Nodes", Mode::KubeSchedulerDefault, 1),
    ("SchedulingBasic/5000Nodes", Mode::KubeSchedulerDefault, 1),
];

/// What one run measured.
#[derive(Clone, Debug)]
struct RunResult {
    /// First create to the last pod seen bound.
    elapsed: Duration,
    pods: usize,
    /// When the last create returned, from the first.
    created_after: Duration,
    /// Pods bound in each full second of the run.
    per_second: Vec<f64>,
    /// Attempt latencies of the measured pods' scheduled attempts.
    scheduled_attempts: Vec<Duration>,
    /// Attempts that found no node (preemption's first attempts).
    unschedulable_attempts: usize,
    /// Mean of `scheduling_algorithm_duration` over the run (all pods of the run).
    algorithm_mean: Duration,
    cycles: u64,
    bind_failures: u64,
    /// The workload's own check, in words.
    check: String,
}

impl RunResult {
    fn pods_per_second(&self) -> f64 {
        self.pods as f64 / self.elapsed.as_secs_f64()
    }
}

/// scheduler_perf's percentile: the sample at `ceil(n * p / 100) - 1` of the sorted samples.
fn percentile<T: Copy + PartialOrd>(sorted: &[T], p: usize) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let index = (sorted.len() * p).div_ceil(100).saturating_sub(1);
    sorted.get(index.min(sorted.len() - 1)).copied()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn client(server: &TestServer, cert: &str, key: &str, qps: f64, burst: u32) -> Result<Client> {
    let mut config = ClientConfig::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: cert.to_string(),
        key_pem: key.to_string(),
    };
    config.qps = qps;
    config.burst = burst;
    Client::new(config).context("build a client")
}

fn from_json<T: DeserializeOwned>(value: Value) -> Result<T> {
    serde_json::from_value(value).context("decode a template")
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// Runs `f(0..count)` with [`CREATE_CONCURRENCY`] in flight; the first error wins.
async fn run_concurrently<F, Fut>(count: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut results = stream::iter(0..count)
        .map(f)
        .buffer_unordered(CREATE_CONCURRENCY);
    while let Some(result) = results.next().await {
        result?;
    }
    Ok(())
}

/// scheduler_perf's `node-default.yaml`: capacity = allocatable, Ready, created with its
/// status in one request as a kubelet registers its node.
fn node_object(i: usize) -> Result<Node> {
    let name = node_name(i);
    let resources = json!({"cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": NODE_PODS});
    from_json(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/zone": ZONES[i % ZONES.len()],
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "phase": "Running",
        },
    }))
}

/// A pod of `kind` named `name` in `namespace`, bound to `node` if given.
fn pod_object(kind: PodKind, namespace: &str, name: &str, node: Option<&str>) -> Result<Pod> {
    let cpu = match kind {
        PodKind::LowPriority => LOW_PRIORITY_CPU,
        PodKind::HighPriority => HIGH_PRIORITY_CPU,
        PodKind::Default | PodKind::AntiAffinity | PodKind::Spreading => POD_CPU,
    };
    let resources = json!({"cpu": cpu, "memory": POD_MEMORY});
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{
            "name": "pause",
            "image": PAUSE_IMAGE,
            "ports": [{"containerPort": 80}],
            "resources": {"limits": resources, "requests": resources},
        }]},
    });
    match kind {
        PodKind::Default => {}
        PodKind::AntiAffinity => {
            pod["metadata"]["labels"] = json!({"color": "green"});
            pod["spec"]["affinity"] = json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"color": "green"}},
                    "topologyKey": "kubernetes.io/hostname",
                    "namespaces": [NS_INIT, NS_MEASURE],
                }],
            }});
        }
        PodKind::Spreading => {
            pod["metadata"]["labels"] = json!({"color": "blue"});
            pod["spec"]["topologySpreadConstraints"] = json!([{
                "maxSkew": SPREAD_MAX_SKEW,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"color": "blue"}},
            }]);
        }
        PodKind::LowPriority => {
            pod["spec"]["terminationGracePeriodSeconds"] = json!(0);
        }
        PodKind::HighPriority => {
            pod["spec"]["priorityClassName"] = json!(HIGH_PRIORITY_CLASS);
        }
    }
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    from_json(pod)
}

fn pod_name(i: usize) -> String {
    format!("pod-{i:05}")
}

/// Sums a histogram's `_sum` and `_count` over its label sets in `text`.
fn histogram_sum_count(text: &str, name: &str) -> (f64, f64) {
    let (mut sum, mut count) = (0.0, 0.0);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if rest.starts_with("_sum") {
            sum += value;
        } else if rest.starts_with("_count") {
            count += value;
        }
    }
    (sum, count)
}

const ALGORITHM_HISTOGRAM: &str = "scheduler_scheduling_algorithm_duration_seconds";

/// Watches `api` from `resource_version` until `want` distinct pods were seen bound; returns
/// the instant each was first seen bound, in order.
async fn watch_bound(api: Api<Pod>, resource_version: String, want: usize) -> Result<Vec<Instant>> {
    let mut seen: HashSet<String> = HashSet::with_capacity(want);
    let mut times = Vec::with_capacity(want);
    let mut version = resource_version;
    while seen.len() < want {
        let params = WatchParams {
            resource_version: Some(version.clone()),
            timeout_seconds: Some(WATCH_TIMEOUT_SECONDS),
            ..WatchParams::default()
        };
        let mut events = api.watch(&params).await.context("watch the pods")?;
        while let Some(event) = events.next().await {
            let pod = match event.context("watch event")? {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => pod,
                WatchEvent::Deleted(_) => continue,
                WatchEvent::Bookmark {
                    resource_version, ..
                } => {
                    version = resource_version;
                    continue;
                }
                WatchEvent::Error(status) => bail!("watch error: {status:?}"),
            };
            if let Some(v) = &pod.metadata.resource_version {
                version.clone_from(v);
            }
            let bound = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty());
            if bound
                && let Some(name) = pod.metadata.name
                && seen.insert(name)
            {
                times.push(Instant::now());
                if seen.len() == want {
                    break;
                }
            }
        }
    }
    Ok(times)
}

/// Creates the namespaces, the PriorityClass, the nodes and the init pods.
async fn set_up(admin: &Client, workload: &Workload) -> Result<()> {
    for ns in [NS_INIT, NS_MEASURE] {
        let namespace: Namespace = from_json(json!({"metadata": {"name": ns}}))?;
        admin
            .api::<Namespace>(None)
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("create namespace {ns}"))?;
    }
    if workload.measure_kind == PodKind::HighPriority {
        let class: PriorityClass = from_json(json!({
            "metadata": {"name": HIGH_PRIORITY_CLASS},
            "value": HIGH_PRIORITY_VALUE,
        }))?;
        admin
            .api::<PriorityClass>(None)
            .create(&PostParams::default(), &class)
            .await
            .context("create the PriorityClass")?;
    }
    let nodes = admin.api::<Node>(None);
    run_concurrently(workload.nodes, |i| {
        let nodes = nodes.clone();
        async move {
            let node = node_object(i)?;
            nodes
                .create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("create {}", node_name(i)))?;
            Ok(())
        }
    })
    .await?;
    let pods = admin.api::<Pod>(Some(NS_INIT));
    run_concurrently(workload.init_pods, |i| {
        let pods = pods.clone();
        let kind = workload.init_kind;
        let node = node_name(i % workload.nodes);
        async move {
            let pod = pod_object(kind, NS_INIT, &pod_name(i), Some(&node))?;
            pods.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("create init pod {i}"))?;
            Ok(())
        }
    })
    .await
}

/// Node name -> zone, as [`node_object`] labels them.
fn zone_of(node: &str) -> Option<&'static str> {
    let index: usize = node.strip_prefix("node-")?.parse().ok()?;
    Some(ZONES[index % ZONES.len()])
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// The workload's own check of the outcome; an error if it does not hold.
async fn check(admin: &Client, workload: &Workload, preemptions: u64) -> Result<String> {
    let list = |ns: &'static str| {
        let api = admin.api::<Pod>(Some(ns));
        async move {
            api.list(&ListParams::default())
                .await
                .with_context(|| format!("list pods in {ns}"))
                .map(|l| l.items)
        }
    };
    let measured = list(NS_MEASURE).await?;
    ensure!(
        measured.len() == workload.measure_pods,
        "{} measured pods exist, want {}",
        measured.len(),
        workload.measure_pods
    );
    match workload.measure_kind {
        PodKind::Default => Ok("all bound".into()),
        PodKind::AntiAffinity => {
            let init = list(NS_INIT).await?;
            let mut per_node: HashMap<&str, usize> = HashMap::new();
            for pod in init.iter().chain(&measured) {
                *per_node
                    .entry(node_of(pod).unwrap_or_default())
                    .or_default() += 1;
            }
            let crowded = per_node.values().filter(|n| **n > 1).count();
            ensure!(crowded == 0, "{crowded} nodes hold two anti-affinity pods");
            Ok(format!("{} nodes, one pod each", per_node.len()))
        }
        PodKind::Spreading => {
            let mut per_zone: BTreeMap<&str, usize> = ZONES.iter().map(|z| (*z, 0)).collect();
            for pod in &measured {
                let zone = node_of(pod)
                    .and_then(zone_of)
                    .context("a pod off the zones")?;
                *per_zone.entry(zone).or_default() += 1;
            }
            let max = per_zone.values().max().copied().unwrap_or(0);
            let min = per_zone.values().min().copied().unwrap_or(0);
            ensure!(
                max - min <= SPREAD_MAX_SKEW,
                "zone skew {} > {SPREAD_MAX_SKEW}: {per_zone:?}",
                max - min
            );
            Ok(format!(
                "per zone {:?}",
                per_zone.values().collect::<Vec<_>>()
            ))
        }
        PodKind::HighPriority => {
            let low_left = list(NS_INIT).await?.len();
            let evicted = workload.init_pods - low_left;
            ensure!(
                evicted >= workload.measure_pods,
                "only {evicted} low-priority pods were evicted for {} preemptors",
                workload.measure_pods
            );
            Ok(format!(
                "{preemptions} preemptions, {evicted} victims deleted"
            ))
        }
        PodKind::LowPriority => Ok(String::new()),
    }
}

/// How many sample pods [`stuck_report`] describes.
const STUCK_SAMPLES: usize = 3;

/// What a timed-out run left behind: the queue's pending pods by sub-queue and a few of the
/// pods still unbound, with their nomination and `PodScheduled` condition.
async fn stuck_report(measured: &Api<Pod>) -> String {
    let pending: Vec<String> = metrics::encode_text()
        .lines()
        .filter(|l| l.starts_with("scheduler_pending_pods{"))
        .map(str::to_string)
        .collect();
    let unbound = match measured.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter(|p| node_of(p).is_none_or(str::is_empty))
            .collect::<Vec<_>>(),
        Err(e) => return format!("pending {pending:?}; cannot list the pods: {e}"),
    };
    let samples: Vec<String> = unbound
        .iter()
        .take(STUCK_SAMPLES)
        .map(|p| {
            let status = p.status.as_ref();
            let condition = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
                .map(|c| format!("{} {:?}", c.status, c.message))
                .unwrap_or_else(|| "no PodScheduled condition".into());
            format!(
                "{} nominated {:?} {condition}",
                p.metadata.name.as_deref().unwrap_or_default(),
                status.and_then(|s| s.nominated_node_name.as_deref())
            )
        })
        .collect();
    format!(
        "pending {pending:?}; {} unbound, e.g. {samples:?}",
        unbound.len()
    )
}

/// One run of `workload` with the scheduler's client in `mode`.
async fn run_once(workload: &Workload, mode: Mode, seed: u64) -> Result<RunResult> {
    let server = TestServer::start().await?;
    let admin = client(
        &server,
        server.admin_cert_pem(),
        server.admin_key_pem(),
        0.0,
        1,
    )?;
    set_up(&admin, workload).await?;

    let (cert, key) = server.issue_client_cert(SCHEDULER_USER, &[])?;
    let (qps, burst) = mode.limits();
    let scheduler_client = client(&server, &cert, &key, qps, burst)?;
    let attempts: Arc<Mutex<Vec<(AttemptResult, Duration)>>> = Arc::default();
    let sink = attempts.clone();
    let measured_prefix = format!("{NS_MEASURE}/");
    let observer: AttemptObserver = Arc::new(move |attempt: &Attempt| {
        if attempt.pod.starts_with(&measured_prefix) {
            sink.lock().push((attempt.result, attempt.duration));
        }
    });
    let config = scheduler::Config {
        seed: Some(seed),
        attempt_observer: Some(observer),
        ..scheduler::Config::default()
    };
    let scheduler = Scheduler::new(scheduler_client, config)?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(scheduler.clone().run(stop.clone()));
    let deadline = Instant::now() + SYNC_TIMEOUT;
    while scheduler.cache().node_count() < workload.nodes
        || scheduler.cache().pod_count() < workload.init_pods
    {
        ensure!(
            Instant::now() < deadline,
            "the scheduler's cache did not fill: {} nodes, {} pods",
            scheduler.cache().node_count(),
            scheduler.cache().pod_count()
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }

    let measured = admin.api::<Pod>(Some(NS_MEASURE));
    let from = measured
        .list(&ListParams::default())
        .await
        .context("list the measured namespace")?
        .metadata
        .resource_version
        .unwrap_or_default();
    let watching = tokio::spawn(watch_bound(measured.clone(), from, workload.measure_pods));
    let (sum_before, count_before) =
        histogram_sum_count(&metrics::encode_text(), ALGORITHM_HISTOGRAM);

    let start = Instant::now();
    let creating = tokio::spawn({
        let measured = measured.clone();
        let workload = *workload;
        async move {
            run_concurrently(workload.measure_pods, |i| {
                let measured = measured.clone();
                async move {
                    let pod = pod_object(workload.measure_kind, NS_MEASURE, &pod_name(i), None)?;
                    measured
                        .create(&PostParams::default(), &pod)
                        .await
                        .with_context(|| format!("create measured pod {i}"))?;
                    Ok(())
                }
            })
            .await
            .map(|()| Instant::now())
        }
    });
    let timeout = Duration::from_secs(env_or("SCHED_PERF_TIMEOUT_SECS", RUN_TIMEOUT.as_secs()));
    let bound = match tokio::time::timeout(timeout, watching).await {
        Ok(joined) => joined.context("the watch task")??,
        Err(_) => {
            let stats = scheduler.stats();
            bail!(
                "timed out after {timeout:?}: {} scheduled, {} unschedulable attempts, {} \
                 cycles, {} preemptions; {}",
                stats.scheduled(),
                stats.unschedulable(),
                stats.cycles(),
                stats.preemptions(),
                stuck_report(&measured).await
            )
        }
    };
    let created = creating.await.context("the create task")??;
    let end = *bound.last().context("no pod was bound")?;
    let elapsed = end - start;
    let (sum_after, count_after) =
        histogram_sum_count(&metrics::encode_text(), ALGORITHM_HISTOGRAM);
    let cycles = count_after - count_before;
    let algorithm_mean = if cycles > 0.0 {
        Duration::from_secs_f64((sum_after - sum_before) / cycles)
    } else {
        Duration::ZERO
    };

    let full_seconds = (elapsed.as_secs_f64() / THROUGHPUT_SAMPLE_INTERVAL.as_secs_f64()) as usize;
    let mut per_second = vec![0.0; full_seconds];
    for t in &bound {
        let second =
            ((*t - start).as_secs_f64() / THROUGHPUT_SAMPLE_INTERVAL.as_secs_f64()) as usize;
        if let Some(slot) = per_second.get_mut(second) {
            *slot += 1.0 / THROUGHPUT_SAMPLE_INTERVAL.as_secs_f64();
        }
    }

    let stats = scheduler.stats();
    let (preemptions, bind_failures) = (stats.preemptions(), stats.bind_failures());
    // A failed bind costs the pod another cycle; nothing in these workloads should cause one
    // (a 429 from the apiserver's in-flight limit is retried by the client, as client-go's).
    ensure!(bind_failures == 0, "{bind_failures} binds failed");
    let check = check(&admin, workload, preemptions).await?;
    stop.cancel();
    let _ = running.await;

    let observed = attempts.lock().clone();
    let mut scheduled_attempts: Vec<Duration> = observed
        .iter()
        .filter(|(r, _)| *r == AttemptResult::Scheduled)
        .map(|(_, d)| *d)
        .collect();
    scheduled_attempts.sort();
    let unschedulable_attempts = observed
        .iter()
        .filter(|(r, _)| *r == AttemptResult::Unschedulable)
        .count();
    Ok(RunResult {
        elapsed,
        pods: workload.measure_pods,
        created_after: created - start,
        per_second,
        scheduled_attempts,
        unschedulable_attempts,
        algorithm_mean,
        cycles: cycles as u64,
        bind_failures,
        check,
    })
}

fn ms(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.2}", d.as_secs_f64() * 1e3))
        .unwrap_or_else(|| "-".into())
}

fn per_second_summary(samples: &[f64]) -> String {
    if samples.is_empty() {
        return "- (run < 1 s)".into();
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let average = sorted.iter().sum::<f64>() / sorted.len() as f64;
    let p = |q| percentile(&sorted, q).unwrap_or(0.0);
    format!(
        "{average:.0} / {:.0} / {:.0} / {:.0} (n={})",
        p(50),
        p(90),
        p(99),
        sorted.len()
    )
}

fn describe(run: &RunResult) -> String {
    format!(
        "{:.2} s, {:.0} pods/s; per-second avg/p50/p90/p99 {}; attempt p50 {} ms p99 {} ms; \
         algorithm mean {} ms over {} cycles; creates done at {:.2} s; {} unschedulable \
         attempts, {} bind failures; {}",
        run.elapsed.as_secs_f64(),
        run.pods_per_second(),
        per_second_summary(&run.per_second),
        ms(percentile(&run.scheduled_attempts, 50)),
        ms(percentile(&run.scheduled_attempts, 99)),
        ms(Some(run.algorithm_mean)),
        run.cycles,
        run.created_after.as_secs_f64(),
        run.unschedulable_attempts,
        run.bind_failures,
        run.check
    )
}

fn main() -> Result<()> {
    // Warnings (a rejected bind, a relisting informer) go to stderr; `RUST_LOG` tunes it.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let plan: Vec<(Workload, Mode, usize)> = match std::env::var("SCHED_PERF_CASES") {
        Ok(cases) => {
            let runs = env_or::<usize>("SCHED_PERF_RUNS", 1).max(1);
            let modes = std::env::var("SCHED_PERF_MODES").unwrap_or_else(|_| "unlimited".into());
            let modes = modes
                .split(',')
                .map(|m| Mode::parse(m.trim()))
                .collect::<Result<Vec<_>>>()?;
            let mut plan = Vec::new();
            for name in cases.split(',').map(str::trim) {
                let workload = WORKLOADS
                    .iter()
                    .find(|w| w.name == name)
                    .with_context(|| format!("unknown workload {name:?}"))?;
                for mode in &modes {
                    plan.push((*workload, *mode, runs));
                }
            }
            plan
        }
        Err(_) => DEFAULT_PLAN
            .iter()
            .map(|(name, mode, runs)| {
                WORKLOADS
                    .iter()
                    .find(|w| w.name == *name)
                    .map(|w| (*w, *mode, *runs))
                    .context("a default workload is missing")
            })
            .collect::<Result<_>>()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let mut table = Vec::new();
    for (workload, mode, runs) in plan {
        let mut results = Vec::with_capacity(runs);
        for run in 0..runs {
            let label = format!("{}/{}", workload.name, mode.name());
            let result = runtime
                .block_on(run_once(&workload, mode, run as u64 + 1))
                .with_context(|| format!("{label} run {}", run + 1))?;
            println!("{label}: run {} {}", run + 1, describe(&result));
            results.push(result);
        }
        results.sort_by(|a, b| a.pods_per_second().total_cmp(&b.pods_per_second()));
        let median = &results[results.len() / 2];
        println!(
            "{}/{}: median of {runs}: {}",
            workload.name,
            mode.name(),
            describe(median)
        );
        let all: Vec<String> = results
            .iter()
            .map(|r| format!("{:.0}", r.pods_per_second()))
            .collect();
        table.push(format!(
            "| {} | {} | {} / {} / {} | {:.0} ({}) | {} | {} / {} | {} | {:.2} / {:.2} |",
            workload.name,
            mode.name(),
            workload.nodes,
            workload.init_pods,
            workload.measure_pods,
            median.pods_per_second(),
            all.join(", "),
            per_second_summary(&median.per_second),
            ms(percentile(&median.scheduled_attempts, 50)),
            ms(percentile(&median.scheduled_attempts, 99)),
            ms(Some(median.algorithm_mean)),
            median.created_after.as_secs_f64(),
            median.elapsed.as_secs_f64(),
        ));
    }
    println!();
    println!(
        "| workload | scheduler client | nodes / init / measured | pods/s median (runs) | \
         per-second avg / p50 / p90 / p99 | attempt p50 / p99 ms | algorithm mean ms | \
         creates done / all bound s |"
    );
    println!("|---|---|---|---:|---|---|---:|---|");
    for row in table {
        println!("{row}");
    }
    Ok(())
}
