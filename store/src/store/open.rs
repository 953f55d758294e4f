//! Opening a data dir and closing the store.
//!
//! [`Store::open`] refuses a data dir that is not a skerry store (other files, a file that is
//! not redb, another format, another member) or that a running skerry holds, loads the tables
//! ([`crate::state::load`]), replays the write-ahead log records after redb's applied index
//! through the one apply path ([`crate::apply::apply_commands`]) and makes them durable, then
//! starts the writer and the background threads. A replicated store keeps no log of its own:
//! its Raft log re-delivers what redb lost.
//!
//! Invariant: when `open` returns, redb holds every write the last run acknowledged (a
//! replicated store: every write up to its applied index; its Raft log re-delivers the rest).

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use prost::Message;
use redb::{Database, Durability};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::background::{run_checkpoint_ticker, run_lessor, run_syncer};
use super::writer::{WRITE_BATCH_COMMANDS_MAX, WRITE_QUEUE_MAX, Writer, WriterMsg};
use super::{RAFT_TERM, Shared, StopGuard, Store, StoreConfig, file_bytes};
use crate::apply::{ApplyCursor, apply_commands};
use crate::error::StoreError;
use crate::mvcc::{META, META_APPLIED_INDEX, Mvcc};
use crate::pb::command::Command;
use crate::quota::QuotaCheck;
use crate::state::{Loaded, load};
use crate::wal::Wal;
use crate::watch::WatchHub;

/// Name of the write-ahead log directory inside the data dir.
pub const WAL_DIR_NAME: &str = "wal";

/// The name of the store file inside the data dir.
pub const DB_FILE_NAME: &str = "skerry.redb";

/// The first bytes of every redb file; anything else in our file's place is not ours.
const REDB_MAGIC: &[u8] = b"redb";

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
        let unfinished_compaction =
            (compact_finished < compact_revision).then_some(compact_revision);
        let mut writer = Writer::new(shared.clone(), rx, cursor, wal, unfinished_compaction);
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

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, StoreError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(StoreError::from)
}
