//! The member's instrumentation with etcd 3.4's metric names, and the Prometheus text format
//! they are served in (`/metrics` on the client port).
//!
//! Events are counted where they happen (the log's `fdatasync`, the writer's redb commit, the
//! Raft loop's leader changes and heartbeats, each gRPC call) into process-wide atomics, as
//! etcd keeps its collectors in package variables: one relaxed `fetch_add` per event, no lock
//! and no allocation on a write's path. State (leader, indexes, sizes, keys) is not counted at
//! all but read from the store when scraped.
//!
//! The exposition is Prometheus' text format 0.0.4, what etcd 3.4's `promhttp` handler serves
//! by default. The apiserver's `prometheus-client` writes OpenMetrics instead, which appends
//! `_total` to every counter and so would rename etcd's `etcd_server_health_success` and
//! `etcd_server_health_failures`; dashboards and alerts written for etcd match on the names.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;

/// `N` bucket bounds in nanoseconds, `start` doubling: Prometheus' `ExponentialBuckets(start,
/// 2, N)`, which etcd's disk and network histograms use.
const fn doubling<const N: usize>(start_nanos: u64) -> [u64; N] {
    let mut bounds = [0; N];
    let mut i = 0;
    while i < N {
        bounds[i] = start_nanos << i;
        i += 1;
    }
    bounds
}

/// Buckets of etcd's disk latency histograms.
pub const DISK_BUCKETS: usize = 14;
/// etcd's disk latency buckets, 1 ms to 8.192 s (`ExponentialBuckets(0.001, 2, 14)` in etcd
/// 3.4's `wal/metrics.go` and `mvcc/backend/metrics.go`).
pub const DISK_BUCKETS_NANOS: [u64; DISK_BUCKETS] = doubling(1_000_000);
/// Buckets of etcd's peer round-trip histogram.
pub const RTT_BUCKETS: usize = 16;
/// etcd's peer round-trip buckets, 0.1 ms to 3.2768 s (`ExponentialBuckets(0.0001, 2, 16)` in
/// etcd 3.4's `etcdserver/api/rafthttp/metrics.go`, as etcd 3.4.23 serves them).
pub const RTT_BUCKETS_NANOS: [u64; RTT_BUCKETS] = doubling(100_000);

/// A latency histogram with `N` fixed buckets, lock-free: one bucket counter and the sum move
/// per observation.
pub struct Histogram<const N: usize> {
    bounds_nanos: [u64; N],
    /// Observations per bucket (not cumulative).
    buckets: [AtomicU64; N],
    /// Observations above every bound.
    overflow: AtomicU64,
    sum_nanos: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    pub const fn new(bounds_nanos: [u64; N]) -> Self {
        Self {
            bounds_nanos,
            buckets: [const { AtomicU64::new(0) }; N],
            overflow: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = self.bounds_nanos.iter().position(|bound| nanos <= *bound);
        match bucket {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.overflow.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        let counted: u64 = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum();
        counted + self.overflow.load(Ordering::Relaxed)
    }
}

/// `etcd_disk_wal_fsync_duration_seconds`: every `fdatasync` of a log (the single store's
/// write-ahead log or a member's Raft log), in `Wal::append`.
pub static WAL_FSYNC: Histogram<DISK_BUCKETS> = Histogram::new(DISK_BUCKETS_NANOS);
/// A log sync this slow sets off the slow-disk alarm (a warning in the log, the counter
/// below, and the appliance's `SlowDiskSync` event on the Node). etcd's hardware guidance is
/// a 99th percentile of `etcd_disk_wal_fsync_duration_seconds` under 10 ms; ten times that
/// is a disk every write through the leader waits on for a tenth of a second, the SD cards
/// and eMMC that stall for hundreds of milliseconds (k3s-io/k3s#8956). etcd itself only logs
/// `slow fdatasync` past 1 s (`warnSyncDuration`), by when skerry's leader has already
/// handed over (`skerry_raft::core::LEADER_DISK_STALL_MAX`).
pub const SLOW_SYNC_WARN: Duration = Duration::from_millis(100);
/// `skerry_disk_stall_handovers_total`: times this member, leading, handed leadership over
/// because its log's sync had stalled (`skerry_raft::core::LEADER_DISK_STALL_MAX`).
pub static DISK_STALL_HANDOVERS: AtomicU64 = AtomicU64::new(0);
/// `skerry_disk_wal_slow_fsyncs_total`: log syncs that took [`SLOW_SYNC_WARN`] or more.
pub static WAL_SLOW_FSYNCS: AtomicU64 = AtomicU64::new(0);
/// The longest slow sync since the alarm last reported (nanoseconds), taken (and reset) by
/// [`take_slowest_sync`].
static WAL_SLOWEST_FSYNC_NANOS: AtomicU64 = AtomicU64::new(0);

/// Records one log `fdatasync`: the histogram, and the slow-disk alarm when it took
/// [`SLOW_SYNC_WARN`] or more.
pub fn observe_wal_fsync(elapsed: Duration) {
    WAL_FSYNC.observe(elapsed);
    if elapsed >= SLOW_SYNC_WARN {
        WAL_SLOW_FSYNCS.fetch_add(1, Ordering::Relaxed);
        let nanos = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        WAL_SLOWEST_FSYNC_NANOS.fetch_max(nanos, Ordering::Relaxed);
        tracing::warn!(
            took_ms = elapsed.as_millis() as u64,
            expected_ms = SLOW_SYNC_WARN.as_millis() as u64,
            "slow fdatasync: this disk is too slow for the log"
        );
    }
}

/// The slow syncs counted so far and the longest since the last call (reset by it): what
/// the alarm reports. `None` when no sync was slow since.
pub fn take_slowest_sync() -> Option<(u64, Duration)> {
    let nanos = WAL_SLOWEST_FSYNC_NANOS.swap(0, Ordering::Relaxed);
    (nanos > 0).then(|| {
        (
            WAL_SLOW_FSYNCS.load(Ordering::Relaxed),
            Duration::from_nanos(nanos),
        )
    })
}
/// `etcd_disk_backend_commit_duration_seconds`: every redb commit of the writer (a batch, a
/// checkpoint).
pub static BACKEND_COMMIT: Histogram<DISK_BUCKETS> = Histogram::new(DISK_BUCKETS_NANOS);
/// `etcd_server_leader_changes_seen_total`: leaders this member has seen take over (a single
/// store counts itself once, at start, as a one-member etcd does).
pub static LEADER_CHANGES: AtomicU64 = AtomicU64::new(0);
/// `etcd_server_proposals_pending`: writes handed to the writer or the log and not answered.
pub static PROPOSALS_PENDING: AtomicI64 = AtomicI64::new(0);
/// `etcd_server_proposals_failed_total`: writes that failed for want of a leader, a
/// timeout, a leader change or a stopped server (not those the state machine refused).
pub static PROPOSALS_FAILED: AtomicU64 = AtomicU64::new(0);
/// `etcd_server_read_indexes_failed_total`: linearizable read barriers that failed.
pub static READ_INDEXES_FAILED: AtomicU64 = AtomicU64::new(0);
/// `etcd_server_health_success` / `etcd_server_health_failures`: answers of `/health`.
pub static HEALTH_SUCCESS: AtomicU64 = AtomicU64::new(0);
pub static HEALTH_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Round trips to each peer (`etcd_network_peer_round_trip_time_seconds{To}`), by member id.
static PEER_RTT: RwLock<Vec<(u64, Arc<PeerRtt>)>> = RwLock::new(Vec::new());

/// One peer's round-trip histogram.
pub type PeerRtt = Histogram<RTT_BUCKETS>;

/// Records one round trip to peer `to`.
pub fn observe_peer_rtt(to: u64, elapsed: Duration) {
    if let Some((_, h)) = PEER_RTT.read().iter().find(|(id, _)| *id == to) {
        h.observe(elapsed);
        return;
    }
    let mut all = PEER_RTT.write();
    let h = match all.iter().find(|(id, _)| *id == to) {
        Some((_, h)) => h.clone(),
        None => {
            let h = Arc::new(Histogram::new(RTT_BUCKETS_NANOS));
            all.push((to, h.clone()));
            h
        }
    };
    h.observe(elapsed);
}

/// The peers with round trips recorded, and their histograms.
pub fn peer_rtts() -> Vec<(u64, Arc<PeerRtt>)> {
    PEER_RTT.read().clone()
}

/// Counts a write handed to the writer or the log until it is answered.
pub(crate) struct Pending;

impl Pending {
    pub(crate) fn start() -> Self {
        PROPOSALS_PENDING.fetch_add(1, Ordering::Relaxed);
        Pending
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        PROPOSALS_PENDING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// gRPC server metrics with go-grpc-prometheus' names and labels, which etcd 3.4 registers
/// (`etcdserver/api/v3rpc/grpc.go`).
pub mod grpc {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Every method skerry serves: `(service, method, type)`.
    pub const METHODS: [(&str, &str, &str); 23] = [
        ("etcdserverpb.KV", "Range", "unary"),
        ("etcdserverpb.KV", "Put", "unary"),
        ("etcdserverpb.KV", "DeleteRange", "unary"),
        ("etcdserverpb.KV", "Txn", "unary"),
        ("etcdserverpb.KV", "Compact", "unary"),
        ("etcdserverpb.Watch", "Watch", "bidi_stream"),
        ("etcdserverpb.Lease", "LeaseGrant", "unary"),
        ("etcdserverpb.Lease", "LeaseRevoke", "unary"),
        ("etcdserverpb.Lease", "LeaseKeepAlive", "bidi_stream"),
        ("etcdserverpb.Lease", "LeaseTimeToLive", "unary"),
        ("etcdserverpb.Lease", "LeaseLeases", "unary"),
        ("etcdserverpb.Cluster", "MemberAdd", "unary"),
        ("etcdserverpb.Cluster", "MemberRemove", "unary"),
        ("etcdserverpb.Cluster", "MemberUpdate", "unary"),
        ("etcdserverpb.Cluster", "MemberList", "unary"),
        ("etcdserverpb.Cluster", "MemberPromote", "unary"),
        ("etcdserverpb.Maintenance", "Alarm", "unary"),
        ("etcdserverpb.Maintenance", "Status", "unary"),
        ("etcdserverpb.Maintenance", "Defragment", "unary"),
        ("etcdserverpb.Maintenance", "Hash", "unary"),
        ("etcdserverpb.Maintenance", "HashKV", "unary"),
        ("etcdserverpb.Maintenance", "Snapshot", "server_stream"),
        ("etcdserverpb.Maintenance", "MoveLeader", "unary"),
    ];

    /// A method, as its index in [`METHODS`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(usize)]
    pub enum Method {
        Range,
        Put,
        DeleteRange,
        Txn,
        Compact,
        Watch,
        LeaseGrant,
        LeaseRevoke,
        LeaseKeepAlive,
        LeaseTimeToLive,
        LeaseLeases,
        MemberAdd,
        MemberRemove,
        MemberUpdate,
        MemberList,
        MemberPromote,
        Alarm,
        Status,
        Defragment,
        Hash,
        HashKv,
        Snapshot,
        MoveLeader,
    }

    /// gRPC's codes by number, as go-grpc-prometheus labels them (`codes.Code.String()`).
    pub const CODES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];

    static STARTED: [AtomicU64; METHODS.len()] = [const { AtomicU64::new(0) }; METHODS.len()];
    static HANDLED: [[AtomicU64; CODES.len()]; METHODS.len()] =
        [const { [const { AtomicU64::new(0) }; CODES.len()] }; METHODS.len()];
    static RECEIVED: [AtomicU64; METHODS.len()] = [const { AtomicU64::new(0) }; METHODS.len()];
    static SENT: [AtomicU64; METHODS.len()] = [const { AtomicU64::new(0) }; METHODS.len()];

    /// A call began (`grpc_server_started_total`).
    pub fn started(method: Method) {
        STARTED[method as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A call ended with `code` (`grpc_server_handled_total`).
    pub fn handled(method: Method, code: tonic::Code) {
        let code = (code as usize).min(CODES.len() - 1);
        HANDLED[method as usize][code].fetch_add(1, Ordering::Relaxed);
    }

    /// A request message arrived (`grpc_server_msg_received_total`).
    pub fn received(method: Method) {
        RECEIVED[method as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A response message left (`grpc_server_msg_sent_total`).
    pub fn sent(method: Method) {
        SENT[method as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A unary call's whole life, as go-grpc-prometheus' interceptor counts it: started and
    /// one message received, handled with the outcome's code, and one message sent if it
    /// succeeded. Only `started` and `handled` are counted here (two atomics per call on the
    /// hot path); a unary call's messages follow from them when scraped (see [`snapshot`]).
    pub async fn unary<T>(
        method: Method,
        call: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        started(method);
        let result = call.await;
        handled(
            method,
            result
                .as_ref()
                .map_or_else(tonic::Status::code, |_| tonic::Code::Ok),
        );
        result
    }

    /// Every method's counts now. For a unary method, messages received are the calls
    /// started and messages sent the calls that ended `OK`.
    pub(super) fn snapshot() -> Vec<MethodCounts> {
        (0..METHODS.len())
            .map(|i| {
                let handled = std::array::from_fn(|c| HANDLED[i][c].load(Ordering::Relaxed));
                let started = STARTED[i].load(Ordering::Relaxed);
                let unary = METHODS[i].2 == "unary";
                MethodCounts {
                    started,
                    handled,
                    received: if unary {
                        started
                    } else {
                        RECEIVED[i].load(Ordering::Relaxed)
                    },
                    sent: if unary {
                        handled[0]
                    } else {
                        SENT[i].load(Ordering::Relaxed)
                    },
                }
            })
            .collect()
    }

    pub(super) struct MethodCounts {
        pub started: u64,
        pub handled: [u64; CODES.len()],
        pub received: u64,
        pub sent: u64,
    }

    /// Counts a streamed call's end when dropped: its code once the stream finished (`OK`,
    /// or the error that ended it), `Canceled` if the client went away first (etcd answers a
    /// canceled watch with `Canceled`).
    pub struct StreamCall {
        pub method: Method,
        /// The code the stream ended with, once it did.
        pub ended: Option<tonic::Code>,
    }

    impl StreamCall {
        pub fn start(method: Method) -> Self {
            started(method);
            StreamCall {
                method,
                ended: None,
            }
        }
    }

    impl Drop for StreamCall {
        fn drop(&mut self) {
            handled(self.method, self.ended.unwrap_or(tonic::Code::Cancelled));
        }
    }

    /// A streamed call's responses, counted: each message sent, and the end.
    pub struct Counted<S> {
        inner: std::pin::Pin<Box<S>>,
        call: StreamCall,
    }

    impl<S> Counted<S> {
        /// Counts the call as started now.
        pub fn new(method: Method, inner: S) -> Self {
            Counted {
                inner: Box::pin(inner),
                call: StreamCall::start(method),
            }
        }
    }

    impl<T, S: futures::Stream<Item = Result<T, tonic::Status>>> futures::Stream for Counted<S> {
        type Item = Result<T, tonic::Status>;

        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            let polled = self.inner.as_mut().poll_next(cx);
            match &polled {
                std::task::Poll::Ready(Some(Ok(_))) => sent(self.call.method),
                std::task::Poll::Ready(Some(Err(status))) => self.call.ended = Some(status.code()),
                std::task::Poll::Ready(None) => {
                    self.call.ended.get_or_insert(tonic::Code::Ok);
                }
                std::task::Poll::Pending => {}
            }
            polled
        }
    }
}

/// The exposition: families in Prometheus' text format 0.0.4.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

/// A metric family's type.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Self {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// One sample of the current family.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", format_value(value));
        self
    }

    /// A whole family of one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: f64) -> &mut Self {
        self.family(name, help, kind).sample(name, &[], value)
    }

    /// The samples of a histogram: cumulative buckets, `+Inf`, sum (seconds) and count.
    pub fn histogram<const N: usize>(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        h: &Histogram<N>,
    ) -> &mut Self {
        let mut cumulative = 0;
        for (i, bound) in h.bounds_nanos.iter().enumerate() {
            cumulative += h.buckets[i].load(Ordering::Relaxed);
            let le = format_value(*bound as f64 / 1e9);
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        cumulative += h.overflow.load(Ordering::Relaxed);
        let _ = write!(self.out, "{name}_bucket");
        self.labels(labels, Some("+Inf"));
        let _ = writeln!(self.out, " {cumulative}");
        let sum = h.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", format_value(sum));
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {cumulative}");
        self
    }

    /// The go-grpc-prometheus families for every method skerry serves, every code's row
    /// present from the start (as its `InitializeMetrics` does for etcd).
    pub fn grpc(&mut self) -> &mut Self {
        use grpc::{CODES, METHODS};
        let counts = grpc::snapshot();
        type Pick = fn(&grpc::MethodCounts) -> u64;
        let simple: [(&str, &str, Pick); 3] = [
            (
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
                |c| c.started,
            ),
            (
                "grpc_server_msg_received_total",
                "Total number of RPC stream messages received on the server.",
                |c| c.received,
            ),
            (
                "grpc_server_msg_sent_total",
                "Total number of gRPC stream messages sent by the server.",
                |c| c.sent,
            ),
        ];
        self.family(
            "grpc_server_handled_total",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            Kind::Counter,
        );
        for ((service, method, kind), c) in METHODS.iter().zip(&counts) {
            for (code, n) in CODES.iter().zip(c.handled) {
                self.sample(
                    "grpc_server_handled_total",
                    &[
                        ("grpc_code", code),
                        ("grpc_method", method),
                        ("grpc_service", service),
                        ("grpc_type", kind),
                    ],
                    n as f64,
                );
            }
        }
        for (name, help, pick) in simple {
            self.family(name, help, Kind::Counter);
            for ((service, method, kind), c) in METHODS.iter().zip(&counts) {
                self.sample(
                    name,
                    &[
                        ("grpc_method", method),
                        ("grpc_service", service),
                        ("grpc_type", kind),
                    ],
                    pick(c) as f64,
                );
            }
        }
        self
    }

    /// The process families Go's process collector gives etcd, and etcd's own `os_fd_*`,
    /// read from `/proc` (Linux; on another system they are left out). CPU times there are
    /// in `USER_HZ`, 100 on every Linux ABI (Prometheus' `procfs` assumes the same).
    pub fn process(&mut self) -> &mut Self {
        let Some(p) = ProcessStats::read() else {
            return self;
        };
        self.single(
            "os_fd_limit",
            "The file descriptor limit.",
            Kind::Gauge,
            p.max_fds,
        )
        .single(
            "os_fd_used",
            "The number of used file descriptors.",
            Kind::Gauge,
            p.open_fds,
        )
        .single(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            Kind::Counter,
            p.cpu_seconds,
        )
        .single(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            Kind::Gauge,
            p.max_fds,
        )
        .single(
            "process_open_fds",
            "Number of open file descriptors.",
            Kind::Gauge,
            p.open_fds,
        )
        .single(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            Kind::Gauge,
            p.resident_bytes,
        )
        .single(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            Kind::Gauge,
            p.start_time_seconds,
        )
        .single(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            Kind::Gauge,
            p.virtual_bytes,
        )
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        let all = labels.iter().copied().chain(le.map(|le| ("le", le)));
        for (name, value) in all {
            if !first {
                self.out.push(',');
            }
            first = false;
            let value = value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(self.out, "{name}=\"{value}\"");
        }
        self.out.push('}');
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// `USER_HZ`: the unit of the CPU and start times in `/proc` (fixed at 100 for user space).
const USER_HZ: f64 = 100.0;

/// This process as `/proc` describes it.
struct ProcessStats {
    cpu_seconds: f64,
    start_time_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    open_fds: f64,
    max_fds: f64,
}

impl ProcessStats {
    fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces:
        // state is field 3, utime 14, stime 15, starttime 22 (proc(5)).
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        let cpu_seconds = (field(14)? + field(15)?) / USER_HZ;
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
        let start_time_seconds = boot_time + field(22)? / USER_HZ;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let kib = |name: &str| {
            status.lines().find_map(|l| {
                let rest = l.strip_prefix(name)?.trim().strip_suffix("kB")?;
                rest.trim().parse::<f64>().ok().map(|k| k * 1024.0)
            })
        };
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let max_fds = limits.lines().find_map(|l| {
            let rest = l.strip_prefix("Max open files")?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })?;
        Some(ProcessStats {
            cpu_seconds,
            start_time_seconds,
            resident_bytes: kib("VmRSS:")?,
            virtual_bytes: kib("VmSize:")?,
            open_fds,
            max_fds,
        })
    }
}

/// A sample value: integers in full (Go's client writes those of a million and more in
/// exponent form; Prometheus parses both the same), others in their shortest form, `+Inf`.
fn format_value(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v.is_nan() {
        return "NaN".into();
    }
    if v == v.trunc() && v.abs() < 1e15 {
        return format!("{}", v as i64);
    }
    format!("{v}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_etcds_bounds() {
        let h = Histogram::new(DISK_BUCKETS_NANOS);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(10));
        let mut e = Exposition::new();
        e.family("x_seconds", "Help.", Kind::Histogram)
            .histogram("x_seconds", &[], &h);
        let text = e.finish();
        assert!(
            text.contains("x_seconds_bucket{le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{le=\"0.002\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{le=\"0.004\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{le=\"8.192\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("x_seconds_sum 10.0035\n"), "{text}");
        assert!(text.contains("x_seconds_count 3\n"), "{text}");
        let rtt = Histogram::new(RTT_BUCKETS_NANOS);
        let mut e = Exposition::new();
        e.histogram("r", &[("To", "a")], &rtt);
        let text = e.finish();
        assert!(
            text.contains("r_bucket{To=\"a\",le=\"0.0001\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("r_bucket{To=\"a\",le=\"3.2768\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn the_process_families_are_read_from_proc() {
        let mut e = Exposition::new();
        e.process();
        let text = e.finish();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        };
        assert!(value("process_resident_memory_bytes") > Some(0.0), "{text}");
        assert!(value("process_open_fds") > Some(0.0), "{text}");
        assert!(
            value("process_max_fds") >= value("process_open_fds"),
            "{text}"
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let started = value("process_start_time_seconds").unwrap_or(0.0);
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
    }

    #[tokio::test]
    async fn unary_calls_count_started_handled_and_their_messages() {
        use grpc::Method;
        let at = Method::MoveLeader as usize;
        let before = grpc::snapshot().swap_remove(at);
        let _ = grpc::unary(Method::MoveLeader, async { Ok::<_, tonic::Status>(()) }).await;
        let _ = grpc::unary(Method::MoveLeader, async {
            Err::<(), _>(tonic::Status::not_found("x"))
        })
        .await;
        let after = grpc::snapshot().swap_remove(at);
        assert_eq!(after.started - before.started, 2);
        assert_eq!(after.received - before.received, 2);
        assert_eq!(after.sent - before.sent, 1);
        assert_eq!(after.handled[0] - before.handled[0], 1);
        let not_found = tonic::Code::NotFound as usize;
        assert_eq!(after.handled[not_found] - before.handled[not_found], 1);
        assert_eq!(grpc::CODES[not_found], "NotFound");
        assert_eq!(grpc::METHODS[at].1, "MoveLeader");
    }

    #[test]
    fn families_have_help_type_and_escaped_labels() {
        let mut e = Exposition::new();
        e.single("a_total", "Counts a.", Kind::Counter, 3.0)
            .family("b", "Gauge b.", Kind::Gauge)
            .sample("b", &[("x", "q\"\\")], 0.5);
        assert_eq!(
            e.finish(),
            "# HELP a_total Counts a.\n# TYPE a_total counter\na_total 3\n\
             # HELP b Gauge b.\n# TYPE b gauge\nb{x=\"q\\\"\\\\\"} 0.5\n"
        );
    }
}
