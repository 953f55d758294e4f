//! Scheduler metrics under kube-scheduler's names (`pkg/scheduler/metrics/metrics.go`, all
//! with the `scheduler_` prefix), so dashboards and alerts written for kube-scheduler read
//! skerry's unchanged: pending pods, attempts, e2e scheduling duration.
//!
//! One process-global [`registry`] holds the families (as the client's workqueue metrics do);
//! [`encode_text`] renders it in Prometheus' text format for the binary's `/metrics`.
//! `scheduler_pending_pods` is read from the live schedulers' queues at scrape time (via
//! [`watch_pending_pods`]) rather than kept up to date on every queue operation: the same
//! numbers at scrape time, with no cost per pod.
//!
//! The families:
//! - `scheduler_pending_pods{queue}`: pods in the active, backoff, unschedulable and gated
//!   sub-queues.
//! - `scheduler_schedule_attempts_total{result,profile}`: attempts by result (`scheduled`,
//!   `unschedulable`, `error`).
//! - `scheduler_scheduling_attempt_duration_seconds{result,profile}`: one attempt, scheduling
//!   algorithm + binding (observed when the bind completes for a scheduled pod).
//! - `scheduler_e2e_scheduling_duration_seconds{result,profile}`: the same measurement under
//!   its pre-1.23 name, which older dashboards use.
//! - `scheduler_scheduling_algorithm_duration_seconds`: the cycle alone (snapshot, filter,
//!   score), without binding.
//! - `scheduler_pod_scheduling_duration_seconds{attempts}`: from the pod's first enqueue to
//!   its successful bind, over all attempts.
//! - `scheduler_pod_scheduling_attempts`: attempts a pod needed to be scheduled.

use std::sync::{OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::text::encode;
use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The first attempt-latency bucket, 1 ms (kube-scheduler's `ExponentialBuckets(0.001, 2,
/// 15)` for attempt, algorithm and e2e latencies): a cycle on a small cluster takes about that.
const ATTEMPT_BUCKET_FIRST_SECONDS: f64 = 0.001;
/// Each bucket doubles the last (kube-scheduler).
const ATTEMPT_BUCKET_FACTOR: f64 = 2.0;
/// Fifteen buckets, 1 ms to ~16 s (kube-scheduler); longer only in `+Inf`.
const ATTEMPT_BUCKET_COUNT: u16 = 15;

/// The first pod-scheduling-duration bucket, 10 ms (kube-scheduler's
/// `ExponentialBuckets(0.01, 2, 20)`): an end-to-end time includes queueing and backoff.
const POD_DURATION_BUCKET_FIRST_SECONDS: f64 = 0.01;
/// Doubling (kube-scheduler).
const POD_DURATION_BUCKET_FACTOR: f64 = 2.0;
/// Twenty buckets, 10 ms to ~87 min (kube-scheduler).
const POD_DURATION_BUCKET_COUNT: u16 = 20;

/// Attempts-per-pod buckets 1, 2, 4, 8, 16 (kube-scheduler's `ExponentialBuckets(1, 2, 5)`).
const ATTEMPTS_BUCKET_COUNT: u16 = 5;

/// The `attempts` label of `pod_scheduling_duration_seconds` is capped here ("15+"), as
/// kube-scheduler's `getAttemptsLabel` does, so a pod retried for hours does not create a new
/// series per attempt.
pub const ATTEMPTS_LABEL_MAX: u32 = 15;

/// An attempt's outcome, the `result` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AttemptResult {
    /// Bound to a node.
    Scheduled,
    /// No node fits (the pod waits for a cluster change).
    Unschedulable,
    /// An internal problem (a plugin error, a failed bind).
    Error,
}

impl EncodeLabelValue for AttemptResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl AttemptResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptResult::Scheduled => "scheduled",
            AttemptResult::Unschedulable => "unschedulable",
            AttemptResult::Error => "error",
        }
    }
}

/// Labels of the attempt metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `scheduled`, `unschedulable` or `error`.
    pub result: AttemptResult,
    /// The scheduling profile (`default-scheduler`).
    pub profile: String,
}

/// Labels of `pending_pods`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// `active`, `backoff`, `unschedulable` or `gated`.
    pub queue: String,
}

/// Labels of `pod_scheduling_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptsLabels {
    /// Attempts the pod needed, `"15+"` past [`ATTEMPTS_LABEL_MAX`].
    pub attempts: String,
}

/// Something that reports its queue's pending pods, by sub-queue, at scrape time.
pub trait PendingPods: Send + Sync {
    /// `(queue, count)` per sub-queue: `active`, `backoff`, `unschedulable`, `gated`.
    fn pending_pods(&self) -> Vec<(&'static str, i64)>;
}

fn attempt_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        ATTEMPT_BUCKET_FIRST_SECONDS,
        ATTEMPT_BUCKET_FACTOR,
        ATTEMPT_BUCKET_COUNT,
    ))
}

fn pod_duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        POD_DURATION_BUCKET_FIRST_SECONDS,
        POD_DURATION_BUCKET_FACTOR,
        POD_DURATION_BUCKET_COUNT,
    ))
}

type AttemptHistograms = Family<AttemptLabels, Histogram, fn() -> Histogram>;

struct Families {
    /// The registry. A `parking_lot::Mutex` because registering and encoding are rare and
    /// short and never await.
    registry: Mutex<Registry>,
    pending_pods: Family<QueueLabels, Gauge>,
    schedule_attempts: Family<AttemptLabels, Counter>,
    attempt_duration: AttemptHistograms,
    e2e_duration: AttemptHistograms,
    algorithm_duration: Histogram,
    pod_scheduling_duration: Family<AttemptsLabels, Histogram, fn() -> Histogram>,
    pod_scheduling_attempts: Histogram,
    /// The live schedulers' queues, asked for their counts on each scrape. Weak so a stopped
    /// scheduler is not kept alive; dead ones are pruned when a new one registers or on
    /// scrape.
    queues: Mutex<Vec<Weak<dyn PendingPods>>>,
}

fn families() -> &'static Families {
    static FAMILIES: OnceLock<Families> = OnceLock::new();
    FAMILIES.get_or_init(|| {
        let mut registry = Registry::with_prefix("scheduler");
        let pending_pods = Family::<QueueLabels, Gauge>::default();
        let schedule_attempts = Family::<AttemptLabels, Counter>::default();
        let attempt_duration = AttemptHistograms::new_with_constructor(attempt_histogram);
        let e2e_duration = AttemptHistograms::new_with_constructor(attempt_histogram);
        let algorithm_duration = attempt_histogram();
        let pod_scheduling_duration =
            Family::<AttemptsLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                pod_duration_histogram,
            );
        let pod_scheduling_attempts =
            Histogram::new(exponential_buckets(1.0, 2.0, ATTEMPTS_BUCKET_COUNT));
        // Help texts are kube-scheduler's.
        registry.register(
            "pending_pods",
            "Number of pending pods, by the queue type. 'active' means number of pods in \
             activeQ; 'backoff' means number of pods in backoffQ; 'unschedulable' means number \
             of pods in unschedulablePods that the scheduler attempted to schedule and failed; \
             'gated' is the number of unschedulable pods that the scheduler never attempted to \
             schedule because they are gated.",
            pending_pods.clone(),
        );
        registry.register(
            "schedule_attempts",
            "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod \
             could not be scheduled, while 'error' means an internal scheduler problem.",
            schedule_attempts.clone(),
        );
        registry.register(
            "scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
            attempt_duration.clone(),
        );
        registry.register(
            "e2e_scheduling_duration_seconds",
            "E2e scheduling latency in seconds (scheduling algorithm + binding). The pre-1.23 \
             name of scheduling_attempt_duration_seconds.",
            e2e_duration.clone(),
        );
        registry.register(
            "scheduling_algorithm_duration_seconds",
            "Scheduling algorithm latency in seconds",
            algorithm_duration.clone(),
        );
        registry.register(
            "pod_scheduling_duration_seconds",
            "E2e latency for a pod being scheduled which may include multiple scheduling \
             attempts.",
            pod_scheduling_duration.clone(),
        );
        registry.register(
            "pod_scheduling_attempts",
            "Number of attempts to successfully schedule a pod.",
            pod_scheduling_attempts.clone(),
        );
        Families {
            registry: Mutex::new(registry),
            pending_pods,
            schedule_attempts,
            attempt_duration,
            e2e_duration,
            algorithm_duration,
            pod_scheduling_duration,
            pod_scheduling_attempts,
            queues: Mutex::new(Vec::new()),
        }
    })
}

/// The process-global registry holding the scheduler's metrics.
pub fn registry() -> &'static Mutex<Registry> {
    &families().registry
}

/// Every scheduler metric in Prometheus' text exposition format (ending in `# EOF`).
pub fn encode_text() -> String {
    let families = families();
    refresh_pending_pods(families);
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug in a metric type.
    if let Err(error) = encode(&mut text, &families.registry.lock()) {
        tracing::error!(%error, "failed to encode scheduler metrics");
    }
    text
}

/// Sets `pending_pods` from the live queues (summed when several schedulers run in one
/// process, as tests do).
fn refresh_pending_pods(families: &Families) {
    let live: Vec<_> = {
        let mut queues = families.queues.lock();
        queues.retain(|queue| queue.strong_count() > 0);
        queues.iter().filter_map(Weak::upgrade).collect()
    };
    let mut totals: Vec<(&'static str, i64)> = Vec::new();
    for queue in live {
        for (name, count) in queue.pending_pods() {
            match totals.iter_mut().find(|(n, _)| *n == name) {
                Some((_, total)) => *total += count,
                None => totals.push((name, count)),
            }
        }
    }
    for (name, count) in totals {
        families
            .pending_pods
            .get_or_create(&QueueLabels {
                queue: name.to_string(),
            })
            .set(count);
    }
}

/// Has `queue` report its pending pods on every scrape.
pub fn watch_pending_pods(queue: Weak<dyn PendingPods>) {
    let mut queues = families().queues.lock();
    queues.retain(|queue| queue.strong_count() > 0);
    queues.push(queue);
}

/// Records one finished attempt: the counter, the attempt latency and its e2e alias.
pub fn observe_attempt(profile: &str, result: AttemptResult, duration: Duration) {
    let families = families();
    let labels = AttemptLabels {
        result,
        profile: profile.to_string(),
    };
    families.schedule_attempts.get_or_create(&labels).inc();
    let seconds = duration.as_secs_f64();
    families
        .attempt_duration
        .get_or_create(&labels)
        .observe(seconds);
    families
        .e2e_duration
        .get_or_create(&labels)
        .observe(seconds);
}

/// Records the algorithm's part of one attempt (snapshot, filter, score).
pub fn observe_algorithm(duration: Duration) {
    families()
        .algorithm_duration
        .observe(duration.as_secs_f64());
}

/// Records a pod scheduled after `attempts` attempts, `since_first_enqueue` after it was
/// first queued.
pub fn observe_pod_scheduled(attempts: u32, since_first_enqueue: Duration) {
    let families = families();
    let attempts_label = if attempts >= ATTEMPTS_LABEL_MAX {
        format!("{ATTEMPTS_LABEL_MAX}+")
    } else {
        attempts.to_string()
    };
    families
        .pod_scheduling_duration
        .get_or_create(&AttemptsLabels {
            attempts: attempts_label,
        })
        .observe(since_first_enqueue.as_secs_f64());
    families
        .pod_scheduling_attempts
        .observe(f64::from(attempts));
}

/// The `schedule_attempts_total` counter's value for `(profile, result)` (tests, benches).
pub fn schedule_attempts(profile: &str, result: AttemptResult) -> u64 {
    families()
        .schedule_attempts
        .get_or_create(&AttemptLabels {
            result,
            profile: profile.to_string(),
        })
        .get()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use std::sync::Arc;

    use super::*;

    struct FixedQueue;
    impl PendingPods for FixedQueue {
        fn pending_pods(&self) -> Vec<(&'static str, i64)> {
            vec![
                ("active", 3),
                ("backoff", 1),
                ("unschedulable", 2),
                ("gated", 0),
            ]
        }
    }

    #[test]
    fn encodes_kube_scheduler_names() {
        let profile = "metrics-test-profile";
        let before = schedule_attempts(profile, AttemptResult::Unschedulable);
        observe_attempt(
            profile,
            AttemptResult::Unschedulable,
            Duration::from_millis(3),
        );
        observe_attempt(profile, AttemptResult::Scheduled, Duration::from_millis(2));
        observe_pod_scheduled(20, Duration::from_secs(1));
        observe_algorithm(Duration::from_micros(500));
        assert_eq!(
            schedule_attempts(profile, AttemptResult::Unschedulable),
            before + 1
        );
        let queue: Arc<dyn PendingPods> = Arc::new(FixedQueue);
        watch_pending_pods(Arc::downgrade(&queue));
        let text = encode_text();
        for needle in [
            "scheduler_pending_pods{queue=\"active\"} 3",
            "scheduler_pending_pods{queue=\"unschedulable\"} 2",
            "scheduler_schedule_attempts_total{result=\"unschedulable\",profile=\"metrics-test-profile\"}",
            "scheduler_scheduling_attempt_duration_seconds_bucket{le=\"0.004\",result=\"scheduled\",profile=\"metrics-test-profile\"}",
            "scheduler_e2e_scheduling_duration_seconds_count{result=\"scheduled\",profile=\"metrics-test-profile\"} 1",
            "scheduler_pod_scheduling_duration_seconds_count{attempts=\"15+\"}",
            "scheduler_scheduling_algorithm_duration_seconds_count",
            "scheduler_pod_scheduling_attempts_count",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        drop(queue);
    }

    #[test]
    fn attempt_buckets_are_kube_schedulers() {
        // ExponentialBuckets(0.001, 2, 15): 1 ms .. 16.384 s.
        let buckets: Vec<f64> = exponential_buckets(
            ATTEMPT_BUCKET_FIRST_SECONDS,
            ATTEMPT_BUCKET_FACTOR,
            ATTEMPT_BUCKET_COUNT,
        )
        .collect();
        assert_eq!(buckets.len(), 15);
        assert!((buckets[0] - 0.001).abs() < 1e-12);
        assert!((buckets[14] - 16.384).abs() < 1e-9);
    }
}
