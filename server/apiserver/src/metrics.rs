//! `/metrics` in Prometheus' text format with Kubernetes' metric names, so dashboards
//! written for kube-apiserver read skerry unchanged.
//!
//! Request counters and latencies are recorded as requests finish; the gauges (objects per
//! resource, registered watchers) are read from the watch caches when scraped, so the hot
//! path does not maintain them.

use std::time::Duration;

use http::Response;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::handler::ApiServer;
use crate::response::{self, Body};

type Labels = Vec<(String, String)>;

/// Request latency buckets in seconds: kube-apiserver's `apiserver_request_duration_seconds`
/// buckets (5 ms to 60 s), so its alerting rules apply as written.
const REQUEST_DURATION_BUCKETS: [f64; 16] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 60.0,
];
/// Store latency buckets in seconds (kube-apiserver's `etcd_request_duration_seconds`).
const STORE_DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 5.0, 15.0,
];
/// Watch-cache wait buckets in seconds, up to the 3-second wait limit.
const CACHE_WAIT_BUCKETS: [f64; 8] = [0.005, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 3.0];

fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_DURATION_BUCKETS)
}
fn store_histogram() -> Histogram {
    Histogram::new(STORE_DURATION_BUCKETS)
}
fn cache_wait_histogram() -> Histogram {
    Histogram::new(CACHE_WAIT_BUCKETS)
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// The apiserver's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    request_duration: HistogramFamily,
    store_duration: HistogramFamily,
    cache_read_wait: HistogramFamily,
    storage_objects: Family<Labels, Gauge>,
    registered_watchers: Family<Labels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<Labels, Counter>::default();
        let request_duration = HistogramFamily::new_with_constructor(request_histogram);
        let store_duration = HistogramFamily::new_with_constructor(store_histogram);
        let cache_read_wait = HistogramFamily::new_with_constructor(cache_wait_histogram);
        let storage_objects = Family::<Labels, Gauge>::default();
        let registered_watchers = Family::<Labels, Gauge>::default();
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, resource and HTTP response code.",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb and resource.",
            request_duration.clone(),
        );
        registry.register(
            "etcd_request_duration_seconds",
            "Store request latency in seconds for each operation and object type.",
            store_duration.clone(),
        );
        registry.register(
            "apiserver_watch_cache_read_wait_seconds",
            "Histogram of time spent waiting for a watch cache to become fresh.",
            cache_read_wait.clone(),
        );
        registry.register(
            "apiserver_storage_objects",
            "Number of stored objects at the time of last check split by kind.",
            storage_objects.clone(),
        );
        registry.register(
            "apiserver_registered_watchers",
            "Number of currently registered watchers for a given resources",
            registered_watchers.clone(),
        );
        Self {
            registry,
            requests,
            request_duration,
            store_duration,
            cache_read_wait,
            storage_objects,
            registered_watchers,
        }
    }

    /// Records one finished request.
    pub fn observe_request(&self, verb: &str, resource: &str, code: u16, elapsed: Duration) {
        let verb = verb.to_ascii_uppercase();
        self.requests
            .get_or_create(&vec![
                ("verb".into(), verb.clone()),
                ("resource".into(), resource.to_string()),
                ("code".into(), code.to_string()),
            ])
            .inc();
        self.request_duration
            .get_or_create(&vec![
                ("verb".into(), verb),
                ("resource".into(), resource.to_string()),
            ])
            .observe(elapsed.as_secs_f64());
    }

    /// Records one store operation (`get`, `list`, `create`, `update`, `delete`).
    pub fn observe_store(&self, operation: &str, resource: &str, elapsed: Duration) {
        self.store_duration
            .get_or_create(&vec![
                ("operation".into(), operation.to_string()),
                ("type".into(), resource.to_string()),
            ])
            .observe(elapsed.as_secs_f64());
    }

    /// Records how long a read waited for a watch cache to catch up.
    pub fn observe_cache_wait(&self, resource: &str, elapsed: Duration) {
        self.cache_read_wait
            .get_or_create(&vec![("resource".into(), resource.to_string())])
            .observe(elapsed.as_secs_f64());
    }

    /// The scrape: gauges are read from the caches now.
    pub fn render(&self, server: &ApiServer) -> Response<Body> {
        for (resource, cache) in &server.caches {
            self.storage_objects
                .get_or_create(&vec![("resource".into(), resource.to_string())])
                .set(cache.len() as i64);
            let info = cache.resource();
            self.registered_watchers
                .get_or_create(&vec![
                    ("group".into(), info.group.to_string()),
                    ("kind".into(), info.kind.to_string()),
                ])
                .set(cache.watchers() as i64);
        }
        let mut text = String::new();
        match encode(&mut text, &self.registry) {
            Ok(()) => {
                if let Some(extra) = &server.extra_metrics {
                    append_families(&mut text, &extra());
                }
                response::bytes(
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                    &[],
                )
            }
            Err(e) => response::error(&skerry_api::ApiError::internal(format!(
                "encoding metrics: {e}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_metrics_use_kubernetes_names() {
        let m = Metrics::new();
        m.observe_request("list", "pods", 200, Duration::from_millis(3));
        m.observe_store("list", "pods", Duration::from_millis(1));
        let mut text = String::new();
        encode(&mut text, &m.registry).expect("encode");
        assert!(
            text.contains(
                "apiserver_request_total{verb=\"LIST\",resource=\"pods\",code=\"200\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("apiserver_request_duration_seconds_bucket{"),
            "{text}"
        );
        assert!(
            text.contains(
                "etcd_request_duration_seconds_count{operation=\"list\",type=\"pods\"} 1"
            ),
            "{text}"
        );
    }
}

/// OpenMetrics' terminator: one per exposition, at its very end.
const EOF_LINE: &str = "# EOF\n";

/// Appends the metric families of another exposition to `text`, keeping one `# EOF` at the
/// end of the whole.
fn append_families(text: &mut String, more: &str) {
    if let Some(body) = text.strip_suffix(EOF_LINE) {
        text.truncate(body.len());
    }
    text.push_str(more.strip_suffix(EOF_LINE).unwrap_or(more));
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(EOF_LINE);
}

#[cfg(test)]
mod append_tests {
    use super::append_families;

    #[test]
    fn one_eof_at_the_end() {
        let mut text = "# TYPE a counter\na_total 1\n# EOF\n".to_string();
        append_families(&mut text, "# TYPE b gauge\nb 2\n# EOF\n");
        assert_eq!(
            text,
            "# TYPE a counter\na_total 1\n# TYPE b gauge\nb 2\n# EOF\n"
        );
        let mut text = "# EOF\n".to_string();
        append_families(&mut text, "c 3");
        assert_eq!(text, "c 3\n# EOF\n");
    }
}
