//! The store handle ([`Store`]): what its threads share, how it is opened, and its reads.
//!
//! # Files
//! - this file: [`Store`], [`StoreConfig`], [`StoreStatus`], the state the threads share
//!   (`Shared`), and the reads, which run on the caller's thread (`status` asks the writer
//!   for the space in use).
//! - `open.rs`: opening a data dir (refusing one that is not ours or is in use), loading its
//!   tables, replaying the write-ahead log, starting the threads; closing.
//! - `writes.rs`: the client writes (put, delete, txn, compaction, leases, alarms, member
//!   attributes): the quota and request checks, then the proposal to the writer, or to the
//!   replicated log.
//! - `replicated.rs`: the store driven by a replicated log: committed entries in, snapshots
//!   pinned and installed, read indexes, leadership, membership; the
//!   [`crate::replication::StateMachine`] the Raft layer drives.
//! - `writer.rs`: the writer thread and its queue.
//! - `background.rs`: the other threads: the watch syncer, the lessor's expiry loop and the
//!   checkpoint ticker.
//!
//! What the writer does to the tables is not in this module: [`crate::apply`] changes them,
//! [`crate::state`] creates and loads them, [`crate::read`] reads them. The simulation's
//! [`crate::sync_store::SyncStore`] runs that same code without threads.
//!
//! # Threads
//! - The **writer** owns every write to redb and to the write-ahead log ([`crate::wal`]). It
//!   takes all commands waiting in its queue (up to [`WRITE_BATCH_COMMANDS_MAX`]), applies
//!   them in order in one redb transaction with the applied index, appends them to the log and
//!   syncs it (one `fdatasync` for the whole batch: group commit), commits the redb
//!   transaction without an fsync, then publishes the new revision, hands the events to the
//!   watch hub and answers every caller. Every [`CHECKPOINT_COMMANDS`] commands (or
//!   [`CHECKPOINT_INTERVAL`]) it commits redb durably and deletes the log segments that commit
//!   covers. Between batches it runs physical compaction in bounded steps.
//! - The **checkpoint ticker** asks the writer for a durable redb commit now and then, so an
//!   idle store does not keep a long log to replay.
//! - The **syncer** replays history from disk to watchers that start in the past or fell
//!   behind, and sends periodic progress notifications.
//! - The **lessor** thread proposes revocations of expired leases.
//!
//! # Recovery
//! Opening replays the log records after redb's applied index through the same apply path,
//! so a crash loses nothing that was acknowledged: what redb lost with its last non-durable
//! commits is in the log.
//!
//! Reads run on the caller's thread against a redb read transaction and the shared index,
//! at the published revision: a write is visible to reads exactly when it is acknowledged.
//!
//! # Raft snapshots
//! A replicated store hands its log a [`PinnedSnapshot`] (one read transaction, with the
//! applied index and membership it holds) to send to a member that is too far behind, and
//! installs one it receives with [`Store::install_snapshot`]: the writer replaces every table
//! in one durable transaction, in queue order, and swaps the in-memory state. Readers that
//! combine memory with a read transaction ([`Store::range`], the syncer) notice an install
//! that overlapped them by the install generation and read again.
//!
//! # Invariants
//! - Only the writer writes redb and the log; everything else sends it a message.
//! - The applied index, revision and watch events of a batch are published only once the
//!   batch is durable; a caller is answered after that.
//! - Once the writer has failed (`Shared::failed`) the store refuses all work until it is
//!   opened again: memory may be ahead of the last good commit.

mod background;
mod open;
mod replicated;
mod writer;
mod writes;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, oneshot};

use self::writer::WriterMsg;
use crate::alarm::Alarms;
use crate::error::StoreError;
use crate::lease::Lessor;
use crate::mvcc::{self, KV, Mvcc};
use crate::pb::etcdserverpb::{
    AlarmMember, AlarmType, RangeRequest, RangeResponse, ResponseHeader,
};
use crate::pb::mvccpb::Event;
use crate::quota;
use crate::read::{hash_kv, read_history};
use crate::replication::Replicator;
use crate::wal::WAL_SEGMENT_BYTES;
use crate::watch::WatchHub;

pub use self::background::{
    LEASE_EXPIRY_CHECK_INTERVAL, LEASE_REVOKES_PER_CHECK_MAX, PROGRESS_NOTIFY_INTERVAL_DEFAULT,
    WATCH_SYNC_INTERVAL, WATCH_SYNC_REVISIONS_MAX, WATCH_SYNC_WATCHERS_MAX,
};
pub use self::open::{DB_FILE_NAME, WAL_DIR_NAME};
pub use self::writer::{
    CHECKPOINT_COMMANDS, CHECKPOINT_INTERVAL, DEFRAGMENT_ATTEMPTS_MAX, DEFRAGMENT_RETRY_DELAY,
    WRITE_BATCH_COMMANDS_MAX, WRITE_QUEUE_MAX,
};
pub use crate::apply::{COMPACTION_BATCH_KEYS, CommandResult};
pub use crate::read::PinnedSnapshot;

/// Attempts a read makes while snapshot installs overlap it (see [`Store::range`]). A read
/// retries only when an install swapped the store under it, and installs come one at a time,
/// each behind an fsync, so a second attempt nearly always succeeds; more than this means the
/// log is installing snapshots back to back, and the read fails rather than spin.
/// Semi-arbitrary.
pub const INSTALL_READ_ATTEMPTS_MAX: u32 = 8;

/// How the store is opened.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub data_dir: PathBuf,
    /// Interval of progress notifications to watchers that asked for them.
    pub progress_notify_interval: Duration,
    /// Size write-ahead log segments are preallocated to.
    pub wal_segment_bytes: u64,
    /// Commands come committed from a replicated log (Raft) through
    /// [`Store::apply_committed`]; the store keeps no log of its own. See
    /// [`crate::replication`].
    pub replicated: bool,
    /// The cluster and member ids a replicated member is known by; they replace the random
    /// ones a single store picks for itself.
    pub identity: Option<(u64, u64)>,
    /// This member's space quota in bytes (`--quota-backend-bytes`, see [`crate::quota`]);
    /// `None` disables it.
    pub quota: Option<u64>,
}

impl StoreConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            progress_notify_interval: PROGRESS_NOTIFY_INTERVAL_DEFAULT,
            wal_segment_bytes: WAL_SEGMENT_BYTES,
            replicated: false,
            identity: None,
            quota: Some(quota::QUOTA_BYTES_DEFAULT),
        }
    }
}

/// How long a replicated write or read waits for the cluster: etcd's request timeout
/// (5 s + 2 × the 1 s election timeout), long enough to ride out one election.
pub const REPLICATED_REQUEST_TIMEOUT: Duration = Duration::from_secs(7);

/// What the threads share.
struct Shared {
    mvcc: Mvcc,
    /// The database. Shared for every transaction; taken exclusively only by defragment, which
    /// needs `&mut Database` and no transaction in flight.
    db: RwLock<Database>,
    hub: WatchHub,
    path: PathBuf,
    cluster_id: u64,
    member_id: u64,
    /// The command index of the last applied command.
    applied_index: std::sync::atomic::AtomicU64,
    stopping: AtomicBool,
    /// Durable commits (log syncs) made by the writer: with group commit, fewer than the
    /// writes.
    durable_commits: std::sync::atomic::AtomicU64,
    /// Durable redb commits (checkpoints) made by the writer.
    checkpoints: std::sync::atomic::AtomicU64,
    /// Commands replayed from the log when the store was opened.
    replayed: usize,
    /// The replicated log writes go to, when the store is a member of a cluster.
    replicator: OnceLock<Arc<dyn Replicator>>,
    replicated: bool,
    /// This member decides lease expiry (a single store always; a cluster member while it
    /// is the leader).
    lease_authority: AtomicBool,
    raft_term: AtomicU64,
    /// The published applied index, for readers waiting on a read index.
    applied_watch: tokio::sync::watch::Sender<u64>,
    /// The applied index of the last durable redb commit: a replicated log must keep every
    /// entry after it.
    durable_applied: AtomicU64,
    /// Set when the writer could not commit: the store refuses further work.
    failed: AtomicBool,
    /// Odd while a snapshot install swaps the store's rows and memory (a seqlock's sequence):
    /// changed by the writer only while it holds the index write lock. A reader that combines
    /// memory with a read transaction loads it before and after, and reads again if it moved.
    install_generation: AtomicU64,
    sync_wakeup: (Mutex<bool>, Condvar),
    progress_notify_interval: Duration,
    /// This member's space quota (see [`crate::quota`]).
    quota: Option<u64>,
    /// The backend's size in bytes (the database file's length), measured by the writer
    /// after every commit: what the quota is checked against.
    backend_bytes: AtomicU64,
    /// The active alarms as of the published applied index.
    alarms: RwLock<Alarms>,
}

impl Shared {
    /// Whether this member's `NOSPACE` alarm is active: raising it again would change
    /// nothing, so nothing is proposed.
    fn nospace_raised_here(&self) -> bool {
        self.alarms
            .read()
            .list(AlarmType::Nospace as i32)
            .iter()
            .any(|a| a.member_id == self.member_id)
    }

    fn wake_syncer(&self) {
        let (flag, condvar) = &self.sync_wakeup;
        *flag.lock() = true;
        condvar.notify_one();
    }
}

/// A single-node store. Cloning is cheap; the store stops when [`Store::close`] is called or
/// the last clone is dropped.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
    writer: mpsc::Sender<WriterMsg>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    _guard: Arc<StopGuard>,
}

/// Stops the background threads when the last handle goes.
struct StopGuard {
    shared: Arc<Shared>,
    writer: mpsc::Sender<WriterMsg>,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        let _ = self.writer.try_send(WriterMsg::Shutdown);
        self.shared.wake_syncer();
    }
}

/// Status of this member, for the Maintenance API.
#[derive(Debug, Clone)]
pub struct StoreStatus {
    pub revision: i64,
    pub compact_revision: i64,
    pub applied_index: u64,
    pub db_size: u64,
    pub db_size_in_use: u64,
}

/// The Raft term a single store reports: one member, one term.
const RAFT_TERM: u64 = 1;

impl Store {
    pub fn cluster_id(&self) -> u64 {
        self.shared.cluster_id
    }

    pub fn member_id(&self) -> u64 {
        self.shared.member_id
    }

    /// The last committed revision.
    pub fn revision(&self) -> i64 {
        self.shared.mvcc.current_rev()
    }

    pub fn compact_revision(&self) -> i64 {
        self.shared.mvcc.compact_rev()
    }

    /// A response header at `revision`.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.shared.cluster_id,
            member_id: self.shared.member_id,
            revision,
            raft_term: self.shared.raft_term.load(Ordering::Relaxed),
        }
    }

    /// Durable (fsynced) commits so far: how well writes are being grouped.
    pub fn durable_commits(&self) -> u64 {
        self.shared.durable_commits.load(Ordering::Relaxed)
    }

    /// Durable redb commits (checkpoints) so far.
    pub fn checkpoints(&self) -> u64 {
        self.shared.checkpoints.load(Ordering::Relaxed)
    }

    /// Commands replayed from the write-ahead log when this store was opened: those the
    /// last run acknowledged after its last checkpoint.
    pub fn replayed_at_open(&self) -> usize {
        self.shared.replayed
    }

    /// Keys in the keyspace now, deleted ones left out (`etcd_debugging_mvcc_keys_total`).
    /// Walks the index under its read lock: for scrapes, not for a request's path.
    pub fn key_count(&self) -> usize {
        self.shared.mvcc.index.read().live_len()
    }

    pub fn hub(&self) -> &WatchHub {
        &self.shared.hub
    }

    /// The data dir this store lives in.
    pub fn data_dir(&self) -> &Path {
        self.shared.path.parent().unwrap_or(Path::new("."))
    }

    /// Range at the published revision (or `req.revision`).
    ///
    /// The revision and the index come from memory, the rows from a read transaction; a
    /// snapshot install that lands in between makes them disagree (a missing row, or the
    /// wrong one), so the read is repeated until no install overlapped it.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, StoreError> {
        crate::validate::range(req)?;
        self.read_consistent(|| {
            let current = self.shared.mvcc.current_rev();
            let txn = self.shared.db.read().begin_read()?;
            let table = txn.open_table(KV)?;
            let mut resp = mvcc::range(&table, &self.shared.mvcc, req, current)?;
            resp.header = Some(self.header(current));
            Ok(resp)
        })
    }

    /// Runs `read`, which combines in-memory state with a redb read transaction it begins
    /// itself, until no snapshot install overlapped it (see [`Shared::install_generation`]);
    /// at most [`INSTALL_READ_ATTEMPTS_MAX`] times. Whatever `read` returned while an install
    /// overlapped it, error or not, is discarded.
    fn read_consistent<T>(
        &self,
        mut read: impl FnMut() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let generation = &self.shared.install_generation;
        for _ in 0..INSTALL_READ_ATTEMPTS_MAX {
            let before = generation.load(Ordering::SeqCst);
            if !before.is_multiple_of(2) {
                // The install holds the index write lock until it is done: wait there.
                drop(self.shared.mvcc.index.read());
                continue;
            }
            let result = read();
            if generation.load(Ordering::SeqCst) == before {
                return result;
            }
        }
        Err(StoreError::Storage(format!(
            "a read was overlapped by snapshot installs {INSTALL_READ_ATTEMPTS_MAX} times"
        )))
    }

    /// The rows of history from revision `from` through `through`, as watch events.
    pub fn history(&self, from: i64, through: i64) -> Result<Vec<Event>, StoreError> {
        self.read_consistent(|| {
            let txn = self.shared.db.read().begin_read()?;
            read_history(&txn, &self.shared.mvcc, from, through)
        })
    }

    /// Writes a consistent snapshot of the whole store to `out`; see [`crate::snapshot`].
    pub fn snapshot(&self, out: &mut impl std::io::Write) -> Result<i64, StoreError> {
        let txn = self.shared.db.read().begin_read()?;
        crate::snapshot::write(&txn, out)
    }

    /// A CRC-32 over every retained row up to `revision` (0: the current one), and the
    /// compacted revision: members holding the same history give the same hash. Rows are
    /// skerry's, so the number is comparable between skerry members, not with etcd's.
    pub fn hash_kv(&self, revision: i64) -> Result<(u32, i64), StoreError> {
        self.read_consistent(|| self.hash_kv_once(revision))
    }

    fn hash_kv_once(&self, revision: i64) -> Result<(u32, i64), StoreError> {
        let txn = self.shared.db.read().begin_read()?;
        hash_kv(&txn, &self.shared.mvcc, revision)
    }

    /// `(remaining TTL, granted TTL, keys)`, or `None` for an unknown lease.
    pub fn lease_time_to_live(&self, id: i64, keys: bool) -> Option<(i64, i64, Vec<Bytes>)> {
        let lessor = self.shared.mvcc.lessor.lock();
        let lease = lessor.get(id)?;
        let remaining = Lessor::remaining_seconds(lease, Instant::now());
        let attached = if keys {
            lease.keys.iter().cloned().collect()
        } else {
            Vec::new()
        };
        Some((remaining, lease.ttl_seconds, attached))
    }

    pub fn lease_ids(&self) -> Vec<i64> {
        self.shared.mvcc.lessor.lock().ids()
    }

    pub async fn status(&self) -> Result<StoreStatus, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(WriterMsg::Stats { reply }).await?;
        let in_use = rx.await.map_err(|_| StoreError::Stopped)??;
        let db_size = fs::metadata(&self.shared.path)
            .map(|m| m.len())
            .unwrap_or(0);
        Ok(StoreStatus {
            revision: self.revision(),
            compact_revision: self.compact_revision(),
            applied_index: self.shared.applied_index.load(Ordering::Acquire),
            db_size,
            db_size_in_use: in_use.min(db_size),
        })
    }

    /// The active alarms, as this member last applied them (no read of the cluster): what a
    /// health check reports (etcd's `/health` is false while any is active).
    pub fn alarms(&self) -> Vec<AlarmMember> {
        self.shared.alarms.read().all()
    }

    /// The backend's size in bytes as the quota sees it, and the quota.
    pub fn quota_usage(&self) -> (u64, Option<u64>) {
        (
            self.shared.backend_bytes.load(Ordering::Acquire),
            self.shared.quota,
        )
    }
}

/// A file's length in bytes; 0 if it cannot be read (the writer measures again after its
/// next commit).
fn file_bytes(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn unexpected(result: &CommandResult) -> StoreError {
    StoreError::Storage(format!(
        "writer answered with the wrong result kind: {result:?}"
    ))
}
