//! LIST of many pods: from the watch cache (`resourceVersion=0`) against from the store
//! (`resourceVersion=""`, a consistent read), in process and over HTTP.
//!
//! Five ways are timed, interleaved within each run so that the machine's noise falls on all
//! of them alike:
//! - in process, `WatchCache::list` with `resourceVersion=0`: the cache's current objects,
//!   reference-count bumps only;
//! - in process, `WatchCache::list` with `resourceVersion` unset: skerry's cache also serves
//!   consistent reads (Kubernetes 1.32's ConsistentListFromCache): a linearizable barrier,
//!   then the same copy;
//! - in process, `storage::list` with `resourceVersion` unset: what the HTTP handler runs
//!   for `resourceVersion=""` today: a barrier, one store range, and a JSON decode of every
//!   object;
//! - over HTTP, `GET .../pods?resourceVersion=0`, `GET .../pods` (consistent, from the cache
//!   since the handler lets the cache plan every LIST) and `GET .../pods?limit=N` with N the
//!   pod count (a limited consistent LIST, which Kubernetes and skerry read from the store, in
//!   one page here): the above plus encoding,
//!   TLS and HTTP/2 flow control, timed to the last byte of the body. From the cache the items
//!   are spliced in as each object's memoized JSON, so only the first (cold) LIST encodes
//!   them; it is the untimed warm-up, reported on its own.
//!
//! Invariant: every timed LIST returns exactly the pods created (checked on the in-process
//! results every run and on the HTTP bodies on the warm-up).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use http::{Method, StatusCode};
use serde_json::{Value, json};
use skerry_apiserver::storage::{self, ListOptions};

use super::fixture::{Harness, LIST_NAMESPACE, pods};
use super::http::Client;
use super::stats::{median, ms};

/// The ways a LIST is served, in the order each run times them.
pub const LIST_WAYS: [ListWay; 6] = [
    ListWay::CacheAny,
    ListWay::CacheConsistent,
    ListWay::Store,
    ListWay::HttpCache,
    ListWay::HttpConsistent,
    ListWay::HttpStore,
];

/// One way of serving the benchmark's LIST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListWay {
    /// In process, `WatchCache::list`, `resourceVersion=0`.
    CacheAny,
    /// In process, `WatchCache::list`, `resourceVersion` unset (consistent, from the cache).
    CacheConsistent,
    /// In process, `storage::list`, `resourceVersion` unset (consistent, from the store).
    Store,
    /// `GET /api/v1/namespaces/<ns>/pods?resourceVersion=0` over HTTP/2 + TLS.
    HttpCache,
    /// `GET /api/v1/namespaces/<ns>/pods` over HTTP/2 + TLS (consistent, from the cache).
    HttpConsistent,
    /// `GET /api/v1/namespaces/<ns>/pods?limit=<count>` over HTTP/2 + TLS (from the store).
    HttpStore,
}

impl ListWay {
    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ListWay::CacheAny => "in-process cache rv=0",
            ListWay::CacheConsistent => "in-process cache rv=\"\" (consistent)",
            ListWay::Store => "in-process store rv=\"\"",
            ListWay::HttpCache => "HTTP GET rv=0",
            ListWay::HttpConsistent => "HTTP GET rv=\"\" (consistent, cache)",
            ListWay::HttpStore => "HTTP GET limit=N (store)",
        }
    }

    /// The JSON key.
    pub fn key(self) -> &'static str {
        match self {
            ListWay::CacheAny => "in_process_cache_rv0",
            ListWay::CacheConsistent => "in_process_cache_consistent",
            ListWay::Store => "in_process_store",
            ListWay::HttpCache => "http_rv0",
            ListWay::HttpConsistent => "http_rv_empty",
            ListWay::HttpStore => "http_limit_store",
        }
    }
}

/// The timings of the LIST benchmark.
#[derive(Debug, Clone)]
pub struct ListResult {
    /// Pods each LIST returns.
    pub pods: usize,
    /// Bytes of the HTTP `resourceVersion=0` body.
    pub http_body_bytes: usize,
    /// The untimed warm-up's HTTP `resourceVersion=0` LIST, which encodes every object once.
    pub http_cache_cold: Duration,
    /// Per way (in [`LIST_WAYS`] order), the time of each run.
    pub runs: Vec<(ListWay, Vec<Duration>)>,
}

impl ListResult {
    /// The median time of `way`.
    pub fn median(&self, way: ListWay) -> Option<Duration> {
        let (_, times) = self.runs.iter().find(|(w, _)| *w == way)?;
        let secs: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
        median(&secs).map(Duration::from_secs_f64)
    }

    /// Median of `slow` over median of `fast`.
    pub fn ratio(&self, slow: ListWay, fast: ListWay) -> Option<f64> {
        let fast = self.median(fast)?.as_secs_f64();
        (fast > 0.0).then(|| self.median(slow).map(|s| s.as_secs_f64() / fast))?
    }

    /// The result as JSON (times in milliseconds).
    pub fn to_json(&self) -> Value {
        let mut ways = serde_json::Map::new();
        for (way, times) in &self.runs {
            ways.insert(
                way.key().to_string(),
                json!({
                    "name": way.name(),
                    "median_ms": self.median(*way).map(ms),
                    "runs_ms": times.iter().map(|t| ms(*t)).collect::<Vec<_>>(),
                }),
            );
        }
        json!({
            "pods": self.pods,
            "http_body_bytes": self.http_body_bytes,
            "http_rv0_cold_ms": ms(self.http_cache_cold),
            "ways": ways,
            "ratio_store_over_cache_in_process": self.ratio(ListWay::Store, ListWay::CacheAny),
            "ratio_store_over_cache_http": self.ratio(ListWay::HttpStore, ListWay::HttpCache),
        })
    }
}

/// Creates `count` pods in [`LIST_NAMESPACE`] and times `runs` rounds of every [`ListWay`]
/// after one untimed warm-up round.
pub async fn run_list(
    harness: &Harness,
    client: &Client,
    count: usize,
    runs: usize,
) -> Result<ListResult> {
    harness.create_pods(LIST_NAMESPACE, "web", count).await?;
    let cache = harness.pods_cache();
    cache
        .wait_fresh(harness.store.revision())
        .await
        .map_err(|e| anyhow!("wait for the pods cache: {}", e.message))?;

    // Warm-up: checks every HTTP body once, and times the cold cache LIST.
    let started = Instant::now();
    let body = list_over_http(client, ListWay::HttpCache, count).await?;
    let http_cache_cold = started.elapsed();
    check_body(&body, count)?;
    check_body(
        &list_over_http(client, ListWay::HttpConsistent, count).await?,
        count,
    )?;
    check_body(
        &list_over_http(client, ListWay::HttpStore, count).await?,
        count,
    )?;
    let http_body_bytes = body.len();
    for way in [ListWay::CacheAny, ListWay::CacheConsistent, ListWay::Store] {
        time_way(harness, client, way, count).await?;
    }

    let mut results: Vec<(ListWay, Vec<Duration>)> = LIST_WAYS
        .iter()
        .map(|w| (*w, Vec::with_capacity(runs)))
        .collect();
    for _ in 0..runs {
        for (way, times) in &mut results {
            times.push(time_way(harness, client, *way, count).await?);
        }
    }
    Ok(ListResult {
        pods: count,
        http_body_bytes,
        http_cache_cold,
        runs: results,
    })
}

/// The LIST options of the benchmark's namespace at `resource_version`.
fn options(resource_version: Option<i64>) -> ListOptions {
    ListOptions {
        resource_version,
        namespace: Some(LIST_NAMESPACE.to_string()),
        ..Default::default()
    }
}

/// One timed LIST of `way`, checked to return `count` items.
async fn time_way(
    harness: &Harness,
    client: &Client,
    way: ListWay,
    count: usize,
) -> Result<Duration> {
    let cache = harness.pods_cache();
    let started = Instant::now();
    let items = match way {
        ListWay::CacheAny | ListWay::CacheConsistent => {
            let rv = (way == ListWay::CacheAny).then_some(0);
            cache
                .list(&options(rv), None)
                .await
                .map_err(|e| anyhow!("{}: {}", way.name(), e.message))?
                .items
                .len()
        }
        ListWay::Store => storage::list(&harness.store, pods(), &options(None), None)
            .await
            .map_err(|e| anyhow!("{}: {}", way.name(), e.message))?
            .items
            .len(),
        ListWay::HttpCache | ListWay::HttpConsistent | ListWay::HttpStore => {
            let body = list_over_http(client, way, count).await?;
            let elapsed = started.elapsed();
            ensure!(!body.is_empty(), "{}: empty body", way.name());
            // Bodies were checked item by item in the warm-up; parsing 20 MiB again per run
            // would dominate the benchmark's own time.
            return Ok(elapsed);
        }
    };
    let elapsed = started.elapsed();
    ensure!(
        items == count,
        "{} returned {items} pods, {count} were created",
        way.name()
    );
    Ok(elapsed)
}

/// The body of one LIST of the namespace's pods over HTTP, the way `way` asks.
async fn list_over_http(client: &Client, way: ListWay, count: usize) -> Result<bytes::Bytes> {
    let query = match way {
        ListWay::HttpCache => "?resourceVersion=0".to_string(),
        ListWay::HttpStore => format!("?limit={count}"),
        _ => String::new(),
    };
    let path = format!("/api/v1/namespaces/{LIST_NAMESPACE}/pods{query}");
    let (status, body) = client.call(Method::GET, &path, bytes::Bytes::new()).await?;
    ensure!(
        status == StatusCode::OK,
        "GET {path} answered {status}: {}",
        String::from_utf8_lossy(&body[..body.len().min(512)])
    );
    Ok(body)
}

/// Checks that a PodList body holds `count` items.
fn check_body(body: &[u8], count: usize) -> Result<()> {
    let list: Value = serde_json::from_slice(body).context("decode a PodList")?;
    ensure!(list["kind"] == "PodList", "not a PodList: {}", list["kind"]);
    let items = list["items"]
        .as_array()
        .map(Vec::len)
        .ok_or_else(|| anyhow!("a PodList without items"))?;
    ensure!(
        items == count,
        "the PodList holds {items} pods, {count} were created"
    );
    Ok(())
}
