//! The reads [`crate::Store`] and [`crate::sync_store::SyncStore`] share, each over one redb
//! read transaction: history as watch events ([`read_history`], [`read_events`]), the hash
//! of the retained rows ([`hash_kv`]), the `raft` and `members` tables, and the whole store
//! pinned for a Raft snapshot ([`PinnedSnapshot`]).
//!
//! # Invariants
//! - A read that combines memory (the index, the compaction floor) with rows must begin its
//!   transaction before it reads the floor: rows at or above a floor it saw are then never
//!   gone from its view. (A threaded store's reader must also retry when a snapshot install
//!   overlapped it: `Store::read_consistent`.)
//! - A pinned snapshot's applied index, revision and membership are those of the rows it
//!   streams, however far the store has moved on.

use parking_lot::RwLock;
use prost::Message;
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable};

use crate::error::StoreError;
use crate::index::KeyIndex;
use crate::mvcc::{
    self, KV, MEMBERS, META, META_APPLIED_INDEX, META_REVISION, Mvcc, RAFT, RAFT_CONF_STATE,
    RAFT_SNAPSHOT_INDEX, RAFT_SNAPSHOT_TERM,
};
use crate::pb::command::Member;
use crate::pb::mvccpb::{Event, event::EventType};
use crate::rev::Rev;

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

fn be_u64(bytes: &[u8]) -> Result<u64, StoreError> {
    let array: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StoreError::Storage(format!("{} bytes are not a u64", bytes.len())))?;
    Ok(u64::from_be_bytes(array))
}
