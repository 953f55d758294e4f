//! The store as a deterministic, single-threaded state machine, for the Raft layer's
//! deterministic simulation: thousands of seeded fault schedules run in one thread on a
//! virtual clock, and each must replay exactly from its seed.
//!
//! A [`SyncStore`] applies committed entries with the same code as [`crate::Store`]'s writer
//! (`apply::apply_commands` over `mvcc::Apply`), reads with the same `mvcc::range` and
//! history reader, compacts with the same bounded steps, and writes and installs the same
//! snapshot stream ([`crate::snapshot`]), over redb's in-memory backend. It starts no
//! thread, opens no file, and takes ids from its caller rather than from a random source:
//! its answers depend only on the calls made to it.
//!
//! # Differences from [`crate::Store`]
//! None changes what a command returns or a read sees.
//! - Physical compaction runs to the end inside the call that applied (or installed) the
//!   compaction, instead of in steps between later batches. Only rows below the compaction
//!   floor differ meanwhile, and no read sees those.
//! - Leases are granted and revoked by commands exactly as in the store, but nothing expires
//!   them: expiry is wall-clock time, which the simulation does not have. The lessor still
//!   stamps each grant with `Instant::now()`, a deadline nothing here reads, so it cannot
//!   change an answer. A simulated leader proposes revocations itself.
//! - Watch events are returned by [`SyncStore::apply`] and read back by
//!   [`SyncStore::history`]; there is no watch hub, the simulation feeds its own watchers.
//! - There is no space quota (an in-memory database has no file to measure): alarms are
//!   raised and cleared by commands only. The alarm table and the appliers it calls for are
//!   the real store's.
//!
//! # Durability
//! The real store commits redb durably only at checkpoints (every
//! [`crate::store::CHECKPOINT_COMMANDS`] commands or [`crate::store::CHECKPOINT_INTERVAL`],
//! and at every snapshot install); a power loss takes back every commit after the last one,
//! and the Raft log re-delivers those entries. Here the simulation decides when
//! [`SyncStore::checkpoint`] happens, and [`SyncStore::crash`] is the power loss.
//!
//! Invariant: the durable image (the snapshot stream of the last checkpoint, plus the applied
//! index it was taken at) holds exactly the tables of the last checkpoint but this member's
//! identity: the stream leaves out only the cluster and member ids and the applied index,
//! which the store keeps itself. So a crash rebuilds exactly what redb would have kept,
//! through the snapshot install's own table replacement.

use std::fmt;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use redb::backends::InMemoryBackend;
use redb::{Database, Durability, ReadableDatabase};

use crate::apply::{
    ApplyCursor, CommandResult, apply_commands, check_entry_order, compaction_step, stage_install,
};
use crate::error::StoreError;
use crate::mvcc::{self, KV, Mvcc};
use crate::pb::command::{Command, Member};
use crate::pb::etcdserverpb::{AlarmMember, RangeRequest, RangeResponse, ResponseHeader};
use crate::pb::mvccpb::Event;
use crate::quota::QuotaCheck;
use crate::read::PinnedSnapshot;
use crate::read::{pin, raft_record, read_history, read_installed_snapshot, read_members};
use crate::replication::{Committed, StateMachine};
use crate::state::{State, load};

/// redb durability of the commits that apply entries (installs are durable, as in the real
/// store). The simulated durability is the image (see the module docs), not this, so the
/// cheaper level will do: about half the cost of a durable commit, even in memory. Memory
/// stays bounded without durable commits, since redb reuses the pages that only
/// non-durable commits wrote (measured: a flat page count over 200,000 commits).
const COMMIT_DURABILITY: Durability = Durability::None;

/// A store member for the deterministic simulation; see the module docs.
pub struct SyncStore {
    /// The store's tables, in memory. Replaced by a new database on [`SyncStore::crash`].
    db: Database,
    /// The key index, published revision and floor, and lessor, as the real store's readers
    /// share them. Nothing here runs concurrently: the locks inside are never contended.
    mvcc: Mvcc,
    /// Where applying stands; equals what [`SyncStore::mvcc`] publishes between calls.
    cursor: ApplyCursor,
    cluster_id: u64,
    member_id: u64,
    /// The term [`SyncStore::header`] reports; set by the simulated Raft layer.
    raft_term: u64,
    /// What a crash leaves: the state of the last checkpoint.
    image: DurableImage,
    /// A batch failed after it had changed memory (see [`crate::mvcc::Apply::poisoned`]):
    /// memory is ahead of the tables. Every fallible call but [`SyncStore::crash`] (the
    /// restart) is refused, as the real store refuses work until it is restarted.
    failed: bool,
}

/// The state of the last checkpoint. See the module docs for why this is all of it.
struct DurableImage {
    applied_index: u64,
    /// The snapshot stream ([`crate::snapshot::write`]) of the tables at `applied_index`.
    snapshot: Vec<u8>,
}

/// What one [`SyncStore::apply`] produced.
#[derive(Debug, Clone, Default)]
pub struct SyncApplied {
    /// One result per entry applied (entries at or below the applied index are skipped):
    /// `results[i]` is entry `first_index + i`. An entry without a command gets an error
    /// result, as in the real store, and only takes its index.
    pub results: Vec<Result<CommandResult, StoreError>>,
    /// The log index of the first entry applied; with no entry applied, the next one due.
    pub first_index: u64,
    /// The watch events the entries produced, in revision order, with `prev_kv`: what the
    /// real store hands its watch hub.
    pub events: Vec<Event>,
    /// The store revision after the entries.
    pub revision: i64,
}

/// A snapshot of a [`SyncStore`] for the Raft layer: the stream
/// [`crate::PinnedSnapshot::write`] produces, with what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSnapshot {
    /// The last log index applied in the snapshot.
    pub applied_index: u64,
    /// The store revision of the snapshot.
    pub revision: i64,
    /// raft-rs's encoded `ConfState` in the snapshot; `None` before any membership change.
    pub conf_state: Option<Vec<u8>>,
    /// The snapshot stream ([`crate::snapshot`]).
    pub bytes: Vec<u8>,
}

impl SyncStore {
    /// A new, empty member `member_id` of cluster `cluster_id`, at revision 1 and applied
    /// index 0, with that state already durable.
    pub fn new(cluster_id: u64, member_id: u64) -> Result<SyncStore, StoreError> {
        let db = in_memory_database()?;
        let loaded = load(&db, Some((cluster_id, member_id)))?;
        let mut store = SyncStore {
            db,
            cursor: loaded.state.cursor(),
            mvcc: loaded.state.into_mvcc(),
            cluster_id,
            member_id,
            raft_term: 0,
            image: DurableImage {
                applied_index: 0,
                snapshot: Vec::new(),
            },
            failed: false,
        };
        store.checkpoint()?;
        Ok(store)
    }

    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    pub fn member_id(&self) -> u64 {
        self.member_id
    }

    /// The last applied log index.
    pub fn applied_index(&self) -> u64 {
        self.cursor.applied_index
    }

    /// The applied index of the last checkpoint: a crash goes back to it, and the Raft log
    /// must keep every entry after it.
    pub fn durable_applied_index(&self) -> u64 {
        self.image.applied_index
    }

    /// The last committed revision.
    pub fn revision(&self) -> i64 {
        self.mvcc.current_rev()
    }

    pub fn compact_revision(&self) -> i64 {
        self.mvcc.compact_rev()
    }

    /// Whether a failed batch left the store refusing work until [`SyncStore::crash`].
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// Sets the Raft term that response headers report (the real store learns it from
    /// `StateMachine::set_leadership`).
    pub fn set_raft_term(&mut self, term: u64) {
        self.raft_term = term;
    }

    /// A response header at `revision`, naming this member.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.raft_term,
        }
    }

    /// Applies committed log entries `(index, command)` in index order, in one redb
    /// transaction as the real store's writer applies a batch. Entries at or below the
    /// applied index are skipped (the log re-delivers them after a crash); the rest must
    /// follow it with no gap, or nothing is applied. `None` is an entry without a command.
    ///
    /// An error other than a gap means the batch failed after it had written (which
    /// validation before the first write makes unreachable for client errors): the store is
    /// failed until [`SyncStore::crash`], like the real store until a restart.
    pub fn apply(
        &mut self,
        entries: Vec<(u64, Option<Command>)>,
    ) -> Result<SyncApplied, StoreError> {
        self.check_usable()?;
        let applied_index = self.cursor.applied_index;
        let entries: Vec<(u64, Option<Command>)> = entries
            .into_iter()
            .filter(|(index, _)| *index > applied_index)
            .collect();
        check_entry_order(applied_index, entries.iter().map(|(index, _)| Some(*index)))?;
        let result = self.apply_batch(&entries);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn apply_batch(
        &mut self,
        entries: &[(u64, Option<Command>)],
    ) -> Result<SyncApplied, StoreError> {
        let first_index = self.cursor.applied_index + 1;
        if entries.is_empty() {
            return Ok(SyncApplied {
                first_index,
                revision: self.cursor.rev,
                ..SyncApplied::default()
            });
        }
        let mut cursor = self.cursor;
        let mut txn = self.db.begin_write()?;
        txn.set_durability(COMMIT_DURABILITY)
            .map_err(StoreError::storage)?;
        let applied = apply_commands(
            &self.mvcc,
            &txn,
            &mut cursor,
            entries.iter().map(|(_, command)| command.as_ref()),
            QuotaCheck::default(),
        )?;
        txn.commit()?;
        // Published after the commit, in the real writer's order.
        self.cursor = cursor;
        self.mvcc.current_rev.store(cursor.rev, Ordering::Release);
        if let Some(at) = applied.new_compaction {
            self.mvcc.compact_rev.store(at, Ordering::Release);
            self.compact_rows(at)?;
        }
        Ok(SyncApplied {
            results: applied.results,
            first_index,
            events: applied.events,
            revision: cursor.rev,
        })
    }

    /// Physical compaction at `at`, every step of it, as the real writer runs it between
    /// batches.
    fn compact_rows(&mut self, at: i64) -> Result<(), StoreError> {
        let mut after: Option<Bytes> = None;
        while let Some(last) = compaction_step(&self.db, &self.mvcc, at, after.as_ref())? {
            after = Some(last);
        }
        Ok(())
    }

    /// Range at the current revision (or `req.revision`), with the real store's validation
    /// and semantics ([`crate::Store::range`]).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, StoreError> {
        self.check_usable()?;
        crate::validate::range(req)?;
        let current = self.mvcc.current_rev();
        let txn = self.db.begin_read()?;
        let table = txn.open_table(KV)?;
        let mut resp = mvcc::range(&table, &self.mvcc, req, current)?;
        resp.header = Some(self.header(current));
        Ok(resp)
    }

    /// The events of revisions `from..=through`, with `prev_kv`, as [`crate::Store::history`]
    /// and the watch syncer read them; [`StoreError::Compacted`] when `from` is below the
    /// compaction floor.
    pub fn history(&self, from: i64, through: i64) -> Result<Vec<Event>, StoreError> {
        self.check_usable()?;
        read_history(&self.db.begin_read()?, &self.mvcc, from, through)
    }

    /// [`crate::Store::hash_kv`]: a CRC-32 over every retained row up to `revision` (0: the
    /// current one), and the compaction floor.
    pub fn hash_kv(&self, revision: i64) -> Result<(u32, i64), StoreError> {
        self.check_usable()?;
        crate::read::hash_kv(&self.db.begin_read()?, &self.mvcc, revision)
    }

    /// The cluster's members as the log recorded them, sorted by id.
    pub fn members(&self) -> Result<Vec<Member>, StoreError> {
        self.check_usable()?;
        read_members(&self.db.begin_read()?)
    }

    /// raft-rs's encoded `ConfState` as of the last applied membership change (or installed
    /// snapshot); `None` before there was one.
    pub fn conf_state(&self) -> Result<Option<Vec<u8>>, StoreError> {
        self.check_usable()?;
        raft_record(&self.db.begin_read()?, mvcc::RAFT_CONF_STATE)
    }

    /// The log index and term of the last snapshot installed, if any.
    pub fn installed_snapshot(&self) -> Result<Option<(u64, u64)>, StoreError> {
        self.check_usable()?;
        read_installed_snapshot(&self.db.begin_read()?)
    }

    /// The active alarms, as the alarm table holds them and the apply path obeys them.
    pub fn alarms(&self) -> Vec<AlarmMember> {
        self.mvcc.alarms.lock().all()
    }

    /// Lease ids, ascending.
    pub fn lease_ids(&self) -> Vec<i64> {
        self.mvcc.lessor.lock().ids()
    }

    /// Lease `id`'s granted TTL in seconds and its keys (ascending), or `None` if there is
    /// no such lease.
    pub fn lease(&self, id: i64) -> Option<(i64, Vec<Bytes>)> {
        let lessor = self.mvcc.lessor.lock();
        let lease = lessor.get(id)?;
        Some((lease.ttl_seconds, lease.keys.iter().cloned().collect()))
    }

    /// Makes the current state durable: a crash from now on comes back to it.
    pub fn checkpoint(&mut self) -> Result<(), StoreError> {
        self.check_usable()?;
        // The last image's size is a good guess at this one's.
        let mut snapshot = Vec::with_capacity(self.image.snapshot.len());
        crate::snapshot::write(&self.db.begin_read()?, &mut snapshot)?;
        self.image = DurableImage {
            applied_index: self.cursor.applied_index,
            snapshot,
        };
        Ok(())
    }

    /// A power loss and restart: everything since the last checkpoint is gone, exactly as
    /// redb loses its non-durable commits, and the store is usable again if it had failed.
    /// The Raft layer then re-delivers the entries after [`SyncStore::applied_index`].
    pub fn crash(&mut self) -> Result<(), StoreError> {
        let db = in_memory_database()?;
        // The tables and this member's identity, as a new data dir gets them at open.
        load(&db, Some((self.cluster_id, self.member_id)))?;
        let index = self.image.applied_index;
        let image = &self.image.snapshot;
        // Nothing is applied in the new database yet, so no index is behind it.
        let (txn, state) = stage_install(&db, 0, index, |txn| {
            crate::snapshot::restore_image(txn, image, index)
        })?;
        txn.commit()?;
        self.db = db;
        self.failed = false;
        // The rebuilt state is the image already: no new checkpoint.
        let result = self.take_state(state, false);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// A snapshot of the store as it is now, in the stream format
    /// [`crate::PinnedSnapshot::write`] produces, for a member too far behind.
    pub fn snapshot(&self) -> Result<SyncSnapshot, StoreError> {
        self.check_usable()?;
        let pinned = pin(&self.db)?;
        let mut bytes = Vec::new();
        pinned.write(&mut bytes)?;
        Ok(SyncSnapshot {
            applied_index: pinned.applied_index,
            revision: pinned.revision,
            conf_state: pinned.conf_state.clone(),
            bytes,
        })
    }

    /// Replaces the whole store with `snapshot`, which holds the state after log entry
    /// `index` of term `term`, as [`crate::Store::install_snapshot`] does: the member keeps
    /// its identity, `(index, term)` is recorded for [`SyncStore::installed_snapshot`], the
    /// next entry to apply is `index + 1`, and the install is durable at once (a
    /// checkpoint). A corrupt snapshot, or one behind the applied index, changes nothing.
    pub fn install(&mut self, snapshot: &[u8], index: u64, term: u64) -> Result<(), StoreError> {
        self.check_usable()?;
        let (txn, state) = stage_install(&self.db, self.cursor.applied_index, index, |txn| {
            crate::snapshot::install_bytes(txn, snapshot, index, term)
        })?;
        txn.commit()?;
        let result = self.take_state(state, true);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// Takes the state just committed by an install or a crash's rebuild: makes it durable
    /// when asked (as the install's durable commit does), then finishes a compaction it left
    /// unfinished, as the real writer resumes it.
    fn take_state(&mut self, state: State, checkpoint: bool) -> Result<(), StoreError> {
        let (compact_finished, compact_revision) = (state.compact_finished, state.compact_revision);
        self.cursor = state.cursor();
        self.mvcc = state.into_mvcc();
        if checkpoint {
            self.checkpoint()?;
        }
        if compact_finished < compact_revision {
            self.compact_rows(compact_revision)?;
        }
        Ok(())
    }

    fn check_usable(&self) -> Result<(), StoreError> {
        if self.failed {
            return Err(StoreError::Stopped);
        }
        Ok(())
    }
}

/// The simulation's hosts drive a [`SyncStore`] through the same calls the production node
/// makes on [`crate::Store`].
impl StateMachine for SyncStore {
    /// The snapshot stream itself: the simulated network carries the bytes.
    type SnapshotSource = [u8];

    fn applied_index(&self) -> u64 {
        SyncStore::applied_index(self)
    }

    fn durable_applied_index(&self) -> u64 {
        SyncStore::durable_applied_index(self)
    }

    fn installed_snapshot(&self) -> Result<Option<(u64, u64)>, StoreError> {
        SyncStore::installed_snapshot(self)
    }

    fn conf_state(&self) -> Result<Option<Vec<u8>>, StoreError> {
        SyncStore::conf_state(self)
    }

    fn members(&self) -> Result<Vec<Member>, StoreError> {
        SyncStore::members(self)
    }

    /// Applies the entries in one batch ([`SyncStore::apply`]) and answers each entry's
    /// reply with its result; skipped entries (at or below the applied index) get none.
    fn apply_committed(&mut self, entries: Vec<Committed>) -> Result<(), StoreError> {
        let mut replies = Vec::with_capacity(entries.len());
        let mut batch = Vec::with_capacity(entries.len());
        for committed in entries {
            replies.push((committed.index, committed.reply));
            batch.push((committed.index, committed.command));
        }
        let applied_before = self.applied_index();
        let applied = self.apply(batch)?;
        // Results come for the entries not skipped, in order.
        let mut results = applied.results.into_iter();
        for (index, reply) in replies {
            if index <= applied_before {
                continue;
            }
            let result = results.next();
            if let (Some(reply), Some(result)) = (reply, result) {
                let _ = reply.send(result);
            }
        }
        Ok(())
    }

    fn pin_snapshot(&self) -> Result<PinnedSnapshot, StoreError> {
        self.check_usable()?;
        pin(&self.db)
    }

    fn install_snapshot(
        &mut self,
        snapshot: &[u8],
        index: u64,
        term: u64,
    ) -> Result<(), StoreError> {
        self.install(snapshot, index, term)
    }

    /// Nothing: nothing here expires leases (see the module docs), so leadership changes
    /// nothing the simulation reads.
    fn set_leadership(&mut self, _leader: bool, _term: u64) {}

    /// Nothing: lease deadlines are never read here (see the module docs).
    fn lease_renewed_elsewhere(&mut self, _id: i64) {}
}

impl fmt::Debug for SyncStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncStore")
            .field("cluster_id", &format_args!("{:x}", self.cluster_id))
            .field("member_id", &format_args!("{:x}", self.member_id))
            .field("applied_index", &self.cursor.applied_index)
            .field("revision", &self.cursor.rev)
            .field("compact_revision", &self.cursor.floor)
            .field("durable_applied_index", &self.image.applied_index)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// A new, empty redb database in memory.
fn in_memory_database() -> Result<Database, StoreError> {
    Ok(Database::builder().create_with_backend(InMemoryBackend::new())?)
}
