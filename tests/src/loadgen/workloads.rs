//! The six workloads and the bounded client loop they share.
//!
//! Invariants: every loop is bounded twice, by an operation count and by the workload's
//! deadline, and every unary request by `REQUEST_TIMEOUT`. A server error is counted and
//! sampled, never unwrapped; past `ERRORS_MAX` the workload stops early. A check that the
//! server broke a guarantee (a watcher missing an event, a scan missing a key) fails the
//! workload with `Err`.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use skerry_store::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::watch_client::WatchClient;
use skerry_store::pb::etcdserverpb::{
    Compare, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    TxnResponse, WatchCreateRequest, WatchRequest, request_op, response_op, watch_request,
};
use skerry_store::pb::mvccpb::event::EventType;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior, interval, sleep_until, timeout_at};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info};

use super::server::CpuMeter;
use super::stats::{ERROR_SAMPLES_MAX, Extra, LatencySummary, WorkloadResult};
use super::unary::{KV_PUT, KV_RANGE, KV_TXN, UnaryConn};

/// Concurrent clients in put64, get and txn, each with one request in flight: the issue's
/// 64, about what a busy kube-apiserver keeps in flight against etcd.
const CLIENTS: usize = 64;

/// gRPC connections the concurrent clients share round-robin. One HTTP/2 connection would
/// measure its flow control and a single server-side reader; one per client is more than
/// any real caller opens. etcd's benchmark tool spreads `--clients` over `--conns` the same
/// way; 8 is semi-arbitrary.
const CHANNELS: usize = 8;

/// Hot keys the txn clients contend on: 64 clients over 16 keys puts four CAS loops on each
/// key, enough to see conflicts without every txn failing. From the issue.
const TXN_HOT_KEYS: usize = 16;

/// Bytes in every value written, from the issue: about a small Kubernetes object's metadata.
const VALUE_BYTES: usize = 256;

/// Page size of the range scan, as the kube-apiserver's paginated LIST defaults to 500.
const RANGE_PAGE_LIMIT: i64 = 500;

/// Streams (and connections, one each) the watchers are spread over. The kube-apiserver
/// multiplexes many watches per stream; 10 gives each stream 100 watchers at 1,000.
const WATCH_STREAMS: usize = 10;

/// The watch writer's put rate. Modest on purpose: the workload measures fan-out latency, not
/// write throughput, and 1,000 watchers turn each put into 1,000 deliveries that the client
/// (on the same 2-core machine) must decode too.
const WATCH_PUTS_PER_SECOND: u32 = 100;

/// Bound on each unary request. Well above any healthy latency (etcd's own slow-request
/// warning fires at 100 ms) so that it only ends requests to a hung server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on opening a connection; loopback connects in microseconds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors after which a workload stops early: enough to ride out a hiccup, few enough that a
/// dead server fails the workload in well under a second instead of spending its whole count.
const ERRORS_MAX: u64 = 100;

/// How long watchers get to create their watches before the writer starts.
const WATCH_SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long after the last put-ack the watchers get to receive the remaining events. A healthy
/// server delivers within milliseconds; a backlog of seconds is itself the finding.
const WATCH_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// After the watchers are told to give up, how long before their tasks are aborted.
const WATCH_GIVE_UP_GRACE: Duration = Duration::from_secs(5);

/// Key prefix under which every workload writes, so `run` against a shared endpoint touches
/// nothing else.
const KEY_PREFIX: &str = "loadgen/";

/// Which workload: the CLI's names for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Workload {
    Put1,
    Put64,
    Get,
    Txn,
    Watch,
    Range,
    /// Clusters only: kill -9 the leader, time until a write succeeds on a survivor; repeat.
    Failover,
    /// Clusters only: freeze the leader (SIGSTOP: its connections stay open and silent, as a
    /// hung or unplugged box's do), time until a write succeeds on another member; repeat.
    FailoverFreeze,
}

impl Workload {
    /// Every workload of `all` for one member (failover needs a cluster).
    pub const ALL: [Workload; 6] = [
        Workload::Put1,
        Workload::Put64,
        Workload::Get,
        Workload::Txn,
        Workload::Watch,
        Workload::Range,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Put1 => "put1",
            Workload::Put64 => "put64",
            Workload::Get => "get",
            Workload::Txn => "txn",
            Workload::Watch => "watch",
            Workload::Range => "range",
            Workload::Failover => "failover",
            Workload::FailoverFreeze => "failover-freeze",
        }
    }

    /// What the workload's throughput counts, per second.
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Put1 | Workload::Put64 | Workload::Get => "ops/s",
            Workload::Txn => "txns/s",
            Workload::Watch => "events/s",
            Workload::Range => "pages/s",
            // One over the mean outage: above 1x in a ratio means the faster failover.
            Workload::Failover | Workload::FailoverFreeze => "failovers/s",
        }
    }
}

/// How big the workloads are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scale {
    /// Small counts: three compare runs of everything take under three minutes (about 75 s
    /// for etcd against itself on 2 CPUs).
    Quick,
    /// The counts for put1, put64 and watch, about 5× quick for the rest: about 50 s
    /// per target and run.
    Full,
}

/// Operation counts and the per-workload deadline for one scale.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Leader kills in the failover workload (the issue asks for the median over 10).
    pub failover_kills: u64,
    pub put1_ops: u64,
    pub put64_ops: u64,
    pub get_ops: u64,
    pub txn_ops: u64,
    pub watchers: usize,
    pub watch_events: u64,
    pub range_keys: u64,
    pub range_scans: u64,
    /// Wall-clock bound on one workload, setup included.
    pub deadline: Duration,
}

impl Scale {
    pub fn name(self) -> &'static str {
        match self {
            Scale::Quick => "quick",
            Scale::Full => "full",
        }
    }
}

impl Plan {
    pub fn for_scale(scale: Scale) -> Self {
        match scale {
            Scale::Quick => Self {
                failover_kills: 5,
                put1_ops: 2_000,
                put64_ops: 20_000,
                get_ops: 20_000,
                txn_ops: 10_000,
                watchers: 1_000,
                watch_events: 200,
                range_keys: 20_000,
                range_scans: 5,
                deadline: Duration::from_secs(60),
            },
            Scale::Full => Self {
                failover_kills: 10,
                put1_ops: 10_000,
                put64_ops: 100_000,
                get_ops: 100_000,
                txn_ops: 50_000,
                watchers: 1_000,
                watch_events: 1_000,
                range_keys: 20_000,
                range_scans: 20,
                deadline: Duration::from_secs(300),
            },
        }
    }

    /// The plan as JSON, for the report.
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "failover_kills": self.failover_kills,
            "put1_ops": self.put1_ops,
            "put64_ops": self.put64_ops,
            "get_ops": self.get_ops,
            "txn_ops": self.txn_ops,
            "watchers": self.watchers,
            "watch_events": self.watch_events,
            "range_keys": self.range_keys,
            "range_scans": self.range_scans,
            "deadline_s": self.deadline.as_secs(),
            "clients": CLIENTS,
            "channels": CHANNELS,
            "value_bytes": VALUE_BYTES,
        })
    }
}

/// Runs one workload against `endpoint` and measures it. With the server's `server_pid`, also
/// reports its CPU time per operation (`SERVER_CPU_EXTRA`) from /proc, measured from here
/// (connection setup included) to the workload's end, except for range's preload.
pub async fn run_workload(
    workload: Workload,
    endpoint: &str,
    plan: &Plan,
    server_pids: &[u32],
) -> Result<WorkloadResult> {
    let deadline = Instant::now() + plan.deadline;
    info!(workload = workload.name(), endpoint, "starting workload");
    let mut cpu = CpuMeter::start(server_pids);
    let result = match workload {
        Workload::Put1 => put_workload(workload, endpoint, 1, 1, plan.put1_ops, deadline).await,
        Workload::Put64 => {
            put_workload(
                workload,
                endpoint,
                CLIENTS,
                CHANNELS,
                plan.put64_ops,
                deadline,
            )
            .await
        }
        Workload::Get => get_workload(endpoint, plan.get_ops, deadline).await,
        Workload::Txn => txn_workload(endpoint, plan.txn_ops, deadline).await,
        Workload::Watch => watch_workload(endpoint, plan, deadline).await,
        Workload::Range => range_workload(endpoint, plan, deadline, &mut cpu).await,
        Workload::Failover | Workload::FailoverFreeze => Err(anyhow::anyhow!(
            "failover needs the cluster's processes: run it through `compare --members 3`"
        )),
    };
    let result = result.map(|mut r| {
        r.extras.extend(cpu.finish(r.ops));
        r
    });
    match &result {
        Ok(r) => info!(
            workload = workload.name(),
            throughput = format!("{:.0} {}", r.throughput(), workload.unit()),
            p50_ms = r.latency.p50_us as f64 / 1_000.0,
            p99_ms = r.latency.p99_us as f64 / 1_000.0,
            errors = r.errors,
            "finished workload"
        ),
        Err(e) => info!(workload = workload.name(), error = %format!("{e:#}"), "workload failed"),
    }
    result
}

/// Opens one connection. `request_timeout` bounds each unary call; leave it `None` for
/// watch streams, since tonic sends it as the whole stream's gRPC deadline.
/// `endpoint` may list several members, comma-separated; this connects to the first.
pub async fn connect(endpoint: &str, request_timeout: Option<Duration>) -> Result<Channel> {
    let endpoint = endpoint.split(',').next().unwrap_or(endpoint);
    let mut builder = Endpoint::from_shared(endpoint.to_owned())
        .with_context(|| format!("parse endpoint {endpoint}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    if let Some(request_timeout) = request_timeout {
        builder = builder.timeout(request_timeout);
    }
    builder
        .connect()
        .await
        .with_context(|| format!("connect to {endpoint}"))
}

async fn connect_many(
    endpoint: &str,
    count: usize,
    request_timeout: Option<Duration>,
) -> Result<Vec<Channel>> {
    // Several members (comma-separated): connections go round-robin over them, as a client
    // given every member's endpoint spreads its load.
    let endpoints: Vec<&str> = endpoint.split(',').collect();
    let mut channels = Vec::with_capacity(count);
    for i in 0..count {
        channels.push(connect(endpoints[i % endpoints.len()], request_timeout).await?);
    }
    Ok(channels)
}

/// Opens `count` lean unary connections (see `unary`), round-robin over the listed members.
async fn connect_unary(endpoint: &str, count: usize) -> Result<Vec<UnaryConn>> {
    let endpoints: Vec<&str> = endpoint.split(',').collect();
    let mut conns = Vec::with_capacity(count);
    for i in 0..count {
        conns.push(
            UnaryConn::connect(
                endpoints[i % endpoints.len()],
                CONNECT_TIMEOUT,
                REQUEST_TIMEOUT,
            )
            .await?,
        );
    }
    Ok(conns)
}

/// The value every put writes: `VALUE_BYTES` of a fixed printable pattern.
fn value() -> Bytes {
    (0..VALUE_BYTES)
        .map(|i| b'a' + (i % 26) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// A gRPC status as one short line for error samples.
fn status_text(status: &tonic::Status) -> String {
    /// Characters of a server's error message kept; etcd's are one short sentence.
    const MESSAGE_CHARS_MAX: usize = 200;
    let message: String = status.message().chars().take(MESSAGE_CHARS_MAX).collect();
    format!("{:?}: {message}", status.code())
}

/// Microseconds in `d`, saturating: no request takes 584,000 years.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The outcome of one operation in the shared client loop.
enum OpOutcome {
    Done,
    /// A txn whose compare failed: an operation, counted as a conflict.
    Conflict,
    Failed(String),
}

/// One client of the shared loop: issues operation `op_index` and waits for it.
trait OpClient: Send + 'static {
    fn op(&mut self, op_index: u64) -> impl Future<Output = OpOutcome> + Send;
}

/// What the shared client loop measured.
#[derive(Default)]
struct Driven {
    /// Completed operations, conflicts included.
    ops: u64,
    conflicts: u64,
    errors: u64,
    error_samples: Vec<String>,
    latencies_us: Vec<u64>,
    elapsed: Duration,
    stopped_early: Option<String>,
}

impl Driven {
    fn add_error(&mut self, error: String) {
        self.errors += 1;
        self.sample_error(error);
    }

    /// Keeps `error` as a sample unless it is a repeat or the samples are full.
    fn sample_error(&mut self, error: String) {
        if self.error_samples.len() < ERROR_SAMPLES_MAX && !self.error_samples.contains(&error) {
            self.error_samples.push(error);
        }
    }

    fn into_result(self, ops_planned: u64, extras: Vec<Extra>) -> WorkloadResult {
        WorkloadResult {
            ops: self.ops,
            ops_planned,
            errors: self.errors,
            error_samples: self.error_samples,
            stopped_early: self.stopped_early,
            elapsed: self.elapsed,
            latency: LatencySummary::from_samples(self.latencies_us),
            extras,
        }
    }
}

/// Runs `clients` concurrently, each with one operation in flight, until `ops_planned`
/// operations have been issued, `deadline` passes, or `ERRORS_MAX` errors accumulate.
/// Operation indexes are handed out once each, so puts keyed by index write distinct keys.
async fn drive<C: OpClient>(clients: Vec<C>, ops_planned: u64, deadline: Instant) -> Driven {
    let next_op = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latencies_per_client = usize::try_from(ops_planned).unwrap_or(0) / clients.len().max(1);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for mut client in clients {
        let next_op = Arc::clone(&next_op);
        let errors = Arc::clone(&errors);
        tasks.spawn(async move {
            let mut driven = Driven {
                latencies_us: Vec::with_capacity(latencies_per_client),
                ..Default::default()
            };
            loop {
                if Instant::now() >= deadline {
                    driven.stopped_early = Some("deadline reached".into());
                    break;
                }
                if errors.load(Ordering::Relaxed) >= ERRORS_MAX {
                    driven.stopped_early = Some(format!("stopped after {ERRORS_MAX} errors"));
                    break;
                }
                let op_index = next_op.fetch_add(1, Ordering::Relaxed);
                if op_index >= ops_planned {
                    break;
                }
                let op_started = Instant::now();
                let outcome = client.op(op_index).await;
                let latency_us = micros(op_started.elapsed());
                match outcome {
                    OpOutcome::Done => {
                        driven.ops += 1;
                        driven.latencies_us.push(latency_us);
                    }
                    OpOutcome::Conflict => {
                        driven.ops += 1;
                        driven.conflicts += 1;
                        driven.latencies_us.push(latency_us);
                    }
                    OpOutcome::Failed(error) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        driven.add_error(error);
                    }
                }
            }
            driven
        });
    }
    let mut total = Driven::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(driven) => {
                total.ops += driven.ops;
                total.conflicts += driven.conflicts;
                total.latencies_us.extend(driven.latencies_us);
                total.errors += driven.errors;
                for error in driven.error_samples {
                    total.sample_error(error);
                }
                if total.stopped_early.is_none() {
                    total.stopped_early = driven.stopped_early;
                }
            }
            Err(e) => total.add_error(format!("client task failed: {e}")),
        }
    }
    total.elapsed = started.elapsed();
    if let Some(reason) = &mut total.stopped_early {
        *reason = format!(
            "{reason} after {} of {ops_planned} ops",
            total.ops + total.errors
        );
    }
    total
}

/// Puts `VALUE_BYTES` to key `<prefix><op_index>`.
struct PutClient {
    kv: UnaryConn,
    prefix: String,
    value: Bytes,
}

impl OpClient for PutClient {
    async fn op(&mut self, op_index: u64) -> OpOutcome {
        let request = PutRequest {
            key: format!("{}{op_index:010}", self.prefix).into(),
            value: self.value.clone(),
            ..Default::default()
        };
        match self.kv.call::<_, PutResponse>(&KV_PUT, &request).await {
            Ok(_) => OpOutcome::Done,
            Err(error) => OpOutcome::Failed(error),
        }
    }
}

fn put_clients(conns: &[UnaryConn], clients: usize, prefix: &str) -> Vec<PutClient> {
    let value = value();
    (0..clients)
        .map(|i| PutClient {
            kv: conns[i % conns.len()].clone(),
            prefix: prefix.to_owned(),
            value: value.clone(),
        })
        .collect()
}

/// put1 and put64: distinct keys, `clients` in flight over `channels` connections.
async fn put_workload(
    workload: Workload,
    endpoint: &str,
    clients: usize,
    channels: usize,
    ops_planned: u64,
    deadline: Instant,
) -> Result<WorkloadResult> {
    let conns = connect_unary(endpoint, channels).await?;
    let prefix = format!("{KEY_PREFIX}{}/", workload.name());
    let driven = drive(put_clients(&conns, clients, &prefix), ops_planned, deadline).await;
    Ok(driven.into_result(ops_planned, Vec::new()))
}

/// Linearizable Range of one key that must exist.
struct GetClient {
    kv: UnaryConn,
    key: Bytes,
}

impl OpClient for GetClient {
    async fn op(&mut self, _op_index: u64) -> OpOutcome {
        let request = RangeRequest {
            key: self.key.clone(),
            ..Default::default()
        };
        match self.kv.call::<_, RangeResponse>(&KV_RANGE, &request).await {
            Ok(response) if response.kvs.len() == 1 => OpOutcome::Done,
            Ok(response) => {
                OpOutcome::Failed(format!("range returned {} kvs, want 1", response.kvs.len()))
            }
            Err(error) => OpOutcome::Failed(error),
        }
    }
}

async fn get_workload(
    endpoint: &str,
    ops_planned: u64,
    deadline: Instant,
) -> Result<WorkloadResult> {
    let conns = connect_unary(endpoint, CHANNELS).await?;
    let key = Bytes::from(format!("{KEY_PREFIX}get/key"));
    conns[0]
        .clone()
        .call::<_, PutResponse>(
            &KV_PUT,
            &PutRequest {
                key: key.clone(),
                value: value(),
                ..Default::default()
            },
        )
        .await
        .map_err(anyhow::Error::msg)
        .context("put the key that get reads")?;
    let clients = (0..CLIENTS)
        .map(|i| GetClient {
            kv: conns[i % CHANNELS].clone(),
            key: key.clone(),
        })
        .collect();
    let driven = drive(clients, ops_planned, deadline).await;
    Ok(driven.into_result(ops_planned, Vec::new()))
}

/// A compare-and-swap loop on one hot key: Txn(mod_revision(key) == last seen → put key;
/// else → range key). A failed compare is a conflict, and its range tells the client the
/// key's current mod_revision for the next attempt, as clientv3's STM does.
struct TxnClient {
    kv: UnaryConn,
    key: Bytes,
    value: Bytes,
    /// The key's mod_revision as this client last saw it.
    mod_revision: i64,
}

impl OpClient for TxnClient {
    async fn op(&mut self, _op_index: u64) -> OpOutcome {
        let request = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Mod as i32,
                key: self.key.clone(),
                range_end: Bytes::new(),
                target_union: Some(TargetUnion::ModRevision(self.mod_revision)),
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: self.key.clone(),
                    value: self.value.clone(),
                    ..Default::default()
                })),
            }],
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestRange(RangeRequest {
                    key: self.key.clone(),
                    ..Default::default()
                })),
            }],
        };
        let response = match self.kv.call::<_, TxnResponse>(&KV_TXN, &request).await {
            Ok(response) => response,
            Err(error) => return OpOutcome::Failed(error),
        };
        if response.succeeded {
            // The put happened at the txn's revision, which is now the key's mod_revision.
            return match response.header {
                Some(header) => {
                    self.mod_revision = header.revision;
                    OpOutcome::Done
                }
                None => OpOutcome::Failed("txn response without header".into()),
            };
        }
        match response
            .responses
            .first()
            .and_then(|op| op.response.as_ref())
        {
            Some(response_op::Response::ResponseRange(range)) => {
                self.mod_revision = range.kvs.first().map_or(0, |kv| kv.mod_revision);
                OpOutcome::Conflict
            }
            _ => OpOutcome::Failed("failed txn did not return its range".into()),
        }
    }
}

async fn txn_workload(
    endpoint: &str,
    ops_planned: u64,
    deadline: Instant,
) -> Result<WorkloadResult> {
    let conns = connect_unary(endpoint, CHANNELS).await?;
    let value = value();
    let mut setup = conns[0].clone();
    let hot_keys: Vec<Bytes> = (0..TXN_HOT_KEYS)
        .map(|i| Bytes::from(format!("{KEY_PREFIX}txn/hot{i:02}")))
        .collect();
    for key in &hot_keys {
        setup
            .call::<_, PutResponse>(
                &KV_PUT,
                &PutRequest {
                    key: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                },
            )
            .await
            .map_err(anyhow::Error::msg)
            .context("create txn hot key")?;
    }
    // Each client reads its key once to learn the mod_revision its first compare expects.
    let mut clients = Vec::with_capacity(CLIENTS);
    for i in 0..CLIENTS {
        let key = hot_keys[i % TXN_HOT_KEYS].clone();
        let mut kv = conns[i % CHANNELS].clone();
        let range = kv
            .call::<_, RangeResponse>(
                &KV_RANGE,
                &RangeRequest {
                    key: key.clone(),
                    ..Default::default()
                },
            )
            .await
            .map_err(anyhow::Error::msg)
            .context("read txn hot key")?;
        let mod_revision = range.kvs.first().map_or(0, |kv| kv.mod_revision);
        clients.push(TxnClient {
            kv,
            key,
            value: value.clone(),
            mod_revision,
        });
    }
    let driven = drive(clients, ops_planned, deadline).await;
    let conflict_percent = if driven.ops > 0 {
        driven.conflicts as f64 * 100.0 / driven.ops as f64
    } else {
        0.0
    };
    let extras = vec![Extra {
        name: "conflicts",
        value: conflict_percent,
        unit: "%",
    }];
    Ok(driven.into_result(ops_planned, extras))
}

/// The watch workload's value for event `seq`: `seq` big-endian in the first 8 bytes, then
/// the usual pattern, so a watcher can check order from the value alone.
fn seq_value(seq: u64, pattern: &[u8]) -> Bytes {
    let mut value = pattern.to_vec();
    value[..8].copy_from_slice(&seq.to_be_bytes());
    value.into()
}

fn decode_seq(value: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(value.get(..8)?.try_into().ok()?))
}

/// Nanoseconds since `base`, saturating.
fn nanos_since(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// What one watch stream's watchers must see.
struct WatchStreamPlan {
    stream_index: usize,
    watchers: usize,
    events: u64,
    key: Bytes,
    base: Instant,
}

/// What one watch stream saw.
#[derive(Default)]
struct StreamLog {
    watchers_created: usize,
    watchers_complete: usize,
    /// `(seq, nanoseconds since base)` for every in-range event any watcher received.
    receipts: Vec<(u64, u64)>,
    violations: u64,
    violation_samples: Vec<String>,
    stream_error: Option<String>,
}

impl StreamLog {
    fn violation(&mut self, text: String) {
        self.violations += 1;
        if self.violation_samples.len() < ERROR_SAMPLES_MAX {
            self.violation_samples.push(text);
        }
    }
}

/// Per-watcher order check state.
#[derive(Default)]
struct WatcherState {
    next_seq: u64,
    last_mod_revision: i64,
}

/// Opens one watch stream with `plan.watchers` watches on `plan.key`, reports on `ready` once
/// all are created, then checks every event until every watcher has all `plan.events` or
/// `give_up` is set.
async fn watch_stream(
    channel: Channel,
    plan: WatchStreamPlan,
    ready: mpsc::Sender<Result<(), String>>,
    mut give_up: watch::Receiver<bool>,
) -> StreamLog {
    let mut log = StreamLog {
        receipts: Vec::new(),
        ..Default::default()
    };
    let stream = plan.stream_index;
    // Sized to hold every create request, so queueing them never waits on the server.
    let (requests, requests_rx) = mpsc::channel(plan.watchers.max(1));
    for _ in 0..plan.watchers {
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: plan.key.clone(),
                    ..Default::default()
                },
            )),
        };
        if requests.try_send(create).is_err() {
            log.stream_error = Some("queue watch create request".into());
            let _ = ready
                .send(Err(format!("stream {stream}: queue create request")))
                .await;
            return log;
        }
    }
    let mut client = WatchClient::new(channel);
    let opened = tokio::select! {
        opened = client.watch(ReceiverStream::new(requests_rx)) => opened,
        _ = give_up.wait_for(|give_up| *give_up) => {
            log.stream_error = Some("gave up while opening stream".into());
            return log;
        }
    };
    let mut responses = match opened {
        Ok(response) => response.into_inner(),
        Err(status) => {
            let error = format!(
                "stream {stream}: open watch stream: {}",
                status_text(&status)
            );
            log.stream_error = Some(error.clone());
            let _ = ready.send(Err(error)).await;
            return log;
        }
    };
    log.receipts
        .reserve(usize::try_from(plan.events).unwrap_or(0) * plan.watchers);
    let mut watchers: HashMap<i64, WatcherState> = HashMap::with_capacity(plan.watchers);
    let mut announced_ready = false;
    while !(announced_ready && log.watchers_complete == plan.watchers) {
        let message = tokio::select! {
            message = responses.message() => message,
            _ = give_up.wait_for(|give_up| *give_up) => break,
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => {
                log.stream_error = Some(format!("stream {stream}: server ended the stream"));
                break;
            }
            Err(status) => {
                log.stream_error = Some(format!("stream {stream}: {}", status_text(&status)));
                break;
            }
        };
        let received_ns = nanos_since(plan.base);
        let id = response.watch_id;
        if response.created {
            if watchers.insert(id, WatcherState::default()).is_some() {
                log.violation(format!("stream {stream}: watch id {id} created twice"));
            }
            log.watchers_created += 1;
            if log.watchers_created == plan.watchers {
                announced_ready = true;
                let _ = ready.send(Ok(())).await;
            }
        }
        if response.canceled {
            log.violation(format!(
                "stream {stream}: watch {id} canceled: {}",
                response.cancel_reason
            ));
        }
        if response.compact_revision != 0 {
            log.violation(format!(
                "stream {stream}: watch {id} compacted at {}",
                response.compact_revision
            ));
        }
        if response.events.is_empty() {
            continue;
        }
        let state = match watchers.entry(id) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(_) => {
                log.violation(format!("stream {stream}: events for unknown watch {id}"));
                continue;
            }
        };
        for event in &response.events {
            let Some(kv) = &event.kv else {
                log.violation(format!("stream {stream}: watch {id}: event without kv"));
                continue;
            };
            if event.r#type != EventType::Put as i32 || kv.key != plan.key {
                log.violation(format!(
                    "stream {stream}: watch {id}: unexpected event type {} on {:?}",
                    event.r#type, kv.key
                ));
                continue;
            }
            let Some(seq) = decode_seq(&kv.value) else {
                log.violation(format!(
                    "stream {stream}: watch {id}: value too short for a seq"
                ));
                continue;
            };
            if seq != state.next_seq {
                log.violation(format!(
                    "stream {stream}: watch {id}: expected seq {}, got {seq}",
                    state.next_seq
                ));
            }
            if kv.mod_revision <= state.last_mod_revision {
                log.violation(format!(
                    "stream {stream}: watch {id}: mod_revision {} after {}",
                    kv.mod_revision, state.last_mod_revision
                ));
            }
            state.next_seq = seq.saturating_add(1);
            state.last_mod_revision = kv.mod_revision;
            if seq < plan.events {
                log.receipts.push((seq, received_ns));
            }
            if state.next_seq == plan.events {
                log.watchers_complete += 1;
            }
        }
    }
    if !announced_ready {
        let error = log.stream_error.clone().unwrap_or_else(|| "gave up".into());
        let _ = ready
            .send(Err(format!(
                "stream {stream}: {} of {} watches created: {error}",
                log.watchers_created, plan.watchers
            )))
            .await;
    }
    // Closing the request side only now: etcd ends a watch stream once its client stops
    // sending, so the sender must outlive the receive loop.
    drop(requests);
    log
}

/// Fan-out: `plan.watchers` watchers on one key over `WATCH_STREAMS` streams, one writer
/// putting `plan.watch_events` values at `WATCH_PUTS_PER_SECOND`. Fails unless every watcher
/// saw every event, in order.
async fn watch_workload(endpoint: &str, plan: &Plan, deadline: Instant) -> Result<WorkloadResult> {
    assert!(plan.watchers > 0, "watch plan has no watchers");
    let key = Bytes::from(format!("{KEY_PREFIX}watch/key"));
    let base = Instant::now();
    let streams = WATCH_STREAMS.min(plan.watchers);
    let channels = connect_many(endpoint, streams, None).await?;
    // `watch` rather than a oneshot per task: one send reaches every stream task, and a task
    // that checks after the send still sees it.
    let (give_up_tx, give_up_rx) = watch::channel(false);
    // Each stream reports readiness once; capacity for all so no report ever waits.
    let (ready_tx, mut ready_rx) = mpsc::channel(streams);
    let mut tasks = JoinSet::new();
    for (stream_index, channel) in channels.into_iter().enumerate() {
        let watchers =
            plan.watchers / streams + usize::from(stream_index < plan.watchers % streams);
        let stream_plan = WatchStreamPlan {
            stream_index,
            watchers,
            events: plan.watch_events,
            key: key.clone(),
            base,
        };
        tasks.spawn(watch_stream(
            channel,
            stream_plan,
            ready_tx.clone(),
            give_up_rx.clone(),
        ));
    }
    drop(ready_tx);

    let setup_deadline = deadline.min(Instant::now() + WATCH_SETUP_TIMEOUT);
    let mut setup_error = None;
    for _ in 0..streams {
        match timeout_at(setup_deadline, ready_rx.recv()).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(error))) => {
                setup_error = Some(error);
                break;
            }
            Ok(None) => {
                setup_error = Some("a stream task ended before its watches were created".into());
                break;
            }
            Err(_) => {
                setup_error = Some(format!(
                    "watches not all created within {WATCH_SETUP_TIMEOUT:?}"
                ));
                break;
            }
        }
    }
    let setup_elapsed = base.elapsed();
    debug!(watchers = plan.watchers, ?setup_elapsed, "watches created");

    let mut writer_error = setup_error.map(|e| format!("set up watchers: {e}"));
    let events = usize::try_from(plan.watch_events).context("watch event count")?;
    // Per seq, when its put was sent and acknowledged; u64::MAX until then.
    let mut send_ns = vec![u64::MAX; events];
    let mut ack_ns = vec![u64::MAX; events];
    let writer_started_ns = nanos_since(base);
    if writer_error.is_none() {
        let mut kv = KvClient::new(connect(endpoint, Some(REQUEST_TIMEOUT)).await?);
        let pattern = value();
        let mut ticker = interval(Duration::from_secs(1) / WATCH_PUTS_PER_SECOND);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        for (seq, (sent, ack)) in (0u64..).zip(send_ns.iter_mut().zip(ack_ns.iter_mut())) {
            ticker.tick().await;
            if Instant::now() >= deadline {
                writer_error = Some(format!("deadline reached after {seq} puts"));
                break;
            }
            let request = PutRequest {
                key: key.clone(),
                value: seq_value(seq, &pattern),
                ..Default::default()
            };
            *sent = nanos_since(base);
            match kv.put(request).await {
                Ok(_) => *ack = nanos_since(base),
                Err(status) => {
                    writer_error = Some(format!("put seq {seq}: {}", status_text(&status)));
                    break;
                }
            }
        }
    }

    let drain_until = if writer_error.is_some() {
        Instant::now()
    } else {
        deadline.min(Instant::now() + WATCH_DRAIN_TIMEOUT)
    };
    let mut logs = Vec::with_capacity(streams);
    let mut task_errors = Vec::new();
    let mut gave_up = false;
    let mut aborted = false;
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                None => break,
                Some(Ok(log)) => logs.push(log),
                Some(Err(e)) => task_errors.push(format!("watch stream task failed: {e}")),
            },
            () = sleep_until(drain_until), if !gave_up => {
                gave_up = true;
                let _ = give_up_tx.send(true);
            }
            () = sleep_until(drain_until + WATCH_GIVE_UP_GRACE), if gave_up && !aborted => {
                aborted = true;
                tasks.abort_all();
            }
        }
    }

    let expected = plan.watchers as u64 * plan.watch_events;
    let delivered: u64 = logs.iter().map(|log| log.receipts.len() as u64).sum();
    let created: usize = logs.iter().map(|log| log.watchers_created).sum();
    let complete: usize = logs.iter().map(|log| log.watchers_complete).sum();
    let violations: u64 = logs.iter().map(|log| log.violations).sum();
    let mut problems: Vec<String> = writer_error.into_iter().chain(task_errors).collect();
    problems.extend(logs.iter().filter_map(|log| log.stream_error.clone()));
    problems.extend(
        logs.iter()
            .flat_map(|log| log.violation_samples.iter().cloned()),
    );
    if created != plan.watchers
        || complete != plan.watchers
        || delivered != expected
        || violations > 0
        || !problems.is_empty()
    {
        problems.truncate(ERROR_SAMPLES_MAX * 2);
        bail!(
            "watch check failed: {created}/{} watches created, {complete} complete, {delivered}/\
             {expected} events delivered, {violations} order violations; {}",
            plan.watchers,
            problems.join("; ")
        );
    }

    // Latency counts from the put's ack, as a client that writes and then waits for its own
    // watch sees it; an event that beats the ack counts as 0. etcd notifies watchers before it
    // answers the put, so most events do, and the latency from the put's send is kept too.
    let mut before_ack: u64 = 0;
    let mut last_receipt_ns = writer_started_ns;
    let mut latencies_us = Vec::with_capacity(usize::try_from(delivered).unwrap_or(0));
    let mut from_send_us = Vec::with_capacity(usize::try_from(delivered).unwrap_or(0));
    for log in &logs {
        for &(seq, received_ns) in &log.receipts {
            let at = |times: &[u64]| {
                usize::try_from(seq)
                    .ok()
                    .and_then(|seq| times.get(seq).copied())
                    .unwrap_or(u64::MAX)
            };
            let acked_ns = at(&ack_ns);
            if received_ns < acked_ns {
                before_ack += 1;
            }
            latencies_us.push(received_ns.saturating_sub(acked_ns) / 1_000);
            from_send_us.push(received_ns.saturating_sub(at(&send_ns)) / 1_000);
            last_receipt_ns = last_receipt_ns.max(received_ns);
        }
    }
    let before_ack_percent = before_ack as f64 * 100.0 / delivered.max(1) as f64;
    let from_send = LatencySummary::from_samples(from_send_us);
    Ok(WorkloadResult {
        ops: delivered,
        ops_planned: expected,
        errors: 0,
        error_samples: Vec::new(),
        stopped_early: None,
        elapsed: Duration::from_nanos(last_receipt_ns.saturating_sub(writer_started_ns)),
        latency: LatencySummary::from_samples(latencies_us),
        extras: vec![
            Extra {
                name: "watch setup",
                value: setup_elapsed.as_secs_f64() * 1_000.0,
                unit: " ms",
            },
            Extra {
                name: "events before put-ack",
                value: before_ack_percent,
                unit: "%",
            },
            Extra {
                name: "p99 from put-send",
                value: from_send.p99_us as f64 / 1_000.0,
                unit: " ms",
            },
        ],
    })
}

/// The smallest key greater than every key with `prefix`: etcd's range_end for a prefix.
fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end.into();
        }
    }
    // Every byte was 0xff: etcd's "\0" means "to the end of the keyspace".
    Bytes::from_static(b"\0")
}

/// Preloads `plan.range_keys` keys under a prefix with put64's clients, then scans the prefix
/// `plan.range_scans` times in pages of `RANGE_PAGE_LIMIT`, each page starting at the last key
/// plus "\0" and pinned to the first page's revision, as the kube-apiserver paginates.
/// `cpu` restarts after the preload, so the server's CPU per page leaves the preload out.
async fn range_workload(
    endpoint: &str,
    plan: &Plan,
    deadline: Instant,
    cpu: &mut CpuMeter,
) -> Result<WorkloadResult> {
    let conns = connect_unary(endpoint, CHANNELS).await?;
    let prefix = format!("{KEY_PREFIX}range/");
    let preload = drive(
        put_clients(&conns, CLIENTS, &prefix),
        plan.range_keys,
        deadline,
    )
    .await;
    if preload.ops != plan.range_keys {
        bail!(
            "preload: {} of {} keys written, {} errors {:?}{}",
            preload.ops,
            plan.range_keys,
            preload.errors,
            preload.error_samples,
            preload
                .stopped_early
                .map(|s| format!(", {s}"))
                .unwrap_or_default()
        );
    }
    info!(keys = plan.range_keys, elapsed = ?preload.elapsed, "preloaded range keys");
    cpu.restart();

    let mut kv = conns[0].clone();
    let range_end = prefix_end(prefix.as_bytes());
    let pages_per_scan_max = plan.range_keys / RANGE_PAGE_LIMIT as u64 + 2;
    let mut driven = Driven::default();
    let mut scan_ms = Vec::new();
    let started = Instant::now();
    'scans: for scan in 0..plan.range_scans {
        if Instant::now() >= deadline {
            driven.stopped_early = Some(format!("deadline reached after {scan} scans"));
            break;
        }
        if driven.errors >= ERRORS_MAX {
            driven.stopped_early = Some(format!("stopped after {ERRORS_MAX} errors"));
            break;
        }
        let scan_started = Instant::now();
        let mut key = Bytes::from(prefix.clone());
        let mut revision = 0;
        let mut seen: u64 = 0;
        let mut last_key: Option<Bytes> = None;
        for page in 0..pages_per_scan_max {
            let request = RangeRequest {
                key: key.clone(),
                range_end: range_end.clone(),
                limit: RANGE_PAGE_LIMIT,
                revision,
                ..Default::default()
            };
            let page_started = Instant::now();
            let response = match kv.call::<_, RangeResponse>(&KV_RANGE, &request).await {
                Ok(response) => response,
                Err(error) => {
                    driven.add_error(error);
                    continue 'scans;
                }
            };
            driven.latencies_us.push(micros(page_started.elapsed()));
            driven.ops += 1;
            if revision == 0 {
                revision = response
                    .header
                    .as_ref()
                    .map(|header| header.revision)
                    .context("range response without header")?;
            }
            for kv in &response.kvs {
                if last_key.as_ref().is_some_and(|last| kv.key <= *last) {
                    bail!(
                        "scan {scan} page {page}: key {:?} not after {last_key:?}",
                        kv.key
                    );
                }
                last_key = Some(kv.key.clone());
            }
            seen += response.kvs.len() as u64;
            if !response.more {
                break;
            }
            let Some(last) = response.kvs.last() else {
                bail!("scan {scan} page {page}: more is set but the page is empty");
            };
            let mut next = last.key.to_vec();
            next.push(0);
            key = next.into();
            if page + 1 == pages_per_scan_max {
                bail!("scan {scan} did not end within {pages_per_scan_max} pages");
            }
        }
        if seen != plan.range_keys {
            bail!(
                "scan {scan} saw {seen} keys under {prefix}, expected {}",
                plan.range_keys
            );
        }
        scan_ms.push(scan_started.elapsed().as_secs_f64() * 1_000.0);
    }
    driven.elapsed = started.elapsed();
    let pages_planned = plan.range_scans * plan.range_keys.div_ceil(RANGE_PAGE_LIMIT as u64);
    let extras = super::stats::median(&scan_ms)
        .map(|value| {
            vec![Extra {
                name: "full scan",
                value,
                unit: " ms",
            }]
        })
        .unwrap_or_default();
    Ok(driven.into_result(pages_planned, extras))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(
            prefix_end(b"loadgen/range/"),
            Bytes::from_static(b"loadgen/range0")
        );
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(prefix_end(b"\xff"), Bytes::from_static(b"\0"));
    }

    #[test]
    fn seq_round_trips_through_value() {
        let value = seq_value(4_242, &super::value());
        assert_eq!(value.len(), VALUE_BYTES);
        assert_eq!(decode_seq(&value), Some(4_242));
        assert_eq!(decode_seq(b"short"), None);
    }
}
