//! The tables of a store and the in-memory state rebuilt from them, for [`crate::Store`] and
//! [`crate::sync_store::SyncStore`] alike: creating the tables of a new store or checking an
//! existing one's format and identity ([`load`]), and rebuilding the key index, the lessor
//! and the active alarms from the rows ([`State`]), at open and after a snapshot install.
//!
//! # Invariants
//! - A store's format version and identity (cluster and member ids) are written once, when
//!   its tables are created; a store of another format, or of another member than the one
//!   asked for, is refused. A store of this format from an older build only gets the
//!   tables it lacks.
//! - The rebuilt state comes from the tables alone, so it is the same after a restart, an
//!   install or a simulated crash; only lease deadlines are new: every lease gets its full
//!   TTL again (etcd does the same after an election).

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use crate::alarm::Alarms;
use crate::apply::ApplyCursor;
use crate::error::StoreError;
use crate::index::KeyIndex;
use crate::lease::Lessor;
use crate::mvcc::{
    self, ALARMS, KV, LEASES, MEMBERS, META, META_APPLIED_INDEX, META_CLUSTER_ID,
    META_COMPACT_FINISHED, META_COMPACT_REVISION, META_FORMAT, META_MEMBER_ID, META_REVISION, Mvcc,
    RAFT,
};
use crate::rev::Rev;

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
pub(crate) fn read_state(
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
