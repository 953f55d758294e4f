//! `apibench`: benchmarks of skerry's apiserver — watch fan-out and LIST from the watch cache
//! against LIST from the store — run against a real [`ApiServer`](skerry_apiserver::ApiServer)
//! over a single-member store in a temp dir.
//!
//! # Layout
//! - [`fixture`]: the ~2 KiB pod, the [`fixture::Harness`] (store, apiserver, TLS listener).
//! - [`pki`]: throwaway CA, serving and `system:masters` admin certificates (`skerry_tls::pki`).
//! - [`fanout`]: the fan-out's shared analysis and its in-process level (`WatchCache::watch`
//!   streams, one task each, writes straight to the store).
//! - [`http`]: the end-to-end level: HTTP/2 + TLS watches multiplexed over a bounded number of
//!   connections, writes as `PUT`s through the full request path.
//! - [`list`]: LIST of many pods from the cache and from the store, in process and over HTTP.
//! - [`stats`]: medians and percentiles.
//!
//! Start at [`run`]; the `skerry-apibench` binary wraps it with a command line, a table and
//! `--json`.
//!
//! It measures two tricks of the apiserver (`docs/tricks.md`): #5, serialize once per watch
//! event (every fan-out run fails unless the cache's serialization
//! count grew by exactly the number of events) and the watch cache's LIST.
//!
//! Invariant: runs of one scenario share one apiserver but never overlap; each starts only
//! when the previous run's watchers are unregistered, so a run measures its own watchers only.

pub mod fanout;
pub mod fixture;
pub mod http;
pub mod list;
pub mod pki;
pub mod stats;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::{Value, json};
use skerry_apiserver::watch_cache::WATCHER_QUEUE_EVENTS_MAX;
use tracing::info;

use fanout::{FanoutRun, Target};
use fixture::Harness;
use http::{CONNECTIONS_MAX, Client, STREAMS_PER_CONNECTION_MAX, connections_for};
use list::{LIST_WAYS, ListResult, ListWay};
use stats::{median, ms};

/// Upper bound on `runs`: a default run takes minutes, so more than this is a typo.
pub const RUNS_MAX: usize = 20;

/// Upper bound on in-process watchers: each is a task and a queue of up to
/// [`WATCHER_QUEUE_EVENTS_MAX`] frame references; ten times the largest count.
pub const CACHE_WATCHERS_MAX: usize = 100_000;

/// Upper bound on HTTP watchers: what [`CONNECTIONS_MAX`] connections carry.
pub const HTTP_WATCHERS_MAX: usize = CONNECTIONS_MAX * STREAMS_PER_CONNECTION_MAX;

/// Upper bound on the pods of the LIST benchmark: ten times the 10,000 (about 200 MiB
/// of store and cache).
pub const LIST_PODS_MAX: usize = 100_000;

/// Updates per fan-out run may not exceed a watcher's queue: the writer does not wait for
/// watchers, so with more a watcher descheduled for the whole burst would be cut off, and the
/// run would measure the cut-off rule instead of delivery.
pub const UPDATES_MAX: usize = WATCHER_QUEUE_EVENTS_MAX;

/// Upper bound on the pause between updates: with 100 updates a run then lasts 100 s, the
/// benchmark's time budget; the deliveries' own timeout is [`fanout::DELIVERY_TIMEOUT`].
pub const UPDATE_INTERVAL_MAX: Duration = Duration::from_secs(1);

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Watcher counts of the in-process fan-out (empty: skip it).
    pub cache_watchers: Vec<usize>,
    /// Watcher counts of the end-to-end fan-out (empty: skip it).
    pub http_watchers: Vec<usize>,
    /// Updates of the pod per fan-out run.
    pub updates: usize,
    /// Least time between the starts of two updates; zero writes back to back (each write
    /// still awaits the previous one's acknowledgement).
    pub update_interval: Duration,
    /// Pods the LIST benchmark creates (0: skip it).
    pub list_pods: usize,
    /// Runs of each scenario; medians are over these.
    pub runs: usize,
}

impl Default for Options {
    /// The sizes: 1,000 and 10,000 watchers at both levels, 100 updates, 10,000 pods,
    /// five runs.
    fn default() -> Self {
        Options {
            cache_watchers: vec![1_000, 10_000],
            http_watchers: vec![1_000, 10_000],
            updates: 100,
            update_interval: Duration::ZERO,
            list_pods: 10_000,
            runs: 5,
        }
    }
}

impl Options {
    /// Checks every count against its bound.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            (1..=RUNS_MAX).contains(&self.runs),
            "runs {} outside 1..={RUNS_MAX}",
            self.runs
        );
        ensure!(
            (1..=UPDATES_MAX).contains(&self.updates),
            "updates {} outside 1..={UPDATES_MAX}",
            self.updates
        );
        for w in &self.cache_watchers {
            ensure!(
                (1..=CACHE_WATCHERS_MAX).contains(w),
                "in-process watchers {w} outside 1..={CACHE_WATCHERS_MAX}"
            );
        }
        for w in &self.http_watchers {
            ensure!(
                (1..=HTTP_WATCHERS_MAX).contains(w),
                "HTTP watchers {w} outside 1..={HTTP_WATCHERS_MAX}"
            );
        }
        ensure!(
            self.update_interval <= UPDATE_INTERVAL_MAX,
            "update interval {:?} over {UPDATE_INTERVAL_MAX:?}",
            self.update_interval
        );
        ensure!(
            self.list_pods <= LIST_PODS_MAX,
            "list pods {} over {LIST_PODS_MAX}",
            self.list_pods
        );
        Ok(())
    }
}

/// Where a fan-out was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `WatchCache::watch` streams in process.
    InProcess,
    /// HTTP/2 watch streams over TLS to the served apiserver.
    Http,
}

impl Level {
    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Level::InProcess => "in-process",
            Level::Http => "http2+tls",
        }
    }
}

/// The runs of one fan-out scenario.
#[derive(Debug, Clone)]
pub struct FanoutResult {
    /// Where it was measured.
    pub level: Level,
    /// Watchers per run.
    pub watchers: usize,
    /// HTTP/2 connections carrying the watches (`None` in process).
    pub connections: Option<usize>,
    /// Updates (events) per run.
    pub updates: usize,
    /// Each run's numbers.
    pub runs: Vec<FanoutRun>,
}

impl FanoutResult {
    /// The median over runs of `metric`.
    pub fn median_of(&self, metric: impl Fn(&FanoutRun) -> f64) -> f64 {
        let values: Vec<f64> = self.runs.iter().map(metric).collect();
        median(&values).unwrap_or(f64::NAN)
    }

    /// The scenario as JSON: medians, then every run.
    pub fn to_json(&self) -> Value {
        json!({
            "level": self.level.name(),
            "watchers": self.watchers,
            "connections": self.connections,
            "streams_per_connection_max": self.connections.map(|_| STREAMS_PER_CONNECTION_MAX),
            "updates": self.updates,
            "median": {
                "events_per_second": self.median_of(FanoutRun::events_per_second),
                "latency_p50_ms": self.median_of(|r| ms(r.latency_p50)),
                "latency_p99_ms": self.median_of(|r| ms(r.latency_p99)),
                "latency_max_ms": self.median_of(|r| ms(r.latency_max)),
                "latency_p99_from_ack_ms": self.median_of(|r| ms(r.latency_p99_from_ack)),
                "elapsed_ms": self.median_of(|r| ms(r.elapsed)),
            },
            "serializations_per_run": self.runs.iter().map(|r| r.serializations).collect::<Vec<_>>(),
            "runs": self.runs.iter().map(FanoutRun::to_json).collect::<Vec<_>>(),
        })
    }
}

/// Everything one benchmark invocation measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// What was asked for.
    pub options: Options,
    /// One entry per (level, watcher count), in-process first.
    pub fanout: Vec<FanoutResult>,
    /// The LIST benchmark, unless skipped.
    pub list: Option<ListResult>,
    /// Wall time of the whole invocation, set-up included.
    pub total: Duration,
}

/// Logs one fan-out run.
fn log_run(
    level: &str,
    watchers: usize,
    connections: Option<usize>,
    run: usize,
    result: &FanoutRun,
) {
    info!(
        level,
        watchers,
        connections,
        run,
        events_per_second = result.events_per_second() as u64,
        p99_ms = ms(result.latency_p99),
        serializations = result.serializations,
        "fan-out run"
    );
}

/// Runs every scenario `options` asks for against one fresh apiserver.
pub async fn run(options: &Options) -> Result<Report> {
    options.validate()?;
    let started = std::time::Instant::now();
    let harness = Harness::start().await?;
    info!(addr = %harness.addr, "apiserver serving");
    let mut fanout = Vec::new();
    for &watchers in &options.cache_watchers {
        let mut target = Target::create(&harness, &format!("fanout-cache-{watchers}")).await?;
        let mut runs = Vec::with_capacity(options.runs);
        for run in 0..options.runs {
            let result = fanout::run_cache_level(
                &harness,
                &mut target,
                watchers,
                options.updates,
                options.update_interval,
            )
            .await?;
            log_run("in-process", watchers, None, run, &result);
            runs.push(result);
        }
        fanout.push(FanoutResult {
            level: Level::InProcess,
            watchers,
            connections: None,
            updates: options.updates,
            runs,
        });
    }
    let tls = harness.pki.admin_client_config()?;
    let writer = Client::connect(harness.addr, tls.clone(), 1).await?;
    for &watchers in &options.http_watchers {
        let connections = connections_for(watchers);
        let watch_client = Arc::new(Client::connect(harness.addr, tls.clone(), connections).await?);
        let mut target = Target::create(&harness, &format!("fanout-http-{watchers}")).await?;
        let mut runs = Vec::with_capacity(options.runs);
        for run in 0..options.runs {
            let result = http::run_http_level(
                &harness,
                &watch_client,
                &writer,
                &mut target,
                watchers,
                options.updates,
                options.update_interval,
            )
            .await?;
            log_run("http2+tls", watchers, Some(connections), run, &result);
            runs.push(result);
        }
        fanout.push(FanoutResult {
            level: Level::Http,
            watchers,
            connections: Some(connections),
            updates: options.updates,
            runs,
        });
    }
    let list = if options.list_pods > 0 {
        info!(pods = options.list_pods, "LIST benchmark: creating pods");
        let result = list::run_list(&harness, &writer, options.list_pods, options.runs).await?;
        info!(
            ratio_in_process = result.ratio(ListWay::Store, ListWay::CacheAny),
            ratio_http = result.ratio(ListWay::HttpStore, ListWay::HttpCache),
            "LIST benchmark done"
        );
        Some(result)
    } else {
        None
    };
    Ok(Report {
        options: options.clone(),
        fanout,
        list,
        total: started.elapsed(),
    })
}

impl Report {
    /// The `--json` summary.
    pub fn to_json(&self) -> Value {
        json!({
            "options": {
                "cache_watchers": self.options.cache_watchers,
                "http_watchers": self.options.http_watchers,
                "updates": self.options.updates,
                "update_interval_ms": ms(self.options.update_interval),
                "list_pods": self.options.list_pods,
                "runs": self.options.runs,
            },
            "fanout": self.fanout.iter().map(FanoutResult::to_json).collect::<Vec<_>>(),
            "list": self.list.as_ref().map(ListResult::to_json),
            "total_ms": ms(self.total),
        })
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let runs = self.options.runs;
        if !self.fanout.is_empty() {
            let pacing = if self.options.update_interval.is_zero() {
                "back to back".to_string()
            } else {
                format!("one every {:?}", self.options.update_interval)
            };
            out.push_str(&format!(
                "Watch fan-out: one pod updated {} times ({pacing}); medians of {runs} runs; \
                 latency from just before the write call to the frame's arrival at a watcher\n",
                self.options.updates
            ));
            out.push_str(&format!(
                "{:<11} {:>8} {:>6} {:>12} {:>8} {:>8} {:>8} {:>13} {:>15}\n",
                "level",
                "watchers",
                "conns",
                "events/s",
                "p50 ms",
                "p99 ms",
                "max ms",
                "p99 ack ms",
                "serializations"
            ));
            for f in &self.fanout {
                let serializations = f.runs.first().map_or(0, |r| r.serializations);
                out.push_str(&format!(
                    "{:<11} {:>8} {:>6} {:>12.0} {:>8.2} {:>8.2} {:>8.2} {:>13.2} {:>15}\n",
                    f.level.name(),
                    f.watchers,
                    f.connections.map_or("-".to_string(), |c| c.to_string()),
                    f.median_of(FanoutRun::events_per_second),
                    f.median_of(|r| ms(r.latency_p50)),
                    f.median_of(|r| ms(r.latency_p99)),
                    f.median_of(|r| ms(r.latency_max)),
                    f.median_of(|r| ms(r.latency_p99_from_ack)),
                    format!("{serializations} = events"),
                ));
            }
            out.push('\n');
        }
        if let Some(list) = &self.list {
            out.push_str(&format!(
                "LIST of {} pods (~2 KiB each, {:.1} MiB as JSON); medians of {runs} runs\n",
                list.pods,
                list.http_body_bytes as f64 / (1024.0 * 1024.0)
            ));
            out.push_str(&format!("{:<40} {:>10}\n", "way", "median ms"));
            for way in LIST_WAYS {
                out.push_str(&format!(
                    "{:<40} {:>10.2}\n",
                    way.name(),
                    list.median(way).map_or(f64::NAN, ms)
                ));
            }
            out.push_str(&format!(
                "{:<40} {:>10.2}\n",
                "HTTP GET rv=0, first (cold, untimed run)",
                ms(list.http_cache_cold)
            ));
            let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.1}x"));
            out.push_str(&format!(
                "store/cache ratio: in process {}, over HTTP {}\n",
                ratio(list.ratio(ListWay::Store, ListWay::CacheAny)),
                ratio(list.ratio(ListWay::HttpStore, ListWay::HttpCache)),
            ));
        }
        out
    }
}
