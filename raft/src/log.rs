//! The Raft log, hard state and conf state, durable in redb (`<data-dir>/raft.redb`), with the
//! live part of the log mirrored in memory for raft-rs's [`Storage`] reads.
//!
//! Each `Ready` is persisted in one redb transaction: its entries (replacing any conflicting
//! suffix a new leader overwrote) and its hard state, committed with `Durability::Immediate`
//! when raft-rs says the Ready must be synced, so votes and append acknowledgements never go
//! out before what they promise is on disk. The store applies committed entries without an
//! fsync of its own; after a crash it replays them from here, which is why
//! [`LogStore::compact`] never drops an entry the store has not made durable.

use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use redb::{Database, Durability, ReadableDatabase, TableDefinition};

use crate::error::RaftError;

const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const META_HARD_STATE: &str = "hard_state";
const META_CONF_STATE: &str = "conf_state";
/// Index and term of the last entry compacted away (or of the snapshot installed).
const META_SNAPSHOT: &str = "snapshot";

/// File name of the log inside the data dir.
pub const LOG_FILE_NAME: &str = "raft.redb";

#[derive(Debug, Default)]
struct Core {
    hard: HardState,
    conf: ConfState,
    /// Index and term just before the first entry held.
    snap_index: u64,
    snap_term: u64,
    /// Entries `snap_index + 1 ..`, consecutive.
    entries: Vec<Entry>,
}

impl Core {
    fn first_index(&self) -> u64 {
        self.snap_index + 1
    }

    fn last_index(&self) -> u64 {
        self.snap_index + self.entries.len() as u64
    }
}

/// The durable Raft log. Cloning shares it (the node owns it through its `RawNode`; status
/// readers hold clones).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    core: Arc<RwLock<Core>>,
}

fn decode<M: protobuf::Message>(bytes: &[u8], what: &str) -> Result<M, RaftError> {
    M::parse_from_bytes(bytes).map_err(|e| RaftError::Corrupt(format!("{what}: {e}")))
}

fn encode<M: protobuf::Message>(m: &M) -> Result<Vec<u8>, RaftError> {
    m.write_to_bytes()
        .map_err(|e| RaftError::Storage(format!("encode: {e}")))
}

impl LogStore {
    /// Opens (or creates) the log in `dir`.
    pub fn open(dir: &Path) -> Result<LogStore, RaftError> {
        std::fs::create_dir_all(dir).map_err(RaftError::storage)?;
        let path = dir.join(LOG_FILE_NAME);
        let db = match Database::create(&path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(RaftError::Config(format!(
                    "{} is in use by another skerry process",
                    path.display()
                )));
            }
            Err(e) => {
                return Err(RaftError::Corrupt(format!(
                    "{} cannot be opened: {e}",
                    path.display()
                )));
            }
        };
        let txn = db.begin_write().map_err(RaftError::storage)?;
        {
            txn.open_table(ENTRIES).map_err(RaftError::storage)?;
            txn.open_table(META).map_err(RaftError::storage)?;
        }
        txn.commit().map_err(RaftError::storage)?;
        let mut core = Core::default();
        {
            let txn = db.begin_read().map_err(RaftError::storage)?;
            let meta = txn.open_table(META).map_err(RaftError::storage)?;
            if let Some(v) = meta.get(META_HARD_STATE).map_err(RaftError::storage)? {
                core.hard = decode(v.value(), "hard state")?;
            }
            if let Some(v) = meta.get(META_CONF_STATE).map_err(RaftError::storage)? {
                core.conf = decode(v.value(), "conf state")?;
            }
            if let Some(v) = meta.get(META_SNAPSHOT).map_err(RaftError::storage)? {
                let v = v.value();
                if v.len() != 16 {
                    return Err(RaftError::Corrupt("snapshot marker".into()));
                }
                let mut word = [0u8; 8];
                word.copy_from_slice(&v[..8]);
                core.snap_index = u64::from_le_bytes(word);
                word.copy_from_slice(&v[8..]);
                core.snap_term = u64::from_le_bytes(word);
            }
            let entries = txn.open_table(ENTRIES).map_err(RaftError::storage)?;
            for row in entries
                .range(core.snap_index + 1..)
                .map_err(RaftError::storage)?
            {
                let (index, bytes) = row.map_err(RaftError::storage)?;
                let entry: Entry = decode(bytes.value(), "entry")?;
                let expected = core.last_index() + 1;
                if index.value() != expected || entry.index != expected {
                    return Err(RaftError::Corrupt(format!(
                        "log entry {} where {expected} was due",
                        index.value()
                    )));
                }
                core.entries.push(entry);
            }
        }
        Ok(LogStore {
            db: Arc::new(db),
            core: Arc::new(RwLock::new(core)),
        })
    }

    /// Whether the log was ever given a membership (bootstrapped or joined).
    pub fn is_initialized(&self) -> bool {
        let core = self.core.read();
        core.conf != ConfState::default()
    }

    pub fn hard_state(&self) -> HardState {
        self.core.read().hard.clone()
    }

    pub fn conf_state(&self) -> ConfState {
        self.core.read().conf.clone()
    }

    pub fn last_index(&self) -> u64 {
        self.core.read().last_index()
    }

    pub fn first_index(&self) -> u64 {
        self.core.read().first_index()
    }

    /// Persists a Ready: `entries` (replacing every held entry from the first one's index on)
    /// and the hard state. `sync`: an fsynced commit (raft-rs's `must_sync`).
    pub fn persist(
        &self,
        entries: &[Entry],
        hard: Option<&HardState>,
        sync: bool,
    ) -> Result<(), RaftError> {
        if entries.is_empty() && hard.is_none() {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(RaftError::storage)?;
        txn.set_durability(if sync {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(RaftError::storage)?;
        let mut core = self.core.write();
        {
            let mut table = txn.open_table(ENTRIES).map_err(RaftError::storage)?;
            if let Some(first) = entries.first() {
                if first.index < core.first_index() || first.index > core.last_index() + 1 {
                    return Err(RaftError::Storage(format!(
                        "append at {} outside the log {}..={}",
                        first.index,
                        core.first_index(),
                        core.last_index()
                    )));
                }
                // A new leader's entries replace the conflicting suffix.
                let last = core.last_index();
                for index in first.index..=last {
                    table.remove(index).map_err(RaftError::storage)?;
                }
                for entry in entries {
                    table
                        .insert(entry.index, encode(entry)?.as_slice())
                        .map_err(RaftError::storage)?;
                }
            }
            if let Some(hard) = hard {
                let mut meta = txn.open_table(META).map_err(RaftError::storage)?;
                meta.insert(META_HARD_STATE, encode(hard)?.as_slice())
                    .map_err(RaftError::storage)?;
            }
        }
        txn.commit().map_err(RaftError::storage)?;
        if let Some(first) = entries.first() {
            let keep = (first.index - core.first_index()) as usize;
            core.entries.truncate(keep);
            core.entries.extend_from_slice(entries);
        }
        if let Some(hard) = hard {
            core.hard = hard.clone();
        }
        Ok(())
    }

    /// Persists the membership (after a conf change is applied, or at bootstrap).
    pub fn set_conf_state(&self, conf: &ConfState) -> Result<(), RaftError> {
        let txn = self.db.begin_write().map_err(RaftError::storage)?;
        {
            let mut meta = txn.open_table(META).map_err(RaftError::storage)?;
            meta.insert(META_CONF_STATE, encode(conf)?.as_slice())
                .map_err(RaftError::storage)?;
        }
        txn.commit().map_err(RaftError::storage)?;
        self.core.write().conf = conf.clone();
        Ok(())
    }

    /// Drops the entries before `index` (keeping its predecessor's term, as the log's new
    /// floor). Callers pass at most the store's durable applied index + 1: entries the store
    /// could still need to replay must stay.
    pub fn compact(&self, index: u64) -> Result<(), RaftError> {
        let mut core = self.core.write();
        if index <= core.first_index() {
            return Ok(());
        }
        let index = index.min(core.last_index() + 1);
        let floor = index - 1;
        let floor_term = if floor == core.snap_index {
            core.snap_term
        } else {
            core.entries[(floor - core.first_index()) as usize].term
        };
        let txn = self.db.begin_write().map_err(RaftError::storage)?;
        {
            let mut table = txn.open_table(ENTRIES).map_err(RaftError::storage)?;
            for i in core.first_index()..index {
                table.remove(i).map_err(RaftError::storage)?;
            }
            let mut meta = txn.open_table(META).map_err(RaftError::storage)?;
            let mut marker = floor.to_le_bytes().to_vec();
            marker.extend_from_slice(&floor_term.to_le_bytes());
            meta.insert(META_SNAPSHOT, marker.as_slice())
                .map_err(RaftError::storage)?;
        }
        txn.commit().map_err(RaftError::storage)?;
        let drop = (index - core.first_index()) as usize;
        core.entries.drain(..drop);
        core.snap_index = floor;
        core.snap_term = floor_term;
        Ok(())
    }
}

impl Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let core = self.core.read();
        Ok(RaftState::new(core.hard.clone(), core.conf.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let core = self.core.read();
        if low < core.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > core.last_index() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - core.first_index()) as usize;
        let to = (high - core.first_index()) as usize;
        let mut out = core.entries[from..to].to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let core = self.core.read();
        if idx == core.snap_index {
            return Ok(core.snap_term);
        }
        if idx < core.snap_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > core.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(core.entries[(idx - core.first_index()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.core.read().first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.core.read().last_index())
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Sending the store to a member behind the compacted log is not built yet; raft-rs
        // retries later. The node does not compact the log yet, so every member that was
        // ever in the cluster catches up from the log.
        Err(raft::Error::Store(
            StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &str) -> Entry {
        Entry {
            index,
            term,
            data: bytes::Bytes::copy_from_slice(data.as_bytes()),
            ..Default::default()
        }
    }

    #[test]
    fn entries_hard_state_and_conf_state_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogStore::open(dir.path()).expect("open");
        assert!(!log.is_initialized());
        let conf = ConfState {
            voters: vec![1, 2, 3],
            ..Default::default()
        };
        log.set_conf_state(&conf).expect("conf");
        let hard = HardState {
            term: 2,
            vote: 1,
            commit: 2,
            ..Default::default()
        };
        log.persist(
            &[entry(1, 1, "a"), entry(2, 2, "b"), entry(3, 2, "c")],
            Some(&hard),
            true,
        )
        .expect("persist");
        drop(log);
        let log = LogStore::open(dir.path()).expect("reopen");
        assert!(log.is_initialized());
        assert_eq!(log.hard_state(), hard);
        assert_eq!(log.conf_state().voters, vec![1, 2, 3]);
        assert_eq!(log.last_index(), 3);
        assert_eq!(log.term(2).expect("term"), 2);
        let got = log
            .entries(1, 4, None, GetEntriesContext::empty(false))
            .expect("entries");
        assert_eq!(got.len(), 3);
        assert_eq!(got[2].data.as_ref(), b"c");
    }

    #[test]
    fn a_new_leaders_entries_replace_the_conflicting_suffix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogStore::open(dir.path()).expect("open");
        log.persist(
            &[entry(1, 1, "a"), entry(2, 1, "b"), entry(3, 1, "c")],
            None,
            true,
        )
        .expect("persist");
        log.persist(&[entry(2, 2, "B")], None, true)
            .expect("overwrite");
        assert_eq!(log.last_index(), 2);
        drop(log);
        let log = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(log.last_index(), 2);
        assert_eq!(log.term(2).expect("term"), 2);
        assert!(log.persist(&[entry(5, 2, "gap")], None, true).is_err());
    }

    #[test]
    fn compaction_keeps_the_floor_term_and_refuses_compacted_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogStore::open(dir.path()).expect("open");
        let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1 + i / 5, "x")).collect();
        log.persist(&entries, None, true).expect("persist");
        log.compact(6).expect("compact");
        assert_eq!(log.first_index(), 6);
        assert_eq!(log.term(5).expect("floor term"), 2);
        assert!(matches!(
            log.term(4),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert!(matches!(
            log.entries(3, 7, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        drop(log);
        let log = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(log.first_index(), 6);
        assert_eq!(log.last_index(), 10);
        assert_eq!(log.term(5).expect("floor term"), 2);
    }
}
