//! Cluster DNS's metrics, with CoreDNS's names so dashboards and alerts written for CoreDNS
//! read them (`plugin/metrics/vars/vars.go`, `plugin/cache/metrics.go`):
//! `coredns_dns_requests_total{server,zone,proto,family,type}`,
//! `coredns_dns_responses_total{server,zone,rcode}`,
//! `coredns_dns_request_duration_seconds{server,zone,type}`,
//! `coredns_cache_hits_total{server,type}` (`type` = `success` or `denial`) and
//! `coredns_cache_misses_total{server}`. The `view` and `plugin` labels of newer CoreDNS are
//! left out: skerry has one view and no plugin chain.
//!
//! One set per process ([`metrics`]), as CoreDNS's default registry; [`Metrics::new`] makes a
//! separate set for tests. [`Metrics::encode`] writes the Prometheus text format for the
//! integrator's `/metrics`.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// The content type [`Metrics::encode`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `server` label: CoreDNS names a server block by its address, `dns://:53`.
pub const SERVER_LABEL: &str = "dns://:53";

/// `coredns_dns_request_duration_seconds` buckets: CoreDNS's
/// `prometheus.ExponentialBuckets(0.00025, 2, 16)` (250 µs to ~8 s).
const DURATION_BUCKETS_START: f64 = 0.00025;
/// See [`DURATION_BUCKETS_START`].
const DURATION_BUCKETS_FACTOR: f64 = 2.0;
/// See [`DURATION_BUCKETS_START`].
const DURATION_BUCKETS_COUNT: u16 = 16;

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        DURATION_BUCKETS_START,
        DURATION_BUCKETS_FACTOR,
        DURATION_BUCKETS_COUNT,
    ))
}

/// The DNS server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    responses: Family<Labels, Counter>,
    duration: HistogramFamily,
    cache_hits: Family<Labels, Counter>,
    cache_misses: Family<Labels, Counter>,
}

static METRICS: LazyLock<Arc<Metrics>> = LazyLock::new(|| Arc::new(Metrics::new()));

/// The process's DNS metrics.
pub fn metrics() -> Arc<Metrics> {
    METRICS.clone()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh set, registered in its own registry.
    pub fn new() -> Metrics {
        let mut r = Registry::default();
        let requests = Family::<Labels, Counter>::default();
        let responses = Family::<Labels, Counter>::default();
        let duration = HistogramFamily::new_with_constructor(duration_histogram);
        let cache_hits = Family::<Labels, Counter>::default();
        let cache_misses = Family::<Labels, Counter>::default();
        // prometheus-client appends `_total` to counters.
        r.register(
            "coredns_dns_requests",
            "Counter of DNS requests made per zone, protocol and family.",
            requests.clone(),
        );
        r.register(
            "coredns_dns_responses",
            "Counter of response status codes.",
            responses.clone(),
        );
        r.register(
            "coredns_dns_request_duration_seconds",
            "Histogram of the time (in seconds) each request took per zone.",
            duration.clone(),
        );
        r.register(
            "coredns_cache_hits",
            "The count of cache hits.",
            cache_hits.clone(),
        );
        r.register(
            "coredns_cache_misses",
            "The count of cache misses.",
            cache_misses.clone(),
        );
        Metrics {
            registry: r,
            requests,
            responses,
            duration,
            cache_hits,
            cache_misses,
        }
    }

    /// One request: `zone` is the zone that answered (`cluster.local.` or `.`), `proto` `udp`
    /// or `tcp`, `family` `1` (IPv4) or `2` (IPv6), `qtype` the question's type.
    pub fn request(&self, zone: &str, proto: &str, family: &str, qtype: &str) {
        self.requests
            .get_or_create(&labels(&[
                ("server", SERVER_LABEL),
                ("zone", zone),
                ("proto", proto),
                ("family", family),
                ("type", qtype),
            ]))
            .inc();
    }

    /// One response with its rcode (`NOERROR`, `NXDOMAIN`, ...) and how long it took.
    pub fn response(&self, zone: &str, rcode: &str, qtype: &str, took: Duration) {
        self.responses
            .get_or_create(&labels(&[
                ("server", SERVER_LABEL),
                ("zone", zone),
                ("rcode", rcode),
            ]))
            .inc();
        self.duration
            .get_or_create(&labels(&[
                ("server", SERVER_LABEL),
                ("zone", zone),
                ("type", qtype),
            ]))
            .observe(took.as_secs_f64());
    }

    /// A forwarded question answered from the cache (`denial`: NXDOMAIN or NODATA).
    pub fn cache_hit(&self, denial: bool) {
        let kind = if denial { "denial" } else { "success" };
        self.cache_hits
            .get_or_create(&labels(&[("server", SERVER_LABEL), ("type", kind)]))
            .inc();
    }

    /// A forwarded question not in the cache.
    pub fn cache_miss(&self) {
        self.cache_misses
            .get_or_create(&labels(&[("server", SERVER_LABEL)]))
            .inc();
    }

    /// Cache hits so far of `kind` (`success` or `denial`).
    pub fn cache_hits(&self, kind: &str) -> u64 {
        self.cache_hits
            .get_or_create(&labels(&[("server", SERVER_LABEL), ("type", kind)]))
            .get()
    }

    /// Cache misses so far.
    pub fn cache_misses(&self) -> u64 {
        self.cache_misses
            .get_or_create(&labels(&[("server", SERVER_LABEL)]))
            .get()
    }

    /// The Prometheus text exposition of every metric ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cluster DNS: encoding metrics failed");
        }
        out
    }
}

/// CoreDNS's rcode label: the RFC mnemonic in capitals.
pub fn rcode_label(rcode: hickory_server::proto::op::ResponseCode) -> String {
    use hickory_server::proto::op::ResponseCode as R;
    match rcode {
        R::NoError => "NOERROR".to_string(),
        R::FormErr => "FORMERR".to_string(),
        R::ServFail => "SERVFAIL".to_string(),
        R::NXDomain => "NXDOMAIN".to_string(),
        R::NotImp => "NOTIMP".to_string(),
        R::Refused => "REFUSED".to_string(),
        other => format!("RCODE{}", u16::from(other)),
    }
}
