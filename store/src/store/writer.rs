//! The writer thread: the only code that writes the store's redb file and write-ahead log.
//!
//! It takes every message waiting in its queue (up to [`WRITE_BATCH_COMMANDS_MAX`] commands),
//! applies the commands in one redb transaction ([`crate::apply::apply_commands`]), appends
//! them to the log with one `fdatasync` (group commit; a replicated store's Raft log is the
//! durable copy instead), commits redb without an fsync, then publishes the batch and answers
//! its callers. Every [`CHECKPOINT_COMMANDS`] commands, or when the ticker asks after
//! [`CHECKPOINT_INTERVAL`], it commits redb durably and releases the log that commit covers.
//! Between batches it runs physical compaction in bounded steps. It also installs Raft
//! snapshots, defragments, and measures the file for the quota.
//!
//! # Invariants
//! - Published only once durable: readers never see, and callers are never answered for, a
//!   write a crash could take back.
//! - A snapshot install is a barrier in the queue: it follows every command queued before it
//!   and precedes every one after. While it swaps the store's memory it holds the index write
//!   lock and keeps the install generation odd ([`InstallWindow`]), so readers that overlap
//!   it read again.
//! - A failed commit stops the writer for good: memory may be ahead of the last good commit,
//!   so every queued and later caller gets an error until the store is opened again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use redb::Durability;
use tokio::sync::{mpsc, oneshot};
use tracing::{error, info, warn};

use super::{Shared, file_bytes};
use crate::apply::{
    ApplyCursor, CommandResult, apply_commands, check_entry_order, compaction_step, stage_install,
};
use crate::error::StoreError;
use crate::mvcc::{META, META_APPLIED_INDEX};
use crate::pb::command::{Command, command::Command as Cmd};
use crate::pb::etcdserverpb::{AlarmRequest, AlarmType, alarm_request::AlarmAction};
use crate::quota::QuotaCheck;
use crate::replication::Reply;
use crate::state::State;
use crate::wal::Wal;

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

/// Attempts to get exclusive use of the database file for a defragmentation; each waits
/// [`DEFRAGMENT_RETRY_DELAY`] for in-flight reads to finish.
pub const DEFRAGMENT_ATTEMPTS_MAX: u32 = 200;
pub const DEFRAGMENT_RETRY_DELAY: Duration = Duration::from_millis(5);

/// A command on its way to the writer.
pub(super) struct Pending {
    /// The log index, for commands from a replicated log; a single store numbers its own.
    pub(super) index: Option<u64>,
    /// `None`: a log entry without a command, which only moves the applied index.
    pub(super) command: Option<Command>,
    /// Physical compaction: answer once the rows are gone.
    pub(super) physical: bool,
    pub(super) reply: Option<Reply>,
}

pub(super) enum WriterMsg {
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

pub(super) struct Writer {
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
    /// A writer that goes on from `cursor`, with this store's own log (`None` when a
    /// replicated log feeds it), resuming physical compaction to `unfinished_compaction` (the
    /// recorded compaction revision, when the last run did not finish compacting to it).
    pub(super) fn new(
        shared: Arc<Shared>,
        rx: mpsc::Receiver<WriterMsg>,
        cursor: ApplyCursor,
        wal: Option<Wal>,
        unfinished_compaction: Option<i64>,
    ) -> Writer {
        Writer {
            shared,
            rx,
            cursor,
            compaction: unfinished_compaction.map(|at| CompactionJob { at, cursor: None }),
            physical_waiters: Vec::new(),
            wal,
            unchecked: 0,
            last_checkpoint: Instant::now(),
            encoded: Vec::new(),
        }
    }

    pub(super) fn run(&mut self) {
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
        if self.shared.nospace_raised_here() {
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
                    member_id: self.shared.member_id,
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
