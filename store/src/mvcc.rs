//! The MVCC state machine: the redb tables, the rows, and how one command changes them.
//!
//! Everything here is deterministic: applying the same commands in the same order to the same
//! state gives the same revisions, rows and responses on every member. The only clock it reads
//! is for lease expiry, which is decided outside (the lessor proposes revocations).
//!
//! On disk (redb):
//! - `kv`: `(main, sub)` revision -> one byte kind (0 put, 1 tombstone) + `mvccpb.KeyValue`.
//!   Scanning it in order replays the whole retained history.
//! - `leases`: lease id -> granted TTL in seconds.
//! - `members`: member id -> `Member` (name, client and peer URLs, learner), outside the
//!   keyspace: no revision, no watch event.
//! - `alarms`: `(alarm type, member id)` -> nothing: the active alarms (see
//!   [`crate::alarm`]), outside the keyspace.
//! - `raft`: what the replicated log asks the store to keep in step with the applied index,
//!   as opaque bytes: `conf_state` (raft-rs's encoded `ConfState` after the last membership
//!   change) and `snapshot_index`/`snapshot_term` (u64 big-endian) of the last installed
//!   snapshot.
//! - `meta`: `applied_index`, `revision`, `compact_revision`, `compact_finished`, the cluster
//!   and member ids, and the format marker. `applied_index` and `revision` are written in the
//!   same transaction as the rows they cover, so replaying an already-applied command is a no-op.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use prost::Message;
use redb::{ReadableTable, TableDefinition};

use crate::alarm::Alarms;
use crate::error::StoreError;
use crate::gosort::sort_like_go;
use crate::index::{KeyIndex, KeyRange};
use crate::lease::Lessor;
use crate::pb::command::{Member, MemberAttributes, Membership};
use crate::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse, compare,
    range_request, request_op, response_op,
};
use crate::pb::mvccpb::{Event, KeyValue, event::EventType};
use crate::rev::Rev;

pub(crate) type KvTable<'a> = redb::Table<'a, (u64, u64), &'static [u8]>;
pub(crate) type MembersTable<'a> = redb::Table<'a, u64, &'static [u8]>;
pub(crate) type RaftTable<'a> = redb::Table<'a, &'static str, &'static [u8]>;
pub(crate) type AlarmsTable<'a> = redb::Table<'a, (i32, u64), ()>;

pub(crate) const KV: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("kv");
pub(crate) const LEASES: TableDefinition<i64, i64> = TableDefinition::new("leases");
/// Cluster members: member id -> `Member` protobuf. Rows an older build wrote as
/// `MemberAttributes` read as a `Member` (its fields 1-3 are the same). Not part of the
/// keyspace: no revision, no watch event.
pub(crate) const MEMBERS: TableDefinition<u64, &[u8]> = TableDefinition::new("members");
/// Active alarms: `(alarm type, member id)`, the type as etcd's `AlarmType` number. Raised and
/// cleared by log commands, so every member holds the same rows at the same applied index.
pub(crate) const ALARMS: TableDefinition<(i32, u64), ()> = TableDefinition::new("alarms");
/// The replicated log's own records, kept in the same transactions as the applied index so
/// they always match it. Opaque bytes: the store knows nothing of Raft.
pub(crate) const RAFT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft");
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub(crate) const META_FORMAT: &str = "skerry_format";
pub(crate) const META_APPLIED_INDEX: &str = "applied_index";
pub(crate) const META_REVISION: &str = "revision";
pub(crate) const META_COMPACT_REVISION: &str = "compact_revision";
pub(crate) const META_COMPACT_FINISHED: &str = "compact_finished";
pub(crate) const META_CLUSTER_ID: &str = "cluster_id";
pub(crate) const META_MEMBER_ID: &str = "member_id";

/// raft-rs's encoded `ConfState` after the last applied membership change.
pub(crate) const RAFT_CONF_STATE: &str = "conf_state";
/// The log index and term of the last snapshot installed, u64 big-endian: the replicated log
/// repairs itself from them after a crash between the store's install and its own.
pub(crate) const RAFT_SNAPSHOT_INDEX: &str = "snapshot_index";
pub(crate) const RAFT_SNAPSHOT_TERM: &str = "snapshot_term";

/// The on-disk format this build writes. A data dir with another value is refused with a
/// clear error rather than misread.
pub(crate) const FORMAT_VERSION: u64 = 1;

const ROW_PUT: u8 = 0;
const ROW_TOMBSTONE: u8 = 1;

/// Opens a table that a store written by an older build may not have.
pub(crate) fn open_if_exists<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(table) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Encodes one row of the `kv` table.
pub(crate) fn encode_row(tombstone: bool, kv: &KeyValue) -> Vec<u8> {
    let mut row = Vec::with_capacity(1 + kv.encoded_len());
    row.push(if tombstone { ROW_TOMBSTONE } else { ROW_PUT });
    kv.encode(&mut row).expect("a Vec grows as needed");
    row
}

/// Decodes one row; a row skerry did not write is a storage error, not a panic.
pub(crate) fn decode_row(row: &[u8]) -> Result<(bool, KeyValue), StoreError> {
    let (&kind, body) = row
        .split_first()
        .ok_or_else(|| StoreError::Storage("empty kv row".into()))?;
    let tombstone = match kind {
        ROW_PUT => false,
        ROW_TOMBSTONE => true,
        other => {
            return Err(StoreError::Storage(format!(
                "kv row of unknown kind {other}"
            )));
        }
    };
    Ok((tombstone, KeyValue::decode(body)?))
}

/// Reads the row at `rev`, which the index says exists.
pub(crate) fn read_kv<T: ReadableTable<(u64, u64), &'static [u8]>>(
    table: &T,
    rev: Rev,
) -> Result<KeyValue, StoreError> {
    let guard = table
        .get(rev.to_row_key())?
        .ok_or_else(|| StoreError::Storage(format!("index names missing row {rev:?}")))?;
    Ok(decode_row(guard.value())?.1)
}

/// What every reader shares: the index and the published revisions.
pub(crate) struct Mvcc {
    /// Readers take it shared for a range walk; the writer takes it exclusively for each
    /// append and for each compaction batch. A `parking_lot` lock: sections are short and
    /// never await.
    pub index: RwLock<KeyIndex>,
    /// The last committed and durable revision. Readers read at or below it.
    pub current_rev: AtomicI64,
    /// Reads below this revision fail with "compacted". Published before any row is deleted.
    pub compact_rev: AtomicI64,
    /// Leases and the keys attached to them. Written by the writer, read by keep-alives.
    /// A plain mutex: keep-alive is a map lookup.
    pub lessor: Mutex<Lessor>,
    /// The active alarms as the apply path sees them (ahead of what readers are shown until
    /// the batch is published). Written and read by the writer only.
    pub alarms: Mutex<Alarms>,
}

impl Mvcc {
    pub fn current_rev(&self) -> i64 {
        self.current_rev.load(Ordering::Acquire)
    }

    pub fn compact_rev(&self) -> i64 {
        self.compact_rev.load(Ordering::Acquire)
    }
}

/// Range over `table` as etcd 3.4's apply does: sorting and filtering fetch everything, then
/// truncate; `count` is the number of keys in the range at the revision, whatever the limit.
///
/// `current` is the newest revision the caller may see. The index lock is held only while
/// the matching revisions are collected (and the compaction floor checked, so that no
/// compaction can remove them meanwhile); the rows are then read from `table`, whose read
/// transaction must have begun before the call, so rows deleted later stay visible to it.
pub(crate) fn range<T: ReadableTable<(u64, u64), &'static [u8]>>(
    table: &T,
    mvcc: &Mvcc,
    req: &RangeRequest,
    current: i64,
) -> Result<RangeResponse, StoreError> {
    let at = if req.revision <= 0 {
        current
    } else {
        req.revision
    };
    if at > current {
        return Err(StoreError::FutureRevision);
    }
    let filtering = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    let sort_order = range_request::SortOrder::try_from(req.sort_order)
        .unwrap_or(range_request::SortOrder::None);
    let sort_target = range_request::SortTarget::try_from(req.sort_target)
        .unwrap_or(range_request::SortTarget::Key);
    // Without sorting or filtering, fetch one row past the limit to learn `more`.
    let fetch_limit = if sort_order != range_request::SortOrder::None || filtering || req.limit <= 0
    {
        usize::MAX
    } else {
        usize::try_from(req.limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
    };
    let key_range = KeyRange::new(&req.key, &req.range_end);
    let mut count: i64 = 0;
    let mut revs = Vec::new();
    {
        let index = mvcc.index.read();
        let compacted = mvcc.compact_rev();
        if at < compacted {
            return Err(StoreError::Compacted {
                compact_revision: compacted,
            });
        }
        index.visit(&key_range, at, |_, rev| {
            count += 1;
            if !req.count_only && revs.len() < fetch_limit {
                revs.push(rev);
            }
            true
        });
    }
    let mut kvs = Vec::with_capacity(revs.len());
    for rev in revs {
        kvs.push(read_kv(table, rev)?);
    }
    if req.max_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision <= req.max_mod_revision);
    }
    if req.min_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision >= req.min_mod_revision);
    }
    if req.max_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision <= req.max_create_revision);
    }
    if req.min_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision >= req.min_create_revision);
    }
    // The index yields keys ascending, so sorting by key ascending is already done; any other
    // target defaults to ascending (etcd: "sort ASCEND by default only when target is not KEY").
    let order = if sort_order == range_request::SortOrder::None
        && sort_target != range_request::SortTarget::Key
    {
        range_request::SortOrder::Ascend
    } else {
        sort_order
    };
    if order != range_request::SortOrder::None {
        sort_kvs(
            &mut kvs,
            sort_target,
            order == range_request::SortOrder::Descend,
        );
    }
    let mut more = false;
    if req.limit > 0 {
        let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
        if kvs.len() > limit {
            kvs.truncate(limit);
            more = true;
        }
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value = Bytes::new();
        }
    }
    Ok(RangeResponse {
        header: Some(revision_header(current)),
        kvs,
        more,
        count,
    })
}

/// Sorts a range's results as etcd 3.4's apply does: Go's `sort.Sort` over one field, with
/// `sort.Reverse` (the comparison's arguments swapped) for descending order, so that keys
/// tied on the field land exactly where etcd puts them (see [`crate::gosort`]). By key the
/// order is already ascending and keys never tie, so ascending is nothing to do and
/// descending a reversal.
fn sort_kvs(kvs: &mut [KeyValue], target: range_request::SortTarget, descending: bool) {
    use range_request::SortTarget as T;
    fn by<F: Fn(&KeyValue, &KeyValue) -> bool>(kvs: &mut [KeyValue], less: F, descending: bool) {
        if descending {
            sort_like_go(kvs, |a, b| less(b, a));
        } else {
            sort_like_go(kvs, less);
        }
    }
    match target {
        T::Key if descending => kvs.reverse(),
        T::Key => {}
        T::Version => by(kvs, |a, b| a.version < b.version, descending),
        T::Create => by(
            kvs,
            |a, b| a.create_revision < b.create_revision,
            descending,
        ),
        T::Mod => by(kvs, |a, b| a.mod_revision < b.mod_revision, descending),
        T::Value => by(kvs, |a, b| a.value < b.value, descending),
    }
}

/// The header of a response nested in a txn: etcd fills only the revision there.
pub(crate) fn revision_header(revision: i64) -> ResponseHeader {
    ResponseHeader {
        revision,
        ..Default::default()
    }
}

/// One write transaction's view while commands are applied: the table, the pending revision
/// and the events produced so far.
pub(crate) struct Apply<'a, 't> {
    pub mvcc: &'a Mvcc,
    pub table: &'a mut KvTable<'t>,
    pub leases: &'a mut redb::Table<'t, i64, i64>,
    pub meta: &'a mut redb::Table<'t, &'static str, u64>,
    /// The last revision assigned (committed or pending in this batch).
    pub rev: &'a mut i64,
    /// The compaction floor in force for the next command: the last compaction applied,
    /// which may be ahead of the published floor (it moves when its batch is durable).
    pub floor: &'a mut i64,
    pub events: &'a mut Vec<Event>,
    /// Set when a command failed after it had written: its rows and index entries cannot be
    /// taken back one by one, so the writer must abandon the whole batch (and restart from
    /// disk). Validation before the first write makes this unreachable for client errors.
    pub poisoned: bool,
}

/// A write transaction inside one command: changes take revision `begin + 1` with increasing
/// sub-revisions.
struct TxnWrite<'x, 'a, 't> {
    apply: &'x mut Apply<'a, 't>,
    begin: i64,
    sub: i64,
}

impl<'x, 'a, 't> TxnWrite<'x, 'a, 't> {
    fn new(apply: &'x mut Apply<'a, 't>) -> Self {
        let begin = *apply.rev;
        Self {
            apply,
            begin,
            sub: 0,
        }
    }

    /// The revision reads in this txn see: the pending one once something was written.
    fn read_rev(&self) -> i64 {
        if self.sub > 0 {
            self.begin + 1
        } else {
            self.begin
        }
    }

    fn next_rev(&mut self) -> Rev {
        let rev = Rev::new(self.begin + 1, self.sub);
        self.sub += 1;
        rev
    }

    /// Ends the txn: the store revision moves only if something was written.
    fn finish(self) -> i64 {
        if self.sub > 0 {
            *self.apply.rev = self.begin + 1;
        }
        *self.apply.rev
    }

    fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, StoreError> {
        self.get_at(key, self.read_rev())
    }

    fn get_at(&self, key: &[u8], at: i64) -> Result<Option<KeyValue>, StoreError> {
        let rev = self.apply.mvcc.index.read().get(key, at);
        rev.map(|rev| read_kv(&*self.apply.table, rev)).transpose()
    }

    /// An event's `prev_kv`: the key as it was before this txn (etcd 3.4 reads it at
    /// `mod_revision - 1`), which differs from the txn's own view when the txn touched the key
    /// earlier (a delete "from key" and a put of that key may share a txn).
    fn event_prev(
        &self,
        key: &[u8],
        in_txn_prev: &Option<KeyValue>,
    ) -> Result<Option<KeyValue>, StoreError> {
        match in_txn_prev {
            Some(p) if p.mod_revision <= self.begin => Ok(Some(p.clone())),
            _ => self.get_at(key, self.begin),
        }
    }

    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, StoreError> {
        let mut resp = range(&*self.apply.table, self.apply.mvcc, req, self.read_rev())?;
        resp.header = Some(revision_header(self.read_rev()));
        Ok(resp)
    }

    fn put(&mut self, req: &PutRequest) -> Result<PutResponse, StoreError> {
        let prev = self.get(&req.key)?;
        let mut value = req.value.clone();
        let mut lease = req.lease;
        if req.ignore_value || req.ignore_lease {
            let prev = prev.as_ref().ok_or(StoreError::KeyNotFound)?;
            if req.ignore_value {
                value = prev.value.clone();
            }
            if req.ignore_lease {
                lease = prev.lease;
            }
        }
        let rev = self.next_rev();
        let (create_revision, version) = match &prev {
            Some(p) => (p.create_revision, p.version + 1),
            None => (rev.main, 1),
        };
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision,
            mod_revision: rev.main,
            version,
            value,
            lease,
        };
        self.apply
            .table
            .insert(rev.to_row_key(), encode_row(false, &kv).as_slice())?;
        self.apply.mvcc.index.write().put(&req.key, rev);
        {
            let mut lessor = self.apply.mvcc.lessor.lock();
            let old_lease = prev.as_ref().map_or(0, |p| p.lease);
            if old_lease != 0 && old_lease != lease {
                lessor.detach(old_lease, &req.key);
            }
            if lease != 0 {
                lessor.attach(lease, &req.key);
            }
        }
        let event_prev = self.event_prev(&req.key, &prev)?;
        self.apply.events.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: event_prev,
        });
        Ok(PutResponse {
            header: Some(revision_header(rev.main)),
            prev_kv: if req.prev_kv { prev } else { None },
        })
    }

    fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, StoreError> {
        let key_range = KeyRange::new(&req.key, &req.range_end);
        let mut doomed = Vec::new();
        self.apply
            .mvcc
            .index
            .read()
            .visit(&key_range, self.read_rev(), |key, rev| {
                doomed.push((key.clone(), rev));
                true
            });
        let mut prev_kvs = Vec::with_capacity(if req.prev_kv { doomed.len() } else { 0 });
        let deleted = doomed.len() as i64;
        for (key, old) in doomed {
            let prev = read_kv(&*self.apply.table, old)?;
            let rev = self.next_rev();
            let tombstone = KeyValue {
                key: key.clone(),
                mod_revision: rev.main,
                ..Default::default()
            };
            self.apply
                .table
                .insert(rev.to_row_key(), encode_row(true, &tombstone).as_slice())?;
            self.apply.mvcc.index.write().tombstone(&key, rev);
            if prev.lease != 0 {
                self.apply.mvcc.lessor.lock().detach(prev.lease, &key);
            }
            let in_txn_prev = Some(prev.clone());
            let event_prev = self.event_prev(&key, &in_txn_prev)?;
            self.apply.events.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(tombstone),
                prev_kv: event_prev,
            });
            if req.prev_kv {
                prev_kvs.push(prev);
            }
        }
        Ok(DeleteRangeResponse {
            header: Some(revision_header(self.read_rev())),
            deleted,
            prev_kvs,
        })
    }

    /// Evaluates every compare of `txn` and of the txns nested on the chosen path, against
    /// the state before any of its writes (etcd's `compareToPath`).
    fn path(&self, txn: &TxnRequest, path: &mut Vec<bool>) -> Result<(), StoreError> {
        let mut succeeded = true;
        for c in &txn.compare {
            if !self.compare(c)? {
                succeeded = false;
                break;
            }
        }
        path.push(succeeded);
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        for op in ops {
            if let Some(request_op::Request::RequestTxn(nested)) = &op.request {
                self.path(nested, path)?;
            }
        }
        Ok(())
    }

    fn compare(&self, c: &Compare) -> Result<bool, StoreError> {
        let key_range = KeyRange::new(&c.key, &c.range_end);
        let mut revs = Vec::new();
        self.apply
            .mvcc
            .index
            .read()
            .visit(&key_range, self.read_rev(), |_, rev| {
                revs.push(rev);
                true
            });
        let target =
            compare::CompareTarget::try_from(c.target).unwrap_or(compare::CompareTarget::Version);
        if revs.is_empty() {
            // A missing key has no value to compare; its version and revisions read as 0.
            if target == compare::CompareTarget::Value {
                return Ok(false);
            }
            return Ok(compare_kv(c, target, &KeyValue::default()));
        }
        for rev in revs {
            let kv = read_kv(&*self.apply.table, rev)?;
            if !compare_kv(c, target, &kv) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Checks the ops on the chosen path before anything is written (etcd's `checkRequests`),
    /// in etcd's order: every put first (leases exist, keys exist for `ignore_value` /
    /// `ignore_lease`), then every range at an explicit revision. The order decides which
    /// error a txn with several faults returns.
    ///
    /// One rule is skerry's own: an `ignore_value`/`ignore_lease` put of a key that an earlier
    /// delete of the same txn removed is `KeyNotFound` here. etcd only finds that out while
    /// applying, and panics ("unexpected error during txn"); the case is reachable through the
    /// `"\0"` quirk of the duplicate-key check, and a client must not be able to stop the store.
    fn check_path(&self, txn: &TxnRequest, path: &[bool]) -> Result<(), StoreError> {
        self.check_ops(txn, path, &mut 0, &mut Some(Vec::new()))?;
        self.check_ops(txn, path, &mut 0, &mut None)
    }

    /// Walks the chosen path in execution order. With `deleted` (the ranges deleted so far)
    /// it checks puts; without, ranges.
    fn check_ops(
        &self,
        txn: &TxnRequest,
        path: &[bool],
        position: &mut usize,
        deleted: &mut Option<Vec<KeyRange>>,
    ) -> Result<(), StoreError> {
        let succeeded = path[*position];
        *position += 1;
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        for op in ops {
            match (&op.request, deleted.as_mut()) {
                (Some(request_op::Request::RequestPut(put)), Some(deleted)) => {
                    self.check_put(put)?;
                    if (put.ignore_value || put.ignore_lease)
                        && deleted.iter().any(|d| d.contains(&put.key))
                    {
                        return Err(StoreError::KeyNotFound);
                    }
                }
                (Some(request_op::Request::RequestDeleteRange(d)), Some(deleted)) => {
                    deleted.push(KeyRange::new(&d.key, &d.range_end));
                }
                (Some(request_op::Request::RequestRange(range)), None) => {
                    self.check_range(range)?;
                }
                (Some(request_op::Request::RequestTxn(nested)), _) => {
                    self.check_ops(nested, path, position, deleted)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// etcd's `checkRequestRange`: a range at an explicit revision must name one that exists
    /// before the txn writes anything (so not the revision the txn itself creates).
    fn check_range(&self, req: &RangeRequest) -> Result<(), StoreError> {
        if req.revision == 0 {
            return Ok(());
        }
        if req.revision > self.begin {
            return Err(StoreError::FutureRevision);
        }
        let compacted = *self.apply.floor;
        // etcd's floor before any compaction is -1, so a negative revision is "compacted".
        let first = if compacted > 0 { compacted } else { -1 };
        if req.revision < first {
            return Err(StoreError::Compacted {
                compact_revision: compacted,
            });
        }
        Ok(())
    }

    fn check_put(&self, req: &PutRequest) -> Result<(), StoreError> {
        if (req.ignore_value || req.ignore_lease) && self.get(&req.key)?.is_none() {
            return Err(StoreError::KeyNotFound);
        }
        if req.lease != 0 && !self.apply.mvcc.lessor.lock().contains(req.lease) {
            return Err(StoreError::LeaseNotFound);
        }
        Ok(())
    }

    fn txn(
        &mut self,
        txn: &TxnRequest,
        path: &[bool],
        position: &mut usize,
    ) -> Result<TxnResponse, StoreError> {
        let succeeded = path[*position];
        *position += 1;
        let ops: &[RequestOp] = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let response = match &op.request {
                Some(request_op::Request::RequestRange(r)) => {
                    response_op::Response::ResponseRange(self.range(r)?)
                }
                Some(request_op::Request::RequestPut(p)) => {
                    response_op::Response::ResponsePut(self.put(p)?)
                }
                Some(request_op::Request::RequestDeleteRange(d)) => {
                    response_op::Response::ResponseDeleteRange(self.delete_range(d)?)
                }
                Some(request_op::Request::RequestTxn(t)) => {
                    response_op::Response::ResponseTxn(self.txn(t, path, position)?)
                }
                None => continue,
            };
            responses.push(ResponseOp {
                response: Some(response),
            });
        }
        // etcd gives a nested txn response an empty header; the caller fills the outer one.
        Ok(TxnResponse {
            header: Some(ResponseHeader::default()),
            succeeded,
            responses,
        })
    }
}

fn compare_kv(c: &Compare, target: compare::CompareTarget, kv: &KeyValue) -> bool {
    use compare::TargetUnion as U;
    use std::cmp::Ordering as O;
    let ordering = match target {
        compare::CompareTarget::Value => {
            let expected: &[u8] = match &c.target_union {
                Some(U::Value(v)) => v,
                _ => &[],
            };
            kv.value.as_ref().cmp(expected)
        }
        compare::CompareTarget::Version => kv.version.cmp(&match c.target_union {
            Some(U::Version(v)) => v,
            _ => 0,
        }),
        compare::CompareTarget::Create => kv.create_revision.cmp(&match c.target_union {
            Some(U::CreateRevision(v)) => v,
            _ => 0,
        }),
        compare::CompareTarget::Mod => kv.mod_revision.cmp(&match c.target_union {
            Some(U::ModRevision(v)) => v,
            _ => 0,
        }),
        compare::CompareTarget::Lease => kv.lease.cmp(&match c.target_union {
            Some(U::Lease(v)) => v,
            _ => 0,
        }),
    };
    match compare::CompareResult::try_from(c.result).unwrap_or(compare::CompareResult::Equal) {
        compare::CompareResult::Equal => ordering == O::Equal,
        compare::CompareResult::NotEqual => ordering != O::Equal,
        compare::CompareResult::Greater => ordering == O::Greater,
        compare::CompareResult::Less => ordering == O::Less,
    }
}

impl<'x, 'a, 't> TxnWrite<'x, 'a, 't> {
    /// Turns an error after a write into poison (see [`Apply::poisoned`]).
    fn guard<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        match result {
            Err(e) if self.sub > 0 => {
                self.apply.poisoned = true;
                Err(StoreError::Storage(format!(
                    "command failed after writing: {e}"
                )))
            }
            other => other,
        }
    }
}

impl<'a, 't> Apply<'a, 't> {
    pub fn put(&mut self, req: &PutRequest) -> Result<PutResponse, StoreError> {
        let mut txn = TxnWrite::new(self);
        txn.check_put(req)?;
        let result = txn.put(req);
        let mut resp = txn.guard(result)?;
        let rev = txn.finish();
        resp.header = Some(revision_header(rev));
        Ok(resp)
    }

    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, StoreError> {
        let mut txn = TxnWrite::new(self);
        let result = txn.delete_range(req);
        let mut resp = txn.guard(result)?;
        resp.header = Some(revision_header(txn.finish()));
        Ok(resp)
    }

    pub fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, StoreError> {
        let mut txn = TxnWrite::new(self);
        let mut path = Vec::new();
        txn.path(req, &mut path)?;
        txn.check_path(req, &path)?;
        let result = txn.txn(req, &path, &mut 0);
        let mut resp = txn.guard(result)?;
        resp.header = Some(revision_header(txn.finish()));
        Ok(resp)
    }

    /// Records a compaction to `revision` and moves [`Apply::floor`] to it. Returns the store
    /// revision. The rows are dropped later, in bounded steps, once this is published.
    pub fn compact(&mut self, revision: i64) -> Result<i64, StoreError> {
        if revision > *self.rev {
            return Err(StoreError::FutureRevision);
        }
        if revision <= *self.floor {
            return Err(StoreError::Compacted {
                compact_revision: *self.floor,
            });
        }
        self.meta
            .insert(META_COMPACT_REVISION, u64::try_from(revision).unwrap_or(0))?;
        *self.floor = revision;
        Ok(*self.rev)
    }

    /// Grants a lease whose id and TTL the proposer has already chosen. The lessor learns of
    /// it at once (later commands of the same batch may attach keys to it); the reply waits
    /// for the commit like every other.
    pub fn lease_grant(&mut self, id: i64, ttl: i64) -> Result<i64, StoreError> {
        if self.mvcc.lessor.lock().contains(id) {
            return Err(StoreError::LeaseExists);
        }
        self.leases.insert(id, ttl)?;
        self.mvcc.lessor.lock().grant(id, ttl);
        Ok(*self.rev)
    }

    /// Revokes a lease: every key attached to it is deleted in one revision.
    pub fn lease_revoke(&mut self, id: i64) -> Result<i64, StoreError> {
        let keys: BTreeSet<Bytes> = match self.mvcc.lessor.lock().keys(id) {
            Some(keys) => keys.iter().cloned().collect(),
            None => return Err(StoreError::LeaseNotFound),
        };
        let mut txn = TxnWrite::new(self);
        for key in keys {
            let result = txn.delete_range(&DeleteRangeRequest {
                key,
                ..Default::default()
            });
            txn.guard(result)?;
        }
        let rev = txn.finish();
        self.leases.remove(id)?;
        self.mvcc.lessor.lock().revoke(id);
        Ok(rev)
    }
}

/// A member's row after it published its attributes: the name and client URLs are the
/// member's to say; the peer URLs and learner flag came from a membership change and stay.
pub(crate) fn merge_attributes(existing: Option<Member>, attrs: &MemberAttributes) -> Member {
    let mut member = existing.unwrap_or_default();
    member.id = attrs.id;
    member.name = attrs.name.clone();
    member.client_urls = attrs.client_urls.clone();
    member
}

/// A member's row after a membership change names it. A change knows what the cluster asked
/// for (peer URLs, learner or voter) but often not the member's name or client URLs, which the
/// member publishes itself: empty fields keep what the row has; `is_learner` is always taken
/// (a promotion sets it false).
pub(crate) fn merge_upsert(existing: Option<Member>, upsert: &Member) -> Member {
    let mut member = existing.unwrap_or_default();
    member.id = upsert.id;
    if !upsert.name.is_empty() {
        member.name = upsert.name.clone();
    }
    if !upsert.client_urls.is_empty() {
        member.client_urls = upsert.client_urls.clone();
    }
    if !upsert.peer_urls.is_empty() {
        member.peer_urls = upsert.peer_urls.clone();
    }
    member.is_learner = upsert.is_learner;
    member
}

/// Reads member `id`'s row; a row that does not decode is a storage error.
pub(crate) fn read_member<T: ReadableTable<u64, &'static [u8]>>(
    members: &T,
    id: u64,
) -> Result<Option<Member>, StoreError> {
    match members.get(id)? {
        Some(row) => Ok(Some(Member::decode(row.value())?)),
        None => Ok(None),
    }
}

/// The rows `change` writes: each upsert merged into its member's row. Only reads, so a row
/// that cannot be read fails the command before anything is written.
pub(crate) fn membership_rows<T: ReadableTable<u64, &'static [u8]>>(
    members: &T,
    change: &Membership,
) -> Result<Vec<Member>, StoreError> {
    let mut rows: Vec<Member> = Vec::with_capacity(change.upsert.len());
    for upsert in &change.upsert {
        // An id upserted twice in one change merges into its first merge.
        let existing = match rows.iter().position(|m| m.id == upsert.id) {
            Some(at) => Some(rows.swap_remove(at)),
            None => read_member(members, upsert.id)?,
        };
        rows.push(merge_upsert(existing, upsert));
    }
    Ok(rows)
}

/// Writes a membership change: the merged rows (from [`membership_rows`]), then the removals
/// (so an id both upserted and removed is gone), then the new `ConfState`. An error here is
/// a failed write inside the batch's transaction, which the caller must abandon.
pub(crate) fn write_membership(
    members: &mut MembersTable<'_>,
    raft: &mut RaftTable<'_>,
    rows: &[Member],
    change: &Membership,
) -> Result<(), StoreError> {
    for row in rows {
        members.insert(row.id, row.encode_to_vec().as_slice())?;
    }
    for id in &change.removed {
        members.remove(*id)?;
    }
    raft.insert(RAFT_CONF_STATE, change.conf_state.as_ref())?;
    Ok(())
}

/// A deleted range as etcd's duplicate-key check sees it: `[start, end)` compared as raw
/// bytes, or one key when `end` is empty. A `range_end` of `"\0"` is *not* read as "to the
/// end" here, so such a delete conflicts with no put: etcd 3.4 does exactly that, and a txn
/// etcd accepts must not be refused.
pub(crate) struct DeleteInterval {
    start: Bytes,
    end: Bytes,
}

impl DeleteInterval {
    fn contains(&self, key: &[u8]) -> bool {
        if self.end.is_empty() {
            self.start.as_ref() == key
        } else {
            self.start.as_ref() <= key && key < self.end.as_ref()
        }
    }
}

fn intersects(dels: &[DeleteInterval], key: &[u8]) -> bool {
    dels.iter().any(|d| d.contains(key))
}

/// etcd 3.4's `checkIntervals`, the duplicate-key rule of a txn branch, rule for rule: a key
/// may not be put twice, nor put where a delete of the same or an enclosing level (seen so
/// far) removes it; the two branches of a nested txn may put the same key, since only one
/// runs; deletes may overlap each other. Returns the branch's puts and deletes.
pub(crate) fn check_intervals(
    ops: &[RequestOp],
) -> Result<(HashSet<Bytes>, Vec<DeleteInterval>), StoreError> {
    let mut dels: Vec<DeleteInterval> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(request_op::Request::RequestDeleteRange(d)) => Some(DeleteInterval {
                start: d.key.clone(),
                end: d.range_end.clone(),
            }),
            _ => None,
        })
        .collect();
    let mut puts: HashSet<Bytes> = HashSet::new();
    for op in ops {
        let Some(request_op::Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for key in &puts_then {
            if puts.contains(key) || intersects(&dels, key) {
                return Err(StoreError::DuplicateKey);
            }
            puts.insert(key.clone());
        }
        for key in &puts_else {
            if (puts.contains(key) && !puts_then.contains(key)) || intersects(&dels, key) {
                return Err(StoreError::DuplicateKey);
            }
            puts.insert(key.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        if let Some(request_op::Request::RequestPut(p)) = &op.request {
            if puts.contains(&p.key) || intersects(&dels, &p.key) {
                return Err(StoreError::DuplicateKey);
            }
            puts.insert(p.key.clone());
        }
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_op(key: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: Bytes::copy_from_slice(key.as_bytes()),
                ..Default::default()
            })),
        }
    }

    fn del_op(key: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: Bytes::copy_from_slice(key.as_bytes()),
                    range_end: Bytes::copy_from_slice(end.as_bytes()),
                    ..Default::default()
                },
            )),
        }
    }

    #[test]
    fn duplicate_keys_in_a_txn_are_refused_as_etcd_does() {
        assert!(check_intervals(&[put_op("a"), put_op("b")]).is_ok());
        assert_eq!(
            check_intervals(&[put_op("a"), put_op("a")]).err(),
            Some(StoreError::DuplicateKey)
        );
        assert_eq!(
            check_intervals(&[del_op("a", "c"), put_op("b")]).err(),
            Some(StoreError::DuplicateKey)
        );
        assert!(check_intervals(&[del_op("a", "c"), del_op("b", "d")]).is_ok());
        let nested = RequestOp {
            request: Some(request_op::Request::RequestTxn(TxnRequest {
                compare: vec![],
                success: vec![put_op("x")],
                failure: vec![put_op("x")],
            })),
        };
        assert!(check_intervals(std::slice::from_ref(&nested)).is_ok());
        assert_eq!(
            check_intervals(&[put_op("x"), nested]).err(),
            Some(StoreError::DuplicateKey)
        );
    }

    fn member(id: u64, name: &str, client: &[&str], peer: &[&str], learner: bool) -> Member {
        Member {
            id,
            name: name.into(),
            client_urls: client.iter().map(|u| u.to_string()).collect(),
            peer_urls: peer.iter().map(|u| u.to_string()).collect(),
            is_learner: learner,
        }
    }

    #[test]
    fn attributes_and_membership_changes_keep_each_others_fields() {
        let attrs = MemberAttributes {
            id: 7,
            name: "n7".into(),
            client_urls: vec!["http://c7".into()],
        };
        let published = merge_attributes(None, &attrs);
        assert_eq!(published, member(7, "n7", &["http://c7"], &[], false));
        // A change that adds peer URLs and makes the member a learner keeps its name and
        // client URLs.
        let added = merge_upsert(Some(published), &member(7, "", &[], &["http://p7"], true));
        assert_eq!(added, member(7, "n7", &["http://c7"], &["http://p7"], true));
        // Publishing again replaces name and client URLs only.
        let renamed = merge_attributes(
            Some(added),
            &MemberAttributes {
                id: 7,
                name: "seven".into(),
                client_urls: vec![],
            },
        );
        assert_eq!(renamed, member(7, "seven", &[], &["http://p7"], true));
        // A promotion with nothing else set keeps the URLs and clears the learner flag.
        let promoted = merge_upsert(Some(renamed), &member(7, "", &[], &[], false));
        assert_eq!(promoted, member(7, "seven", &[], &["http://p7"], false));
    }

    #[test]
    fn member_attributes_rows_read_as_members() {
        let attrs = MemberAttributes {
            id: 3,
            name: "n3".into(),
            client_urls: vec!["http://c3".into()],
        };
        let decoded = Member::decode(attrs.encode_to_vec().as_slice()).expect("decode");
        assert_eq!(decoded, member(3, "n3", &["http://c3"], &[], false));
    }

    #[test]
    fn sorted_ranges_keep_tied_keys_in_key_order_in_both_orders() {
        // a, b, c written by one txn (mod revision 5), d later, e earlier: as the index
        // yields them, in key order.
        let kv = |key: &str, mod_revision: i64| KeyValue {
            key: Bytes::copy_from_slice(key.as_bytes()),
            mod_revision,
            create_revision: mod_revision,
            version: 1,
            ..Default::default()
        };
        let keys = |kvs: &[KeyValue]| -> Vec<String> {
            kvs.iter()
                .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
                .collect()
        };
        let all = vec![kv("a", 5), kv("b", 5), kv("c", 5), kv("d", 6), kv("e", 3)];
        for target in [
            range_request::SortTarget::Mod,
            range_request::SortTarget::Create,
        ] {
            let mut descending = all.clone();
            sort_kvs(&mut descending, target, true);
            assert_eq!(keys(&descending), ["d", "a", "b", "c", "e"], "{target:?}");
            let mut ascending = all.clone();
            sort_kvs(&mut ascending, target, false);
            assert_eq!(keys(&ascending), ["e", "a", "b", "c", "d"], "{target:?}");
        }
        // Every version is 1: a tie all through, left in key order.
        let mut by_version = all.clone();
        sort_kvs(&mut by_version, range_request::SortTarget::Version, true);
        assert_eq!(keys(&by_version), ["a", "b", "c", "d", "e"]);
        let mut by_key = all;
        sort_kvs(&mut by_key, range_request::SortTarget::Key, true);
        assert_eq!(keys(&by_key), ["e", "d", "c", "b", "a"]);
    }

    #[test]
    fn rows_round_trip_and_garbage_is_an_error() {
        let kv = KeyValue {
            key: Bytes::from_static(b"k"),
            version: 3,
            ..Default::default()
        };
        let row = encode_row(true, &kv);
        assert_eq!(decode_row(&row).ok(), Some((true, kv)));
        assert!(decode_row(&[]).is_err());
        assert!(decode_row(&[7, 1, 2]).is_err());
    }
}
