//! The service proxy's metrics, with kube-proxy's names (upstream `pkg/proxy/metrics/metrics.go`,
//! subsystem `kubeproxy`): sync durations (all, full, partial), the last sync's time, the
//! Service and endpoint changes seen, nft failures. The rule and element counts of the last
//! transaction follow the shape of upstream's iptables `sync_proxy_rules_iptables_total`
//! gauge (upstream's nftables mode has no such count; the names here are skerry's).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use super::sync::SyncReport;

/// Upstream's sync-duration buckets: `ExponentialBuckets(0.001, 2, 15)`, 1 ms to ~16 s.
const SYNC_BUCKETS_START: f64 = 0.001;
/// See [`SYNC_BUCKETS_START`].
const SYNC_BUCKETS_FACTOR: f64 = 2.0;
/// See [`SYNC_BUCKETS_START`].
const SYNC_BUCKETS_COUNT: u16 = 15;

type Labels = Vec<(String, String)>;

fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        SYNC_BUCKETS_START,
        SYNC_BUCKETS_FACTOR,
        SYNC_BUCKETS_COUNT,
    ))
}

/// The proxy's metrics; one per proxy.
pub struct ProxyMetrics {
    registry: Registry,
    sync_duration: Histogram,
    full_duration: Histogram,
    partial_duration: Histogram,
    last_timestamp: Gauge<f64, AtomicU64>,
    endpoint_changes: Counter,
    service_changes: Counter,
    sync_failures: Counter,
    objects: Family<Labels, Gauge>,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics::new()
    }
}

impl ProxyMetrics {
    /// All metrics registered, at zero.
    pub fn new() -> ProxyMetrics {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("kubeproxy");
        let sync_duration = sync_histogram();
        let full_duration = sync_histogram();
        let partial_duration = sync_histogram();
        let last_timestamp = Gauge::<f64, AtomicU64>::default();
        let endpoint_changes = Counter::default();
        let service_changes = Counter::default();
        let sync_failures = Counter::default();
        let objects = Family::<Labels, Gauge>::default();
        registry.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            sync_duration.clone(),
        );
        registry.register(
            "sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            full_duration.clone(),
        );
        registry.register(
            "sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            partial_duration.clone(),
        );
        registry.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            last_timestamp.clone(),
        );
        registry.register(
            "sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            endpoint_changes.clone(),
        );
        registry.register(
            "sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            service_changes.clone(),
        );
        registry.register(
            "sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            sync_failures.clone(),
        );
        registry.register(
            "sync_proxy_rules_nftables",
            "Rules and elements written by the last nftables transaction, by kind",
            objects.clone(),
        );
        ProxyMetrics {
            registry: root,
            sync_duration,
            full_duration,
            partial_duration,
            last_timestamp,
            endpoint_changes,
            service_changes,
            sync_failures,
            objects,
        }
    }

    /// Counts one Service change.
    pub fn service_changed(&self) {
        self.service_changes.inc();
    }

    /// Counts one EndpointSlice change.
    pub fn endpoints_changed(&self) {
        self.endpoint_changes.inc();
    }

    /// Records a successful sync.
    pub fn synced(&self, took: Duration, report: &SyncReport) {
        let secs = took.as_secs_f64();
        self.sync_duration.observe(secs);
        if report.full {
            self.full_duration.observe(secs);
        } else {
            self.partial_duration.observe(secs);
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.last_timestamp.set(now.as_secs_f64());
        let gauge = |kind: &str| {
            self.objects
                .get_or_create(&vec![("kind".to_string(), kind.to_string())])
                .clone()
        };
        gauge("rules").set(i64::try_from(report.rules).unwrap_or(i64::MAX));
        gauge("elements").set(i64::try_from(report.elements).unwrap_or(i64::MAX));
    }

    /// Records a failed sync.
    pub fn failed(&self) {
        self.sync_failures.inc();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kube_proxys() {
        let m = ProxyMetrics::new();
        m.service_changed();
        m.endpoints_changed();
        m.endpoints_changed();
        m.synced(
            Duration::from_millis(3),
            &SyncReport {
                full: true,
                rules: 12,
                elements: 4,
                ..SyncReport::default()
            },
        );
        let text = m.encode();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 2",
            "kubeproxy_sync_proxy_rules_service_changes_total 1",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total 0",
            "kubeproxy_sync_proxy_rules_nftables{kind=\"rules\"} 12",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
