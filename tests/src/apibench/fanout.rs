//! Watch fan-out: one pod updated `updates` times while `watchers` watch its namespace; how
//! fast the events reach every watcher, and how many times the cache serialized them.
//!
//! This module holds what both levels share (the write marks, the per-watcher arrivals and
//! their analysis) and the in-process level: [`WatchCache::watch`] streams consumed by one
//! tokio task each, with the writes going straight to the store. The HTTP level is in
//! [`super::http`].
//!
//! It measures `docs/tricks.md` #5, serialize once per watch event: the cache's
//! serialization counter must grow by exactly the number of events, not events × watchers,
//! and a run that sees anything else fails.
//!
//! Invariants checked on every run: every watcher receives every update exactly once, in
//! write order (the frames' resourceVersions equal the writes'), no watcher is cut off for
//! being slow, and every watcher is unregistered before the next run starts.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use futures::StreamExt;
use serde_json::{Value, json};
use skerry_apiserver::storage;
use skerry_apiserver::watch_cache::{WatchCache, WatchOptions, WatchStream};

use super::fixture::{Harness, NAMESPACE, frame_resource_version, pods, resource_version_of};
use super::stats::{ms, percentile};

/// How long a watcher may take to receive all its events before the run fails. Generous: at
/// 10,000 watchers over HTTP on two shared cores a run takes seconds, and a hang should fail
/// the run rather than the whole benchmark's time budget.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the unregistration of a run's watchers may take once their streams are dropped.
pub const UNREGISTER_TIMEOUT: Duration = Duration::from_secs(30);

/// The annotation each update bumps (so every write changes the object).
pub const SEQUENCE_ANNOTATION: &str = "apibench.skerry.dev/sequence";

/// One write of the run, as the writer saw it.
#[derive(Debug, Clone, Copy)]
pub struct WriteMark {
    /// Just before the write call.
    pub started: Instant,
    /// When the write's acknowledgement (store reply or HTTP response) was in hand.
    pub acked: Instant,
    /// The resourceVersion the write produced.
    pub resource_version: i64,
}

/// What one watcher received: each frame's resourceVersion and arrival time, in order.
pub type Arrivals = Vec<(i64, Instant)>;

/// The measurements of one run at one level and one watcher count.
#[derive(Debug, Clone)]
pub struct FanoutRun {
    /// Frames delivered to watchers (watchers × updates when every check passes).
    pub events_delivered: u64,
    /// From just before the first write to the last frame's arrival.
    pub elapsed: Duration,
    /// Delivery latency, from just before the write call to the frame's arrival at a watcher,
    /// over every (watcher, event) pair.
    pub latency_p50: Duration,
    /// As `latency_p50`, the 99th percentile.
    pub latency_p99: Duration,
    /// As `latency_p50`, the largest.
    pub latency_max: Duration,
    /// The 99th percentile from the write's acknowledgement instead (0 when the frame
    /// arrived before the acknowledgement).
    pub latency_p99_from_ack: Duration,
    /// Serializations the watch cache performed during the run.
    pub serializations: u64,
    /// Watchers the cache cut off for a full queue during the run.
    pub watchers_cut: u64,
}

impl FanoutRun {
    /// Delivered events per second over [`FanoutRun::elapsed`].
    pub fn events_per_second(&self) -> f64 {
        self.events_delivered as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// The run as JSON (times in milliseconds).
    pub fn to_json(&self) -> Value {
        json!({
            "events_delivered": self.events_delivered,
            "elapsed_ms": ms(self.elapsed),
            "events_per_second": self.events_per_second(),
            "latency_p50_ms": ms(self.latency_p50),
            "latency_p99_ms": ms(self.latency_p99),
            "latency_max_ms": ms(self.latency_max),
            "latency_p99_from_ack_ms": ms(self.latency_p99_from_ack),
            "serializations": self.serializations,
            "watchers_cut": self.watchers_cut,
        })
    }
}

/// The counters a run is judged by, read before its first write.
pub struct CacheCounters {
    serializations: u64,
    watchers_terminated: u64,
}

impl CacheCounters {
    pub fn read(cache: &skerry_apiserver::watch_cache::WatchCache) -> Self {
        Self {
            serializations: cache.metrics().serializations(),
            watchers_terminated: cache.metrics().watchers_terminated(),
        }
    }
}

impl WriteMark {
    /// A write that produced `stored`, called at `started` and acknowledged at `acked`.
    pub fn of(started: Instant, acked: Instant, stored: &serde_json::Value) -> Result<Self> {
        Ok(Self {
            started,
            acked,
            resource_version: super::fixture::resource_version_of(stored)?,
        })
    }
}

/// Waits for every watcher and judges the run against the counters read before it.
pub async fn finish(
    cache: &skerry_apiserver::watch_cache::WatchCache,
    before: CacheCounters,
    writes: &[WriteMark],
    tasks: Vec<tokio::task::JoinHandle<Result<Arrivals>>>,
) -> Result<FanoutRun> {
    let arrivals = join_watchers(tasks).await?;
    let serializations = cache.metrics().serializations() - before.serializations;
    let cut = cache.metrics().watchers_terminated() - before.watchers_terminated;
    analyze(writes, &arrivals, serializations, cut)
}

/// Checks what every watcher received against the writes and computes the run's numbers.
/// `serializations` and `watchers_cut` are the cache counters' growth over the run.
pub fn analyze(
    writes: &[WriteMark],
    arrivals: &[Arrivals],
    serializations: u64,
    watchers_cut: u64,
) -> Result<FanoutRun> {
    let first = writes
        .first()
        .ok_or_else(|| anyhow!("a run with no writes"))?;
    ensure!(
        watchers_cut == 0,
        "the cache cut off {watchers_cut} slow watchers"
    );
    let mut from_start = Vec::with_capacity(writes.len() * arrivals.len());
    let mut from_ack = Vec::with_capacity(writes.len() * arrivals.len());
    let mut last_arrival = first.started;
    for (watcher, got) in arrivals.iter().enumerate() {
        ensure!(
            got.len() == writes.len(),
            "watcher {watcher} received {} events, {} were written",
            got.len(),
            writes.len()
        );
        for (index, ((rv, at), write)) in got.iter().zip(writes).enumerate() {
            ensure!(
                *rv == write.resource_version,
                "watcher {watcher}'s event {index} is at resourceVersion {rv}, the write was \
                 at {}",
                write.resource_version
            );
            from_start.push(at.saturating_duration_since(write.started));
            from_ack.push(at.saturating_duration_since(write.acked));
            last_arrival = last_arrival.max(*at);
        }
    }
    ensure!(
        serializations == writes.len() as u64,
        "the cache serialized {serializations} times for {} events to {} watchers: \
         serialize-once is broken",
        writes.len(),
        arrivals.len()
    );
    from_start.sort_unstable();
    from_ack.sort_unstable();
    let pick = |sorted: &[Duration], p| percentile(sorted, p).unwrap_or_default();
    Ok(FanoutRun {
        events_delivered: from_start.len() as u64,
        elapsed: last_arrival.saturating_duration_since(first.started),
        latency_p50: pick(&from_start, 50.0),
        latency_p99: pick(&from_start, 99.0),
        latency_max: from_start.last().copied().unwrap_or_default(),
        latency_p99_from_ack: pick(&from_ack, 99.0),
        serializations,
        watchers_cut,
    })
}

/// Waits until the cache has no watchers left (the previous run's streams were dropped).
pub async fn wait_unregistered(cache: &WatchCache) -> Result<()> {
    let deadline = Instant::now() + UNREGISTER_TIMEOUT;
    while cache.watchers() > 0 {
        ensure!(
            Instant::now() < deadline,
            "{} watchers still registered {UNREGISTER_TIMEOUT:?} after their streams ended",
            cache.watchers()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The pod the writer updates, as the writer last stored it.
pub struct Target {
    /// The pod's name.
    pub name: String,
    /// The last stored state, with its resourceVersion.
    pub object: Value,
    /// Updates written so far (the sequence annotation's value).
    pub sequence: u64,
}

impl Target {
    /// Creates the pod `name` in the store.
    pub async fn create(harness: &Harness, name: &str) -> Result<Target> {
        let object = harness.create_pod(NAMESPACE, name, 0).await?;
        Ok(Target {
            name: name.to_string(),
            object,
            sequence: 0,
        })
    }

    /// The resourceVersion of the last stored state.
    pub fn resource_version(&self) -> Result<i64> {
        resource_version_of(&self.object)
    }

    /// The next state: the last one with the sequence annotation bumped.
    pub fn next_state(&mut self) -> Value {
        self.sequence += 1;
        let mut next = self.object.clone();
        next["metadata"]["annotations"][SEQUENCE_ANNOTATION] = json!(self.sequence.to_string());
        next
    }
}

/// Starts one task per cache stream that collects `updates` frames.
fn start_cache_watchers(
    streams: Vec<WatchStream>,
    updates: usize,
) -> Vec<tokio::task::JoinHandle<Result<Arrivals>>> {
    streams
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let collect = async {
                    let mut got = Arrivals::with_capacity(updates);
                    while got.len() < updates {
                        let frame = stream
                            .next()
                            .await
                            .ok_or_else(|| anyhow!("the watch ended early"))?;
                        let at = Instant::now();
                        let rv = frame_resource_version(&frame).ok_or_else(|| {
                            anyhow!("a frame without a resourceVersion: {frame:?}")
                        })?;
                        got.push((rv, at));
                    }
                    Ok::<_, anyhow::Error>(got)
                };
                tokio::time::timeout(DELIVERY_TIMEOUT, collect)
                    .await
                    .context("a watcher did not receive every event in time")?
            })
        })
        .collect()
}

/// Waits for every watcher task and gathers what each received.
pub async fn join_watchers(
    tasks: Vec<tokio::task::JoinHandle<Result<Arrivals>>>,
) -> Result<Vec<Arrivals>> {
    let mut all = Vec::with_capacity(tasks.len());
    for task in tasks {
        all.push(task.await.context("a watcher task panicked")??);
    }
    Ok(all)
}

/// Waits until `interval` after `started` (the previous write's start), so writes start at
/// most once per `interval`; a zero interval writes back to back.
pub async fn pace(started: Instant, interval: Duration) {
    if !interval.is_zero() {
        tokio::time::sleep_until((started + interval).into()).await;
    }
}

/// One in-process run: `watchers` cache watches of the namespace, then `updates` sequential
/// store updates of `target` (each awaited before the next, and started at most once per
/// `interval`), then the analysis.
pub async fn run_cache_level(
    harness: &Harness,
    target: &mut Target,
    watchers: usize,
    updates: usize,
    interval: Duration,
) -> Result<FanoutRun> {
    let cache = harness.pods_cache();
    wait_unregistered(cache).await?;
    let start_rv = target.resource_version()?;
    cache
        .wait_fresh(start_rv)
        .await
        .map_err(|e| anyhow!("wait for the cache: {}", e.message))?;
    let mut streams = Vec::with_capacity(watchers);
    for _ in 0..watchers {
        let stream = cache
            .watch(WatchOptions {
                resource_version: Some(start_rv),
                send_initial_events: Some(false),
                namespace: Some(NAMESPACE.to_string()),
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!("watch the pods cache: {}", e.message))?;
        streams.push(stream);
    }
    ensure!(
        cache.watchers() == watchers,
        "{} watchers registered, {watchers} asked for",
        cache.watchers()
    );
    let tasks = start_cache_watchers(streams, updates);
    let before = CacheCounters::read(cache);
    let mut writes: Vec<WriteMark> = Vec::with_capacity(updates);
    for _ in 0..updates {
        if let Some(previous) = writes.last() {
            pace(previous.started, interval).await;
        }
        let next = target.next_state();
        let expected = target.resource_version()?;
        let started = Instant::now();
        let stored = storage::update(
            &harness.store,
            pods(),
            Some(NAMESPACE),
            &target.name,
            next,
            expected,
        )
        .await;
        let acked = Instant::now();
        let stored = match stored {
            Ok(stored) => stored,
            Err(e) => bail!(
                "update pod {}: {}",
                target.name,
                e.into_api_error(pods(), &target.name).message
            ),
        };
        writes.push(WriteMark::of(started, acked, &stored)?);
        target.object = stored;
    }
    finish(cache, before, &writes, tasks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(base: Instant, rvs: &[i64]) -> Vec<WriteMark> {
        rvs.iter()
            .enumerate()
            .map(|(i, rv)| WriteMark {
                started: base + Duration::from_millis(10 * i as u64),
                acked: base + Duration::from_millis(10 * i as u64 + 2),
                resource_version: *rv,
            })
            .collect()
    }

    #[test]
    fn analyze_measures_from_write_start_and_from_ack() {
        let base = Instant::now();
        let writes = marks(base, &[5, 6]);
        let arrivals = vec![
            vec![
                (5, base + Duration::from_millis(1)),
                (6, base + Duration::from_millis(13)),
            ],
            vec![
                (5, base + Duration::from_millis(4)),
                (6, base + Duration::from_millis(15)),
            ],
        ];
        let run = analyze(&writes, &arrivals, 2, 0).expect("valid run");
        assert_eq!(run.events_delivered, 4);
        assert_eq!(run.elapsed, Duration::from_millis(15));
        assert_eq!(run.latency_max, Duration::from_millis(5));
        assert_eq!(run.latency_p50, Duration::from_millis(3));
        // From the ack: 0 (arrived first), 1, 2, 3 ms.
        assert_eq!(run.latency_p99_from_ack, Duration::from_millis(3));
        assert!((run.events_per_second() - 4.0 / 0.015).abs() < 1e-6);
    }

    #[test]
    fn analyze_rejects_missing_reordered_and_reserialized_events() {
        let base = Instant::now();
        let writes = marks(base, &[5, 6]);
        let at = base + Duration::from_millis(20);
        let missing = vec![vec![(5, at)]];
        assert!(analyze(&writes, &missing, 2, 0).is_err());
        let reordered = vec![vec![(6, at), (5, at)]];
        assert!(analyze(&writes, &reordered, 2, 0).is_err());
        let good = vec![vec![(5, at), (6, at)], vec![(5, at), (6, at)]];
        let err = analyze(&writes, &good, 4, 0).expect_err("4 serializations for 2 events");
        assert!(err.to_string().contains("serialize-once"), "{err}");
        assert!(
            analyze(&writes, &good, 2, 1).is_err(),
            "a cut watcher fails"
        );
        assert!(analyze(&writes, &good, 2, 0).is_ok());
    }
}
