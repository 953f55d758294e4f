//! The operations the model test generates, their proptest strategies, and how each becomes a
//! wire request. Revisions and compare operands are chosen relative to the state when the
//! operation runs (`RevPick`, `CmpOperand`), so a shrunk sequence still aims where the
//! original did: "two revisions back", "one past the compaction floor".

use std::fmt;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::sample::select;
use skerry_store::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, compare,
    request_op,
};

use crate::etcd::{Model, in_range};

/// The keys written. Six, two of them sharing prefixes with others, so that puts collide,
/// prefixes hold several keys and a limit of 1..3 cuts ranges short.
pub const KEYS: [&str; 6] = ["a", "a/x", "a/y", "b", "b/x", "c"];
/// Range boundaries: around, between and beyond the keys.
const BOUNDS: [&str; 10] = ["\0", "a", "a/", "a/x", "a/y", "a0", "b", "b/x", "c", "d"];
const PREFIXES: [&str; 4] = ["a", "a/", "b", "c"];
/// Few values, so that value compares sometimes hold; "" is a legal value.
const VALUES: [&str; 5] = ["", "0", "1", "2", "10"];

pub fn bytes(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Which keys a range, delete, compare or watch covers.
#[derive(Clone, Copy)]
pub enum Keys {
    One(&'static str),
    /// `[p, prefix_end(p))`, as `etcdctl --prefix` sends it.
    Prefix(&'static str),
    /// `range_end = "\0"`: every key from this one on.
    From(&'static str),
    /// `[start, end)`, possibly empty or inverted.
    Span(&'static str, &'static str),
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keys::One(k) => write!(f, "{k:?}"),
            Keys::Prefix(p) => write!(f, "prefix({p:?})"),
            Keys::From(k) => write!(f, "from({k:?})"),
            Keys::Span(a, b) => write!(f, "[{a:?}..{b:?})"),
        }
    }
}

/// etcd's `GetPrefixRangeEnd`.
fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(b"\0")
}

impl Keys {
    /// `(key, range_end)` on the wire.
    pub fn wire(self) -> (Bytes, Bytes) {
        match self {
            Keys::One(k) => (bytes(k), Bytes::new()),
            Keys::Prefix(p) => (bytes(p), prefix_end(p.as_bytes())),
            Keys::From(k) => (bytes(k), Bytes::from_static(b"\0")),
            Keys::Span(a, b) => (bytes(a), bytes(b)),
        }
    }
}

/// A revision chosen relative to the state when the operation runs.
#[derive(Clone, Copy, Debug)]
pub enum RevPick {
    /// 0: the current revision (for a compaction: the current revision itself).
    Now,
    /// `current - n`, at least 1.
    Back(u8),
    /// `compacted + delta`, at least 1: both sides of the floor.
    AtCompacted(i8),
    /// `current + 1 + n`.
    Future(u8),
}

impl RevPick {
    /// The revision for a read: `Now` is 0 ("current").
    pub fn for_read(self, model: &Model) -> i64 {
        match self {
            RevPick::Now => 0,
            other => other.absolute(model),
        }
    }

    /// An explicit revision.
    pub fn absolute(self, model: &Model) -> i64 {
        let current = model.revision();
        match self {
            RevPick::Now => current,
            RevPick::Back(n) => (current - i64::from(n)).max(1),
            RevPick::AtCompacted(d) => (model.compact_revision() + i64::from(d)).max(1),
            RevPick::Future(n) => current + 1 + i64::from(n),
        }
    }
}

#[derive(Clone, Debug)]
pub struct RangeOp {
    pub keys: Keys,
    pub revision: RevPick,
    pub limit: i64,
    pub count_only: bool,
    pub keys_only: bool,
}

impl RangeOp {
    pub fn wire(&self, model: &Model) -> RangeRequest {
        let (key, range_end) = self.keys.wire();
        RangeRequest {
            key,
            range_end,
            limit: self.limit,
            revision: self.revision.for_read(model),
            count_only: self.count_only,
            keys_only: self.keys_only,
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug)]
pub struct PutOp {
    pub key: &'static str,
    pub value: &'static str,
    pub prev_kv: bool,
    /// `ignore_value`: keep the current value (the request carries none).
    pub ignore_value: bool,
}

impl PutOp {
    pub fn wire(&self) -> PutRequest {
        PutRequest {
            key: bytes(self.key),
            value: if self.ignore_value {
                Bytes::new()
            } else {
                bytes(self.value)
            },
            prev_kv: self.prev_kv,
            ignore_value: self.ignore_value,
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug)]
pub struct DeleteOp {
    pub keys: Keys,
    pub prev_kv: bool,
}

impl DeleteOp {
    pub fn wire(&self) -> DeleteRangeRequest {
        let (key, range_end) = self.keys.wire();
        DeleteRangeRequest {
            key,
            range_end,
            prev_kv: self.prev_kv,
        }
    }
}

/// A compare operand for version, create, mod or lease targets.
#[derive(Clone, Copy, Debug)]
pub enum CmpOperand {
    Literal(i64),
    /// The compared field of the first key the compare covers (0 if none) plus a delta:
    /// lands on, just below and just above the real value.
    Own(i8),
}

#[derive(Clone, Copy, Debug)]
pub enum CmpTarget {
    Value(&'static str),
    Version(CmpOperand),
    Create(CmpOperand),
    Mod(CmpOperand),
    Lease(i64),
}

#[derive(Clone, Debug)]
pub struct CmpOp {
    pub keys: Keys,
    pub target: CmpTarget,
    pub result: compare::CompareResult,
}

impl CmpOp {
    fn wire(&self, model: &Model) -> Compare {
        use compare::{CompareTarget as T, TargetUnion as U};
        let (key, range_end) = self.keys.wire();
        let first = model
            .current()
            .iter()
            .find(|(k, _)| in_range(k, &key, &range_end))
            .map(|(_, kv)| kv);
        let operand = |o: CmpOperand, field: fn(&skerry_store::pb::mvccpb::KeyValue) -> i64| match o
        {
            CmpOperand::Literal(v) => v,
            CmpOperand::Own(d) => first.map_or(0, field) + i64::from(d),
        };
        let (target, union) = match self.target {
            CmpTarget::Value(v) => (T::Value, U::Value(bytes(v))),
            CmpTarget::Version(o) => (T::Version, U::Version(operand(o, |kv| kv.version))),
            CmpTarget::Create(o) => (
                T::Create,
                U::CreateRevision(operand(o, |kv| kv.create_revision)),
            ),
            CmpTarget::Mod(o) => (T::Mod, U::ModRevision(operand(o, |kv| kv.mod_revision))),
            CmpTarget::Lease(v) => (T::Lease, U::Lease(v)),
        };
        Compare {
            result: self.result as i32,
            target: target as i32,
            key,
            range_end,
            target_union: Some(union),
        }
    }
}

#[derive(Clone, Debug)]
pub enum TxnReq {
    Put(PutOp),
    Delete(DeleteOp),
    Range(RangeOp),
    Txn(TxnOp),
}

#[derive(Clone, Debug)]
pub struct TxnOp {
    pub compare: Vec<CmpOp>,
    pub success: Vec<TxnReq>,
    pub failure: Vec<TxnReq>,
}

impl TxnOp {
    /// The wire request. Operands relative to the state are resolved against `model`, the
    /// state before the txn (nested compares too: etcd evaluates them all before writing).
    pub fn wire(&self, model: &Model) -> TxnRequest {
        let ops = |reqs: &[TxnReq]| -> Vec<RequestOp> {
            reqs.iter()
                .map(|r| RequestOp {
                    request: Some(match r {
                        TxnReq::Put(p) => request_op::Request::RequestPut(p.wire()),
                        TxnReq::Delete(d) => request_op::Request::RequestDeleteRange(d.wire()),
                        TxnReq::Range(r) => request_op::Request::RequestRange(r.wire(model)),
                        TxnReq::Txn(t) => request_op::Request::RequestTxn(t.wire(model)),
                    }),
                })
                .collect()
        };
        TxnRequest {
            compare: self.compare.iter().map(|c| c.wire(model)).collect(),
            success: ops(&self.success),
            failure: ops(&self.failure),
        }
    }

    /// Drops the writes that could make etcd refuse the txn as "duplicate key": a second put
    /// of a key anywhere in the txn (both branches, nested too) or a put and a delete that
    /// overlap. Conservative (it drops more than etcd would refuse), so that most txns apply.
    fn sanitize(&mut self) {
        let mut puts = Vec::new();
        let mut dels = Vec::new();
        sanitize_ops(&mut self.success, &mut puts, &mut dels);
        sanitize_ops(&mut self.failure, &mut puts, &mut dels);
    }
}

fn sanitize_ops(reqs: &mut Vec<TxnReq>, puts: &mut Vec<Bytes>, dels: &mut Vec<(Bytes, Bytes)>) {
    reqs.retain_mut(|r| match r {
        TxnReq::Put(p) => {
            let key = bytes(p.key);
            let clash = puts.contains(&key) || dels.iter().any(|(s, e)| in_range(&key, s, e));
            if !clash {
                puts.push(key);
            }
            !clash
        }
        TxnReq::Delete(d) => {
            let (s, e) = d.keys.wire();
            let clash = puts.iter().any(|k| in_range(k, &s, &e));
            if !clash {
                dels.push((s, e));
            }
            !clash
        }
        TxnReq::Range(_) => true,
        TxnReq::Txn(t) => {
            sanitize_ops(&mut t.success, puts, dels);
            sanitize_ops(&mut t.failure, puts, dels);
            true
        }
    });
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug)]
pub enum WatchStart {
    /// `start_revision = 0`: from the next revision.
    Now,
    At(RevPick),
}

#[derive(Clone, Debug)]
pub enum Op {
    Put(PutOp),
    Delete(DeleteOp),
    Range(RangeOp),
    Txn(TxnOp),
    Compact {
        to: RevPick,
        physical: bool,
    },
    /// Creates a watcher and checks it (and every other open one) catches up with the store.
    Watch {
        keys: Keys,
        start: WatchStart,
        prev_kv: bool,
    },
    History {
        from: RevPick,
        through: RevPick,
    },
    /// `count` puts cycling over the keys. Sent one after the other they make more revisions
    /// than a watch stream queues (128 responses), so open watchers fall behind and catch up
    /// by replay; sent all at once they share group commits.
    Burst {
        count: u16,
        concurrent: bool,
    },
    /// Closes the store and opens its data dir again.
    Reopen,
}

impl Op {
    /// The puts of a burst.
    pub fn burst(count: u16) -> Vec<PutOp> {
        (0..usize::from(count))
            .map(|i| PutOp {
                key: KEYS[i % KEYS.len()],
                value: VALUES[i % VALUES.len()],
                prev_kv: i % 2 == 0,
                ignore_value: false,
            })
            .collect()
    }
}

fn keys() -> impl Strategy<Value = Keys> {
    prop_oneof![
        4 => select(&KEYS[..]).prop_map(Keys::One),
        2 => select(&PREFIXES[..]).prop_map(Keys::Prefix),
        1 => select(&BOUNDS[..]).prop_map(Keys::From),
        2 => (select(&BOUNDS[..]), select(&BOUNDS[..])).prop_map(|(a, b)| Keys::Span(a, b)),
    ]
}

fn rev_pick() -> impl Strategy<Value = RevPick> {
    prop_oneof![
        3 => Just(RevPick::Now),
        4 => (0u8..12).prop_map(RevPick::Back),
        2 => (-2i8..=2).prop_map(RevPick::AtCompacted),
        1 => (0u8..3).prop_map(RevPick::Future),
    ]
}

fn range_op() -> impl Strategy<Value = RangeOp> {
    (
        keys(),
        rev_pick(),
        prop_oneof![3 => Just(0i64), 2 => 1i64..4],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(keys, revision, limit, count_only, keys_only)| RangeOp {
            keys,
            revision,
            limit,
            count_only: count_only && keys_only, // a quarter of ranges count only
            keys_only: keys_only && !count_only,
        })
}

/// A range inside a txn: mostly at the txn's own view, sometimes at a revision of its own.
fn txn_range_op() -> impl Strategy<Value = RangeOp> {
    (range_op(), prop::bool::weighted(0.6)).prop_map(|(mut r, now)| {
        if now {
            r.revision = RevPick::Now;
        }
        r
    })
}

fn put_op() -> impl Strategy<Value = PutOp> {
    (
        select(&KEYS[..]),
        select(&VALUES[..]),
        any::<bool>(),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(key, value, prev_kv, ignore_value)| PutOp {
            key,
            value,
            prev_kv,
            ignore_value,
        })
}

fn delete_op() -> impl Strategy<Value = DeleteOp> {
    (keys(), any::<bool>()).prop_map(|(keys, prev_kv)| DeleteOp { keys, prev_kv })
}

fn cmp_operand(literal: std::ops::Range<i64>) -> impl Strategy<Value = CmpOperand> {
    prop_oneof![
        1 => literal.prop_map(CmpOperand::Literal),
        2 => (-1i8..=1).prop_map(CmpOperand::Own),
    ]
}

fn cmp_op() -> impl Strategy<Value = CmpOp> {
    use compare::CompareResult as R;
    let target = prop_oneof![
        3 => select(&VALUES[..]).prop_map(CmpTarget::Value),
        2 => cmp_operand(0..4).prop_map(CmpTarget::Version),
        2 => cmp_operand(0..8).prop_map(CmpTarget::Create),
        2 => cmp_operand(0..8).prop_map(CmpTarget::Mod),
        1 => (0i64..2).prop_map(CmpTarget::Lease),
    ];
    let keys = prop_oneof![4 => select(&KEYS[..]).prop_map(Keys::One), 1 => keys()];
    let result = select(&[R::Equal, R::NotEqual, R::Greater, R::Less][..]);
    (keys, target, result).prop_map(|(keys, target, result)| CmpOp {
        keys,
        target,
        result,
    })
}

fn leaf_req() -> impl Strategy<Value = TxnReq> {
    prop_oneof![
        4 => put_op().prop_map(TxnReq::Put),
        2 => delete_op().prop_map(TxnReq::Delete),
        3 => txn_range_op().prop_map(TxnReq::Range),
    ]
}

fn txn_body(req: BoxedStrategy<TxnReq>) -> impl Strategy<Value = TxnOp> {
    (
        prop::collection::vec(cmp_op(), 0..3),
        prop::collection::vec(req.clone(), 0..4),
        prop::collection::vec(req, 0..4),
    )
        .prop_map(|(compare, success, failure)| TxnOp {
            compare,
            success,
            failure,
        })
}

/// A txn, one level of nesting at most; four in five have their duplicate writes removed,
/// the rest test etcd's duplicate-key rule.
fn txn_op() -> impl Strategy<Value = TxnOp> {
    let nested = txn_body(leaf_req().boxed()).prop_map(TxnReq::Txn);
    let req = prop_oneof![9 => leaf_req(), 1 => nested].boxed();
    (txn_body(req), prop::bool::weighted(0.8)).prop_map(|(mut txn, sanitize)| {
        if sanitize {
            txn.sanitize();
        }
        txn
    })
}

fn watch_start() -> impl Strategy<Value = WatchStart> {
    prop_oneof![1 => Just(WatchStart::Now), 3 => rev_pick().prop_map(WatchStart::At)]
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => put_op().prop_map(Op::Put),
        8 => delete_op().prop_map(Op::Delete),
        12 => range_op().prop_map(Op::Range),
        16 => txn_op().prop_map(Op::Txn),
        4 => (rev_pick(), prop::bool::weighted(0.3))
            .prop_map(|(to, physical)| Op::Compact { to, physical }),
        4 => (keys(), watch_start(), any::<bool>())
            .prop_map(|(keys, start, prev_kv)| Op::Watch { keys, start, prev_kv }),
        2 => (rev_pick(), rev_pick()).prop_map(|(from, through)| Op::History { from, through }),
        1 => prop_oneof![
            (1u16..=300).prop_map(|count| Op::Burst { count, concurrent: false }),
            (1u16..=300).prop_map(|count| Op::Burst { count, concurrent: true }),
        ],
        1 => Just(Op::Reopen),
    ]
}
