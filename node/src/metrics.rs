//! The kubelet's own metrics, served on `/metrics` (upstream `pkg/kubelet/metrics/metrics.go`:
//! the names, help texts, stability prefixes, labels and buckets are upstream's).
//!
//! They are recorded where the events happen: every CRI call in `crate::cri`'s one call
//! wrapper (`kubelet_runtime_operations_*`, named as upstream's `instrumented_services.go`
//! names them), the PLEG's relist (its duration, and the running pods and containers it
//! saw), the pod workers (each sync's duration by kind, the time from first seeing a pod to
//! its running), sandbox and container starts in the sync. One process-wide set, as
//! upstream's legacy registry: [`metrics`].

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// The content type `encode` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// client_golang's `DefBuckets`, which upstream's pod worker and PLEG histograms use.
pub const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `podStartupDurationBuckets` (0.5 s to an hour: image pulls on slow links are minutes).
pub const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// `RuntimeOperationsDuration`'s `ExponentialBuckets(.005, 2.5, 14)`: 5 ms up to ~3.7 h,
/// so a pull or a slow `StopContainer` lands in a bucket.
const RUNTIME_BUCKETS_START: f64 = 0.005;
/// See [`RUNTIME_BUCKETS_START`].
const RUNTIME_BUCKETS_FACTOR: f64 = 2.5;
/// See [`RUNTIME_BUCKETS_START`].
const RUNTIME_BUCKETS_COUNT: u16 = 14;

/// `container_type` label values (`metrics.Container`, `metrics.InitContainer`).
pub const CONTAINER: &str = "container";
/// See [`CONTAINER`].
pub const INIT_CONTAINER: &str = "init_container";

/// `container_state` values of `kubelet_running_containers` (`kubecontainer.State`).
pub const CONTAINER_STATES: [&str; 4] = ["created", "running", "exited", "unknown"];

fn def_histogram() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}
fn runtime_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        RUNTIME_BUCKETS_START,
        RUNTIME_BUCKETS_FACTOR,
        RUNTIME_BUCKETS_COUNT,
    ))
}

/// The kubelet's metrics.
pub struct Metrics {
    registry: Registry,
    node_name: Family<Labels, Gauge>,
    running_pods: Gauge,
    running_containers: Family<Labels, Gauge>,
    started_pods: Counter,
    started_pods_errors: Counter,
    started_containers: Family<Labels, Counter>,
    pod_start_duration: Histogram,
    pod_worker_duration: HistogramFamily,
    runtime_operations: Family<Labels, Counter>,
    runtime_operations_errors: Family<Labels, Counter>,
    runtime_operations_duration: HistogramFamily,
    pleg_relist_duration: Histogram,
    evictions: Family<Labels, Counter>,
    /// When each pod was first seen, and whether its start was recorded yet.
    first_seen: Mutex<HashMap<String, (Instant, bool)>>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's kubelet metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

fn alpha(help: &str) -> String {
    format!("[ALPHA] {help}")
}

impl Metrics {
    fn new() -> Metrics {
        let mut r = Registry::default();
        let node_name = Family::<Labels, Gauge>::default();
        let running_pods = Gauge::default();
        let running_containers = Family::<Labels, Gauge>::default();
        let started_pods = Counter::default();
        let started_pods_errors = Counter::default();
        let started_containers = Family::<Labels, Counter>::default();
        let pod_start_duration = Histogram::new(POD_START_BUCKETS);
        let pod_worker_duration = HistogramFamily::new_with_constructor(def_histogram);
        let runtime_operations = Family::<Labels, Counter>::default();
        let runtime_operations_errors = Family::<Labels, Counter>::default();
        let runtime_operations_duration = HistogramFamily::new_with_constructor(runtime_histogram);
        let pleg_relist_duration = def_histogram();
        let evictions = Family::<Labels, Counter>::default();
        r.register(
            "kubelet_node_name",
            alpha("The node's name. The count is always 1."),
            node_name.clone(),
        );
        r.register(
            "kubelet_running_pods",
            alpha("Number of pods that have a running pod sandbox"),
            running_pods.clone(),
        );
        r.register(
            "kubelet_running_containers",
            alpha("Number of containers currently running"),
            running_containers.clone(),
        );
        r.register(
            "kubelet_started_pods",
            alpha("Cumulative number of pods started"),
            started_pods.clone(),
        );
        r.register(
            "kubelet_started_pods_errors",
            alpha("Cumulative number of errors when starting pods"),
            started_pods_errors.clone(),
        );
        r.register(
            "kubelet_started_containers",
            alpha("Cumulative number of containers started"),
            started_containers.clone(),
        );
        r.register(
            "kubelet_pod_start_duration_seconds",
            alpha("Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run"),
            pod_start_duration.clone(),
        );
        r.register(
            "kubelet_pod_worker_duration_seconds",
            alpha("Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync"),
            pod_worker_duration.clone(),
        );
        r.register(
            "kubelet_runtime_operations",
            alpha("Cumulative number of runtime operations by operation type."),
            runtime_operations.clone(),
        );
        r.register(
            "kubelet_runtime_operations_errors",
            alpha("Cumulative number of runtime operation errors by operation type."),
            runtime_operations_errors.clone(),
        );
        r.register(
            "kubelet_runtime_operations_duration_seconds",
            alpha("Duration in seconds of runtime operations. Broken down by operation type."),
            runtime_operations_duration.clone(),
        );
        r.register(
            "kubelet_pleg_relist_duration_seconds",
            alpha("Duration in seconds for relisting pods in PLEG."),
            pleg_relist_duration.clone(),
        );
        r.register(
            "kubelet_evictions",
            alpha("Cumulative number of pod evictions by eviction signal"),
            evictions.clone(),
        );
        Metrics {
            registry: r,
            evictions,
            node_name,
            running_pods,
            running_containers,
            started_pods,
            started_pods_errors,
            started_containers,
            pod_start_duration,
            pod_worker_duration,
            runtime_operations,
            runtime_operations_errors,
            runtime_operations_duration,
            pleg_relist_duration,
            first_seen: Mutex::new(HashMap::new()),
        }
    }

    /// One pod evicted for `signal` (`kubelet_evictions{eviction_signal}`, upstream's
    /// `metrics.Evictions`).
    pub fn evicted(&self, signal: &str) {
        self.evictions
            .get_or_create(&vec![("eviction_signal".to_string(), signal.to_string())])
            .inc();
    }

    /// `kubelet_node_name{node}` = 1.
    pub fn set_node_name(&self, node: &str) {
        self.node_name
            .get_or_create(&vec![("node".into(), node.to_string())])
            .set(1);
    }

    /// One CRI call (`recordOperation` and `recordError`): `call` is the RPC's name
    /// (`ListPodSandbox`), recorded as upstream's `operation_type` (`list_podsandbox`).
    pub fn runtime_operation(&self, call: &str, elapsed: Duration, failed: bool) {
        let labels = vec![("operation_type".to_string(), operation_type(call))];
        self.runtime_operations.get_or_create(&labels).inc();
        self.runtime_operations_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if failed {
            self.runtime_operations_errors.get_or_create(&labels).inc();
        }
    }

    /// One PLEG relist: how long it took, the pods with a ready sandbox and the containers
    /// by state (`updateRunningPodAndContainerMetrics`).
    pub fn relisted(&self, elapsed: Duration, running_pods: usize, states: &HashMap<&str, usize>) {
        self.pleg_relist_duration.observe(elapsed.as_secs_f64());
        self.running_pods.set(running_pods as i64);
        for s in CONTAINER_STATES {
            self.running_containers
                .get_or_create(&vec![("container_state".into(), s.to_string())])
                .set(states.get(s).copied().unwrap_or(0) as i64);
        }
    }

    /// A sandbox creation attempt (`StartedPodsTotal`), and its failure.
    pub fn pod_started(&self, failed: bool) {
        self.started_pods.inc();
        if failed {
            self.started_pods_errors.inc();
        }
    }

    /// A container start attempt of `container_type` ([`CONTAINER`], [`INIT_CONTAINER`]).
    pub fn container_started(&self, container_type: &str) {
        self.started_containers
            .get_or_create(&vec![("container_type".into(), container_type.to_string())])
            .inc();
    }

    /// One pod worker pass of `operation` (`create`, `update`, `sync`, `kill`).
    pub fn pod_worker(&self, operation: &str, elapsed: Duration) {
        self.pod_worker_duration
            .get_or_create(&vec![("operation_type".into(), operation.to_string())])
            .observe(elapsed.as_secs_f64());
    }

    /// The kubelet saw pod `uid` (its worker started); the first time counts.
    pub fn pod_seen(&self, uid: &str) {
        let mut seen = self.first_seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.entry(uid.to_string())
            .or_insert_with(|| (Instant::now(), false));
    }

    /// Pod `uid`'s status says Running: the first time, the time since it was first seen
    /// goes into `kubelet_pod_start_duration_seconds`.
    pub fn pod_running(&self, uid: &str) {
        let mut seen = self.first_seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, recorded)) = seen.get_mut(uid)
            && !*recorded
        {
            *recorded = true;
            self.pod_start_duration.observe(at.elapsed().as_secs_f64());
        }
    }

    /// Pod `uid`'s worker is gone.
    pub fn pod_forgotten(&self, uid: &str) {
        let mut seen = self.first_seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.remove(uid);
    }

    /// The metrics in the text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Upstream's `operation_type` of a CRI call: the RPC in snake case, "pod sandbox" written
/// `podsandbox` (`instrumented_services.go`: `run_podsandbox`, `list_podsandbox`).
pub fn operation_type(call: &str) -> String {
    let mut out = String::new();
    for (i, ch) in call.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out.replace("pod_sandbox", "podsandbox")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn operation_types_are_upstreams() {
        assert_eq!(operation_type("ListPodSandbox"), "list_podsandbox");
        assert_eq!(operation_type("RunPodSandbox"), "run_podsandbox");
        assert_eq!(operation_type("PodSandboxStatus"), "podsandbox_status");
        assert_eq!(operation_type("ListContainerStats"), "list_container_stats");
        assert_eq!(operation_type("ImageFsInfo"), "image_fs_info");
        assert_eq!(operation_type("Version"), "version");
    }

    #[test]
    fn recorded_values_reach_the_text() {
        let m = Metrics::new();
        m.set_node_name("n1");
        m.runtime_operation("ListContainers", Duration::from_millis(3), false);
        m.runtime_operation("ListContainers", Duration::from_millis(30), true);
        m.pod_seen("u");
        m.pod_running("u");
        m.pod_running("u");
        let text = m.encode().unwrap();
        assert!(text.contains("kubelet_node_name{node=\"n1\"} 1"), "{text}");
        assert!(
            text.contains("kubelet_runtime_operations_total{operation_type=\"list_containers\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "kubelet_runtime_operations_errors_total{operation_type=\"list_containers\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("kubelet_runtime_operations_duration_seconds_bucket{le=\"0.005\",operation_type=\"list_containers\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_pod_start_duration_seconds_count 1"),
            "recorded once: {text}"
        );
        assert!(
            text.contains("# HELP kubelet_running_pods [ALPHA] Number of pods"),
            "{text}"
        );
    }
}
