//! A plain in-memory model of etcd 3.4's MVCC keyspace, written to be obviously correct rather
//! than fast: every revision keeps a whole snapshot of the keyspace, and every change is kept
//! as an event forever (compaction only moves the floor below which reads fail).
//!
//! The model consumes the same wire requests the store does and answers with the responses
//! etcd 3.4 would give. Each rule cites the etcd 3.4 function it follows (`etcdserver/apply.go`,
//! `mvcc/kvstore_txn.go`, `etcdserver/api/v3rpc/key.go`, `etcdserver/api/v3rpc/watch.go`).
//!
//! One etcd quirk is copied on purpose: etcd's duplicate-key check (`checkIntervals`) builds
//! the interval `[key, "\0")` for a delete with `range_end = "\0"`, which is empty, so it lets
//! a txn put a key that the same txn deletes "from key". skerry accepts what etcd accepts.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use skerry_store::StoreError;
use skerry_store::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse, compare,
    request_op, response_op,
};
use skerry_store::pb::mvccpb::{Event, KeyValue, event::EventType};

/// The keyspace at one revision.
pub type Snapshot = BTreeMap<Bytes, KeyValue>;

/// etcd's `(key, range_end)` convention: empty end is one key, `"\0"` every key from `key`,
/// anything else the half-open interval `[key, range_end)`.
pub fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    if end.is_empty() {
        key == start
    } else if end == [0] {
        key >= start
    } else {
        key >= start && key < end
    }
}

/// A header that carries only a revision: what etcd puts on responses nested in a txn, and
/// what the harness reduces a top-level header to before comparing.
pub fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

#[derive(Clone, Debug)]
pub struct Model {
    /// The revision of `snapshots[0]`: the store's revision when it was created empty.
    base: i64,
    /// `snapshots[i]` is the keyspace at revision `base + i`.
    snapshots: Vec<Snapshot>,
    /// Every change ever made, in commit order, without `prev_kv`. A delete's kv is
    /// `{key, mod_revision}` only (etcd's tombstone with the revision patched in).
    events: Vec<Event>,
    /// Reads below this revision fail with "compacted"; 0 before any compaction.
    compacted: i64,
}

impl Model {
    pub fn new(base: i64) -> Self {
        Self {
            base,
            snapshots: vec![Snapshot::new()],
            events: Vec::new(),
            compacted: 0,
        }
    }

    pub fn revision(&self) -> i64 {
        self.base + self.snapshots.len() as i64 - 1
    }

    pub fn compact_revision(&self) -> i64 {
        self.compacted
    }

    /// The keyspace at `revision` (which must be retained by the model, i.e. in
    /// `base..=revision()`; the model never forgets, only the floor moves).
    pub fn at(&self, revision: i64) -> &Snapshot {
        assert!(
            revision >= self.base,
            "revision {revision} below the model's base {}",
            self.base
        );
        let index = usize::try_from(revision - self.base).expect("checked above");
        self.snapshots.get(index).unwrap_or_else(|| {
            panic!(
                "revision {revision} beyond the model's revision {}",
                self.revision()
            )
        })
    }

    pub fn current(&self) -> &Snapshot {
        self.at(self.revision())
    }

    /// The revision a range at `requested` reads, or etcd's error (`rangeKeys`: future is
    /// checked before compacted; the compacted revision itself stays readable).
    fn read_revision(&self, requested: i64, current: i64) -> Result<i64, StoreError> {
        if requested > current {
            return Err(StoreError::FutureRevision);
        }
        let at = if requested <= 0 { current } else { requested };
        if at < self.compacted {
            return Err(StoreError::Compacted {
                compact_revision: self.compacted,
            });
        }
        Ok(at)
    }

    /// A top-level Range (`applierV3backend.Range` with no txn).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, StoreError> {
        let current = self.revision();
        let at = self.read_revision(req.revision, current)?;
        Ok(range_over(self.at(at), req, current))
    }

    /// A top-level Put: a txn of one put.
    pub fn put(&mut self, req: &PutRequest) -> Result<PutResponse, StoreError> {
        let mut txn = TxnState::new(self);
        txn.check_put(req)?;
        let resp = txn.put(req);
        let revision = txn.commit();
        Ok(PutResponse {
            header: header(revision),
            ..resp
        })
    }

    /// A top-level DeleteRange: takes a revision only if it deleted something.
    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, StoreError> {
        let mut txn = TxnState::new(self);
        let resp = txn.delete_range(req);
        let revision = txn.commit();
        Ok(DeleteRangeResponse {
            header: header(revision),
            ..resp
        })
    }

    /// A Txn (`kvServer.Txn` checks, then `applierV3backend.Txn`).
    pub fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, StoreError> {
        // v3rpc/key.go: the static checks come first.
        check_intervals(&req.success)?;
        check_intervals(&req.failure)?;
        // compareToPath: every compare on the chosen path sees the state before the txn.
        let path = choose_path(self.current(), req);
        // checkRequests(checkPut), then checkRequests(checkRange), against the same view.
        let mut deleted: Vec<(Bytes, Bytes)> = Vec::new();
        check_path(req, &path, &mut |op| self.check_put_op(op, &mut deleted))?;
        check_path(req, &path, &mut |op| self.check_range_op(op))?;
        let mut txn = TxnState::new(self);
        let mut resp = txn.apply(req, &path);
        resp.header = header(txn.commit());
        Ok(resp)
    }

    /// `checkPut`, plus one rule etcd lacks: an `ignore_value`/`ignore_lease` put of a key an
    /// earlier delete of the same txn removed (possible only through the `"\0"` quirk of the
    /// duplicate-key check) is `KeyNotFound` before anything is written. etcd finds that out
    /// while applying and panics ("unexpected error during txn"); skerry refuses it cleanly.
    fn check_put_op(
        &self,
        op: &RequestOp,
        deleted: &mut Vec<(Bytes, Bytes)>,
    ) -> Result<(), StoreError> {
        match &op.request {
            Some(request_op::Request::RequestPut(put)) => {
                let removed = deleted.iter().any(|(k, end)| in_range(&put.key, k, end));
                if (put.ignore_value || put.ignore_lease)
                    && (!self.current().contains_key(&put.key) || removed)
                {
                    return Err(StoreError::KeyNotFound);
                }
                assert_eq!(put.lease, 0, "the model has no leases");
                Ok(())
            }
            Some(request_op::Request::RequestDeleteRange(d)) => {
                deleted.push((d.key.clone(), d.range_end.clone()));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `checkRange`: a range in a txn at an explicit revision must be readable *before* the
    /// txn; a revision the txn itself would create is still "future".
    fn check_range_op(&self, op: &RequestOp) -> Result<(), StoreError> {
        match &op.request {
            Some(request_op::Request::RequestRange(range)) if range.revision != 0 => {
                if range.revision > self.revision() {
                    return Err(StoreError::FutureRevision);
                }
                if range.revision < self.compacted {
                    return Err(StoreError::Compacted {
                        compact_revision: self.compacted,
                    });
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Compaction (`store.updateCompactRev`): at or below the floor is "compacted", above
    /// the current revision "future". Answers with the current revision.
    pub fn compact(&mut self, revision: i64) -> Result<i64, StoreError> {
        if revision <= self.compacted {
            return Err(StoreError::Compacted {
                compact_revision: self.compacted,
            });
        }
        if revision > self.revision() {
            return Err(StoreError::FutureRevision);
        }
        self.compacted = revision;
        Ok(self.revision())
    }

    /// The `prev_kv` etcd's watch attaches to an event at `revision`: a range of the key at
    /// `revision - 1` (`serverWatchStream.sendLoop`), which finds nothing once that revision is
    /// compacted (`compacted` is the floor when the event is sent).
    pub fn prev_kv(&self, key: &[u8], revision: i64, compacted: i64) -> Option<KeyValue> {
        if revision - 1 < compacted || revision - 1 < self.base {
            return None;
        }
        self.at(revision - 1).get(key).cloned()
    }

    /// The events of revisions `from..=through` whose key is in `[key, range_end)`, with
    /// `prev_kv` when asked, given the floor `compacted` when they are sent.
    pub fn events(
        &self,
        from: i64,
        through: i64,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
        compacted: i64,
    ) -> Vec<Event> {
        self.events
            .iter()
            .filter(|e| {
                let kv = e.kv.as_ref().expect("model events carry a kv");
                kv.mod_revision >= from
                    && kv.mod_revision <= through
                    && in_range(&kv.key, key, range_end)
            })
            .map(|e| {
                let kv = e.kv.as_ref().expect("model events carry a kv");
                let prev = if prev_kv {
                    self.prev_kv(&kv.key, kv.mod_revision, compacted)
                } else {
                    None
                };
                Event {
                    prev_kv: prev,
                    ..e.clone()
                }
            })
            .collect()
    }

    /// skerry's `Store::history`: the events of `from..=through` with `prev_kv`, refused
    /// below the compaction floor.
    pub fn history(&self, from: i64, through: i64) -> Result<Vec<Event>, StoreError> {
        if from < self.compacted {
            return Err(StoreError::Compacted {
                compact_revision: self.compacted,
            });
        }
        Ok(self.events(from, through, b"\0", b"\0", true, self.compacted))
    }
}

/// etcd's Range over one snapshot (`applierV3backend.Range` + `storeTxnRead.rangeKeys`):
/// `count` is every key in the range whatever the limit; `more` whether keys remain past it.
fn range_over(snapshot: &Snapshot, req: &RangeRequest, header_revision: i64) -> RangeResponse {
    assert_eq!(req.sort_order, 0, "the model does not sort");
    let matching: Vec<&KeyValue> = snapshot
        .iter()
        .filter(|(k, _)| in_range(k, &req.key, &req.range_end))
        .map(|(_, kv)| kv)
        .collect();
    let count = matching.len() as i64;
    let mut kvs: Vec<KeyValue> = if req.count_only {
        Vec::new()
    } else {
        matching.into_iter().cloned().collect()
    };
    let mut more = false;
    if req.limit > 0 && kvs.len() as i64 > req.limit {
        kvs.truncate(usize::try_from(req.limit).expect("positive"));
        more = true;
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value = Bytes::new();
        }
    }
    RangeResponse {
        header: header(header_revision),
        kvs,
        more,
        count,
    }
}

/// Which branch each txn on the chosen path takes, in the order etcd's `compareToPath` lists
/// them: the txn itself, then the nested txns of its chosen branch, depth first.
#[derive(Debug)]
struct Path {
    succeeded: bool,
    nested: Vec<Path>,
}

fn choose_path(view: &Snapshot, txn: &TxnRequest) -> Path {
    let succeeded = txn.compare.iter().all(|c| apply_compare(view, c));
    let ops = if succeeded {
        &txn.success
    } else {
        &txn.failure
    };
    let nested = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(request_op::Request::RequestTxn(t)) => Some(choose_path(view, t)),
            _ => None,
        })
        .collect();
    Path { succeeded, nested }
}

/// `checkRequests`: `check` on every non-txn op of the chosen path, in order.
fn check_path(
    txn: &TxnRequest,
    path: &Path,
    check: &mut impl FnMut(&RequestOp) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let ops = if path.succeeded {
        &txn.success
    } else {
        &txn.failure
    };
    let mut nested = path.nested.iter();
    for op in ops {
        match &op.request {
            Some(request_op::Request::RequestTxn(t)) => {
                check_path(t, nested.next().expect("a path per nested txn"), check)?;
            }
            _ => check(op)?,
        }
    }
    Ok(())
}

/// `applyCompare`: a value compare on a missing key fails; otherwise a missing key compares
/// as the empty KeyValue (version, revisions and lease 0); a range compare holds only if it
/// holds for every key in it.
fn apply_compare(view: &Snapshot, c: &Compare) -> bool {
    let kvs: Vec<&KeyValue> = view
        .iter()
        .filter(|(k, _)| in_range(k, &c.key, &c.range_end))
        .map(|(_, kv)| kv)
        .collect();
    let target = compare::CompareTarget::try_from(c.target).expect("generated targets are valid");
    if kvs.is_empty() {
        if target == compare::CompareTarget::Value {
            return false;
        }
        return compare_kv(c, target, &KeyValue::default());
    }
    kvs.into_iter().all(|kv| compare_kv(c, target, kv))
}

/// `compareKV`.
fn compare_kv(c: &Compare, target: compare::CompareTarget, kv: &KeyValue) -> bool {
    use compare::TargetUnion as U;
    let ordering = match (target, &c.target_union) {
        (compare::CompareTarget::Value, Some(U::Value(v))) => kv.value.as_ref().cmp(v.as_ref()),
        (compare::CompareTarget::Version, Some(U::Version(v))) => kv.version.cmp(v),
        (compare::CompareTarget::Create, Some(U::CreateRevision(v))) => kv.create_revision.cmp(v),
        (compare::CompareTarget::Mod, Some(U::ModRevision(v))) => kv.mod_revision.cmp(v),
        (compare::CompareTarget::Lease, Some(U::Lease(v))) => kv.lease.cmp(v),
        (target, union) => panic!("generated compare target {target:?} with union {union:?}"),
    };
    use std::cmp::Ordering as O;
    match compare::CompareResult::try_from(c.result).expect("generated results are valid") {
        compare::CompareResult::Equal => ordering == O::Equal,
        compare::CompareResult::NotEqual => ordering != O::Equal,
        compare::CompareResult::Greater => ordering == O::Greater,
        compare::CompareResult::Less => ordering == O::Less,
    }
}

/// A delete's key set, for the duplicate-key check.
#[derive(Clone, Debug)]
struct Interval {
    key: Bytes,
    range_end: Bytes,
}

impl Interval {
    /// As etcd's interval tree sees a delete: raw `[key, range_end)`, or the one key when the
    /// end is empty; `"\0"` gets no special meaning here (see the module docs).
    fn contains(&self, key: &[u8]) -> bool {
        if self.range_end.is_empty() {
            self.key.as_ref() == key
        } else {
            self.key.as_ref() <= key && key < self.range_end.as_ref()
        }
    }
}

/// etcd 3.4's `checkIntervals`, step for step: this level's deletes are collected first;
/// then each nested txn's puts (either branch; the two branches may share a key) must not hit
/// an earlier sibling's puts nor the deletes collected so far, after which that nested txn's
/// deletes join the set; last, this level's puts must hit neither.
fn check_intervals(ops: &[RequestOp]) -> Result<(BTreeSet<Bytes>, Vec<Interval>), StoreError> {
    let mut dels: Vec<Interval> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(request_op::Request::RequestDeleteRange(d)) => Some(Interval {
                key: d.key.clone(),
                range_end: d.range_end.clone(),
            }),
            _ => None,
        })
        .collect();
    let mut puts: BTreeSet<Bytes> = BTreeSet::new();
    for op in ops {
        let Some(request_op::Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || dels.iter().any(|d| d.contains(k)) {
                return Err(StoreError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if puts.contains(k) && !puts_then.contains(k) {
                return Err(StoreError::DuplicateKey);
            }
            if dels.iter().any(|d| d.contains(k)) {
                return Err(StoreError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let Some(request_op::Request::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || dels.iter().any(|d| d.contains(&p.key)) {
            return Err(StoreError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// One write transaction in progress (`storeTxnWrite`): changes take revision `begin + 1`
/// and are visible to the txn's own later reads.
struct TxnState<'m> {
    model: &'m mut Model,
    begin: i64,
    working: Snapshot,
    changes: Vec<Event>,
}

impl<'m> TxnState<'m> {
    fn new(model: &'m mut Model) -> Self {
        let begin = model.revision();
        let working = model.current().clone();
        Self {
            model,
            begin,
            working,
            changes: Vec::new(),
        }
    }

    /// The revision the txn reads at (`storeTxnWrite.Range`): the pending one once written.
    fn read_revision(&self) -> i64 {
        if self.changes.is_empty() {
            self.begin
        } else {
            self.begin + 1
        }
    }

    fn check_put(&self, req: &PutRequest) -> Result<(), StoreError> {
        if (req.ignore_value || req.ignore_lease) && !self.working.contains_key(&req.key) {
            return Err(StoreError::KeyNotFound);
        }
        Ok(())
    }

    /// `applierV3backend.Range` inside a txn. An explicit revision was checked against the
    /// state before the txn, so it reads history; revision 0 reads the txn's own writes.
    fn range(&self, req: &RangeRequest) -> RangeResponse {
        let current = self.read_revision();
        if req.revision > 0 {
            assert!(
                req.revision <= self.begin,
                "checkRange let a future revision through"
            );
            range_over(self.model.at(req.revision), req, current)
        } else {
            range_over(&self.working, req, current)
        }
    }

    /// `applierV3backend.Put` + `storeTxnWrite.put`.
    fn put(&mut self, req: &PutRequest) -> PutResponse {
        let prev = self.working.get(&req.key).cloned();
        let revision = self.begin + 1;
        let value = if req.ignore_value {
            prev.as_ref().expect("checked by check_put").value.clone()
        } else {
            req.value.clone()
        };
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
            mod_revision: revision,
            version: prev.as_ref().map_or(0, |p| p.version) + 1,
            value,
            lease: 0,
        };
        self.working.insert(req.key.clone(), kv.clone());
        self.changes.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: None,
        });
        PutResponse {
            header: header(revision),
            prev_kv: if req.prev_kv { prev } else { None },
        }
    }

    /// `applierV3backend.DeleteRange` + `storeTxnWrite.DeleteRange`.
    fn delete_range(&mut self, req: &DeleteRangeRequest) -> DeleteRangeResponse {
        let doomed: Vec<KeyValue> = self
            .working
            .iter()
            .filter(|(k, _)| in_range(k, &req.key, &req.range_end))
            .map(|(_, kv)| kv.clone())
            .collect();
        let revision = self.begin + 1;
        for kv in &doomed {
            self.working.remove(&kv.key);
            let tombstone = KeyValue {
                key: kv.key.clone(),
                mod_revision: revision,
                ..Default::default()
            };
            self.changes.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(tombstone),
                prev_kv: None,
            });
        }
        DeleteRangeResponse {
            header: header(self.read_revision()),
            deleted: doomed.len() as i64,
            prev_kvs: if req.prev_kv { doomed } else { Vec::new() },
        }
    }

    /// `applyTxn`. A nested txn's response keeps the empty header `newTxnResp` gave it: etcd
    /// sets a revision only on the top-level txn response.
    fn apply(&mut self, txn: &TxnRequest, path: &Path) -> TxnResponse {
        let ops = if path.succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let mut nested = path.nested.iter();
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let response = match op.request.as_ref().expect("generated ops are never empty") {
                request_op::Request::RequestRange(r) => {
                    response_op::Response::ResponseRange(self.range(r))
                }
                request_op::Request::RequestPut(p) => {
                    response_op::Response::ResponsePut(self.put(p))
                }
                request_op::Request::RequestDeleteRange(d) => {
                    response_op::Response::ResponseDeleteRange(self.delete_range(d))
                }
                request_op::Request::RequestTxn(t) => {
                    let path = nested.next().expect("a path per nested txn");
                    response_op::Response::ResponseTxn(self.apply(t, path))
                }
            };
            responses.push(ResponseOp {
                response: Some(response),
            });
        }
        TxnResponse {
            header: header(0),
            succeeded: path.succeeded,
            responses,
        }
    }

    /// Ends the txn; a new revision exists only if something changed. Returns the revision.
    fn commit(self) -> i64 {
        if self.changes.is_empty() {
            return self.begin;
        }
        self.model.snapshots.push(self.working);
        self.model.events.extend(self.changes);
        self.begin + 1
    }
}
