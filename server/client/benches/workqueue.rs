//! Workqueue throughput with coalescing (`docs/tricks.md` #17) against a naive
//! queue that keeps every add.
//!
//! [`PRODUCERS`] producers add [`ADDS`] keys drawn from [`KEYS`] distinct keys while one consumer
//! takes them and "syncs" each (a busy wait of the given cost, standing in for a reconcile).
//! The workqueue merges adds of a key that is already waiting, so the consumer syncs far fewer
//! times than there were adds; the naive queue (an unbounded tokio channel) syncs once per
//! add. Criterion reports adds/s for the whole run, from the first add until every add has
//! been synced; the sync counts are printed before the measurements.
//!
//! Producers run either as tasks on the consumer's runtime (adds arrive about as fast as they
//! are taken, so there is little to merge) or on threads of their own (a burst, as after a
//! relist, where nearly every add merges).
//!
//! Run with `cargo bench -p skerry-client --bench workqueue`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use skerry_client::workqueue::WorkQueue;

/// Distinct keys: a controller watching ~100 objects.
const KEYS: u32 = 100;
/// Adds per run: 1,000 changes per key, enough that coalescing dominates.
const ADDS: u32 = 100_000;
/// Concurrent producers (informer handlers); adds are spread evenly over them.
const PRODUCERS: u32 = 4;
/// Adds between yields of a producer, so producers and the consumer interleave on two cores.
const ADDS_PER_YIELD: u32 = 100;
/// A key no producer adds: queued after the producers finish, it tells the consumer to drain.
const LAST_KEY: u32 = u32::MAX;
/// Simulated cost of one sync: none (pure queue overhead) and 10 µs (a cheap reconcile).
const SYNC_COSTS: [Duration; 2] = [Duration::ZERO, Duration::from_micros(10)];

/// Busy-waits for `cost`, standing in for a reconcile of `key`.
fn sync(key: u32, cost: Duration) {
    black_box(key);
    if cost.is_zero() {
        return;
    }
    let until = Instant::now() + cost;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn key_of(producer: u32, i: u32) -> u32 {
    (i.wrapping_mul(31).wrapping_add(producer * 17)) % KEYS
}

/// Where the producers run.
#[derive(Debug, Clone, Copy)]
enum Producers {
    /// Tasks on the consumer's two-thread runtime, yielding every [`ADDS_PER_YIELD`] adds:
    /// adds arrive at about the pace the consumer takes them (informer handlers and workers
    /// sharing a runtime).
    Tasks,
    /// Threads of their own adding as fast as they can: a burst (a relist) far faster than
    /// the consumer.
    Threads,
}

/// Runs [`PRODUCERS`] producers, each calling `add` for its share of [`ADDS`] keys, and waits
/// for them all.
async fn produce(producers: Producers, add: impl Fn(u32) + Clone + Send + 'static) {
    let handles: Vec<_> = (0..PRODUCERS)
        .map(|producer| {
            let add = add.clone();
            match producers {
                Producers::Tasks => tokio::spawn(async move {
                    for i in 0..ADDS / PRODUCERS {
                        add(key_of(producer, i));
                        if i % ADDS_PER_YIELD == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                }),
                Producers::Threads => tokio::task::spawn_blocking(move || {
                    for i in 0..ADDS / PRODUCERS {
                        add(key_of(producer, i));
                    }
                }),
            }
        })
        .collect();
    drop(add);
    for handle in handles {
        handle.await.expect("producer panicked");
    }
}

/// One run through the workqueue; returns the number of syncs.
async fn run_workqueue(producers: Producers, cost: Duration) -> u64 {
    let queue = WorkQueue::<u32>::new("bench");
    let consumer = tokio::spawn({
        let queue = queue.clone();
        async move {
            let mut syncs = 0u64;
            while let Some(key) = queue.get().await {
                if key == LAST_KEY {
                    queue.done(&key);
                    // The only consumer holds nothing else, so whatever is left is queued.
                    while !queue.is_empty() {
                        let Some(key) = queue.get().await else { break };
                        sync(key, cost);
                        queue.done(&key);
                        syncs += 1;
                    }
                    break;
                }
                sync(key, cost);
                queue.done(&key);
                syncs += 1;
            }
            syncs
        }
    });
    let producer_queue = queue.clone();
    produce(producers, move |key| producer_queue.add(key)).await;
    queue.add(LAST_KEY);
    let syncs = consumer.await.expect("consumer panicked");
    queue.shut_down();
    syncs
}

/// One run through an unbounded channel that keeps every add; returns the number of syncs.
async fn run_naive(producers: Producers, cost: Duration) -> u64 {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let consumer = tokio::spawn(async move {
        let mut syncs = 0u64;
        while let Some(key) = receiver.recv().await {
            sync(key, cost);
            syncs += 1;
        }
        syncs
    });
    produce(producers, move |key| {
        sender.send(key).expect("consumer alive");
    })
    .await;
    consumer.await.expect("consumer panicked")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build tokio runtime")
}

/// Producer placements and sync costs measured.
const VARIANTS: [(Producers, Duration); 4] = [
    (Producers::Tasks, SYNC_COSTS[0]),
    (Producers::Tasks, SYNC_COSTS[1]),
    (Producers::Threads, SYNC_COSTS[0]),
    (Producers::Threads, SYNC_COSTS[1]),
];

fn bench_workqueue(c: &mut Criterion) {
    let runtime = runtime();
    // The sync counts, once per variant, before the timings.
    for (producers, cost) in VARIANTS {
        let start = Instant::now();
        let workqueue_syncs = runtime.block_on(run_workqueue(producers, cost));
        let workqueue_elapsed = start.elapsed();
        let start = Instant::now();
        let naive_syncs = runtime.block_on(run_naive(producers, cost));
        let naive_elapsed = start.elapsed();
        for (queue, syncs, elapsed) in [
            ("workqueue", workqueue_syncs, workqueue_elapsed),
            ("naive", naive_syncs, naive_elapsed),
        ] {
            println!(
                "{queue:>9} producers={producers:?} sync_cost={cost:?}: {ADDS} adds over {KEYS} \
                 keys -> {syncs} syncs ({:.1} adds per sync), {elapsed:.2?}, {:.0} adds/s",
                f64::from(ADDS) / syncs as f64,
                f64::from(ADDS) / elapsed.as_secs_f64(),
            );
        }
    }

    let mut group = c.benchmark_group("workqueue_adds");
    group.throughput(Throughput::Elements(u64::from(ADDS)));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(12));
    for (producers, cost) in VARIANTS {
        let label = format!("{producers:?}/sync_{}us", cost.as_micros()).to_lowercase();
        group.bench_with_input(BenchmarkId::new("workqueue", &label), &cost, |b, &cost| {
            b.iter(|| runtime.block_on(run_workqueue(producers, cost)));
        });
        group.bench_with_input(
            BenchmarkId::new("naive_channel", &label),
            &cost,
            |b, &cost| {
                b.iter(|| runtime.block_on(run_naive(producers, cost)));
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_workqueue);
criterion_main!(benches);
