//! Store benchmarks (criterion). Run: `cargo bench -p skerry-store --bench store`.
//!
//! - `durability/*`: the two ways to make a batch of writes durable that the store issue asked
//!   to compare: one redb `Durability::Immediate` commit per batch, or a write-ahead log
//!   fsynced per batch with redb committed lazily (`Durability::None`, a durable commit every
//!   50 batches), as etcd does with its WAL and bbolt. The log won for the batch sizes 64
//!   clients produce, so the store uses it (`skerry_store::wal`).
//! - `put/*`: puts through the store's group-commit writer with 1 and 64 concurrent callers.
//! - `range/*`: a page of 500 keys out of 20,000 (with the full `count`), and a point get.

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use redb::{Database, Durability, TableDefinition};
use skerry_store::pb::etcdserverpb::{PutRequest, RangeRequest};
use skerry_store::{Store, StoreConfig};

const TABLE: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("kv");
const VALUE_BYTES: usize = 256;
/// How often the WAL variant makes redb durable (and could truncate its log).
const WAL_CHECKPOINT_BATCHES: u64 = 50;

fn durability(c: &mut Criterion) {
    let mut group = c.benchmark_group("durability");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(4));
    for batch in [1u64, 64, 512] {
        group.throughput(Throughput::Elements(batch));
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Database::create(dir.path().join("a.redb")).expect("create");
        let value = vec![7u8; VALUE_BYTES];
        let mut rev = 0u64;
        group.bench_with_input(
            BenchmarkId::new("redb_immediate_per_batch", batch),
            &batch,
            |b, &n| {
                b.iter(|| {
                    let mut txn = db.begin_write().expect("begin");
                    txn.set_durability(Durability::Immediate)
                        .expect("durability");
                    {
                        let mut t = txn.open_table(TABLE).expect("table");
                        for _ in 0..n {
                            rev += 1;
                            t.insert((rev, 0), value.as_slice()).expect("insert");
                        }
                    }
                    txn.commit().expect("commit");
                })
            },
        );
        let db = Database::create(dir.path().join("b.redb")).expect("create");
        let mut wal = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.path().join("wal"))
            .expect("wal");
        // Preallocated like etcd's 64 MB segments, so appends do not grow the file.
        wal.set_len(256 << 20).expect("preallocate");
        wal.sync_all().expect("sync");
        let mut batches = 0u64;
        group.bench_with_input(
            BenchmarkId::new("wal_fsync_redb_lazy", batch),
            &batch,
            |b, &n| {
                b.iter(|| {
                    let mut record = Vec::with_capacity(VALUE_BYTES * n as usize);
                    for _ in 0..n {
                        record.extend_from_slice(&value);
                    }
                    wal.write_all(&record).expect("append");
                    wal.sync_data().expect("fdatasync");
                    let mut txn = db.begin_write().expect("begin");
                    txn.set_durability(Durability::None).expect("durability");
                    {
                        let mut t = txn.open_table(TABLE).expect("table");
                        for _ in 0..n {
                            rev += 1;
                            t.insert((rev, 0), value.as_slice()).expect("insert");
                        }
                    }
                    txn.commit().expect("commit");
                    batches += 1;
                    if batches.is_multiple_of(WAL_CHECKPOINT_BATCHES) {
                        let mut txn = db.begin_write().expect("begin");
                        txn.set_durability(Durability::Immediate)
                            .expect("durability");
                        txn.commit().expect("checkpoint");
                        if wal.metadata().map(|m| m.len()).unwrap_or(0) > 0 {
                            use std::io::Seek;
                            wal.seek(std::io::SeekFrom::Start(0)).expect("rewind");
                        }
                    }
                })
            },
        );
    }
    group.finish();
}

/// A runtime and a store in a fresh temp dir (kept alive by the returned guard).
fn open_store() -> (tokio::runtime::Runtime, tempfile::TempDir, Store) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(StoreConfig::new(dir.path())).expect("open");
    (runtime, dir, store)
}

fn put(c: &mut Criterion) {
    let (runtime, _dir, store) = open_store();
    let mut group = c.benchmark_group("put");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    let value = Bytes::from(vec![1u8; VALUE_BYTES]);
    for clients in [1usize, 64] {
        group.throughput(Throughput::Elements(clients as u64));
        let mut counter = 0u64;
        group.bench_with_input(
            BenchmarkId::new("concurrent_callers", clients),
            &clients,
            |b, &n| {
                b.iter(|| {
                    runtime.block_on(async {
                        let mut tasks = Vec::with_capacity(n);
                        for _ in 0..n {
                            counter += 1;
                            let store = store.clone();
                            let key = Bytes::from(format!("bench/{counter:08}"));
                            let value = value.clone();
                            tasks.push(tokio::spawn(async move {
                                store
                                    .put(PutRequest {
                                        key,
                                        value,
                                        ..Default::default()
                                    })
                                    .await
                            }));
                        }
                        for t in tasks {
                            black_box(t.await.expect("join").expect("put"));
                        }
                    })
                })
            },
        );
    }
    group.finish();
    drop(store);
}

fn range(c: &mut Criterion) {
    let (runtime, _dir, store) = open_store();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..20_000u32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store
                    .put(PutRequest {
                        key: Bytes::from(format!("/registry/pods/default/pod-{i:06}")),
                        value: Bytes::from(vec![2u8; VALUE_BYTES]),
                        ..Default::default()
                    })
                    .await
            }));
        }
        for t in tasks {
            t.await.expect("join").expect("put");
        }
    });
    let mut group = c.benchmark_group("range");
    group.sample_size(30);
    group.bench_function("page_500_of_20000_with_count", |b| {
        b.iter(|| {
            let resp = store
                .range(&RangeRequest {
                    key: Bytes::from_static(b"/registry/pods/"),
                    range_end: Bytes::from_static(b"/registry/pods0"),
                    limit: 500,
                    ..Default::default()
                })
                .expect("range");
            assert_eq!(resp.count, 20_000);
            black_box(resp)
        })
    });
    group.bench_function("point_get", |b| {
        b.iter(|| {
            black_box(
                store
                    .range(&RangeRequest {
                        key: Bytes::from_static(b"/registry/pods/default/pod-012345"),
                        ..Default::default()
                    })
                    .expect("get"),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, durability, put, range);
criterion_main!(benches);
