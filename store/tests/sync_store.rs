//! `SyncStore`, the store as a deterministic state machine for the Raft layer's simulation:
//! differentially against the real replicated store (fed through `apply_committed`, as the
//! Raft layer feeds it), its crash model, snapshots in both directions between the two, and
//! determinism (the same inputs give byte-identical snapshots).
//!
//! Commands are drawn from seeded RNGs over a small keyspace, so that puts, deletes, txns
//! with compares, compactions, leases, membership and alarms (which change how later commands
//! apply) collide often; every assertion names the seed, and a failure replays exactly from
//! it.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use skerry_store::pb::command::{Command, Member, MemberAttributes, Membership, command};
use skerry_store::pb::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmType, CompactionRequest, Compare, DeleteRangeRequest,
    LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    TxnRequest, WatchCreateRequest, alarm_request::AlarmAction, compare, request_op,
};
use skerry_store::pb::mvccpb::{Event, KeyValue};
use skerry_store::replication::Committed;
use skerry_store::sync_store::{SyncApplied, SyncStore};
use skerry_store::watch::WatchOut;
use skerry_store::{CommandResult, Store, StoreConfig, StoreError};
use tokio::sync::{mpsc, oneshot};

/// Every wait on the real store is bounded, so that a bug fails the test instead of hanging.
const WAIT: Duration = Duration::from_secs(10);

/// How long the real store's watcher is listened to at the end for a stray event: several
/// of the syncer's 100 ms rounds.
const QUIET: Duration = Duration::from_millis(300);

const CLUSTER: u64 = 0xc1;

/// Seeds of the differential test; each runs [`DIFFERENTIAL_STEPS`] batches.
const DIFFERENTIAL_SEEDS: [u64; 3] = [11, 12, 13];

/// Batches per differential seed: long enough for several compactions, lease revocations
/// and membership changes to interleave (a few hundred revisions), short enough for a debug
/// build in seconds.
const DIFFERENTIAL_STEPS: usize = 250;

/// Entries in one batch at most. The real store groups what its writer finds queued, so it
/// sees these and smaller batches; the `SyncStore` applies each as one transaction.
const BATCH_ENTRIES_MAX: usize = 4;

/// The keyspace: small, so that commands on the same keys meet.
const KEYS: [&str; 8] = ["k/a", "k/b", "k/c", "k/d", "k/e", "k/f", "k/g", "k/h"];

/// Lease ids drawn from: small, so grants of an existing lease and revocations of a missing
/// one happen too.
const LEASE_IDS_MAX: i64 = 4;

/// Member ids drawn from for membership commands.
const MEMBER_IDS_MAX: u64 = 4;

/// Members named by alarm commands: two, so that alarms of several members overlap.
const ALARM_MEMBERS: [u64; 2] = [1, 2];

/// Entries applied one by one in the timing check.
const TIMING_ENTRIES: u64 = 10_000;

/// One committed log entry as the Raft layer hands it over: its index and its command.
type Entry = (u64, Option<Command>);

/// A range over every key, without the header: `(kvs, count, more)`.
type Contents = Result<(Vec<KeyValue>, i64, bool), StoreError>;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

// ---------------------------------------------------------------------------------------
// Random commands.

fn random_key(rng: &mut StdRng) -> Bytes {
    b(KEYS[rng.random_range(0..KEYS.len())])
}

/// A key range: one key, a span, or every key.
fn random_range_keys(rng: &mut StdRng) -> (Bytes, Bytes) {
    match rng.random_range(0..4) {
        0 => (b("k/"), b("k0")),
        1 => {
            let start = rng.random_range(0..KEYS.len());
            let end = rng.random_range(start..KEYS.len());
            (b(KEYS[start]), b(KEYS[end]))
        }
        _ => (random_key(rng), Bytes::new()),
    }
}

fn random_put(rng: &mut StdRng) -> PutRequest {
    let mut put = PutRequest {
        key: random_key(rng),
        value: Bytes::from(format!("v{}", rng.random_range(0..1_000))),
        prev_kv: rng.random_bool(0.3),
        ..Default::default()
    };
    if rng.random_bool(0.25) {
        put.lease = rng.random_range(1..=LEASE_IDS_MAX);
    }
    if rng.random_bool(0.05) {
        put.ignore_value = true;
        put.value = Bytes::new();
    }
    if rng.random_bool(0.05) {
        put.ignore_lease = true;
        put.lease = 0;
    }
    put
}

fn random_delete(rng: &mut StdRng) -> DeleteRangeRequest {
    let (key, range_end) = random_range_keys(rng);
    DeleteRangeRequest {
        key,
        range_end,
        prev_kv: rng.random_bool(0.4),
    }
}

/// A range request with random options, at a revision around `revision` (so sometimes a
/// compacted or future one).
fn random_range(rng: &mut StdRng, revision: i64) -> RangeRequest {
    let (key, range_end) = random_range_keys(rng);
    RangeRequest {
        key,
        range_end,
        limit: if rng.random_bool(0.3) {
            rng.random_range(1..4)
        } else {
            0
        },
        revision: if rng.random_bool(0.4) {
            rng.random_range(revision - 4..=revision + 1)
        } else {
            0
        },
        sort_order: rng.random_range(0..3),
        sort_target: rng.random_range(0..5),
        keys_only: rng.random_bool(0.1),
        count_only: rng.random_bool(0.1),
        min_mod_revision: if rng.random_bool(0.1) {
            revision - 3
        } else {
            0
        },
        ..Default::default()
    }
}

fn random_compare(rng: &mut StdRng, revision: i64) -> Compare {
    use compare::TargetUnion as U;
    let target = rng.random_range(0..5);
    let target_union = match target {
        0 => U::Version(rng.random_range(0..4)),
        1 => U::CreateRevision(rng.random_range(0..=revision)),
        2 => U::ModRevision(rng.random_range(0..=revision)),
        3 => U::Value(Bytes::from(format!("v{}", rng.random_range(0..1_000)))),
        _ => U::Lease(rng.random_range(0..=LEASE_IDS_MAX)),
    };
    let (key, range_end) = if rng.random_bool(0.2) {
        random_range_keys(rng)
    } else {
        (random_key(rng), Bytes::new())
    };
    Compare {
        result: rng.random_range(0..4),
        target,
        key,
        range_end,
        target_union: Some(target_union),
    }
}

fn random_op(rng: &mut StdRng, revision: i64, nested: bool) -> RequestOp {
    let request = match rng.random_range(0..10) {
        0..=3 => request_op::Request::RequestPut(random_put(rng)),
        4..=5 => request_op::Request::RequestDeleteRange(random_delete(rng)),
        6..=8 => request_op::Request::RequestRange(random_range(rng, revision)),
        _ if !nested => request_op::Request::RequestTxn(random_txn(rng, revision, true)),
        _ => request_op::Request::RequestRange(random_range(rng, revision)),
    };
    RequestOp {
        request: Some(request),
    }
}

fn random_txn(rng: &mut StdRng, revision: i64, nested: bool) -> TxnRequest {
    TxnRequest {
        compare: (0..rng.random_range(0..3))
            .map(|_| random_compare(rng, revision))
            .collect(),
        success: (0..rng.random_range(0..4))
            .map(|_| random_op(rng, revision, nested))
            .collect(),
        failure: (0..rng.random_range(0..3))
            .map(|_| random_op(rng, revision, nested))
            .collect(),
    }
}

fn random_member(rng: &mut StdRng) -> Member {
    let id = rng.random_range(1..=MEMBER_IDS_MAX);
    Member {
        id,
        name: if rng.random_bool(0.3) {
            format!("m{id}")
        } else {
            String::new()
        },
        client_urls: Vec::new(),
        peer_urls: if rng.random_bool(0.7) {
            vec![format!("http://p{id}:2380")]
        } else {
            Vec::new()
        },
        is_learner: rng.random_bool(0.4),
    }
}

/// One log entry's command, as a proposer would have sent it: requests pass the checks the
/// gRPC layer makes before proposing (`skerry_store::validate`); `None` is an entry without
/// a command (a new leader's empty entry). `revision` and `floor` are the store's before the
/// batch, to aim compactions and compares at revisions that exist.
fn random_command(rng: &mut StdRng, revision: i64, floor: i64) -> Option<Command> {
    let command = loop {
        let candidate = match rng.random_range(0..100) {
            0..=34 => command::Command::Put(random_put(rng)),
            35..=44 => command::Command::DeleteRange(random_delete(rng)),
            45..=64 => command::Command::Txn(random_txn(rng, revision, false)),
            65..=70 => command::Command::Compaction(CompactionRequest {
                // Mostly a revision it can compact to; now and then one at or below the
                // floor, or in the future.
                revision: rng.random_range(floor - 1..=revision + 1),
                physical: false,
            }),
            71..=79 => command::Command::LeaseGrant(LeaseGrantRequest {
                id: rng.random_range(1..=LEASE_IDS_MAX),
                ttl: rng.random_range(10..100),
            }),
            80..=85 => command::Command::LeaseRevoke(LeaseRevokeRequest {
                id: rng.random_range(1..=LEASE_IDS_MAX),
            }),
            86..=89 => command::Command::Membership(Membership {
                conf_state: Bytes::from(format!("conf-{}", rng.random_range(0..1_000))),
                upsert: (0..rng.random_range(0..3))
                    .map(|_| random_member(rng))
                    .collect(),
                removed: (0..rng.random_range(0..2))
                    .map(|_| rng.random_range(1..=MEMBER_IDS_MAX))
                    .collect(),
            }),
            90..=92 => {
                let id = rng.random_range(1..=MEMBER_IDS_MAX);
                command::Command::MemberAttributes(MemberAttributes {
                    id,
                    name: format!("n{id}-{}", rng.random_range(0..10)),
                    client_urls: vec![format!("http://c{id}:2379")],
                })
            }
            93..=96 => command::Command::Alarm(random_alarm(rng)),
            _ => return None,
        };
        let valid = match &candidate {
            command::Command::Put(put) => skerry_store::validate::put(put).is_ok(),
            command::Command::DeleteRange(delete) => {
                skerry_store::validate::delete_range(delete).is_ok()
            }
            command::Command::Txn(txn) => skerry_store::validate::txn(txn).is_ok(),
            _ => true,
        };
        if valid {
            break candidate;
        }
    };
    Some(Command {
        command: Some(command),
    })
}

/// An alarm request: mostly clearing, so that `NOSPACE` and `CORRUPT` are active now and
/// then, not most of the time (each refuses much of what follows); now and then of type
/// `NONE`, or an action etcd does not know.
fn random_alarm(rng: &mut StdRng) -> AlarmRequest {
    let action = match rng.random_range(0..100) {
        0..=4 => AlarmAction::Activate as i32,
        5..=89 => AlarmAction::Deactivate as i32,
        90..=97 => AlarmAction::Get as i32,
        _ => 7,
    };
    let alarm = match rng.random_range(0..20) {
        0 => AlarmType::None,
        1..=10 => AlarmType::Nospace,
        _ => AlarmType::Corrupt,
    };
    AlarmRequest {
        action,
        member_id: ALARM_MEMBERS[rng.random_range(0..ALARM_MEMBERS.len())],
        alarm: alarm as i32,
    }
}

/// Clears every alarm [`random_alarm`] can raise.
fn clear_alarms() -> Vec<Command> {
    let mut out = Vec::new();
    for member_id in ALARM_MEMBERS {
        for alarm in [AlarmType::None, AlarmType::Nospace, AlarmType::Corrupt] {
            out.push(Command {
                command: Some(command::Command::Alarm(AlarmRequest {
                    action: AlarmAction::Deactivate as i32,
                    member_id,
                    alarm: alarm as i32,
                })),
            });
        }
    }
    out
}

/// A batch of 1..=[`BATCH_ENTRIES_MAX`] entries numbered from `next_index`.
fn random_batch(rng: &mut StdRng, next_index: u64, revision: i64, floor: i64) -> Vec<Entry> {
    let len = rng.random_range(1..=BATCH_ENTRIES_MAX) as u64;
    (next_index..next_index + len)
        .map(|index| (index, random_command(rng, revision, floor)))
        .collect()
}

// ---------------------------------------------------------------------------------------
// The real store.

fn real_config(dir: &Path, member: u64) -> StoreConfig {
    StoreConfig {
        replicated: true,
        identity: Some((CLUSTER, member)),
        ..StoreConfig::new(dir)
    }
}

/// Applies `entries` to the real store through `apply_committed` and waits for every result.
fn apply_real(store: &Store, entries: &[Entry]) -> Vec<Result<CommandResult, StoreError>> {
    let mut replies = Vec::with_capacity(entries.len());
    let mut committed = Vec::with_capacity(entries.len());
    for (index, command) in entries {
        let (reply, rx) = oneshot::channel();
        committed.push(Committed {
            index: *index,
            command: command.clone(),
            reply: Some(reply),
        });
        replies.push(rx);
    }
    store.apply_committed(committed).expect("hand over entries");
    let deadline = Instant::now() + WAIT;
    replies
        .into_iter()
        .map(|mut rx| {
            loop {
                match rx.try_recv() {
                    Ok(result) => break result,
                    Err(oneshot::error::TryRecvError::Empty) => {
                        assert!(
                            Instant::now() < deadline,
                            "an entry was not applied in time"
                        );
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Err(oneshot::error::TryRecvError::Closed) => panic!("writer dropped a reply"),
                }
            }
        })
        .collect()
}

/// A watcher on every key of the real store from its next revision, with `prev_kv`.
fn watch_everything(store: &Store) -> (mpsc::Sender<WatchOut>, mpsc::Receiver<WatchOut>) {
    let (stream, tx, mut rx) = store.hub().open_stream();
    let permit = tx.try_reserve().expect("room for the created response");
    let req = WatchCreateRequest {
        key: b("\0"),
        range_end: b("\0"),
        prev_kv: true,
        ..Default::default()
    };
    store
        .hub()
        .create(stream, &req, permit)
        .expect("create watch");
    let created = rx.try_recv().expect("created response").response;
    assert!(created.created);
    (tx, rx)
}

/// The next `count` events the watcher gets.
fn receive_events(rx: &mut mpsc::Receiver<WatchOut>, count: usize) -> Vec<Event> {
    let deadline = Instant::now() + WAIT;
    let mut events = Vec::new();
    while events.len() < count {
        match rx.try_recv() {
            Ok(out) => {
                assert!(!out.response.canceled, "watch canceled: {:?}", out.response);
                events.extend(out.response.events);
            }
            Err(mpsc::error::TryRecvError::Empty) => {
                assert!(
                    Instant::now() < deadline,
                    "watch events did not come in time"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(mpsc::error::TryRecvError::Disconnected) => panic!("watch stream closed"),
        }
    }
    events
}

// ---------------------------------------------------------------------------------------
// Observing either store the same way.

/// What both stores answer, so that one observation compares them.
trait View {
    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, StoreError>;
    fn history(&self, from: i64, through: i64) -> Result<Vec<Event>, StoreError>;
    fn revision(&self) -> i64;
    fn compact_revision(&self) -> i64;
    fn applied_index(&self) -> u64;
    /// `(id, granted TTL, keys)` of every lease.
    fn leases(&self) -> Vec<(i64, i64, Vec<Bytes>)>;
    fn members(&self) -> Vec<Member>;
    fn conf_state(&self) -> Option<Vec<u8>>;
    fn alarms(&self) -> Vec<AlarmMember>;
}

impl View for Store {
    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, StoreError> {
        Store::range(self, req)
    }
    fn history(&self, from: i64, through: i64) -> Result<Vec<Event>, StoreError> {
        Store::history(self, from, through)
    }
    fn revision(&self) -> i64 {
        Store::revision(self)
    }
    fn compact_revision(&self) -> i64 {
        Store::compact_revision(self)
    }
    fn applied_index(&self) -> u64 {
        Store::applied_index(self)
    }
    fn leases(&self) -> Vec<(i64, i64, Vec<Bytes>)> {
        self.lease_ids()
            .into_iter()
            .map(|id| {
                let (_, granted, keys) = self.lease_time_to_live(id, true).expect("lease");
                (id, granted, keys)
            })
            .collect()
    }
    fn members(&self) -> Vec<Member> {
        Store::members(self).expect("members")
    }
    fn conf_state(&self) -> Option<Vec<u8>> {
        Store::conf_state(self).expect("conf state")
    }
    fn alarms(&self) -> Vec<AlarmMember> {
        Store::alarms(self)
    }
}

impl View for SyncStore {
    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, StoreError> {
        SyncStore::range(self, req)
    }
    fn history(&self, from: i64, through: i64) -> Result<Vec<Event>, StoreError> {
        SyncStore::history(self, from, through)
    }
    fn revision(&self) -> i64 {
        SyncStore::revision(self)
    }
    fn compact_revision(&self) -> i64 {
        SyncStore::compact_revision(self)
    }
    fn applied_index(&self) -> u64 {
        SyncStore::applied_index(self)
    }
    fn leases(&self) -> Vec<(i64, i64, Vec<Bytes>)> {
        self.lease_ids()
            .into_iter()
            .map(|id| {
                let (granted, keys) = self.lease(id).expect("lease");
                (id, granted, keys)
            })
            .collect()
    }
    fn members(&self) -> Vec<Member> {
        SyncStore::members(self).expect("members")
    }
    fn conf_state(&self) -> Option<Vec<u8>> {
        SyncStore::conf_state(self).expect("conf state")
    }
    fn alarms(&self) -> Vec<AlarmMember> {
        SyncStore::alarms(self)
    }
}

/// Every key at `revision` (0: the current one), without the header (which names the
/// member that answered).
fn everything(store: &impl View, revision: i64) -> Contents {
    store
        .range(&RangeRequest {
            key: b("\0"),
            range_end: b("\0"),
            revision,
            ..Default::default()
        })
        .map(|resp| (resp.kvs, resp.count, resp.more))
}

/// Everything a store is, short of its identity, as one comparable value: the keyspace at
/// every revision from just below the floor to just past the current one, the whole
/// retained history, leases, membership and alarms.
#[derive(Debug, PartialEq)]
struct Observed {
    applied_index: u64,
    revision: i64,
    compact_revision: i64,
    contents: Vec<(i64, Contents)>,
    history: Result<Vec<Event>, StoreError>,
    history_below_floor: Result<Vec<Event>, StoreError>,
    leases: Vec<(i64, i64, Vec<Bytes>)>,
    members: Vec<Member>,
    conf_state: Option<Vec<u8>>,
    alarms: Vec<AlarmMember>,
}

fn observe(store: &impl View) -> Observed {
    let revision = store.revision();
    let floor = store.compact_revision();
    Observed {
        applied_index: store.applied_index(),
        revision,
        compact_revision: floor,
        contents: (floor - 1..=revision + 1)
            .map(|at| (at, everything(store, at)))
            .collect(),
        history: store.history(floor.max(1), revision),
        history_below_floor: store.history(floor - 1, revision),
        leases: store.leases(),
        members: store.members(),
        conf_state: store.conf_state(),
        alarms: store.alarms(),
    }
}

/// Results compared as etcd's clients would see them; `CommandResult` has no `PartialEq`.
fn render(results: &[Result<CommandResult, StoreError>]) -> Vec<String> {
    results.iter().map(|r| format!("{r:?}")).collect()
}

fn apply_sync(store: &mut SyncStore, entries: &[Entry]) -> SyncApplied {
    store.apply(entries.to_vec()).expect("sync store applies")
}

/// Waits until the real store's physical compaction has caught up, which it runs between
/// batches: until its snapshot stream is byte-identical to `expected`.
fn settle_to_snapshot(store: &Store, expected: &[u8], seed: u64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut bytes = Vec::new();
        store
            .pin_snapshot()
            .expect("pin")
            .write(&mut bytes)
            .expect("write snapshot");
        if bytes == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: the real store's snapshot never became the sync store's"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------
// (1) Differential: the same entries give the same answers.

#[test]
fn the_sync_store_answers_as_the_real_store_does() {
    for seed in DIFFERENTIAL_SEEDS {
        differential(seed);
    }
}

fn differential(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let real = Store::open(real_config(dir.path(), 1)).expect("open real store");
    let (_watch_tx, mut watch_rx) = watch_everything(&real);
    let mut sync = SyncStore::new(CLUSTER, 1).expect("new sync store");
    let mut next = 1;
    let mut errors = 0;
    let mut alarmed_steps = 0;
    for step in 0..DIFFERENTIAL_STEPS {
        let mut batch = random_batch(&mut rng, next, sync.revision(), sync.compact_revision());
        // Besides the rare random ones, each alarm for a stretch of certain length.
        let raise = |alarm: AlarmType| {
            Some(Command {
                command: Some(command::Command::Alarm(AlarmRequest {
                    action: AlarmAction::Activate as i32,
                    member_id: ALARM_MEMBERS[0],
                    alarm: alarm as i32,
                })),
            })
        };
        let scheduled: Vec<Option<Command>> = match step {
            40 => vec![raise(AlarmType::Nospace)],
            100 => vec![raise(AlarmType::Corrupt)],
            60 | 120 => clear_alarms().into_iter().map(Some).collect(),
            _ => Vec::new(),
        };
        for command in scheduled {
            batch.push((next + batch.len() as u64, command));
        }
        next += batch.len() as u64;
        let expected = apply_real(&real, &batch);
        let applied = apply_sync(&mut sync, &batch);
        let at = format!("seed {seed}, step {step}, entries {batch:?}");
        assert_eq!(render(&applied.results), render(&expected), "{at}");
        assert_eq!(applied.first_index, batch[0].0, "{at}");
        errors += expected.iter().filter(|r| r.is_err()).count();
        assert_eq!(sync.alarms(), real.alarms(), "{at}");
        alarmed_steps += usize::from(!sync.alarms().is_empty());
        // The events are what the real store's watcher heard, prev_kv included.
        let heard = receive_events(&mut watch_rx, applied.events.len());
        assert_eq!(applied.events, heard, "{at}");
        assert_eq!(applied.revision, real.revision(), "{at}");
        assert_eq!(sync.revision(), real.revision(), "{at}");
        assert_eq!(sync.compact_revision(), real.compact_revision(), "{at}");
        assert_eq!(sync.applied_index(), real.applied_index(), "{at}");
        // One random read with random options, headers included (same member, term 0).
        let req = random_range(&mut rng, sync.revision());
        assert_eq!(sync.range(&req), real.range(&req), "{at}, range {req:?}");
        let from = rng.random_range(sync.compact_revision() - 1..=sync.revision() + 1);
        assert_eq!(
            sync.history(from, sync.revision()),
            real.history(from, real.revision()),
            "{at}, history from {from}"
        );
        if step % 25 == 0 {
            assert_eq!(observe(&sync), observe(&real), "{at}");
        }
    }
    // The mix exercised both sides of every command: results that failed as well as applied.
    assert!(errors > 0, "seed {seed}: no command failed");
    assert!(
        sync.compact_revision() > 0,
        "seed {seed}: nothing compacted"
    );
    assert!(!sync.members().expect("members").is_empty(), "seed {seed}");
    assert!(
        alarmed_steps > 0 && alarmed_steps < DIFFERENTIAL_STEPS / 2,
        "seed {seed}: alarms active after {alarmed_steps} of {DIFFERENTIAL_STEPS} steps"
    );
    assert_eq!(observe(&sync), observe(&real), "seed {seed}: at the end");
    // Once the real store's physical compaction has caught up, the two hold the same rows
    // to the byte: the same snapshot stream and the same hash.
    let snapshot = sync.snapshot().expect("snapshot");
    settle_to_snapshot(&real, &snapshot.bytes, seed);
    assert_eq!(
        sync.hash_kv(0).expect("hash"),
        real.hash_kv(0).expect("hash"),
        "seed {seed}"
    );
    std::thread::sleep(QUIET);
    assert!(watch_rx.try_recv().is_err(), "seed {seed}: a stray event");
    real.close();
}

// ---------------------------------------------------------------------------------------
// (2) Crash: back to the last checkpoint, and the log replays the rest.

/// Entries applied to a sync store, with what they gave.
#[derive(Default)]
struct Run {
    entries: Vec<Entry>,
    /// The results, rendered (see [`render`]).
    results: Vec<String>,
    events: Vec<Event>,
}

/// Applies about `count` random entries after the store's applied index in random batches.
fn run_random(rng: &mut StdRng, store: &mut SyncStore, count: usize) -> Run {
    let mut run = Run::default();
    while run.entries.len() < count {
        let batch = random_batch(
            rng,
            store.applied_index() + 1,
            store.revision(),
            store.compact_revision(),
        );
        let applied = apply_sync(store, &batch);
        run.results.extend(render(&applied.results));
        run.events.extend(applied.events);
        run.entries.extend(batch);
    }
    run
}

/// What [`observe`] sees, plus what only a `SyncStore` shows: its snapshot stream, hash and
/// durable index.
fn observe_sync(store: &SyncStore) -> (Observed, Vec<u8>, (u32, i64), u64) {
    (
        observe(store),
        store.snapshot().expect("snapshot").bytes,
        store.hash_kv(0).expect("hash"),
        store.durable_applied_index(),
    )
}

#[test]
fn a_crash_goes_back_to_the_checkpoint_and_the_log_replays_the_rest() {
    let seed = 21;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut store = SyncStore::new(CLUSTER, 1).expect("new");
    let mut log = run_random(&mut rng, &mut store, 150).entries;
    store.checkpoint().expect("checkpoint");
    let checkpoint_index = store.applied_index();
    let at_checkpoint = observe_sync(&store);
    assert_eq!(at_checkpoint.3, checkpoint_index);

    // After the checkpoint: random entries, then (alarms cleared, so that nothing is refused)
    // a compaction, a lease, a membership change and an alarm for certain, so that the
    // crash has to take each kind back.
    let Run {
        entries: lost,
        results: mut lost_results,
        events: mut lost_events,
    } = run_random(&mut rng, &mut store, 150);
    log.extend(lost);
    let mut tail = clear_alarms();
    tail.extend([
        Command {
            command: Some(command::Command::Compaction(CompactionRequest {
                revision: store.revision(),
                physical: false,
            })),
        },
        Command {
            command: Some(command::Command::LeaseGrant(LeaseGrantRequest {
                id: 99,
                ttl: 30,
            })),
        },
        Command {
            command: Some(command::Command::Put(PutRequest {
                key: b("k/leased"),
                value: b("1"),
                lease: 99,
                ..Default::default()
            })),
        },
        Command {
            command: Some(command::Command::Membership(Membership {
                conf_state: b("conf-after-checkpoint"),
                upsert: vec![Member {
                    id: 9,
                    peer_urls: vec!["http://p9:2380".into()],
                    ..Default::default()
                }],
                removed: vec![],
            })),
        },
        Command {
            command: Some(command::Command::Alarm(AlarmRequest {
                action: AlarmAction::Activate as i32,
                member_id: 9,
                alarm: AlarmType::Nospace as i32,
            })),
        },
    ]);
    let mut tail: Vec<Option<Command>> = tail.into_iter().map(Some).collect();
    tail.push(None);
    let first = store.applied_index() + 1;
    let tail: Vec<Entry> = (first..).zip(tail).collect();
    let applied = apply_sync(&mut store, &tail);
    assert!(
        applied.results[..applied.results.len() - 1]
            .iter()
            .all(Result::is_ok),
        "{:?}",
        applied.results
    );
    assert!(store.alarms().iter().any(|a| a.member_id == 9));
    lost_results.extend(render(&applied.results));
    lost_events.extend(applied.events);
    log.extend(tail);
    let before_crash = observe_sync(&store);
    assert_ne!(before_crash.0, at_checkpoint.0);
    assert_eq!(store.durable_applied_index(), checkpoint_index);

    store.crash().expect("crash");
    assert_eq!(
        observe_sync(&store),
        at_checkpoint,
        "seed {seed}: after the crash"
    );
    assert_eq!(store.applied_index(), checkpoint_index);
    // A second crash with nothing applied in between changes nothing.
    store.crash().expect("crash again");
    assert_eq!(
        observe_sync(&store),
        at_checkpoint,
        "seed {seed}: after two crashes"
    );

    // A gap is refused and changes nothing; it does not fail the store.
    let gap = vec![(checkpoint_index + 2, log[0].1.clone())];
    assert!(store.apply(gap).is_err());
    assert!(!store.is_failed());
    assert_eq!(observe_sync(&store), at_checkpoint);

    // The log re-delivers from its start in batches of its own size: what was applied is
    // skipped, and the rest gives what it gave the first time.
    let mut replayed_results = Vec::new();
    let mut replayed_events = Vec::new();
    for chunk in log.chunks(7) {
        let applied = apply_sync(&mut store, chunk);
        let skipped = chunk
            .iter()
            .filter(|(index, _)| *index < applied.first_index)
            .count();
        assert_eq!(applied.results.len(), chunk.len() - skipped);
        replayed_results.extend(render(&applied.results));
        replayed_events.extend(applied.events);
    }
    assert_eq!(
        replayed_results, lost_results,
        "seed {seed}: replayed results"
    );
    assert_eq!(replayed_events, lost_events, "seed {seed}: replayed events");
    let after_replay = observe_sync(&store);
    // Everything as before the crash but the durable index, which is still the checkpoint's.
    assert_eq!(after_replay.0, before_crash.0, "seed {seed}: after replay");
    assert_eq!(
        after_replay.1, before_crash.1,
        "seed {seed}: snapshot after replay"
    );
    assert_eq!(
        after_replay.2, before_crash.2,
        "seed {seed}: hash after replay"
    );
    assert_eq!(after_replay.3, checkpoint_index);
}

// ---------------------------------------------------------------------------------------
// (3) Snapshots between sync stores and real stores.

/// Observations of two stores whose physical compaction may lag compare equal once it is
/// done; the real store is polled for it, using `sync`'s stream as the goal when given.
fn assert_same(sync: &SyncStore, real: &Store, what: &str) {
    assert_eq!(observe(sync), observe(real), "{what}");
    assert_eq!(
        sync.installed_snapshot().expect("read"),
        real.installed_snapshot().expect("read"),
        "{what}"
    );
}

#[test]
fn snapshots_install_between_sync_stores_and_real_stores() {
    let seed = 31;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut a = SyncStore::new(CLUSTER, 1).expect("new");
    run_random(&mut rng, &mut a, 200);
    // An active alarm, which the snapshot must carry (every observation compares alarms).
    let raise = Command {
        command: Some(command::Command::Alarm(AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: 3,
            alarm: AlarmType::Nospace as i32,
        })),
    };
    let next = a.applied_index() + 1;
    apply_sync(&mut a, &[(next, Some(raise))]);
    assert!(!a.alarms().is_empty());
    let snapshot = a.snapshot().expect("snapshot");
    assert_eq!(snapshot.applied_index, a.applied_index());
    assert_eq!(snapshot.revision, a.revision());
    assert_eq!(snapshot.conf_state, a.conf_state().expect("conf state"));

    // Into another sync store with a shorter history of its own, which the install replaces.
    let mut b_store = SyncStore::new(CLUSTER, 2).expect("new");
    run_random(&mut rng, &mut b_store, 20);
    let before = observe_sync(&b_store);
    // A stale or corrupt snapshot is refused and changes nothing.
    assert!(b_store.install(&snapshot.bytes, 1, 7).is_err(), "stale");
    let mut corrupt = snapshot.bytes.clone();
    corrupt[40] ^= 1;
    assert!(
        b_store
            .install(&corrupt, snapshot.applied_index, 7)
            .is_err()
    );
    assert!(
        b_store
            .install(
                &snapshot.bytes[..snapshot.bytes.len() - 1],
                snapshot.applied_index,
                7
            )
            .is_err()
    );
    assert!(!b_store.is_failed());
    assert_eq!(observe_sync(&b_store), before);
    b_store
        .install(&snapshot.bytes, snapshot.applied_index, 7)
        .expect("install");
    assert_eq!(observe(&b_store), observe(&a), "sync into sync");
    assert_eq!((b_store.cluster_id(), b_store.member_id()), (CLUSTER, 2));
    assert_eq!(b_store.applied_index(), snapshot.applied_index);
    assert_eq!(b_store.durable_applied_index(), snapshot.applied_index);
    assert_eq!(
        b_store.installed_snapshot().expect("read"),
        Some((snapshot.applied_index, 7))
    );
    // The install is a checkpoint: a crash right after keeps it.
    b_store.crash().expect("crash");
    assert_eq!(
        observe(&b_store),
        observe(&a),
        "sync into sync, after a crash"
    );
    assert_eq!(
        b_store.installed_snapshot().expect("read"),
        Some((snapshot.applied_index, 7))
    );

    // Into a real store, through a file.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("from-sync.snap");
    std::fs::write(&path, &snapshot.bytes).expect("write snapshot file");
    let real_dir = tempfile::tempdir().expect("tempdir");
    let real = Store::open(real_config(real_dir.path(), 3)).expect("open real store");
    apply_real(&real, &[(1, None), (2, None)]);
    real.install_snapshot(&path, snapshot.applied_index, 7)
        .expect("install into the real store");
    assert_eq!(observe(&real), observe(&a), "sync into real");

    // The three go on with the same entries, and stay equal.
    let more = {
        let mut entries = Vec::new();
        let mut index = a.applied_index() + 1;
        while entries.len() < 60 {
            let batch = random_batch(&mut rng, index, a.revision(), a.compact_revision());
            index += batch.len() as u64;
            let applied = apply_sync(&mut a, &batch);
            let on_b = apply_sync(&mut b_store, &batch);
            let on_real = apply_real(&real, &batch);
            assert_eq!(render(&on_b.results), render(&applied.results));
            assert_eq!(render(&on_real), render(&applied.results));
            assert_eq!(on_b.events, applied.events);
            entries.extend(batch);
        }
        entries
    };
    assert!(!more.is_empty());
    assert_eq!(observe(&b_store), observe(&a), "sync into sync, after more");
    assert_same(&b_store, &real, "sync into real, after more");

    // A real store's pinned snapshot into a sync store, from a history made on the real one.
    let source_dir = tempfile::tempdir().expect("tempdir");
    let source = Store::open(real_config(source_dir.path(), 4)).expect("open real store");
    let mut index = 1;
    for _ in 0..60 {
        let batch = random_batch(
            &mut rng,
            index,
            source.revision(),
            source.compact_revision(),
        );
        index += batch.len() as u64;
        apply_real(&source, &batch);
    }
    let pinned = source.pin_snapshot().expect("pin");
    let mut bytes = Vec::new();
    pinned.write(&mut bytes).expect("write snapshot");
    let mut c = SyncStore::new(CLUSTER, 5).expect("new");
    c.install(&bytes, pinned.applied_index, 9)
        .expect("install a real store's snapshot");
    drop(pinned);
    assert_eq!(observe(&c), observe(&source), "real into sync");
    for _ in 0..30 {
        let batch = random_batch(&mut rng, index, c.revision(), c.compact_revision());
        index += batch.len() as u64;
        let on_source = apply_real(&source, &batch);
        let on_c = apply_sync(&mut c, &batch);
        assert_eq!(render(&on_c.results), render(&on_source));
    }
    assert_eq!(observe(&c), observe(&source), "real into sync, after more");
    real.close();
    source.close();
}

// ---------------------------------------------------------------------------------------
// (4) Determinism.

/// One seeded schedule of batches, checkpoints and crashes; returns every result rendered,
/// and the store.
fn scheduled_run(seed: u64, member: u64) -> (Vec<String>, SyncStore) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut store = SyncStore::new(CLUSTER, member).expect("new");
    let mut log: Vec<Entry> = Vec::new();
    let mut out = Vec::new();
    for _ in 0..150 {
        match rng.random_range(0..20) {
            0 => store.checkpoint().expect("checkpoint"),
            1 => {
                store.crash().expect("crash");
                // The log re-delivers what the crash took back.
                let lost: Vec<_> = log
                    .iter()
                    .filter(|(index, _)| *index > store.applied_index())
                    .cloned()
                    .collect();
                out.extend(render(&apply_sync(&mut store, &lost).results));
            }
            _ => {
                let batch = random_batch(
                    &mut rng,
                    store.applied_index() + 1,
                    store.revision(),
                    store.compact_revision(),
                );
                let applied = apply_sync(&mut store, &batch);
                out.extend(render(&applied.results));
                out.extend(applied.events.iter().map(|e| format!("{e:?}")));
                log.extend(batch);
            }
        }
    }
    (out, store)
}

#[test]
fn the_same_inputs_give_byte_identical_snapshots() {
    for seed in [41, 42] {
        let (out_1, one) = scheduled_run(seed, 1);
        let (out_2, two) = scheduled_run(seed, 1);
        assert_eq!(out_1, out_2, "seed {seed}");
        let snapshot_1 = one.snapshot().expect("snapshot");
        let snapshot_2 = two.snapshot().expect("snapshot");
        assert_eq!(snapshot_1, snapshot_2, "seed {seed}");
        assert_eq!(one.hash_kv(0), two.hash_kv(0), "seed {seed}");
        // The stream leaves out who the member is, so another member with the same log
        // writes the same bytes too.
        let (out_3, three) = scheduled_run(seed, 3);
        assert_eq!(out_1, out_3, "seed {seed}");
        assert_eq!(
            three.snapshot().expect("snapshot"),
            snapshot_1,
            "seed {seed}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Cost, for the simulation that runs thousands of seeds.

#[test]
fn ten_thousand_single_put_entries_apply_quickly() {
    let mut store = SyncStore::new(CLUSTER, 1).expect("new");
    let start = Instant::now();
    for index in 1..=TIMING_ENTRIES {
        let put = Command {
            command: Some(command::Command::Put(PutRequest {
                key: Bytes::from(format!("k/{}", index % 1_000)),
                value: b("value"),
                ..Default::default()
            })),
        };
        store.apply(vec![(index, Some(put))]).expect("apply");
    }
    let elapsed = start.elapsed();
    let start = Instant::now();
    store.checkpoint().expect("checkpoint");
    let checkpoint = start.elapsed();
    let start = Instant::now();
    store.crash().expect("crash");
    let crash = start.elapsed();
    eprintln!(
        "{TIMING_ENTRIES} single-put entries: {elapsed:?} ({:?} each); checkpoint of 1,000 keys \
         with 10,000 revisions: {checkpoint:?}; crash: {crash:?}",
        elapsed / TIMING_ENTRIES as u32
    );
    assert_eq!(store.revision(), 1 + TIMING_ENTRIES as i64);
    // A loose bound that catches an order-of-magnitude regression without failing on a busy
    // machine: debug builds compile redb without optimisation, which dominates.
    let bound = if cfg!(debug_assertions) {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(5)
    };
    assert!(elapsed < bound, "{TIMING_ENTRIES} entries took {elapsed:?}");
}
