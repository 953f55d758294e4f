//! Workqueue metrics under client-go's names (`util/workqueue/metrics.go` and the component-base
//! provider), each labelled with the queue's `name`, so dashboards and alerts written for
//! kube-controller-manager read skerry's controllers unchanged.
//!
//! One process-global [`registry`] holds the families; each [`WorkQueue`] takes its labelled
//! children when it is built. [`encode_text`] renders the registry in Prometheus' text format
//! for the binary's `/metrics`. The two unfinished-work gauges are computed from the processing
//! set when scraped (client-go refreshes them every 500 ms from a goroutine per queue; reading
//! them at scrape time gives the same numbers without a task).
//!
//! [`WorkQueue`]: super::WorkQueue

use std::sync::atomic::AtomicU64;
use std::sync::{OnceLock, Weak};

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Smallest latency bucket, in seconds: client-go's `ExponentialBuckets(10e-9, 10, 10)` starts
/// at 10 ns, below any real queue wait, so the first bucket means "no wait".
const LATENCY_BUCKET_FIRST_SECONDS: f64 = 1e-8;
/// Each latency bucket is ten times the last (client-go).
const LATENCY_BUCKET_FACTOR: f64 = 10.0;
/// Ten buckets, 10 ns to 10 s (client-go); anything longer counts only in `+Inf`.
const LATENCY_BUCKET_COUNT: u16 = 10;

/// The label set of every workqueue metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The queue's name, as given to `WorkQueue::new`.
    pub name: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        LATENCY_BUCKET_FIRST_SECONDS,
        LATENCY_BUCKET_FACTOR,
        LATENCY_BUCKET_COUNT,
    ))
}

type HistogramFamily = Family<QueueLabels, Histogram, fn() -> Histogram>;
type SecondsGauge = Gauge<f64, AtomicU64>;

/// Something whose unfinished-work gauges must be brought up to date before a scrape.
pub(crate) trait UnfinishedWork: Send + Sync {
    fn update_unfinished_work(&self);
}

/// The metric families, registered once per process.
struct Families {
    /// The registry. A `parking_lot::Mutex` because registering and encoding are rare and
    /// short and never await; `Registry` itself is not `Sync`-mutable.
    registry: Mutex<Registry>,
    depth: Family<QueueLabels, Gauge>,
    adds: Family<QueueLabels, Counter>,
    queue_duration: HistogramFamily,
    work_duration: HistogramFamily,
    retries: Family<QueueLabels, Counter>,
    unfinished_work: Family<QueueLabels, SecondsGauge>,
    longest_running_processor: Family<QueueLabels, SecondsGauge>,
    /// The live queues, asked to refresh their unfinished-work gauges on each scrape. Weak so
    /// a dropped queue is not kept alive; dead ones are pruned on scrape.
    queues: Mutex<Vec<Weak<dyn UnfinishedWork>>>,
}

fn families() -> &'static Families {
    static FAMILIES: OnceLock<Families> = OnceLock::new();
    FAMILIES.get_or_init(|| {
        let mut registry = Registry::default();
        let depth = Family::<QueueLabels, Gauge>::default();
        let adds = Family::<QueueLabels, Counter>::default();
        let queue_duration = HistogramFamily::new_with_constructor(latency_histogram);
        let work_duration = HistogramFamily::new_with_constructor(latency_histogram);
        let retries = Family::<QueueLabels, Counter>::default();
        let unfinished_work = Family::<QueueLabels, SecondsGauge>::default();
        let longest_running_processor = Family::<QueueLabels, SecondsGauge>::default();
        // Help texts are client-go's.
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            work_duration.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            retries.clone(),
        );
        registry.register(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has done that is in progress and hasn't been observed by \
             work_duration. Large values indicate stuck threads. One can deduce the number of \
             stuck threads by observing the rate at which this increases.",
            unfinished_work.clone(),
        );
        registry.register(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            longest_running_processor.clone(),
        );
        Families {
            registry: Mutex::new(registry),
            depth,
            adds,
            queue_duration,
            work_duration,
            retries,
            unfinished_work,
            longest_running_processor,
            queues: Mutex::new(Vec::new()),
        }
    })
}

/// The process-global registry holding every workqueue's metrics. A binary may register its
/// own metrics here too and serve [`encode_text`].
pub fn registry() -> &'static Mutex<Registry> {
    &families().registry
}

/// Every workqueue metric in Prometheus' text exposition format (ending in `# EOF`).
pub fn encode_text() -> String {
    let families = families();
    let live: Vec<_> = {
        let mut queues = families.queues.lock();
        queues.retain(|queue| queue.strong_count() > 0);
        queues.iter().filter_map(Weak::upgrade).collect()
    };
    for queue in live {
        queue.update_unfinished_work();
    }
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug in a metric type.
    if let Err(error) = encode(&mut text, &families.registry.lock()) {
        tracing::error!(%error, "failed to encode workqueue metrics");
    }
    text
}

/// One queue's labelled metrics. Each handle is a shared atomic, so recording never locks.
#[derive(Debug, Clone)]
pub(crate) struct QueueMetrics {
    pub(crate) depth: Gauge,
    pub(crate) adds: Counter,
    pub(crate) queue_duration: Histogram,
    pub(crate) work_duration: Histogram,
    pub(crate) retries: Counter,
    pub(crate) unfinished_work: SecondsGauge,
    pub(crate) longest_running_processor: SecondsGauge,
}

impl QueueMetrics {
    /// The metrics labelled `name`. Queues sharing a name share their metrics.
    pub(crate) fn new(name: &str) -> Self {
        let families = families();
        let labels = QueueLabels {
            name: name.to_string(),
        };
        QueueMetrics {
            depth: families.depth.get_or_create(&labels).clone(),
            adds: families.adds.get_or_create(&labels).clone(),
            queue_duration: families.queue_duration.get_or_create(&labels).clone(),
            work_duration: families.work_duration.get_or_create(&labels).clone(),
            retries: families.retries.get_or_create(&labels).clone(),
            unfinished_work: families.unfinished_work.get_or_create(&labels).clone(),
            longest_running_processor: families
                .longest_running_processor
                .get_or_create(&labels)
                .clone(),
        }
    }

    /// Has `queue` refresh its unfinished-work gauges before every scrape.
    /// Dropped queues are pruned here too, so building queues in a loop does not grow the list.
    pub(crate) fn watch_unfinished_work(queue: Weak<dyn UnfinishedWork>) {
        let mut queues = families().queues.lock();
        queues.retain(|queue| queue.strong_count() > 0);
        queues.push(queue);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_client_gos() {
        let expected: Vec<f64> = (0..10).map(|i| 1e-8 * 10f64.powi(i)).collect();
        let actual: Vec<f64> = exponential_buckets(
            LATENCY_BUCKET_FIRST_SECONDS,
            LATENCY_BUCKET_FACTOR,
            LATENCY_BUCKET_COUNT,
        )
        .collect();
        assert_eq!(actual.len(), expected.len());
        for (a, e) in actual.iter().zip(&expected) {
            assert!((a - e).abs() <= e * 1e-9, "{a} vs {e}");
        }
    }

    #[test]
    fn encodes_client_go_names() {
        let metrics = QueueMetrics::new("metrics-names-test");
        metrics.adds.inc();
        metrics.depth.set(3);
        metrics.queue_duration.observe(0.5);
        let text = encode_text();
        for needle in [
            "workqueue_depth{name=\"metrics-names-test\"} 3",
            "workqueue_adds_total{name=\"metrics-names-test\"} 1",
            "workqueue_queue_duration_seconds_count{name=\"metrics-names-test\"} 1",
            "workqueue_work_duration_seconds",
            "workqueue_retries_total",
            "workqueue_unfinished_work_seconds",
            "workqueue_longest_running_processor_seconds",
            "# EOF",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
    }
}
