//! The store handle: opening a data dir, the group-commit writer, reads, leases, watches.
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

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use prost::Message;
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    WriteTransaction,
};
use tokio::sync::{mpsc, oneshot};
use tracing::{error, info, warn};

use crate::alarm::{Alarms, Applier};
use crate::error::StoreError;
use crate::index::KeyIndex;
use crate::lease::{LEASE_TTL_MAX_SECONDS, LEASE_TTL_MIN_SECONDS, Lessor};
use crate::mvcc::{
    self, ALARMS, Apply, KV, LEASES, MEMBERS, META, META_APPLIED_INDEX, META_CLUSTER_ID,
    META_COMPACT_FINISHED, META_COMPACT_REVISION, META_FORMAT, META_MEMBER_ID, META_REVISION, Mvcc,
    RAFT, RAFT_CONF_STATE, RAFT_SNAPSHOT_INDEX, RAFT_SNAPSHOT_TERM,
};
use crate::pb::command::{Command, Member, command::Command as Cmd};
use crate::pb::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionRequest, DeleteRangeRequest,
    DeleteRangeResponse, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, PutResponse,
    RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
    alarm_request::AlarmAction,
};
use crate::pb::mvccpb::{Event, event::EventType};
use crate::quota::{self, QuotaCheck};
use crate::replication::{Committed, Replicator};
use crate::rev::Rev;
use crate::wal::{WAL_SEGMENT_BYTES, Wal};
use crate::watch::WatchHub;

/// Commands applied in one redb transaction and made durable by one log fsync. Larger batches
/// amortize the fsync further but delay the first caller of the batch and hold more results
/// in memory; etcd's backend commits every 10,000 ops or 100 ms. 1,024 covers any realistic
/// number of concurrent clients while keeping one batch's apply time in the low milliseconds.
pub const WRITE_BATCH_COMMANDS_MAX: usize = 1_024;

/// Commands that may wait for the writer. Callers beyond it wait on the queue (back-pressure)
/// instead of growing memory without bound.
pub const WRITE_QUEUE_MAX: usize = 16_384;

/// Commands after which the writer commits redb durably (a checkpoint) and frees the log
/// segments it covers: etcd's backend batch limit. It bounds the log replayed at startup to
/// about this many commands (well under a second), while hot btree pages rewritten by many
/// batches in between reach the disk once instead of once per batch.
pub const CHECKPOINT_COMMANDS: u64 = 10_000;

/// Longest time between checkpoints while there are commands that only the log holds, so
/// that a store under light load also keeps its log short.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

/// How often the checkpoint ticker wakes: short, so that it notices a stopping store
/// quickly; it asks for a checkpoint only every [`CHECKPOINT_INTERVAL`].
const CHECKPOINT_TICK: Duration = Duration::from_millis(100);

/// Name of the write-ahead log directory inside the data dir.
pub const WAL_DIR_NAME: &str = "wal";

/// Keys whose history one physical-compaction step drops (etcd's `compactionBatchLimit`).
/// Each step is one redb transaction between client batches, so writes never wait behind
/// more than one step.
pub const COMPACTION_BATCH_KEYS: usize = 1_000;

/// How often the syncer looks for watchers to replay when nothing woke it (etcd: 100 ms).
pub const WATCH_SYNC_INTERVAL: Duration = Duration::from_millis(100);

/// Revisions of history one syncer round reads from disk (etcd's `watchBatchMaxRevs`).
/// Bounds the memory one round holds; a watcher far behind catches up over several rounds.
pub const WATCH_SYNC_REVISIONS_MAX: i64 = 1_000;

/// Unsynced watchers served per round (etcd's `maxWatchersPerSync`).
pub const WATCH_SYNC_WATCHERS_MAX: usize = 512;

/// etcd's default `--experimental-watch-progress-notify-interval`.
pub const PROGRESS_NOTIFY_INTERVAL_DEFAULT: Duration = Duration::from_secs(600);

/// How often expired leases are looked for (etcd checks every 500 ms).
pub const LEASE_EXPIRY_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Revocations proposed per check: etcd's `leaseRevokeRate` of 1,000/s at two checks a
/// second. A mass expiry (a rebooted fleet) then cannot flood the write path.
pub const LEASE_REVOKES_PER_CHECK_MAX: usize = 500;

/// Attempts to get exclusive use of the database file for a defragmentation; each waits
/// [`DEFRAGMENT_RETRY_DELAY`] for in-flight reads to finish.
pub const DEFRAGMENT_ATTEMPTS_MAX: u32 = 200;
pub const DEFRAGMENT_RETRY_DELAY: Duration = Duration::from_millis(5);

/// Attempts a read makes while snapshot installs overlap it (see [`Store::range`]). A read
/// retries only when an install swapped the store under it, and installs come one at a time,
/// each behind an fsync, so a second attempt nearly always succeeds; more than this means the
/// log is installing snapshots back to back, and the read fails rather than spin.
/// Semi-arbitrary.
pub const INSTALL_READ_ATTEMPTS_MAX: u32 = 8;

/// The name of the store file inside the data dir.
pub const DB_FILE_NAME: &str = "skerry.redb";

/// The first bytes of every redb file; anything else in our file's place is not ours.
const REDB_MAGIC: &[u8] = b"redb";

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

/// The result of one applied command.
#[derive(Debug, Clone)]
pub enum CommandResult {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact {
        revision: i64,
    },
    LeaseGrant {
        id: i64,
        ttl: i64,
        revision: i64,
    },
    LeaseRevoke {
        revision: i64,
    },
    /// A member's attributes were recorded.
    MemberPublished,
    /// A membership change was recorded (members and `ConfState`).
    Membership,
    /// An alarm was raised or cleared: the alarms it concerned, as etcd answers (no header).
    Alarm(AlarmResponse),
}

use crate::replication::Reply;

/// How long a replicated write or read waits for the cluster: etcd's request timeout
/// (5 s + 2 × the 1 s election timeout), long enough to ride out one election.
pub const REPLICATED_REQUEST_TIMEOUT: Duration = Duration::from_secs(7);

/// A command on its way to the writer.
struct Pending {
    /// The log index, for commands from a replicated log; a single store numbers its own.
    index: Option<u64>,
    /// `None`: a log entry without a command, which only moves the applied index.
    command: Option<Command>,
    /// Physical compaction: answer once the rows are gone.
    physical: bool,
    reply: Option<Reply>,
}

enum WriterMsg {
    Command(Pending),
    Defragment {
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Stats {
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Commit redb durably if the log holds commands it does not.
    Checkpoint,
    /// Replace the store's contents with a snapshot (see [`Store::install_snapshot`]). A
    /// barrier: the batch that takes it ends with it, so it follows every command queued
    /// before it and precedes every one after.
    InstallSnapshot {
        path: PathBuf,
        index: u64,
        term: u64,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Shutdown,
}

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

impl Store {
    /// Opens (or creates) the store in `config.data_dir`.
    pub fn open(config: StoreConfig) -> Result<Store, StoreError> {
        let db = open_database(&config.data_dir)?;
        let path = config.data_dir.join(DB_FILE_NAME);
        let Loaded {
            state: loaded,
            cluster_id,
            member_id,
        } = load(&db, config.identity)?;
        let mut cursor = loaded.cursor();
        let compact_finished = loaded.compact_finished;
        let mvcc = loaded.into_mvcc();
        let (wal, records) = if config.replicated {
            // The replicated log replays what redb lost; a log of our own would be a second
            // fsync per write.
            (None, Vec::new())
        } else {
            let (wal, records) = Wal::open(
                &config.data_dir.join(WAL_DIR_NAME),
                cursor.applied_index,
                config.wal_segment_bytes,
            )?;
            (Some(wal), records)
        };
        let replayed = records.len();
        replay(&db, &mvcc, records, &mut cursor)?;
        let (revision, applied_index) = (cursor.rev, cursor.applied_index);
        info!(
            data_dir = %config.data_dir.display(),
            revision,
            compact_revision = mvcc.compact_rev(),
            keys = mvcc.index.read().len(),
            replayed,
            "opened store"
        );
        let compact_revision = mvcc.compact_rev();
        let alarms = mvcc.alarms.lock().clone();
        if !alarms.is_empty() {
            warn!(
                alarms = ?alarms.all(),
                "alarms are active; writes are limited until they are cleared (etcdctl alarm \
                 disarm)"
            );
        }
        let backend_bytes = file_bytes(&path);
        let shared = Arc::new(Shared {
            mvcc,
            db: RwLock::new(db),
            hub: WatchHub::new(revision, cluster_id, member_id, RAFT_TERM),
            path,
            cluster_id,
            member_id,
            applied_index: applied_index.into(),
            stopping: AtomicBool::new(false),
            durable_commits: 0.into(),
            checkpoints: 0.into(),
            replayed,
            replicator: OnceLock::new(),
            replicated: config.replicated,
            lease_authority: AtomicBool::new(!config.replicated),
            raft_term: AtomicU64::new(if config.replicated { 0 } else { RAFT_TERM }),
            applied_watch: tokio::sync::watch::Sender::new(applied_index),
            durable_applied: AtomicU64::new(applied_index),
            failed: AtomicBool::new(false),
            install_generation: AtomicU64::new(0),
            sync_wakeup: (Mutex::new(false), Condvar::new()),
            progress_notify_interval: config.progress_notify_interval,
            quota: config.quota,
            backend_bytes: AtomicU64::new(backend_bytes),
            alarms: RwLock::new(alarms),
        });
        if !config.replicated {
            // A single store leads itself from its start, as a one-member etcd's first
            // election makes it leader once.
            crate::metrics::LEADER_CHANGES.fetch_add(1, Ordering::Relaxed);
        }
        let (tx, rx) = mpsc::channel(WRITE_QUEUE_MAX);
        let mut writer = Writer {
            shared: shared.clone(),
            rx,
            cursor,
            compaction: None,
            physical_waiters: Vec::new(),
            wal,
            unchecked: 0,
            last_checkpoint: Instant::now(),
            encoded: Vec::new(),
        };
        if compact_finished < compact_revision {
            writer.compaction = Some(CompactionJob {
                at: compact_revision,
                cursor: None,
            });
        }
        let mut threads = Vec::new();
        threads.push(spawn("skerry-writer", move || writer.run())?);
        let syncer_shared = shared.clone();
        threads.push(spawn("skerry-watch-sync", move || {
            run_syncer(&syncer_shared)
        })?);
        let lessor_shared = shared.clone();
        let lessor_tx = tx.clone();
        threads.push(spawn("skerry-lessor", move || {
            run_lessor(&lessor_shared, &lessor_tx)
        })?);
        let ticker_shared = shared.clone();
        let ticker_tx = tx.clone();
        threads.push(spawn("skerry-checkpoint", move || {
            run_checkpoint_ticker(&ticker_shared, &ticker_tx)
        })?);
        Ok(Store {
            _guard: Arc::new(StopGuard {
                shared: shared.clone(),
                writer: tx.clone(),
            }),
            shared,
            writer: tx,
            threads: Arc::new(Mutex::new(threads)),
        })
    }

    /// Stops the background threads and waits for them, so the data dir can be opened again.
    pub fn close(self) {
        self.shared.stopping.store(true, Ordering::Release);
        let _ = self.writer.try_send(WriterMsg::Shutdown);
        self.shared.wake_syncer();
        let threads = std::mem::take(&mut *self.threads.lock());
        for thread in threads {
            let _ = thread.join();
        }
    }

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

    /// A put, checked against this member's quota first (before the request's own checks,
    /// as etcd's quota layer sits in front of its KV service).
    pub async fn put(&self, req: PutRequest) -> Result<PutResponse, StoreError> {
        self.check_quota(quota::put_cost(&req)).await?;
        crate::validate::put(&req)?;
        let result = self.propose(Cmd::Put(req), false).await;
        match self.after_quota(result).await? {
            CommandResult::Put(mut resp) => {
                resp.header = Some(self.header(header_revision(&resp.header)));
                Ok(resp)
            }
            other => Err(unexpected(&other)),
        }
    }

    pub async fn delete_range(
        &self,
        req: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, StoreError> {
        crate::validate::delete_range(&req)?;
        match self.propose(Cmd::DeleteRange(req), false).await? {
            CommandResult::DeleteRange(mut resp) => {
                resp.header = Some(self.header(header_revision(&resp.header)));
                Ok(resp)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// A txn, checked against this member's quota first (one without puts costs nothing and
    /// always passes).
    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, StoreError> {
        self.check_quota(quota::txn_cost(&req)).await?;
        crate::validate::txn(&req)?;
        let result = self.propose(Cmd::Txn(req), false).await;
        match self.after_quota(result).await? {
            CommandResult::Txn(mut resp) => {
                resp.header = Some(self.header(header_revision(&resp.header)));
                Ok(resp)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Compacts history below `revision`. With `physical`, answers only once the old rows are
    /// gone from disk.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<i64, StoreError> {
        let req = CompactionRequest { revision, physical };
        match self.propose(Cmd::Compaction(req), physical).await? {
            CommandResult::Compact { revision } => Ok(revision),
            other => Err(unexpected(&other)),
        }
    }

    /// Grants a lease. `id == 0` lets the store choose; TTLs below the minimum are raised.
    /// Checked against this member's quota first.
    pub async fn lease_grant(&self, ttl: i64, id: i64) -> Result<(i64, i64), StoreError> {
        self.check_quota(quota::LEASE_GRANT_COST).await?;
        if ttl > LEASE_TTL_MAX_SECONDS {
            return Err(StoreError::LeaseTtlTooLarge);
        }
        let ttl = ttl.max(LEASE_TTL_MIN_SECONDS);
        let id = if id == 0 { self.fresh_lease_id() } else { id };
        let result = self
            .propose(Cmd::LeaseGrant(LeaseGrantRequest { ttl, id }), false)
            .await;
        match self.after_quota(result).await? {
            CommandResult::LeaseGrant { id, ttl, .. } => Ok((id, ttl)),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn lease_revoke(&self, id: i64) -> Result<i64, StoreError> {
        match self
            .propose(Cmd::LeaseRevoke(LeaseRevokeRequest { id }), false)
            .await?
        {
            CommandResult::LeaseRevoke { revision } => Ok(revision),
            other => Err(unexpected(&other)),
        }
    }

    /// Renews a lease; `None` if it does not exist (the client then sees TTL 0).
    pub fn lease_keep_alive(&self, id: i64) -> Option<i64> {
        let ttl = self.shared.mvcc.lessor.lock().keep_alive(id);
        if ttl.is_some()
            && !self.is_lease_authority()
            && let Some(replicator) = self.shared.replicator.get()
        {
            replicator.renew_lease(id);
        }
        ttl
    }

    /// A renewal a follower passed on: moves the deadline here, where expiry is decided.
    pub fn lease_renewed_elsewhere(&self, id: i64) {
        let _ = self.shared.mvcc.lessor.lock().keep_alive(id);
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

    /// A positive lease id not in use (etcd's are positive 63-bit numbers).
    fn fresh_lease_id(&self) -> i64 {
        let lessor = self.shared.mvcc.lessor.lock();
        loop {
            let id = rand::random::<i64>() & i64::MAX;
            if id != 0 && !lessor.contains(id) {
                return id;
            }
        }
    }

    /// Rewrites the database file without its free space.
    pub async fn defragment(&self) -> Result<(), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(WriterMsg::Defragment { reply }).await?;
        rx.await.map_err(|_| StoreError::Stopped)?
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

    /// Writes a consistent snapshot of the whole store to `out`; see [`crate::snapshot`].
    pub fn snapshot(&self, out: &mut impl std::io::Write) -> Result<i64, StoreError> {
        let txn = self.shared.db.read().begin_read()?;
        crate::snapshot::write(&txn, out)
    }

    /// The rows of history from revision `from` through `through`, as watch events.
    pub fn history(&self, from: i64, through: i64) -> Result<Vec<Event>, StoreError> {
        self.read_consistent(|| {
            let txn = self.shared.db.read().begin_read()?;
            read_history(&txn, &self.shared.mvcc, from, through)
        })
    }

    /// Pins the store as it is now for a Raft snapshot: one read transaction, with the
    /// applied index, revision and `ConfState` it holds. Writes go on meanwhile; the pinned
    /// view does not move. See [`PinnedSnapshot`] for what holding it costs.
    pub fn pin_snapshot(&self) -> Result<PinnedSnapshot, StoreError> {
        pin(&self.shared.db.read())
    }

    /// Replaces this member's whole store with the snapshot file at `path`, which holds the
    /// state after log entry `index` of term `term` (a leader's [`PinnedSnapshot`]).
    /// Blocking: call it from the log's own thread, not from async code.
    ///
    /// The writer takes it in queue order, after every entry handed over before it. It checks
    /// the file's digest, replaces every table in one durable transaction (the member keeps
    /// its own cluster and member ids), records `(index, term)` for
    /// [`Store::installed_snapshot`], then swaps the in-memory state: reads and watchers
    /// continue from the snapshot's history, and the next entry to apply is `index + 1`.
    /// On error nothing has changed.
    ///
    /// Only a replicated store installs snapshots, and never one behind what it has applied.
    ///
    /// # Panics
    /// When called from inside an async runtime (it blocks on the writer, as
    /// [`Store::apply_committed`] does).
    pub fn install_snapshot(&self, path: &Path, index: u64, term: u64) -> Result<(), StoreError> {
        if !self.shared.replicated {
            return Err(StoreError::Storage(
                "only a replicated store installs snapshots".into(),
            ));
        }
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(StoreError::Stopped);
        }
        let (reply, rx) = oneshot::channel();
        self.writer
            .blocking_send(WriterMsg::InstallSnapshot {
                path: path.to_path_buf(),
                index,
                term,
                reply,
            })
            .map_err(|_| StoreError::Stopped)?;
        rx.blocking_recv().map_err(|_| StoreError::Stopped)?
    }

    /// The log index and term of the last snapshot installed into this store, if any. The
    /// store records them in the install's own transaction, so after a crash between the
    /// store's install and the log's own update they tell the log where the store stands.
    pub fn installed_snapshot(&self) -> Result<Option<(u64, u64)>, StoreError> {
        read_installed_snapshot(&self.shared.db.read().begin_read()?)
    }

    /// raft-rs's encoded `ConfState` as of the last applied membership change (or installed
    /// snapshot); `None` before there was one.
    pub fn conf_state(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.shared.db.read().begin_read()?;
        raft_record(&txn, RAFT_CONF_STATE)
    }

    async fn propose(&self, command: Cmd, physical: bool) -> Result<CommandResult, StoreError> {
        let _pending = crate::metrics::Pending::start();
        let result = self.propose_inner(command, physical).await;
        if let Err(
            StoreError::NoLeader
            | StoreError::LeaderChanged
            | StoreError::Timeout
            | StoreError::Stopped,
        ) = &result
        {
            crate::metrics::PROPOSALS_FAILED.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn propose_inner(
        &self,
        command: Cmd,
        physical: bool,
    ) -> Result<CommandResult, StoreError> {
        let (reply, rx) = oneshot::channel();
        let command = Command {
            command: Some(command),
        };
        if self.shared.replicated {
            let replicator = self.shared.replicator.get().ok_or(StoreError::NoLeader)?;
            replicator.submit(command, reply);
            return match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, rx).await {
                Ok(result) => result.map_err(|_| StoreError::Timeout)?,
                Err(_) => Err(StoreError::Timeout),
            };
        }
        self.send(WriterMsg::Command(Pending {
            index: None,
            command: Some(command),
            physical,
            reply: Some(reply),
        }))
        .await?;
        rx.await.map_err(|_| StoreError::Stopped)?
    }

    /// Connects a replicated store to its log. Once only; later calls are ignored.
    pub fn set_replicator(&self, replicator: Arc<dyn Replicator>) {
        let _ = self.shared.replicator.set(replicator);
    }

    /// Hands committed log entries to the writer, in index order. Blocks while the writer's
    /// queue is full (back-pressure on the log's apply loop).
    pub fn apply_committed(&self, entries: Vec<Committed>) -> Result<(), StoreError> {
        for entry in entries {
            let msg = WriterMsg::Command(Pending {
                index: Some(entry.index),
                command: entry.command,
                physical: false,
                reply: entry.reply,
            });
            self.writer
                .blocking_send(msg)
                .map_err(|_| StoreError::Stopped)?;
        }
        Ok(())
    }

    /// The last applied (and published) log index.
    pub fn applied_index(&self) -> u64 {
        self.shared.applied_index.load(Ordering::Acquire)
    }

    /// The applied index of the last durable redb commit. A replicated log must keep the
    /// entries after it: they are what a crash would make the store replay.
    pub fn durable_applied_index(&self) -> u64 {
        self.shared.durable_applied.load(Ordering::Acquire)
    }

    /// Waits until the store has applied (and published) `index`.
    pub async fn wait_applied(&self, index: u64) -> Result<(), StoreError> {
        let mut rx = self.shared.applied_watch.subscribe();
        let wait = rx.wait_for(|applied| *applied >= index);
        match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(StoreError::Stopped),
            Err(_) => Err(StoreError::Timeout),
        }
    }

    /// Makes the next read linearizable: in a cluster, one ReadIndex round and a wait until
    /// this member has applied that index (etcd's `linearizableReadNotify`). A single store
    /// publishes only what it committed, so every read is already linearizable.
    pub async fn linearizable_barrier(&self) -> Result<(), StoreError> {
        if !self.shared.replicated {
            return Ok(());
        }
        let result = self.read_index_wait().await;
        if result.is_err() {
            crate::metrics::READ_INDEXES_FAILED.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn read_index_wait(&self) -> Result<(), StoreError> {
        let replicator = self.shared.replicator.get().ok_or(StoreError::NoLeader)?;
        let (reply, rx) = oneshot::channel();
        replicator.read_index(reply);
        let index = match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, rx).await {
            Ok(result) => result.map_err(|_| StoreError::Timeout)??,
            Err(_) => return Err(StoreError::Timeout),
        };
        self.wait_applied(index).await
    }

    /// Tells a replicated store whether this member leads, and the term. Only the leader
    /// proposes lease revocations; on becoming leader every lease gets its full TTL.
    pub fn set_leadership(&self, leader: bool, term: u64) {
        self.shared.raft_term.store(term, Ordering::Relaxed);
        let was = self.shared.lease_authority.swap(leader, Ordering::AcqRel);
        if leader && !was {
            self.shared.mvcc.lessor.lock().promote();
        }
    }

    /// The log's state: from the replicated log, or this single store's own (it leads itself,
    /// and its log index is its applied index).
    pub fn replica_status(&self) -> crate::replication::ReplicaStatus {
        match self.shared.replicator.get() {
            Some(replicator) => replicator.status(),
            None => crate::replication::ReplicaStatus {
                leader: self.shared.member_id,
                term: RAFT_TERM,
                commit_index: self.applied_index(),
            },
        }
    }

    /// Records (through the log, in a cluster) how clients reach member `id`, so that every
    /// member's `MemberList` shows it.
    pub async fn publish_member(
        &self,
        id: u64,
        name: &str,
        client_urls: Vec<String>,
    ) -> Result<(), StoreError> {
        let attrs = crate::pb::command::MemberAttributes {
            id,
            name: name.to_string(),
            client_urls,
        };
        match self.propose(Cmd::MemberAttributes(attrs), false).await? {
            CommandResult::MemberPublished => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// The cluster's members as the log recorded them (membership changes, and the
    /// attributes members published), sorted by id.
    pub fn members(&self) -> Result<Vec<Member>, StoreError> {
        read_members(&self.shared.db.read().begin_read()?)
    }

    /// Whether this store is a member of a replicated cluster.
    pub fn is_replicated(&self) -> bool {
        self.shared.replicated
    }

    /// Adds, promotes or removes a cluster member (etcd's Cluster API), once the change is
    /// committed and applied on this member. The replicated log validates it on its leader.
    pub async fn change_membership(
        &self,
        change: crate::replication::MembershipChange,
    ) -> Result<(), StoreError> {
        if !self.shared.replicated {
            return Err(StoreError::Unsupported(
                "skerry: this member runs without replication; membership changes need a \
                 Raft cluster (--initial-cluster)"
                    .into(),
            ));
        }
        let replicator = self.shared.replicator.get().ok_or(StoreError::NoLeader)?;
        let (reply, rx) = oneshot::channel();
        replicator.change_membership(change, reply);
        match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, rx).await {
            Ok(Ok(Ok(CommandResult::Membership))) => Ok(()),
            Ok(Ok(Ok(other))) => Err(unexpected(&other)),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) | Err(_) => Err(StoreError::Timeout),
        }
    }

    /// etcd's quota check before a proposal (`quotaAlarmer.check`): if this member's backend
    /// plus `cost` is not below its quota, raise `NOSPACE` for this member and refuse.
    async fn check_quota(&self, cost: u64) -> Result<(), StoreError> {
        let check = QuotaCheck {
            limit: self.shared.quota,
            size: self.shared.backend_bytes.load(Ordering::Acquire),
        };
        if check.available(cost) {
            return Ok(());
        }
        self.raise_nospace().await;
        Err(StoreError::NoSpace)
    }

    /// A command applied past this member's quota answers `NoSpace` (etcd's quota applier);
    /// as etcd does then, raise `NOSPACE` for this member before answering, unless the alarm
    /// is active already (then the refusal came from it).
    async fn after_quota(
        &self,
        result: Result<CommandResult, StoreError>,
    ) -> Result<CommandResult, StoreError> {
        if matches!(result, Err(StoreError::NoSpace))
            && !self.shared.alarms.read().is_active(AlarmType::Nospace)
        {
            self.raise_nospace().await;
        }
        result
    }

    /// Raises `NOSPACE` for this member through the log and waits for it to apply; a failure
    /// is only logged, as etcd ignores it (the next refused write tries again). Nothing is
    /// proposed when this member's alarm is active already: applying it would change nothing.
    async fn raise_nospace(&self) {
        let member = self.shared.member_id;
        let active = self
            .shared
            .alarms
            .read()
            .list(AlarmType::Nospace as i32)
            .iter()
            .any(|a| a.member_id == member);
        if active {
            return;
        }
        warn!(
            quota = self.shared.quota,
            backend_bytes = self.shared.backend_bytes.load(Ordering::Acquire),
            "backend quota exceeded; raising the NOSPACE alarm"
        );
        let request = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: member,
            alarm: AlarmType::Nospace as i32,
        };
        if let Err(e) = self.propose(Cmd::Alarm(request), false).await {
            warn!(error = %e, "raising the NOSPACE alarm failed");
        }
    }

    /// etcd's `Maintenance.Alarm`: `GET` lists the active alarms of a type (`NONE`: all) as
    /// of a linearizable read; `ACTIVATE` and `DEACTIVATE` go through the log and answer
    /// with the alarm they concerned (none when there was nothing to clear). An unknown
    /// action is answered with nothing, as etcd's apply answers it.
    pub async fn alarm(&self, request: AlarmRequest) -> Result<AlarmResponse, StoreError> {
        match AlarmAction::try_from(request.action) {
            Ok(AlarmAction::Get) => {
                self.linearizable_barrier().await?;
                Ok(AlarmResponse {
                    header: None,
                    alarms: self.shared.alarms.read().list(request.alarm),
                })
            }
            Ok(AlarmAction::Activate | AlarmAction::Deactivate) => {
                match self.propose(Cmd::Alarm(request), false).await? {
                    CommandResult::Alarm(resp) => Ok(resp),
                    other => Err(unexpected(&other)),
                }
            }
            Err(_) => Ok(AlarmResponse::default()),
        }
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

    /// Hands leadership to member `target` (etcd's `MoveLeader`, `etcdctl move-leader`):
    /// only the leader takes it, the target must be a voting member, and the answer comes
    /// once this member sees the target lead, or after [`REPLICATED_REQUEST_TIMEOUT`]
    /// (`etcdserver: request timed out, leader transfer took too long`). A single store is
    /// its own leader and only member: itself is the one target it accepts.
    pub async fn move_leader(&self, target: u64) -> Result<(), StoreError> {
        if !self.shared.replicated {
            return if target == self.shared.member_id {
                Ok(())
            } else {
                Err(StoreError::BadLeaderTransferee)
            };
        }
        let replicator = self.shared.replicator.get().ok_or(StoreError::NoLeader)?;
        let (reply, rx) = oneshot::channel();
        replicator.move_leader(target, reply);
        match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Stopped),
            Err(_) => Err(StoreError::LeaderTransferTimeout),
        }
    }

    /// Whether this member decides lease expiry (see [`Store::set_leadership`]).
    pub fn is_lease_authority(&self) -> bool {
        self.shared.lease_authority.load(Ordering::Acquire)
    }

    async fn send(&self, msg: WriterMsg) -> Result<(), StoreError> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(StoreError::Stopped);
        }
        self.writer.send(msg).await.map_err(|_| StoreError::Stopped)
    }
}

/// The Raft term a single store reports: one member, one term.
const RAFT_TERM: u64 = 1;

/// The whole store as one read transaction saw it, pinned for a Raft snapshot
/// ([`Store::pin_snapshot`]). `applied_index`, `revision` and `conf_state` are those of the
/// rows [`PinnedSnapshot::write`] streams, however far the store has moved on since.
///
/// Holding it keeps the pages of that view allocated, so the file grows under writes until
/// it is dropped, and defragmentation waits for it: drop it once the transfer is done.
pub struct PinnedSnapshot {
    /// The last log index applied in this view.
    pub applied_index: u64,
    /// The store revision of this view.
    pub revision: i64,
    /// raft-rs's encoded `ConfState` in this view; `None` if no membership change was applied.
    pub conf_state: Option<Vec<u8>>,
    txn: ReadTransaction,
}

// Handed to a blocking task that streams it to a peer while the writer goes on.
const _: fn() = || {
    fn send_static<T: Send + 'static>() {}
    send_static::<PinnedSnapshot>();
};

impl PinnedSnapshot {
    /// Writes the snapshot stream ([`crate::snapshot`]) of exactly this view to `out`;
    /// returns its revision. May be called more than once (a retried transfer).
    pub fn write(&self, out: &mut impl std::io::Write) -> Result<i64, StoreError> {
        crate::snapshot::write(&self.txn, out)
    }
}

impl std::fmt::Debug for PinnedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedSnapshot")
            .field("applied_index", &self.applied_index)
            .field("revision", &self.revision)
            .field("conf_state_bytes", &self.conf_state.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

/// Pins `db` as it is now for a Raft snapshot (see [`Store::pin_snapshot`]).
pub(crate) fn pin(db: &Database) -> Result<PinnedSnapshot, StoreError> {
    let txn = db.begin_read()?;
    let (applied_index, revision) = {
        let meta = txn.open_table(META)?;
        let get = |key: &str| -> Result<u64, StoreError> {
            Ok(meta.get(key)?.map(|g| g.value()).unwrap_or(0))
        };
        let revision = get(META_REVISION)?;
        let revision = i64::try_from(revision)
            .map_err(|_| StoreError::Storage(format!("revision {revision} out of range")))?;
        (get(META_APPLIED_INDEX)?, revision)
    };
    let conf_state = raft_record(&txn, RAFT_CONF_STATE)?;
    Ok(PinnedSnapshot {
        applied_index,
        revision,
        conf_state,
        txn,
    })
}

/// One record of the `raft` table as `txn` sees it.
pub(crate) fn raft_record(
    txn: &ReadTransaction,
    name: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(table) = mvcc::open_if_exists(txn, RAFT)? else {
        return Ok(None);
    };
    Ok(table.get(name)?.map(|g| g.value().to_vec()))
}

/// The `(index, term)` of the last installed snapshot as `txn` sees it (see
/// [`Store::installed_snapshot`]).
pub(crate) fn read_installed_snapshot(
    txn: &ReadTransaction,
) -> Result<Option<(u64, u64)>, StoreError> {
    let index = raft_record(txn, RAFT_SNAPSHOT_INDEX)?;
    let term = raft_record(txn, RAFT_SNAPSHOT_TERM)?;
    match (index, term) {
        (Some(index), Some(term)) => Ok(Some((be_u64(&index)?, be_u64(&term)?))),
        (None, None) => Ok(None),
        _ => Err(StoreError::Storage(
            "installed snapshot has an index or a term, not both".into(),
        )),
    }
}

/// The members table as `txn` sees it, in id order (see [`Store::members`]).
pub(crate) fn read_members(txn: &ReadTransaction) -> Result<Vec<Member>, StoreError> {
    let Some(table) = mvcc::open_if_exists(txn, MEMBERS)? else {
        return Ok(Vec::new());
    };
    // Rows are keyed by id, so the scan is in id order.
    let mut out = Vec::new();
    for row in table.iter()? {
        let (_, value) = row?;
        out.push(Member::decode(value.value())?);
    }
    Ok(out)
}

fn be_u64(bytes: &[u8]) -> Result<u64, StoreError> {
    let array: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StoreError::Storage(format!("{} bytes are not a u64", bytes.len())))?;
    Ok(u64::from_be_bytes(array))
}

/// A file's length in bytes; 0 if it cannot be read (the writer measures again after its
/// next commit).
fn file_bytes(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn header_revision(header: &Option<ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}

fn unexpected(result: &CommandResult) -> StoreError {
    StoreError::Storage(format!(
        "writer answered with the wrong result kind: {result:?}"
    ))
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, StoreError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(StoreError::from)
}

/// Opens the database file, refusing a data dir that is not a skerry store or is in use.
fn open_database(dir: &Path) -> Result<Database, StoreError> {
    let dir_error =
        |what: String| StoreError::DataDir(format!("data dir {}: {what}", dir.display()));
    if dir.exists() && !dir.is_dir() {
        return Err(dir_error("exists and is not a directory".into()));
    }
    fs::create_dir_all(dir).map_err(|e| dir_error(format!("cannot create: {e}")))?;
    let path = dir.join(DB_FILE_NAME);
    if !path.exists() {
        let foreign: Vec<String> = fs::read_dir(dir)
            .map_err(|e| dir_error(format!("cannot read: {e}")))?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| !name.starts_with('.'))
            .collect();
        if !foreign.is_empty() {
            return Err(dir_error(format!(
                "holds files that are not a skerry store ({}); refusing to use it",
                foreign.join(", ")
            )));
        }
    } else {
        let mut magic = [0u8; 4];
        let mut file = fs::File::open(&path)
            .map_err(|e| dir_error(format!("cannot open {DB_FILE_NAME}: {e}")))?;
        use std::io::Read;
        let read = file
            .read(&mut magic)
            .map_err(|e| dir_error(format!("cannot read {DB_FILE_NAME}: {e}")))?;
        if read > 0 && (read < REDB_MAGIC.len() || magic[..] != *REDB_MAGIC) {
            return Err(dir_error(format!(
                "{DB_FILE_NAME} is not a skerry store file"
            )));
        }
    }
    let opened = std::panic::catch_unwind(|| Database::builder().create(&path));
    let db = match opened {
        Ok(Ok(db)) => db,
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
            return Err(dir_error("is in use by another skerry process".into()));
        }
        Ok(Err(e)) => return Err(dir_error(format!("{DB_FILE_NAME} cannot be opened: {e}"))),
        Err(_) => return Err(dir_error(format!("{DB_FILE_NAME} is corrupt"))),
    };
    Ok(db)
}

/// The in-memory state rebuilt from the tables: at open, and after a snapshot install.
pub(crate) struct State {
    pub(crate) index: KeyIndex,
    pub(crate) lessor: Lessor,
    pub(crate) revision: i64,
    pub(crate) compact_revision: i64,
    pub(crate) compact_finished: i64,
    pub(crate) applied_index: u64,
    pub(crate) alarms: Alarms,
}

impl State {
    /// Where applying stands in this state.
    pub(crate) fn cursor(&self) -> ApplyCursor {
        ApplyCursor {
            applied_index: self.applied_index,
            rev: self.revision,
            floor: self.compact_revision,
        }
    }

    /// The readers' shared view of this state, published at its revision and floor.
    pub(crate) fn into_mvcc(self) -> Mvcc {
        Mvcc {
            index: RwLock::new(self.index),
            current_rev: self.revision.into(),
            compact_rev: self.compact_revision.into(),
            lessor: Mutex::new(self.lessor),
            alarms: Mutex::new(self.alarms),
        }
    }
}

/// What opening a store reads: its state and who it is.
pub(crate) struct Loaded {
    pub(crate) state: State,
    pub(crate) cluster_id: u64,
    pub(crate) member_id: u64,
}

/// Creates the tables of a new store, or checks and loads an existing one.
pub(crate) fn load(db: &Database, identity: Option<(u64, u64)>) -> Result<Loaded, StoreError> {
    prepare(db, identity)?;
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    let state = read_state(
        &meta,
        &txn.open_table(KV)?,
        &txn.open_table(LEASES)?,
        &txn.open_table(ALARMS)?,
    )?;
    let get = |key: &str| -> Result<u64, StoreError> {
        Ok(meta.get(key)?.map(|g| g.value()).unwrap_or(0))
    };
    Ok(Loaded {
        state,
        cluster_id: get(META_CLUSTER_ID)?,
        member_id: get(META_MEMBER_ID)?,
    })
}

/// Creates the tables (and identity) of a new store, or checks an existing one's format and
/// identity; creates tables a store from an older build lacks.
fn prepare(db: &Database, identity: Option<(u64, u64)>) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        let format = meta.get(META_FORMAT)?.map(|g| g.value());
        match format {
            None => {
                if meta.len()? > 0 {
                    return Err(StoreError::DataDir(
                        "store file has no format marker".into(),
                    ));
                }
                meta.insert(META_FORMAT, mvcc::FORMAT_VERSION)?;
                // etcd's store starts at revision 1, so the first write is revision 2 and no
                // object ever has resourceVersion "0" (which Kubernetes reads as "any").
                meta.insert(META_REVISION, 1)?;
                let (cluster, member) =
                    identity.unwrap_or((rand::random::<u64>() >> 1, rand::random::<u64>() >> 1));
                meta.insert(META_CLUSTER_ID, cluster)?;
                meta.insert(META_MEMBER_ID, member)?;
            }
            Some(mvcc::FORMAT_VERSION) => {
                if let Some((cluster, member)) = identity {
                    let stored = (
                        meta.get(META_CLUSTER_ID)?.map(|g| g.value()),
                        meta.get(META_MEMBER_ID)?.map(|g| g.value()),
                    );
                    if stored != (Some(cluster), Some(member)) {
                        return Err(StoreError::DataDir(format!(
                            "store belongs to member {:x} of cluster {:x}, not member {member:x} \
                             of cluster {cluster:x}",
                            stored.1.unwrap_or(0),
                            stored.0.unwrap_or(0)
                        )));
                    }
                }
            }
            Some(other) => {
                return Err(StoreError::DataDir(format!(
                    "store format {other} is not the format {} this skerry reads",
                    mvcc::FORMAT_VERSION
                )));
            }
        }
        txn.open_table(KV)?;
        txn.open_table(LEASES)?;
        txn.open_table(MEMBERS)?;
        txn.open_table(RAFT)?;
        txn.open_table(ALARMS)?;
    }
    txn.commit()?;
    Ok(())
}

/// Rebuilds the in-memory state from the tables: the key index from the rows, the lessor
/// from the lease table and the keys' leases, the active alarms. Generic over the table kind
/// so that an install can rebuild from its write transaction before it commits.
fn read_state(
    meta: &impl ReadableTable<&'static str, u64>,
    kv: &impl ReadableTable<(u64, u64), &'static [u8]>,
    leases: &impl ReadableTable<i64, i64>,
    alarms: &impl ReadableTable<(i32, u64), ()>,
) -> Result<State, StoreError> {
    let get = |key: &str| -> Result<u64, StoreError> {
        Ok(meta.get(key)?.map(|g| g.value()).unwrap_or(0))
    };
    let as_rev = |v: u64| {
        i64::try_from(v).map_err(|_| StoreError::Storage(format!("revision {v} out of range")))
    };
    let revision = as_rev(get(META_REVISION)?)?;
    let compact_revision = as_rev(get(META_COMPACT_REVISION)?)?;
    let compact_finished = as_rev(get(META_COMPACT_FINISHED)?)?;
    let applied_index = get(META_APPLIED_INDEX)?;

    let mut index = KeyIndex::default();
    let mut last = Rev::default();
    let mut lease_of: std::collections::HashMap<Bytes, i64> = std::collections::HashMap::new();
    for row in kv.iter()? {
        let (key, value) = row?;
        let rev = Rev::from_row_key(key.value());
        if rev <= last {
            return Err(StoreError::Storage(format!(
                "kv rows out of order at {rev:?}"
            )));
        }
        last = rev;
        let (tombstone, kv) = mvcc::decode_row(value.value())?;
        if tombstone {
            index.tombstone(&kv.key, rev);
            lease_of.remove(&kv.key);
        } else {
            index.put(&kv.key, rev);
            if kv.lease != 0 {
                lease_of.insert(kv.key.clone(), kv.lease);
            } else {
                lease_of.remove(&kv.key);
            }
        }
    }
    if last.main > revision {
        return Err(StoreError::Storage(format!(
            "rows reach revision {} beyond the recorded revision {revision}",
            last.main
        )));
    }
    let mut lessor = Lessor::default();
    for row in leases.iter()? {
        let (id, ttl) = row?;
        // Every lease restarts its full TTL: the time the store was down is not held against
        // the clients (etcd does the same when a leader is elected).
        lessor.grant(id.value(), ttl.value());
    }
    for (key, lease) in lease_of {
        lessor.attach(lease, &key);
    }
    let mut pairs = Vec::new();
    for row in alarms.iter()? {
        let (key, _) = row?;
        pairs.push(key.value());
    }
    Ok(State {
        index,
        lessor,
        revision,
        compact_revision,
        compact_finished,
        applied_index,
        alarms: Alarms::from_pairs(pairs),
    })
}

/// The history of revisions `from..=through` as `txn` sees it, as watch events with `prev_kv`
/// (see [`Store::history`]); compacted when `from` is below the compaction floor. `txn` must
/// have begun before the floor is read here, so that no row at or above it is gone.
pub(crate) fn read_history(
    txn: &ReadTransaction,
    mvcc: &Mvcc,
    from: i64,
    through: i64,
) -> Result<Vec<Event>, StoreError> {
    let compacted = mvcc.compact_rev();
    if from < compacted {
        return Err(StoreError::Compacted {
            compact_revision: compacted,
        });
    }
    let table = txn.open_table(KV)?;
    read_events(&table, &mvcc.index, compacted, from, through, true)
}

/// Reads rows of revisions `from..=through` as watch events, with `prev_kv` when asked.
///
/// An event's `prev_kv` is the key as it was at the revision before the event (etcd 3.4 reads
/// it at `mod_revision - 1`); like etcd's, it is left out when that
/// revision is below the compaction floor `compacted`, whether or not physical compaction has
/// reached the row yet, so the answer does not depend on timing.
pub(crate) fn read_events<T: ReadableTable<(u64, u64), &'static [u8]>>(
    table: &T,
    index: &RwLock<KeyIndex>,
    compacted: i64,
    from: i64,
    through: i64,
    with_prev: bool,
) -> Result<Vec<Event>, StoreError> {
    let mut events = Vec::new();
    if through < from {
        return Ok(events);
    }
    let start = Rev::first_of(from).to_row_key();
    let end = Rev::first_of(through.saturating_add(1)).to_row_key();
    for row in table.range(start..end)? {
        let (key, value) = row?;
        let rev = Rev::from_row_key(key.value());
        let (tombstone, mut kv) = mvcc::decode_row(value.value())?;
        let prev_kv = if with_prev && rev.main > compacted {
            let prev_rev = index.read().get(&kv.key, rev.main - 1);
            match prev_rev {
                Some(p) => table
                    .get(p.to_row_key())?
                    .map(|g| mvcc::decode_row(g.value()))
                    .transpose()?
                    .map(|(_, kv)| kv),
                None => None,
            }
        } else {
            None
        };
        let r#type = if tombstone {
            kv.mod_revision = rev.main;
            EventType::Delete
        } else {
            EventType::Put
        };
        events.push(Event {
            r#type: r#type as i32,
            kv: Some(kv),
            prev_kv,
        });
    }
    Ok(events)
}

/// Where applying stands: the last applied command, the last revision, the compaction floor.
/// The writer's moves while a batch is applied and equals what is published between batches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ApplyCursor {
    pub(crate) applied_index: u64,
    pub(crate) rev: i64,
    pub(crate) floor: i64,
}

/// What applying a batch of commands produced.
pub(crate) struct Applied {
    pub(crate) results: Vec<Result<CommandResult, StoreError>>,
    pub(crate) events: Vec<Event>,
    /// The compaction revision a command of the batch moved the floor to.
    pub(crate) new_compaction: Option<i64>,
    /// The positions of commands that applied while this member was past its quota, so
    /// answered `NoSpace`: this member must raise `NOSPACE` for them (etcd's
    /// `applyEntryNormal`).
    pub(crate) over_quota: Vec<usize>,
    /// A command of the batch raised or cleared an alarm.
    pub(crate) alarms_changed: bool,
}

/// Applies `commands` in order inside `txn`, numbering them from `applied_index + 1`, and
/// records the applied index and revision in the same transaction. The one apply path for
/// live batches and for replay at startup, so replay gives exactly what the first run gave.
///
/// Each command goes through the applier the active alarms call for ([`Applier`]): refused
/// whole under an alarm, or applied and, with no alarm, checked against this member's
/// `quota` (which changes the answer, never the state: every member applies alike).
///
/// Fails only when a command failed after writing (see [`Apply::poisoned`]): the transaction
/// must then be dropped, and memory (index, lessor) is ahead of disk until a restart.
pub(crate) fn apply_commands<'c>(
    mvcc: &Mvcc,
    txn: &WriteTransaction,
    cursor: &mut ApplyCursor,
    commands: impl Iterator<Item = Option<&'c Command>>,
    quota: QuotaCheck,
) -> Result<Applied, StoreError> {
    let mut events = Vec::new();
    let mut results = Vec::new();
    let mut new_compaction = None;
    let mut over_quota = Vec::new();
    let mut alarms_changed = false;
    let mut table = txn.open_table(KV)?;
    let mut leases = txn.open_table(LEASES)?;
    let mut meta = txn.open_table(META)?;
    for (position, command) in commands.enumerate() {
        cursor.applied_index += 1;
        let mut apply = Apply {
            mvcc,
            table: &mut table,
            leases: &mut leases,
            meta: &mut meta,
            rev: &mut cursor.rev,
            floor: &mut cursor.floor,
            events: &mut events,
            poisoned: false,
        };
        let Some(command) = command else {
            // A log entry without a command: it only takes an index.
            results.push(Err(StoreError::Storage(
                "log entry without a command".into(),
            )));
            continue;
        };
        let applier = mvcc.alarms.lock().applier();
        // What the quota applier checks, and the cost, for the commands it checks; etcd
        // computes availability before applying.
        let quota_cost = match &command.command {
            Some(Cmd::Put(req)) => Some(quota::put_cost(req)),
            Some(Cmd::Txn(req)) if !quota::txn_is_read_only(req) => Some(quota::txn_cost(req)),
            Some(Cmd::LeaseGrant(_)) => Some(quota::LEASE_GRANT_COST),
            _ => None,
        };
        let within_quota = quota_cost.is_none_or(|cost| quota.available(cost));
        let result = match (&command.command, applier) {
            // Refusals under an alarm, before anything is written.
            (Some(Cmd::Put(_) | Cmd::LeaseGrant(_)), Applier::Capped) => Err(StoreError::NoSpace),
            (Some(Cmd::Txn(req)), Applier::Capped) if quota::txn_cost(req) > 0 => {
                Err(StoreError::NoSpace)
            }
            (
                Some(
                    Cmd::Put(_)
                    | Cmd::DeleteRange(_)
                    | Cmd::Compaction(_)
                    | Cmd::LeaseGrant(_)
                    | Cmd::LeaseRevoke(_),
                ),
                Applier::Corrupt,
            ) => Err(StoreError::Corrupt),
            // A read-only txn never reaches etcd's appliers (it is served without the log).
            (Some(Cmd::Txn(req)), Applier::Corrupt) if !quota::txn_is_read_only(req) => {
                Err(StoreError::Corrupt)
            }
            (Some(Cmd::Put(req)), _) => apply.put(req).map(CommandResult::Put),
            (Some(Cmd::DeleteRange(req)), _) => {
                apply.delete_range(req).map(CommandResult::DeleteRange)
            }
            (Some(Cmd::Txn(req)), _) => apply.txn(req).map(CommandResult::Txn),
            (Some(Cmd::LeaseGrant(req)), _) => {
                apply
                    .lease_grant(req.id, req.ttl)
                    .map(|revision| CommandResult::LeaseGrant {
                        id: req.id,
                        ttl: req.ttl,
                        revision,
                    })
            }
            (Some(Cmd::LeaseRevoke(req)), _) => apply
                .lease_revoke(req.id)
                .map(|revision| CommandResult::LeaseRevoke { revision }),
            // Member rows are read before anything is written, so a row that cannot be read
            // fails the command alone; a failed write after that leaves the transaction
            // half-written, and the batch is abandoned (`?`).
            (Some(Cmd::MemberAttributes(attrs)), _) => {
                let mut members = txn.open_table(MEMBERS)?;
                match mvcc::read_member(&members, attrs.id) {
                    Ok(existing) => {
                        let row = mvcc::merge_attributes(existing, attrs);
                        members.insert(row.id, row.encode_to_vec().as_slice())?;
                        Ok(CommandResult::MemberPublished)
                    }
                    Err(e) => Err(e),
                }
            }
            (Some(Cmd::Membership(change)), _) => {
                let mut members = txn.open_table(MEMBERS)?;
                match mvcc::membership_rows(&members, change) {
                    Ok(rows) => {
                        let mut raft = txn.open_table(RAFT)?;
                        mvcc::write_membership(&mut members, &mut raft, &rows, change)?;
                        Ok(CommandResult::Membership)
                    }
                    Err(e) => Err(e),
                }
            }
            (Some(Cmd::Compaction(req)), _) => apply.compact(req.revision).map(|revision| {
                new_compaction = Some(req.revision);
                CommandResult::Compact { revision }
            }),
            (Some(Cmd::Alarm(req)), _) => {
                let mut table = txn.open_table(ALARMS)?;
                let (response, changed) = apply_alarm(&mut table, &mut mvcc.alarms.lock(), req)?;
                alarms_changed |= changed;
                Ok(CommandResult::Alarm(response))
            }
            (None, _) => Err(StoreError::Storage("empty command".into())),
        };
        if apply.poisoned {
            return Err(result
                .err()
                .unwrap_or_else(|| StoreError::Storage("command left partial writes".into())));
        }
        // etcd's quota applier: the command applied, but this member was past its quota.
        let result = match result {
            Ok(_) if applier == Applier::Normal && !within_quota => {
                over_quota.push(position);
                Err(StoreError::NoSpace)
            }
            other => other,
        };
        results.push(result);
    }
    meta.insert(META_APPLIED_INDEX, cursor.applied_index)?;
    meta.insert(META_REVISION, cursor.rev as u64)?;
    Ok(Applied {
        results,
        events,
        new_compaction,
        over_quota,
        alarms_changed,
    })
}

/// Applies an alarm request (etcd's `applierV3backend.Alarm`): `ACTIVATE` records the alarm
/// (answering with it, new or not), `DEACTIVATE` clears it (answering with it if it was
/// active), `GET` lists them; anything else is answered with nothing. The table is written
/// first, memory after; a failed write abandons the batch. Returns whether an alarm changed.
fn apply_alarm(
    table: &mut mvcc::AlarmsTable<'_>,
    alarms: &mut Alarms,
    req: &AlarmRequest,
) -> Result<(AlarmResponse, bool), StoreError> {
    let member = AlarmMember {
        member_id: req.member_id,
        alarm: req.alarm,
    };
    let mut response = AlarmResponse::default();
    let mut changed = false;
    match AlarmAction::try_from(req.action) {
        Ok(AlarmAction::Get) => response.alarms = alarms.list(req.alarm),
        Ok(AlarmAction::Activate) => {
            let first_of_its_type = alarms.list(req.alarm).is_empty();
            if !alarms.list(req.alarm).contains(&member) {
                table.insert((req.alarm, req.member_id), ())?;
                alarms.activate(req.alarm, req.member_id);
                changed = true;
                if first_of_its_type {
                    warn!(alarm = %crate::alarm::alarm_text(&member), "alarm raised");
                }
            }
            response.alarms.push(member);
        }
        Ok(AlarmAction::Deactivate) => {
            if alarms.list(req.alarm).contains(&member) {
                table.remove((req.alarm, req.member_id))?;
                alarms.deactivate(req.alarm, req.member_id);
                changed = true;
                if alarms.list(req.alarm).is_empty() {
                    info!(alarm = %crate::alarm::alarm_text(&member), "alarm disarmed");
                }
                response.alarms.push(member);
            }
        }
        Err(_) => {}
    }
    Ok((response, changed))
}

/// Checks that the entries of a batch (their log indexes; `None` for a command a single store
/// numbers itself) follow `applied_index` with no gap. Entries already applied must have been
/// dropped first.
pub(crate) fn check_entry_order(
    applied_index: u64,
    indexes: impl Iterator<Item = Option<u64>>,
) -> Result<(), StoreError> {
    let first_index = applied_index + 1;
    for (offset, index) in indexes.enumerate() {
        let due = first_index + offset as u64;
        if let Some(index) = index
            && index != due
        {
            return Err(StoreError::Storage(format!(
                "log entry {index} arrived where entry {due} was due"
            )));
        }
    }
    Ok(())
}

/// Applies the log's records that redb lost in a crash (those after its applied index), in
/// batches as the writer would, and commits the result durably.
fn replay(
    db: &Database,
    mvcc: &Mvcc,
    records: Vec<(u64, Bytes)>,
    cursor: &mut ApplyCursor,
) -> Result<(), StoreError> {
    if records.is_empty() {
        return Ok(());
    }
    let count = records.len();
    for chunk in records.chunks(WRITE_BATCH_COMMANDS_MAX) {
        let mut commands = Vec::with_capacity(chunk.len());
        for (index, payload) in chunk {
            if *index != cursor.applied_index + 1 + commands.len() as u64 {
                return Err(StoreError::DataDir(format!(
                    "write-ahead log record {index} is out of order"
                )));
            }
            commands.push(Command::decode(payload.as_ref()).map_err(|e| {
                StoreError::DataDir(format!("write-ahead log record {index} is unreadable: {e}"))
            })?);
        }
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::None)
            .map_err(StoreError::storage)?;
        // Nobody reads a replayed command's result, and the quota changes only results.
        apply_commands(
            mvcc,
            &txn,
            cursor,
            commands.iter().map(Some),
            QuotaCheck::default(),
        )
        .map_err(|e| StoreError::DataDir(format!("replaying the write-ahead log: {e}")))?;
        txn.commit()?;
        mvcc.compact_rev.store(cursor.floor, Ordering::Release);
        mvcc.current_rev.store(cursor.rev, Ordering::Release);
    }
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(META_APPLIED_INDEX, cursor.applied_index)?;
    }
    txn.commit()?;
    info!(
        commands = count,
        revision = cursor.rev,
        "replayed the write-ahead log"
    );
    Ok(())
}

/// The first half of a snapshot install (see [`Store::install_snapshot`]), before the commit:
/// refuses a snapshot at a log `index` behind `applied_index`, begins a durable write
/// transaction, lets `write` replace the tables in it (returning the snapshot's revision) and
/// rebuilds the in-memory state from it. The caller commits and swaps that state in; dropping
/// the transaction instead leaves the store as it was.
///
/// # Panics
/// If the tables `write` left disagree with `index` or with the revision it returned.
pub(crate) fn stage_install(
    db: &Database,
    applied_index: u64,
    index: u64,
    write: impl FnOnce(&WriteTransaction) -> Result<i64, StoreError>,
) -> Result<(WriteTransaction, State), StoreError> {
    if index < applied_index {
        return Err(StoreError::Storage(format!(
            "snapshot at log index {index} is behind applied index {applied_index}"
        )));
    }
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)
        .map_err(StoreError::storage)?;
    let snapshot_revision = write(&txn)?;
    let state = read_state(
        &txn.open_table(META)?,
        &txn.open_table(KV)?,
        &txn.open_table(LEASES)?,
        &txn.open_table(ALARMS)?,
    )?;
    assert_eq!(
        state.applied_index, index,
        "install wrote applied index {} for snapshot index {index}",
        state.applied_index
    );
    assert_eq!(
        state.revision, snapshot_revision,
        "install wrote revision {} for a snapshot at revision {snapshot_revision}",
        state.revision
    );
    Ok((txn, state))
}

/// An install's critical section for readers: the install generation is odd from
/// [`InstallWindow::open`] until the window is dropped, whether the install's commit
/// succeeded or not. Opened and dropped while the index write lock is held.
struct InstallWindow<'a> {
    generation: &'a AtomicU64,
}

impl<'a> InstallWindow<'a> {
    /// # Panics
    /// If another window is open: installs are the writer's alone, one at a time.
    fn open(generation: &'a AtomicU64) -> Self {
        let before = generation.fetch_add(1, Ordering::SeqCst);
        assert!(
            before.is_multiple_of(2),
            "install generation {before} is odd: two installs at once"
        );
        Self { generation }
    }
}

impl Drop for InstallWindow<'_> {
    fn drop(&mut self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// Physical compaction in progress.
struct CompactionJob {
    at: i64,
    /// The last key whose history was compacted; the next step starts after it.
    cursor: Option<Bytes>,
}

struct Writer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<WriterMsg>,
    /// Where applying stands (equal to what is published between batches).
    cursor: ApplyCursor,
    compaction: Option<CompactionJob>,
    /// Callers of a physical compaction, answered when the compaction reaches their revision.
    physical_waiters: Vec<(i64, Reply)>,
    /// This store's own log; `None` when a replicated log feeds it.
    wal: Option<Wal>,
    /// Commands applied since the last durable redb commit: only the log holds them.
    unchecked: u64,
    last_checkpoint: Instant,
    /// Reused buffer for the encoded commands of a batch.
    encoded: Vec<u8>,
}

impl Writer {
    fn run(&mut self) {
        loop {
            let first = if self.compaction.is_some() {
                match self.rx.try_recv() {
                    Ok(msg) => msg,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        if let Err(e) = self.compaction_step() {
                            self.fail(&e);
                            return;
                        }
                        continue;
                    }
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        self.shut_down();
                        return;
                    }
                }
            } else {
                match self.rx.blocking_recv() {
                    Some(msg) => msg,
                    None => {
                        self.shut_down();
                        return;
                    }
                }
            };
            let mut commands = Vec::new();
            let mut others = Vec::new();
            let mut next = Some(first);
            while let Some(msg) = next.take() {
                let barrier = matches!(msg, WriterMsg::InstallSnapshot { .. });
                match msg {
                    WriterMsg::Command(pending) => commands.push(pending),
                    other => others.push(other),
                }
                if !barrier && commands.len() < WRITE_BATCH_COMMANDS_MAX {
                    next = self.rx.try_recv().ok();
                }
            }
            if !commands.is_empty()
                && let Err(e) = self.apply_batch(commands)
            {
                self.fail(&e);
                return;
            }
            for msg in others {
                match msg {
                    WriterMsg::Defragment { reply } => {
                        let _ = reply.send(self.defragment());
                    }
                    WriterMsg::Stats { reply } => {
                        let _ = reply.send(self.in_use_bytes());
                    }
                    WriterMsg::Checkpoint => {
                        if self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL
                            && let Err(e) = self.checkpoint()
                        {
                            self.fail(&e);
                            return;
                        }
                    }
                    WriterMsg::InstallSnapshot {
                        path,
                        index,
                        term,
                        reply,
                    } => {
                        let result = self.install_snapshot(&path, index, term);
                        if let Err(e) = &result {
                            warn!(index, term, error = %e, "installing a snapshot failed");
                        }
                        let _ = reply.send(result);
                    }
                    WriterMsg::Shutdown => {
                        if self.shared.stopping.load(Ordering::Acquire) {
                            self.shut_down();
                            return;
                        }
                    }
                    WriterMsg::Command(_) => {}
                }
            }
            // A compaction step after every batch keeps compaction moving under steady load.
            if self.compaction.is_some()
                && let Err(e) = self.compaction_step()
            {
                self.fail(&e);
                return;
            }
        }
    }

    /// A commit failed: what is on disk is the last good commit, but this process's memory is
    /// ahead of it. Refuse all further work; a restart recovers from disk.
    fn fail(&mut self, e: &StoreError) {
        error!(error = %e, "store writer failed; refusing further writes until restart");
        self.shared.failed.store(true, Ordering::Release);
        self.rx.close();
        while let Ok(msg) = self.rx.try_recv() {
            if let WriterMsg::Command(Pending {
                reply: Some(reply), ..
            }) = msg
            {
                let _ = reply.send(Err(e.clone()));
            }
        }
        for (_, reply) in self.physical_waiters.drain(..) {
            let _ = reply.send(Err(e.clone()));
        }
    }

    /// A clean stop: one last checkpoint, so the next start has nothing to replay.
    fn shut_down(&mut self) {
        info!(
            commands = self.cursor.applied_index,
            log_syncs = self.shared.durable_commits.load(Ordering::Relaxed),
            checkpoints = self.shared.checkpoints.load(Ordering::Relaxed),
            "store writer stopping"
        );
        if let Err(e) = self.checkpoint() {
            warn!(error = %e, "final checkpoint failed; the log will be replayed at start");
        }
    }

    /// Applies `commands` in one redb transaction, makes them durable in the log (one
    /// `fdatasync` for the whole batch: the group commit), commits redb (durably only at a
    /// checkpoint), then publishes the batch and answers the callers.
    fn apply_batch(&mut self, mut commands: Vec<Pending>) -> Result<(), StoreError> {
        // Entries of a replicated log that this store applied before a restart come again;
        // applying is idempotent by index, so they are skipped.
        commands.retain(|p| p.index.is_none_or(|i| i > self.cursor.applied_index));
        let Some(first) = commands.first() else {
            return Ok(());
        };
        let first_index = self.cursor.applied_index + 1;
        check_entry_order(
            self.cursor.applied_index,
            commands.iter().map(|pending| pending.index),
        )?;
        let _ = first;
        let db = self.shared.db.read();
        let mut txn = db.begin_write()?;
        let quota = QuotaCheck {
            limit: self.shared.quota,
            size: self.shared.backend_bytes.load(Ordering::Acquire),
        };
        let applied = apply_commands(
            &self.shared.mvcc,
            &txn,
            &mut self.cursor,
            commands.iter().map(|p| p.command.as_ref()),
            quota,
        )?;
        if let Some(wal) = self.wal.as_mut() {
            // The log first: once it is synced the batch survives a crash whatever happens to
            // the redb commit, which therefore need not be durable itself.
            self.encoded.clear();
            let mut ends = Vec::with_capacity(commands.len());
            for pending in &commands {
                if let Some(command) = &pending.command {
                    command
                        .encode(&mut self.encoded)
                        .map_err(StoreError::storage)?;
                }
                ends.push(self.encoded.len());
            }
            let encoded = &self.encoded;
            let records = ends.iter().enumerate().map(|(i, end)| {
                let start = if i == 0 { 0 } else { ends[i - 1] };
                (first_index + i as u64, &encoded[start..*end])
            });
            wal.append(records)?;
            self.shared.durable_commits.fetch_add(1, Ordering::Relaxed);
        }
        self.unchecked += commands.len() as u64;
        let checkpoint = self.unchecked >= CHECKPOINT_COMMANDS;
        txn.set_durability(if checkpoint {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(StoreError::storage)?;
        let commit_started = Instant::now();
        txn.commit()?;
        crate::metrics::BACKEND_COMMIT.observe(commit_started.elapsed());
        drop(db);
        self.measure();
        if checkpoint {
            self.checkpointed()?;
        }
        // Published only now that the batch is durable (in this store's log, or committed in
        // the replicated one): a reader never sees a write that a crash could take back, and
        // a caller is answered only after its write is durable.
        self.shared
            .applied_index
            .store(self.cursor.applied_index, Ordering::Release);
        self.shared
            .mvcc
            .current_rev
            .store(self.cursor.rev, Ordering::Release);
        if let Some(at) = applied.new_compaction {
            self.shared.mvcc.compact_rev.store(at, Ordering::Release);
            self.compaction = Some(CompactionJob { at, cursor: None });
        }
        self.shared.hub.notify(&applied.events, self.cursor.rev);
        if applied.alarms_changed {
            let alarms = self.shared.mvcc.alarms.lock().clone();
            *self.shared.alarms.write() = alarms;
        }
        self.shared
            .applied_watch
            .send_replace(self.cursor.applied_index);
        // One raise per batch is enough: applying it again would change nothing.
        if applied
            .over_quota
            .iter()
            .any(|&position| commands[position].reply.is_none())
        {
            self.raise_nospace_for_entry();
        }
        for (pending, result) in commands.into_iter().zip(applied.results) {
            let Some(reply) = pending.reply else {
                continue;
            };
            if let (true, Ok(CommandResult::Compact { .. }), Some(at)) =
                (pending.physical, &result, applied.new_compaction)
            {
                // Answered when physical compaction reaches this revision.
                self.physical_waiters.push((at, reply));
            } else {
                let _ = reply.send(result);
            }
        }
        Ok(())
    }

    /// Replaces the store with the snapshot at `path` (see [`Store::install_snapshot`]).
    ///
    /// The new state is rebuilt from the write transaction before it commits, so that the
    /// index write lock is held only for the commit and the swap; readers that overlap that
    /// window see the install generation move and read again.
    fn install_snapshot(&mut self, path: &Path, index: u64, term: u64) -> Result<(), StoreError> {
        let db = self.shared.db.read();
        let (txn, state) = stage_install(&db, self.cursor.applied_index, index, |txn| {
            crate::snapshot::install(txn, path, index, term)
        })?;
        let State {
            index: key_index,
            lessor,
            revision,
            compact_revision,
            compact_finished,
            applied_index: _,
            alarms,
        } = state;
        {
            let mut shared_index = self.shared.mvcc.index.write();
            let _window = InstallWindow::open(&self.shared.install_generation);
            txn.commit()?;
            *shared_index = key_index;
            *self.shared.mvcc.lessor.lock() = lessor;
            *self.shared.mvcc.alarms.lock() = alarms;
            self.shared
                .mvcc
                .compact_rev
                .store(compact_revision, Ordering::Release);
            self.shared
                .mvcc
                .current_rev
                .store(revision, Ordering::Release);
            self.shared.applied_index.store(index, Ordering::Release);
            *self.shared.alarms.write() = self.shared.mvcc.alarms.lock().clone();
            self.shared.hub.jump(revision);
        }
        drop(db);
        self.measure();
        self.cursor = ApplyCursor {
            applied_index: index,
            rev: revision,
            floor: compact_revision,
        };
        // The install's commit was durable: the applied index is the durable one now.
        self.checkpointed()?;
        self.compaction = (compact_finished < compact_revision).then_some(CompactionJob {
            at: compact_revision,
            cursor: None,
        });
        if self.compaction.is_none() {
            // The snapshot's rows are compacted through its floor already.
            let (ready, waiting): (Vec<_>, Vec<_>) = self
                .physical_waiters
                .drain(..)
                .partition(|(target, _)| *target <= compact_revision);
            self.physical_waiters = waiting;
            for (_, reply) in ready {
                let _ = reply.send(Ok(CommandResult::Compact { revision }));
            }
        }
        self.shared.applied_watch.send_replace(index);
        self.shared.wake_syncer();
        info!(
            index,
            term,
            revision,
            compact_revision,
            keys = self.shared.mvcc.index.read().len(),
            "installed snapshot"
        );
        Ok(())
    }

    /// Commits redb durably if the log holds commands redb has not made durable.
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        if self.unchecked == 0 {
            self.last_checkpoint = Instant::now();
            return Ok(());
        }
        {
            let db = self.shared.db.read();
            let txn = db.begin_write()?;
            {
                // Rewriting the applied index gives the durable commit something to write;
                // it persists every non-durable commit before it.
                let mut meta = txn.open_table(META)?;
                meta.insert(META_APPLIED_INDEX, self.cursor.applied_index)?;
            }
            let commit_started = Instant::now();
            txn.commit()?;
            crate::metrics::BACKEND_COMMIT.observe(commit_started.elapsed());
        }
        // A durable commit may give the file's free tail back.
        self.measure();
        self.checkpointed()
    }

    /// After a durable redb commit: the log before it is no longer needed.
    fn checkpointed(&mut self) -> Result<(), StoreError> {
        self.unchecked = 0;
        self.last_checkpoint = Instant::now();
        self.shared.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.shared
            .durable_applied
            .store(self.cursor.applied_index, Ordering::Release);
        match self.wal.as_mut() {
            Some(wal) => wal.release(self.cursor.applied_index),
            None => Ok(()),
        }
    }

    /// One bounded step of physical compaction: drops the superseded history of the next
    /// [`COMPACTION_BATCH_KEYS`] keys. Its commit need not be durable: after a crash the
    /// recorded compaction revision is still there and compaction simply runs again.
    fn compaction_step(&mut self) -> Result<(), StoreError> {
        let Some(job) = self.compaction.as_mut() else {
            return Ok(());
        };
        let at = job.at;
        let db = self.shared.db.read();
        let last = compaction_step(&db, &self.shared.mvcc, at, job.cursor.as_ref())?;
        drop(db);
        self.measure();
        if last.is_none() {
            info!(revision = at, "finished compaction");
            self.compaction = None;
            let (ready, waiting): (Vec<_>, Vec<_>) = self
                .physical_waiters
                .drain(..)
                .partition(|(target, _)| *target <= at);
            self.physical_waiters = waiting;
            for (_, reply) in ready {
                let revision = self.shared.mvcc.current_rev();
                let _ = reply.send(Ok(CommandResult::Compact { revision }));
            }
        } else if let Some(job) = self.compaction.as_mut() {
            job.cursor = last;
        }
        Ok(())
    }

    fn defragment(&mut self) -> Result<(), StoreError> {
        self.checkpoint()?;
        for attempt in 0..DEFRAGMENT_ATTEMPTS_MAX {
            let mut db = self.shared.db.write();
            match db.compact() {
                Ok(_) => {
                    drop(db);
                    self.measure();
                    info!(
                        attempts = attempt + 1,
                        backend_bytes = self.shared.backend_bytes.load(Ordering::Acquire),
                        "defragmented store"
                    );
                    return Ok(());
                }
                Err(redb::CompactionError::TransactionInProgress) => {
                    drop(db);
                    std::thread::sleep(DEFRAGMENT_RETRY_DELAY);
                }
                Err(e) => return Err(StoreError::storage(e)),
            }
        }
        Err(StoreError::Storage(
            "defragment: reads kept the database busy; try again".into(),
        ))
    }

    /// Measures the backend's size (the database file's length) for the quota.
    fn measure(&self) {
        self.shared
            .backend_bytes
            .store(file_bytes(&self.shared.path), Ordering::Release);
    }

    /// An entry proposed on another member applied past this member's quota: raise
    /// `NOSPACE` for this member through the log, as every etcd member does for itself
    /// (`applyEntryNormal`). Only a cluster member gets entries it did not propose. The
    /// proposal is not waited for; a lost one is made again by the next entry over quota.
    fn raise_nospace_for_entry(&self) {
        let Some(replicator) = self.shared.replicator.get() else {
            return;
        };
        let member = self.shared.member_id;
        let active = self
            .shared
            .alarms
            .read()
            .list(AlarmType::Nospace as i32)
            .iter()
            .any(|a| a.member_id == member);
        if active {
            return;
        }
        warn!(
            quota = self.shared.quota,
            backend_bytes = self.shared.backend_bytes.load(Ordering::Acquire),
            "an entry applied past the backend quota; raising the NOSPACE alarm"
        );
        let (reply, _) = oneshot::channel();
        replicator.submit(
            Command {
                command: Some(Cmd::Alarm(AlarmRequest {
                    action: AlarmAction::Activate as i32,
                    member_id: member,
                    alarm: AlarmType::Nospace as i32,
                })),
            },
            reply,
        );
    }

    fn in_use_bytes(&self) -> Result<u64, StoreError> {
        let db = self.shared.db.read();
        let txn = db.begin_write()?;
        let stats = txn.stats()?;
        let in_use = stats.allocated_pages() * stats.page_size() as u64;
        txn.abort()?;
        Ok(in_use)
    }
}

/// One bounded step of physical compaction at revision `at`: drops the superseded history of
/// the next [`COMPACTION_BATCH_KEYS`] keys after `after` (`None`: from the first key), or,
/// when no key is left, records the compaction as finished. Returns the last key it
/// compacted, or `None` once finished. Its commit need not be durable: after a crash the
/// recorded compaction revision is still there and compaction simply runs again.
pub(crate) fn compaction_step(
    db: &Database,
    mvcc: &Mvcc,
    at: i64,
    after: Option<&Bytes>,
) -> Result<Option<Bytes>, StoreError> {
    let keys = mvcc.index.read().keys_after(after, COMPACTION_BATCH_KEYS);
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::None)
        .map_err(StoreError::storage)?;
    {
        let mut table = txn.open_table(KV)?;
        if keys.is_empty() {
            let mut meta = txn.open_table(META)?;
            meta.insert(META_COMPACT_FINISHED, at as u64)?;
        } else {
            let mut removed = Vec::new();
            {
                let mut index = mvcc.index.write();
                for key in &keys {
                    index.compact_key(key, at, &mut removed);
                }
            }
            for rev in removed {
                table.remove(rev.to_row_key())?;
            }
        }
    }
    txn.commit()?;
    Ok(keys.last().cloned())
}

/// Replays history to unsynced watchers and sends periodic progress notifications.
fn run_syncer(shared: &Shared) {
    let mut last_progress = Instant::now();
    while !shared.stopping.load(Ordering::Acquire) {
        {
            let (flag, condvar) = &shared.sync_wakeup;
            let mut woken = flag.lock();
            if !*woken {
                condvar.wait_for(&mut woken, WATCH_SYNC_INTERVAL);
            }
            *woken = false;
        }
        if let Err(e) = sync_round(shared) {
            warn!(error = %e, "watch sync round failed");
        }
        shared.hub.retry_progress();
        if last_progress.elapsed() >= shared.progress_notify_interval {
            shared.hub.progress_tick();
            last_progress = Instant::now();
        }
    }
}

/// One round: reads at most [`WATCH_SYNC_REVISIONS_MAX`] revisions of history once and hands
/// each unsynced watcher its part.
///
/// The round combines the hub's watchers, the compaction floor and the index (for `prev_kv`)
/// with rows of a read transaction; a snapshot install that overlaps it may have replaced any
/// of them, so such a round delivers nothing and the next one starts over (the install wakes
/// it). The hub's epoch covers an install that starts after the round's reads and is done
/// before a delivery.
fn sync_round(shared: &Shared) -> Result<(), StoreError> {
    let generation = shared.install_generation.load(Ordering::SeqCst);
    if !generation.is_multiple_of(2) {
        return Ok(());
    }
    let round = shared.hub.unsynced(WATCH_SYNC_WATCHERS_MAX);
    if round.watchers.is_empty() {
        return Ok(());
    }
    let current = round.current_rev;
    // The read transaction starts before the compaction floor is read: rows at or above the
    // floor this round sees are never deleted while the transaction lives.
    let txn = shared.db.read().begin_read()?;
    let compacted = shared.mvcc.compact_rev();
    let (gone, live): (Vec<_>, Vec<_>) = round
        .watchers
        .into_iter()
        .partition(|w| w.next_rev < compacted);
    let mut events = Vec::new();
    let mut through = current;
    if let Some(from) = live.iter().map(|w| w.next_rev).min() {
        through = current.min(from.saturating_add(WATCH_SYNC_REVISIONS_MAX - 1));
        let table = txn.open_table(KV)?;
        let with_prev = live.iter().any(|w| w.prev_kv);
        events = read_events(
            &table,
            &shared.mvcc.index,
            compacted,
            from,
            through,
            with_prev,
        )?;
    }
    drop(txn);
    if shared.install_generation.load(Ordering::SeqCst) != generation {
        shared.wake_syncer();
        return Ok(());
    }
    for w in gone {
        shared
            .hub
            .compacted(round.epoch, w.stream, w.watch_id, compacted);
    }
    let mut any_behind = false;
    for w in live {
        let mine: Vec<Event> = events
            .iter()
            .filter(|e| {
                e.kv.as_ref()
                    .is_some_and(|kv| kv.mod_revision >= w.next_rev && w.range.contains(&kv.key))
            })
            .map(|e| {
                if w.prev_kv {
                    e.clone()
                } else {
                    Event {
                        prev_kv: None,
                        ..e.clone()
                    }
                }
            })
            .collect();
        if !shared
            .hub
            .deliver_history(round.epoch, w.stream, w.watch_id, mine, through)
            || through < current
        {
            any_behind = true;
        }
    }
    if any_behind {
        shared.wake_syncer();
    }
    Ok(())
}

/// Proposes revocations of expired leases.
fn run_lessor(shared: &Shared, writer: &mpsc::Sender<WriterMsg>) {
    while !shared.stopping.load(Ordering::Acquire) {
        std::thread::sleep(LEASE_EXPIRY_CHECK_INTERVAL);
        if !shared.lease_authority.load(Ordering::Acquire) {
            // Followers keep deadlines (so a new leader can promote them) but never revoke.
            continue;
        }
        let expired = shared
            .mvcc
            .lessor
            .lock()
            .take_expired(Instant::now(), LEASE_REVOKES_PER_CHECK_MAX);
        // All revocations go to the writer at once so they share one group commit.
        let mut pending = Vec::with_capacity(expired.len());
        for id in expired {
            let (reply, rx) = oneshot::channel();
            let command = Command {
                command: Some(Cmd::LeaseRevoke(LeaseRevokeRequest { id })),
            };
            if shared.replicated {
                match shared.replicator.get() {
                    Some(replicator) => replicator.submit(command, reply),
                    None => {
                        shared.mvcc.lessor.lock().revoke_failed(id);
                        continue;
                    }
                }
            } else if writer
                .blocking_send(WriterMsg::Command(Pending {
                    index: None,
                    command: Some(command),
                    physical: false,
                    reply: Some(reply),
                }))
                .is_err()
            {
                return;
            }
            pending.push((id, rx));
        }
        let deadline = Instant::now() + REPLICATED_REQUEST_TIMEOUT;
        for (id, mut rx) in pending {
            // Polled against a deadline: a replicated revocation lost in a leader change is
            // never answered.
            let answer = loop {
                match rx.try_recv() {
                    Ok(answer) => break Some(answer),
                    Err(oneshot::error::TryRecvError::Empty) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(oneshot::error::TryRecvError::Empty) => break None,
                    Err(oneshot::error::TryRecvError::Closed) => {
                        if shared.replicated {
                            break None;
                        }
                        return;
                    }
                }
            };
            match answer {
                Some(Ok(_)) | Some(Err(StoreError::LeaseNotFound)) => {}
                Some(Err(e)) => {
                    warn!(lease = id, error = %e, "revoking expired lease failed");
                    shared.mvcc.lessor.lock().revoke_failed(id);
                }
                None => shared.mvcc.lessor.lock().revoke_failed(id),
            }
        }
    }
}

/// Asks the writer for a checkpoint every [`CHECKPOINT_INTERVAL`]; the writer skips it when
/// a batch made one recently or nothing is pending.
fn run_checkpoint_ticker(shared: &Shared, writer: &mpsc::Sender<WriterMsg>) {
    let mut last = Instant::now();
    while !shared.stopping.load(Ordering::Acquire) {
        std::thread::sleep(CHECKPOINT_TICK);
        if last.elapsed() >= CHECKPOINT_INTERVAL {
            last = Instant::now();
            // A full queue means the writer is busy and checkpoints by count anyway.
            let _ = writer.try_send(WriterMsg::Checkpoint);
        }
    }
}

impl Store {
    /// The data dir this store lives in.
    pub fn data_dir(&self) -> &Path {
        self.shared.path.parent().unwrap_or(Path::new("."))
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
}

/// [`Store::hash_kv`] over `txn`, which must have begun before the revisions are read here.
pub(crate) fn hash_kv(
    txn: &ReadTransaction,
    mvcc: &Mvcc,
    revision: i64,
) -> Result<(u32, i64), StoreError> {
    let current = mvcc.current_rev();
    let compacted = mvcc.compact_rev();
    let at = if revision <= 0 { current } else { revision };
    if at > current {
        return Err(StoreError::FutureRevision);
    }
    if at < compacted {
        return Err(StoreError::Compacted {
            compact_revision: compacted,
        });
    }
    let table = txn.open_table(KV)?;
    let mut hasher = crc32fast::Hasher::new();
    let end = Rev::first_of(at.saturating_add(1)).to_row_key();
    for row in table.range(..end)? {
        let (key, value) = row?;
        let (main, sub) = key.value();
        hasher.update(&main.to_be_bytes());
        hasher.update(&sub.to_be_bytes());
        hasher.update(value.value());
    }
    Ok((hasher.finalize(), compacted))
}

#[cfg(test)]
mod tests {
    use redb::backends::InMemoryBackend;

    use super::*;
    use crate::pb::etcdserverpb::{RequestOp, request_op};

    /// A fresh store's tables in memory, its shared state and its apply cursor.
    fn fresh() -> (Database, Mvcc, ApplyCursor) {
        let db = Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .expect("in-memory database");
        let loaded = load(&db, Some((1, 2))).expect("load");
        let cursor = loaded.state.cursor();
        (db, loaded.state.into_mvcc(), cursor)
    }

    fn apply(
        db: &Database,
        mvcc: &Mvcc,
        cursor: &mut ApplyCursor,
        commands: &[Cmd],
        quota: QuotaCheck,
    ) -> Applied {
        let commands: Vec<Command> = commands
            .iter()
            .map(|c| Command {
                command: Some(c.clone()),
            })
            .collect();
        let txn = db.begin_write().expect("begin");
        let applied =
            apply_commands(mvcc, &txn, cursor, commands.iter().map(Some), quota).expect("apply");
        txn.commit().expect("commit");
        applied
    }

    fn put(key: &str) -> PutRequest {
        PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        }
    }

    fn op(request: request_op::Request) -> RequestOp {
        RequestOp {
            request: Some(request),
        }
    }

    fn alarm(action: AlarmAction, member: u64, kind: AlarmType) -> Cmd {
        Cmd::Alarm(AlarmRequest {
            action: action as i32,
            member_id: member,
            alarm: kind as i32,
        })
    }

    /// Each result as `Ok` or the error, for comparing with what etcd answers.
    fn outcomes(applied: &Applied) -> Vec<Result<(), StoreError>> {
        applied
            .results
            .iter()
            .map(|r| r.as_ref().map(|_| ()).map_err(Clone::clone))
            .collect()
    }

    #[test]
    fn nospace_refuses_puts_txns_with_puts_and_grants_and_applies_the_rest() {
        let (db, mvcc, mut cursor) = fresh();
        let none = QuotaCheck::default();
        apply(&db, &mvcc, &mut cursor, &[Cmd::Put(put("a"))], none);
        let raised = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[alarm(AlarmAction::Activate, 7, AlarmType::Nospace)],
            none,
        );
        assert!(raised.alarms_changed);
        let revision = cursor.rev;
        let nested = TxnRequest {
            success: vec![op(request_op::Request::RequestPut(put("n")))],
            ..Default::default()
        };
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                Cmd::Put(put("b")),
                Cmd::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 5 }),
                Cmd::Txn(TxnRequest {
                    failure: vec![op(request_op::Request::RequestPut(put("c")))],
                    ..Default::default()
                }),
                // etcd's cost of a txn counts top-level puts only: a nested put gets through.
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestTxn(nested))],
                    ..Default::default()
                }),
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestRange(RangeRequest {
                        key: Bytes::from_static(b"a"),
                        ..Default::default()
                    }))],
                    ..Default::default()
                }),
                Cmd::DeleteRange(DeleteRangeRequest {
                    key: Bytes::from_static(b"a"),
                    ..Default::default()
                }),
                Cmd::Compaction(CompactionRequest {
                    revision: 2,
                    physical: false,
                }),
            ],
            QuotaCheck::default(),
        );
        assert_eq!(
            outcomes(&applied),
            [
                Err(StoreError::NoSpace),
                Err(StoreError::NoSpace),
                Err(StoreError::NoSpace),
                Ok(()),
                Ok(()),
                Ok(()),
                Ok(()),
            ]
        );
        assert!(
            !mvcc.lessor.lock().contains(5),
            "a refused grant grants nothing"
        );
        // The nested put and the delete each took a revision; the refusals none.
        assert_eq!(cursor.rev, revision + 2);
        assert!(applied.over_quota.is_empty());
        // Cleared: writes apply again.
        apply(
            &db,
            &mvcc,
            &mut cursor,
            &[alarm(AlarmAction::Deactivate, 7, AlarmType::Nospace)],
            none,
        );
        let applied = apply(&db, &mvcc, &mut cursor, &[Cmd::Put(put("b"))], none);
        assert_eq!(outcomes(&applied), [Ok(())]);
    }

    #[test]
    fn corrupt_refuses_every_write_but_serves_read_only_txns() {
        let (db, mvcc, mut cursor) = fresh();
        let none = QuotaCheck::default();
        apply(&db, &mvcc, &mut cursor, &[Cmd::Put(put("a"))], none);
        apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                alarm(AlarmAction::Activate, 7, AlarmType::Nospace),
                alarm(AlarmAction::Activate, 8, AlarmType::Corrupt),
            ],
            none,
        );
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                Cmd::Put(put("b")),
                Cmd::DeleteRange(DeleteRangeRequest {
                    key: Bytes::from_static(b"a"),
                    ..Default::default()
                }),
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestDeleteRange(
                        DeleteRangeRequest {
                            key: Bytes::from_static(b"a"),
                            ..Default::default()
                        },
                    ))],
                    ..Default::default()
                }),
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestRange(
                        RangeRequest::default(),
                    ))],
                    ..Default::default()
                }),
                Cmd::Compaction(CompactionRequest {
                    revision: 2,
                    physical: false,
                }),
                Cmd::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 5 }),
                Cmd::LeaseRevoke(LeaseRevokeRequest { id: 5 }),
            ],
            none,
        );
        assert_eq!(
            outcomes(&applied),
            [
                Err(StoreError::Corrupt),
                Err(StoreError::Corrupt),
                Err(StoreError::Corrupt),
                Ok(()),
                Err(StoreError::Corrupt),
                Err(StoreError::Corrupt),
                Err(StoreError::Corrupt),
            ]
        );
        // CORRUPT cleared, NOSPACE still active: capped, not plain.
        apply(
            &db,
            &mvcc,
            &mut cursor,
            &[alarm(AlarmAction::Deactivate, 8, AlarmType::Corrupt)],
            none,
        );
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                Cmd::Put(put("b")),
                Cmd::DeleteRange(DeleteRangeRequest {
                    key: Bytes::from_static(b"a"),
                    ..Default::default()
                }),
            ],
            none,
        );
        assert_eq!(outcomes(&applied), [Err(StoreError::NoSpace), Ok(())]);
    }

    #[test]
    fn past_the_quota_a_write_applies_but_answers_nospace() {
        let (db, mvcc, mut cursor) = fresh();
        let past = QuotaCheck {
            limit: Some(1_000),
            size: 900,
        };
        let revision = cursor.rev;
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                // 256 + 1 + 1: over.
                Cmd::Put(put("a")),
                // A txn of deletes costs nothing: fine.
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestDeleteRange(
                        DeleteRangeRequest {
                            key: Bytes::from_static(b"zz"),
                            ..Default::default()
                        },
                    ))],
                    ..Default::default()
                }),
                // 64: within.
                Cmd::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 5 }),
            ],
            past,
        );
        assert_eq!(
            outcomes(&applied),
            [Err(StoreError::NoSpace), Ok(()), Ok(())]
        );
        assert_eq!(applied.over_quota, [0]);
        // etcd's quota applier applies first, then answers: the put is there.
        assert_eq!(cursor.rev, revision + 1);
        assert_eq!(
            mvcc.index.read().get(b"a", cursor.rev),
            Some(Rev::new(cursor.rev, 0))
        );
    }

    #[test]
    fn alarm_requests_answer_as_etcds() {
        let (db, mvcc, mut cursor) = fresh();
        let none = QuotaCheck::default();
        let responses = |applied: &Applied| -> Vec<Vec<(u64, i32)>> {
            applied
                .results
                .iter()
                .map(|r| match r {
                    Ok(CommandResult::Alarm(resp)) => {
                        assert_eq!(resp.header, None, "etcd 3.4 answers without a header");
                        resp.alarms.iter().map(|a| (a.member_id, a.alarm)).collect()
                    }
                    other => panic!("not an alarm answer: {other:?}"),
                })
                .collect()
        };
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                alarm(AlarmAction::Activate, 7, AlarmType::Nospace),
                // Again: answered with the alarm, nothing changes.
                alarm(AlarmAction::Activate, 7, AlarmType::Nospace),
                alarm(AlarmAction::Activate, 3, AlarmType::Corrupt),
                alarm(AlarmAction::Get, 0, AlarmType::None),
                alarm(AlarmAction::Get, 0, AlarmType::Corrupt),
                // Not active: answered with nothing.
                alarm(AlarmAction::Deactivate, 8, AlarmType::Nospace),
                alarm(AlarmAction::Deactivate, 7, AlarmType::Nospace),
                alarm(AlarmAction::Get, 0, AlarmType::None),
            ],
            none,
        );
        assert_eq!(
            responses(&applied),
            [
                vec![(7, 1)],
                vec![(7, 1)],
                vec![(3, 2)],
                vec![(7, 1), (3, 2)],
                vec![(3, 2)],
                vec![],
                vec![(7, 1)],
                vec![(3, 2)],
            ]
        );
        assert!(applied.alarms_changed);
        // The table holds what memory holds, so a restart reads it back.
        let txn = db.begin_read().expect("read");
        let rows: Vec<(i32, u64)> = txn
            .open_table(ALARMS)
            .expect("alarms table")
            .iter()
            .expect("iterate")
            .map(|row| row.expect("row").0.value())
            .collect();
        assert_eq!(rows, [(2, 3)]);
        assert_eq!(mvcc.alarms.lock().all().len(), 1);
    }
}
