//! The workload clients and the watchers, recording what they asked and what came back in the
//! checkers' types.
//!
//! A client runs one op at a time (get, put, delete, CAS txn, or a range over the current key
//! generation), each write with a value no other write uses, against one member; when the
//! member fails it, the client switches to the next one. How an op ended follows
//! `check::history`: an answer is `Ok`; an error the server returns only when nothing happened
//! (no leader, learner, connection refused) is `Failed`; a timeout or any other error is
//! `Unknown` for a write (it may still be applied) and `Failed` for a read (a read changes
//! nothing).
//!
//! A watcher watches the whole key prefix with progress notifications and no `prev_kv`, and on
//! any stream failure (and now and then on purpose) resumes on another member from the
//! revision after the last it saw, recording `WatchItem::Resumed`. Cut off by a compaction
//! (the compactor's, see `compactor`), it records `WatchItem::Compacted` with the time it
//! arrived and resumes from the compact revision on the same member, as an informer relists.
//!
//! Invariant: keys rotate to a fresh generation every `KeySpace::generation_period`, so every
//! key starts absent and sees a bounded number of ops, which keeps the linearizability search
//! (exponential in the worst case in the ops per key) tractable.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use skerry_store::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::request_op::Request;
use skerry_store::pb::etcdserverpb::watch_client::WatchClient;
use skerry_store::pb::etcdserverpb::watch_request::RequestUnion;
use skerry_store::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, ResponseHeader, TxnRequest,
    WatchCreateRequest, WatchRequest,
};
use skerry_store::pb::mvccpb::event::EventType;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep, timeout};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, warn};

use super::Clock;
use crate::check::{
    Answer, Call, EventKind, Expect, KeyValue, Op, Outcome, Versioned, WatchItem, WatchLog,
};

/// Bound on opening a TCP connection to a member. A member on this machine answers a SYN in
/// microseconds; one that does not within this is frozen, dead or cut off.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Pause after an op that did not succeed, before the next. Without it a client facing a dead
/// member records thousands of refused ops a second, which bloat the history and teach the
/// checkers nothing. A tenth of an election timeout.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// A watch stream with no message for this long is taken for dead (a frozen member or a lost
/// connection) and resumed elsewhere. Progress notifications come every second
/// (`PROGRESS_NOTIFY_INTERVAL`), so a live stream is never this quiet.
const WATCH_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Bound on opening a watch stream.
const WATCH_OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// Watchers drop their stream on purpose after a random time in this range and resume on
/// another member, so resumes are exercised in every run, not only under faults.
const VOLUNTARY_RESUME_SECS: std::ops::Range<u64> = 5..15;

/// Pause between a watcher's attempts after a failure, so a dead member is not hammered.
const WATCH_RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Requests a watcher can queue on its stream: only the create request is ever sent.
const WATCH_REQUESTS_MAX: usize = 4;

/// How often `wait_watchers` polls the watchers' progress.
const WATCH_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Percent of ops of each kind, cumulative: gets 25, puts 20, deletes 10, CAS 30, ranges 15.
/// CAS dominates because a compare is what catches a stale or lost write; deletes are rarer so
/// keys spend most of their time present and reads see values. Semi-arbitrary.
const GET_PERCENT_END: u32 = 25;
const PUT_PERCENT_END: u32 = 45;
const DELETE_PERCENT_END: u32 = 55;
const CAS_PERCENT_END: u32 = 85;

/// The keys the clients use: `<prefix>g<generation>/k<index>`, a fresh generation every
/// `generation_period`.
#[derive(Debug, Clone)]
pub struct KeySpace {
    pub prefix: String,
    /// Keys written concurrently. Fewer means more contention per key (more interesting
    /// interleavings, a costlier search); more spreads ops thin.
    pub keys_per_generation: usize,
    /// How long clients stay on one generation of keys; bounds the ops per key.
    pub generation_period: Duration,
}

impl Default for KeySpace {
    fn default() -> Self {
        KeySpace {
            prefix: "torture/".into(),
            keys_per_generation: 5,
            generation_period: Duration::from_secs(10),
        }
    }
}

impl KeySpace {
    /// The generation in use `elapsed_ns` after the run started.
    pub fn generation(&self, elapsed_ns: u64) -> u64 {
        let period = u64::try_from(self.generation_period.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        elapsed_ns / period
    }

    fn generation_prefix(&self, generation: u64) -> String {
        format!("{}g{generation:04}/", self.prefix)
    }

    pub fn key(&self, generation: u64, index: usize) -> Vec<u8> {
        format!("{}k{index}", self.generation_prefix(generation)).into_bytes()
    }

    /// The etcd range `[start, end)` of one generation's keys.
    pub fn generation_range(&self, generation: u64) -> (Vec<u8>, Vec<u8>) {
        let start = self.generation_prefix(generation).into_bytes();
        let end = prefix_end(&start);
        (start, end)
    }

    /// The etcd range of every key the clients use.
    pub fn range(&self) -> (Vec<u8>, Vec<u8>) {
        let start = self.prefix.clone().into_bytes();
        let end = prefix_end(&start);
        (start, end)
    }
}

/// The end of the etcd range holding every key that starts with `prefix` (etcd's
/// `GetPrefixRangeEnd`): the prefix with its last byte below 0xff incremented, or `"\0"`
/// (everything) when there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A channel to `url` that connects on first use and reconnects after failures.
pub fn lazy_channel(url: &str) -> Result<Channel> {
    Ok(Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("parse endpoint {url}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy())
}

/// What one client needs.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    pub id: u64,
    /// Every member's client URL.
    pub endpoints: Vec<String>,
    pub clock: Clock,
    pub op_timeout: Duration,
    pub seed: u64,
    pub keys: KeySpace,
    /// Hands out op ids unique across clients.
    pub ids: Arc<AtomicU64>,
}

/// What a client recorded: its ops, and for each the member it was sent to (for the report;
/// the checkers do not need it).
#[derive(Debug, Default)]
pub struct ClientRecord {
    pub ops: Vec<Op>,
    pub members: Vec<usize>,
}

/// Runs one client until `stop` turns true (finishing the op in flight); returns its ops.
pub async fn run_client(spec: ClientSpec, stop: watch::Receiver<bool>) -> ClientRecord {
    let mut record = ClientRecord::default();
    let channels: Vec<Channel> = match spec.endpoints.iter().map(|url| lazy_channel(url)).collect()
    {
        Ok(channels) => channels,
        Err(e) => {
            warn!(client = spec.id, "failed to set up channels: {e:#}");
            return record;
        }
    };
    if channels.is_empty() {
        return record;
    }
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut current = usize::try_from(spec.id).unwrap_or(0) % channels.len();
    let mut known: HashMap<Vec<u8>, Option<Versioned>> = HashMap::new();
    let mut sequence = 0u64;
    while !*stop.borrow() {
        let generation = spec.keys.generation(spec.clock.now_ns());
        sequence += 1;
        let value = format!("c{}-{sequence}", spec.id).into_bytes();
        let call = choose_call(&mut rng, &spec.keys, generation, value, &known);
        let id = spec.ids.fetch_add(1, Ordering::Relaxed);
        let invoke = spec.clock.now_ns();
        let answered = timeout(spec.op_timeout, execute(&channels[current], &call)).await;
        let now = spec.clock.now_ns();
        let (result, complete) = match answered {
            Ok(Ok(answer)) => (Outcome::Ok(answer), Some(now)),
            Ok(Err(status)) => {
                debug!(client = spec.id, member = current, code = ?status.code(), message = status.message(), "op failed");
                match classify(&status, call.is_write()) {
                    Outcome::Unknown => (Outcome::Unknown, None),
                    other => (other, Some(now)),
                }
            }
            Err(_) if call.is_write() => (Outcome::Unknown, None),
            Err(_) => (Outcome::Failed, Some(now)),
        };
        let failed = !matches!(result, Outcome::Ok(_));
        if let Outcome::Ok(answer) = &result {
            learn(&mut known, &spec.keys, generation, &call, answer);
        }
        record.ops.push(Op {
            id,
            client: spec.id,
            call,
            invoke,
            complete,
            result,
        });
        record.members.push(current);
        if failed {
            current = (current + 1) % channels.len();
            sleep(ERROR_BACKOFF).await;
        }
    }
    record
}

/// Picks the next call on one of `generation`'s keys. A CAS expects what this client last saw
/// of the key, so it often succeeds and sometimes races another client.
fn choose_call(
    rng: &mut StdRng,
    keys: &KeySpace,
    generation: u64,
    value: Vec<u8>,
    known: &HashMap<Vec<u8>, Option<Versioned>>,
) -> Call {
    let key = keys.key(generation, rng.random_range(0..keys.keys_per_generation));
    match rng.random_range(0..100) {
        0..GET_PERCENT_END => Call::Get { key },
        GET_PERCENT_END..PUT_PERCENT_END => Call::Put { key, value },
        PUT_PERCENT_END..DELETE_PERCENT_END => Call::Delete { key },
        DELETE_PERCENT_END..CAS_PERCENT_END => {
            let expect = match known.get(&key) {
                Some(Some(seen)) => match rng.random_range(0..10) {
                    0..5 => Expect::ModRevision(seen.mod_revision),
                    5..8 => Expect::Value(seen.value.clone()),
                    _ => Expect::Absent,
                },
                Some(None) if rng.random_bool(0.5) => Expect::ModRevision(0),
                _ => Expect::Absent,
            };
            Call::Cas { key, expect, value }
        }
        _ => {
            let (start, end) = keys.generation_range(generation);
            Call::Range { start, end }
        }
    }
}

/// Remembers what an acknowledged op showed of its keys, for later CAS compares.
fn learn(
    known: &mut HashMap<Vec<u8>, Option<Versioned>>,
    keys: &KeySpace,
    generation: u64,
    call: &Call,
    answer: &Answer,
) {
    match (call, answer) {
        (Call::Get { key }, Answer::Get { kv, .. }) => {
            known.insert(key.clone(), kv.clone());
        }
        (Call::Put { key, value }, Answer::Put { revision })
        | (
            Call::Cas { key, value, .. },
            Answer::Cas {
                revision,
                succeeded: true,
            },
        ) => {
            let seen = Versioned {
                value: value.clone(),
                mod_revision: *revision,
            };
            known.insert(key.clone(), Some(seen));
        }
        (Call::Delete { key }, Answer::Delete { .. }) => {
            known.insert(key.clone(), None);
        }
        (Call::Range { .. }, Answer::Range { kvs, .. }) => {
            for index in 0..keys.keys_per_generation {
                known.insert(keys.key(generation, index), None);
            }
            for kv in kvs {
                let seen = Versioned {
                    value: kv.value.clone(),
                    mod_revision: kv.mod_revision,
                };
                known.insert(kv.key.clone(), Some(seen));
            }
        }
        _ => {}
    }
    // Forget keys of older generations: they are never used again.
    let current = keys.generation_prefix(generation).into_bytes();
    known.retain(|key, _| key.starts_with(&current));
}

/// The response header's revision, or an error a server must never cause.
fn header_revision(header: Option<ResponseHeader>) -> Result<i64, Status> {
    header
        .map(|header| header.revision)
        .ok_or_else(|| Status::internal("torture: response without a header"))
}

/// Sends `call` to the member behind `channel` and converts the answer.
async fn execute(channel: &Channel, call: &Call) -> Result<Answer, Status> {
    let mut kv = KvClient::new(channel.clone());
    match call {
        Call::Get { key } => {
            let response = kv
                .range(RangeRequest {
                    key: key.clone().into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            Ok(Answer::Get {
                revision: header_revision(response.header)?,
                kv: response.kvs.first().map(|kv| Versioned {
                    value: kv.value.to_vec(),
                    mod_revision: kv.mod_revision,
                }),
            })
        }
        Call::Put { key, value } => {
            let response = kv
                .put(PutRequest {
                    key: key.clone().into(),
                    value: value.clone().into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            Ok(Answer::Put {
                revision: header_revision(response.header)?,
            })
        }
        Call::Delete { key } => {
            let response = kv
                .delete_range(DeleteRangeRequest {
                    key: key.clone().into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            Ok(Answer::Delete {
                revision: header_revision(response.header)?,
                deleted: response.deleted,
            })
        }
        Call::Cas { key, expect, value } => {
            let (target, union) = match expect {
                Expect::ModRevision(revision) => {
                    (CompareTarget::Mod, TargetUnion::ModRevision(*revision))
                }
                Expect::Value(expected) => (
                    CompareTarget::Value,
                    TargetUnion::Value(expected.clone().into()),
                ),
                Expect::Absent => (CompareTarget::Create, TargetUnion::CreateRevision(0)),
            };
            let response = kv
                .txn(TxnRequest {
                    compare: vec![Compare {
                        result: CompareResult::Equal as i32,
                        target: target as i32,
                        key: key.clone().into(),
                        target_union: Some(union),
                        ..Default::default()
                    }],
                    success: vec![RequestOp {
                        request: Some(Request::RequestPut(PutRequest {
                            key: key.clone().into(),
                            value: value.clone().into(),
                            ..Default::default()
                        })),
                    }],
                    failure: Vec::new(),
                })
                .await?
                .into_inner();
            Ok(Answer::Cas {
                revision: header_revision(response.header)?,
                succeeded: response.succeeded,
            })
        }
        Call::Range { start, end } => {
            let response = kv
                .range(RangeRequest {
                    key: start.clone().into(),
                    range_end: end.clone().into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            Ok(Answer::Range {
                revision: header_revision(response.header)?,
                kvs: response
                    .kvs
                    .iter()
                    .map(|kv| KeyValue {
                        key: kv.key.to_vec(),
                        value: kv.value.to_vec(),
                        mod_revision: kv.mod_revision,
                    })
                    .collect(),
            })
        }
    }
}

/// Error texts etcd (and skerry, which copies them) return only for a request that was never
/// proposed: there is no leader to propose to, Raft dropped the proposal, the server is
/// overloaded, or the member is a learner, which serves no client requests in etcd 3.4.
const NOT_PROPOSED_ERRORS: [&str; 5] = [
    "etcdserver: no leader",
    "raft proposal dropped",
    "etcdserver: too many requests",
    "etcdserver: rpc not supported for learner",
    "etcdserver: not capable",
];

/// How an op that returned `status` ended: `Failed` when nothing can have happened, else
/// `Unknown` for a write and `Failed` for a read.
pub fn classify(status: &Status, is_write: bool) -> Outcome {
    if !is_write || never_sent(status) {
        return Outcome::Failed;
    }
    let message = status.message();
    if NOT_PROPOSED_ERRORS
        .iter()
        .any(|known| message.contains(known))
    {
        Outcome::Failed
    } else {
        Outcome::Unknown
    }
}

/// Whether the request never left this process: the connection to the member could not be
/// opened (refused, or timed out connecting).
fn never_sent(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// What one watcher needs.
#[derive(Debug, Clone)]
pub struct WatcherSpec {
    pub id: u64,
    pub endpoints: Vec<String>,
    pub keys: KeySpace,
    pub seed: u64,
    /// How long after the run starts the watcher starts.
    pub start_delay: Duration,
    /// The highest revision the watcher knows it has seen everything up to (its last event or
    /// progress notification), for `wait_watchers`.
    pub seen: Arc<AtomicI64>,
    /// Stamps compacted errors, which the checker compares with the compactions' times.
    pub clock: Clock,
}

/// Where a watcher starts, by its id: the first watches from revision 1 (everything), the
/// second from "now" (0), the third from a revision a little before the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatchStart {
    Beginning,
    Now,
    Recent,
}

/// How far below the current revision a `WatchStart::Recent` watcher starts, so its first
/// events come from history rather than live. Semi-arbitrary.
const RECENT_START_BACK: i64 = 20;

/// How one watch stream ended.
enum StreamEnd {
    Stopped,
    Failed,
    Voluntary,
    Compacted(i64),
}

/// What a watcher recorded: its log, and where each stream began (the index of its first
/// item in the log, and the member), for the report.
#[derive(Debug)]
pub struct WatcherRecord {
    pub log: WatchLog,
    pub segments: Vec<(usize, usize)>,
}

/// Runs one watcher until `stop` turns true; returns its log.
pub async fn run_watcher(spec: WatcherSpec, stop: watch::Receiver<bool>) -> WatcherRecord {
    let (range_start, range_end) = spec.keys.range();
    let mut record = WatcherRecord {
        log: WatchLog {
            watcher: spec.id,
            range: (range_start, range_end),
            start_revision: 0,
            items: Vec::new(),
        },
        segments: Vec::new(),
    };
    watch_loop(&spec, stop, &mut record).await;
    record
}

async fn watch_loop(
    spec: &WatcherSpec,
    mut stop: watch::Receiver<bool>,
    record: &mut WatcherRecord,
) {
    let channels: Vec<Channel> = match spec.endpoints.iter().map(|url| lazy_channel(url)).collect()
    {
        Ok(channels) => channels,
        Err(e) => {
            warn!(watcher = spec.id, "failed to set up channels: {e:#}");
            return;
        }
    };
    if channels.is_empty() {
        return;
    }
    tokio::select! {
        _ = sleep(spec.start_delay) => {}
        _ = stop.wait_for(|stopped| *stopped) => return,
    }
    let log = &mut record.log;
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut current = usize::try_from(spec.id).unwrap_or(0) % channels.len();
    let start = match spec.id % 3 {
        0 => WatchStart::Beginning,
        1 => WatchStart::Now,
        _ => WatchStart::Recent,
    };
    log.start_revision = match start {
        WatchStart::Beginning => 1,
        WatchStart::Now => 0,
        WatchStart::Recent => current_revision(&channels[current])
            .await
            .map_or(0, |revision| (revision - RECENT_START_BACK).max(1)),
    };
    // The revision to (re)start from: 0 means "from now", until something was seen.
    let mut next = log.start_revision;
    let mut first = true;
    loop {
        if *stop.borrow() {
            break;
        }
        if !first {
            log.items.push(WatchItem::Resumed {
                from_revision: next,
            });
        }
        first = false;
        record.segments.push((log.items.len(), current));
        let resume_after = Duration::from_secs(rng.random_range(VOLUNTARY_RESUME_SECS));
        let end = watch_stream(
            &channels[current],
            log,
            &mut next,
            &spec.seen,
            spec.clock,
            &mut stop,
            Instant::now() + resume_after,
        )
        .await;
        match end {
            StreamEnd::Stopped => break,
            StreamEnd::Failed => {
                current = (current + 1) % channels.len();
                sleep(WATCH_RETRY_BACKOFF).await;
            }
            StreamEnd::Voluntary => {
                current = (current + rng.random_range(1..channels.len().max(2))) % channels.len();
            }
            StreamEnd::Compacted(compact_revision) => next = compact_revision,
        }
    }
}

/// One watch stream from `next`: records what arrives into `log` and advances `next` past
/// it, until the stream fails, `resume_at` passes, or `stop` turns true.
async fn watch_stream(
    channel: &Channel,
    log: &mut WatchLog,
    next: &mut i64,
    seen: &AtomicI64,
    clock: Clock,
    stop: &mut watch::Receiver<bool>,
    resume_at: Instant,
) -> StreamEnd {
    let (requests, requests_rx) = mpsc::channel(WATCH_REQUESTS_MAX);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: log.range.0.clone().into(),
            range_end: log.range.1.clone().into(),
            start_revision: *next,
            progress_notify: true,
            ..Default::default()
        })),
    };
    if requests.send(create).await.is_err() {
        return StreamEnd::Failed;
    }
    let mut client = WatchClient::new(channel.clone());
    let opened = timeout(
        WATCH_OPEN_TIMEOUT,
        client.watch(ReceiverStream::new(requests_rx)),
    )
    .await;
    let mut stream = match opened {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => {
            debug!(
                watcher = log.watcher,
                message = status.message(),
                "watch open failed"
            );
            return StreamEnd::Failed;
        }
        Err(_) => return StreamEnd::Failed,
    };
    loop {
        let message = tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => return StreamEnd::Stopped,
            _ = tokio::time::sleep_until(resume_at) => return StreamEnd::Voluntary,
            message = timeout(WATCH_IDLE_TIMEOUT, stream.message()) => message,
        };
        let response = match message {
            Ok(Ok(Some(response))) => response,
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return StreamEnd::Failed,
        };
        if response.canceled {
            if response.compact_revision > 0 {
                log.items.push(WatchItem::Compacted {
                    compact_revision: response.compact_revision,
                    received: clock.now_ns(),
                });
                return StreamEnd::Compacted(response.compact_revision);
            }
            debug!(watcher = log.watcher, reason = %response.cancel_reason, "watch cancelled");
            return StreamEnd::Failed;
        }
        if response.created {
            // Its header revision is the store's when the watch was created, not a claim
            // that everything up to it was delivered: not a progress notification.
            continue;
        }
        if response.events.is_empty() {
            let Some(header) = response.header else {
                continue;
            };
            log.items.push(WatchItem::Progress {
                revision: header.revision,
            });
            advance(next, seen, header.revision);
            continue;
        }
        for event in &response.events {
            let Some(kv) = &event.kv else {
                continue;
            };
            let kind = if event.r#type == EventType::Delete as i32 {
                EventKind::Delete
            } else {
                EventKind::Put
            };
            log.items.push(WatchItem::Event {
                revision: kv.mod_revision,
                key: kv.key.to_vec(),
                kind,
                value: kv.value.to_vec(),
            });
            advance(next, seen, kv.mod_revision);
        }
    }
}

/// Records that everything up to `revision` was seen.
fn advance(next: &mut i64, seen: &AtomicI64, revision: i64) {
    *next = (*next).max(revision.saturating_add(1));
    seen.fetch_max(revision, Ordering::Relaxed);
}

/// The store's current revision as one member sees it (a serializable read: any answer will
/// do for choosing where to start watching).
async fn current_revision(channel: &Channel) -> Option<i64> {
    let request = RangeRequest {
        key: "torture-revision-probe".into(),
        serializable: true,
        ..Default::default()
    };
    let response = timeout(
        WATCH_OPEN_TIMEOUT,
        KvClient::new(channel.clone()).range(request),
    )
    .await
    .ok()?
    .ok()?;
    response.into_inner().header.map(|header| header.revision)
}

/// Waits until every watcher has seen everything up to `revision`, or `limit` passes.
pub async fn wait_watchers(seen: &[Arc<AtomicI64>], revision: i64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if seen
            .iter()
            .all(|seen| seen.load(Ordering::Relaxed) >= revision)
        {
            return;
        }
        sleep(WATCH_POLL_INTERVAL).await;
    }
    let behind: Vec<i64> = seen.iter().map(|s| s.load(Ordering::Relaxed)).collect();
    warn!(
        revision,
        ?behind,
        "watchers did not reach the final revision in time"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_generations_rotate_and_ranges_cover_them() {
        let keys = KeySpace::default();
        assert_eq!(keys.generation(0), 0);
        assert_eq!(keys.generation(10_000_000_000), 1);
        assert_eq!(keys.key(3, 2), b"torture/g0003/k2".to_vec());
        let (start, end) = keys.generation_range(3);
        assert_eq!(start, b"torture/g0003/".to_vec());
        assert_eq!(end, b"torture/g00030".to_vec());
        let key = keys.key(3, 4);
        assert!(crate::check::range_contains(&start, &end, &key));
        assert!(!crate::check::range_contains(&start, &end, &keys.key(4, 0)));
        let (all_start, all_end) = keys.range();
        assert!(crate::check::range_contains(&all_start, &all_end, &key));
    }

    #[test]
    fn prefix_end_follows_etcd() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn errors_that_mean_nothing_happened_fail_writes() {
        let no_leader = Status::unavailable("etcdserver: no leader");
        assert_eq!(classify(&no_leader, true), Outcome::Failed);
        let timed_out = Status::unavailable("etcdserver: request timed out");
        assert_eq!(classify(&timed_out, true), Outcome::Unknown);
        assert_eq!(classify(&timed_out, false), Outcome::Failed);
        let reset = Status::unavailable("transport error");
        assert_eq!(classify(&reset, true), Outcome::Unknown);
    }

    #[tokio::test]
    async fn a_refused_connection_fails_a_write() {
        // A port nobody listens on: bind one, learn it, release it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("bind a free port")
            .port();
        let channel = lazy_channel(&format!("http://127.0.0.1:{port}")).expect("channel");
        let call = Call::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        };
        let status = execute(&channel, &call).await.expect_err("nobody listens");
        assert_eq!(classify(&status, true), Outcome::Failed, "{status:?}");
    }
}
