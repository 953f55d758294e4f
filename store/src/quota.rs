//! The space quota: etcd's `--quota-backend-bytes` (`etcdserver/quota.go`,
//! `etcdserver/api/v3rpc/quota.go`).
//!
//! Each member checks its own backend against the quota; the `NOSPACE` alarm it raises when
//! the backend would pass it is cluster-wide (see [`crate::alarm`]). etcd checks twice, and
//! so does skerry:
//!
//! - before proposing a put, a txn or a lease grant, on the member the client asked: when
//!   the command costs something and `size + cost` is not below the quota, the member raises
//!   `NOSPACE` (through the log) and refuses with `etcdserver: mvcc: database space exceeded`
//!   (gRPC `ResourceExhausted`);
//! - when applying one, on every member: the command applies, but if the member was over its
//!   quota the result is that same error, and the member raises `NOSPACE` for itself.
//!
//! The cost is etcd's estimate, not the bytes the command will take: 256 bytes of key
//! metadata plus the key and value of every put at a txn's top level (the costlier branch),
//! 64 bytes for a lease.
//!
//! The backend's size is the length of the redb file: the `DB SIZE` `etcdctl endpoint
//! status` shows, as etcd's quota measures what etcd shows there. Other measures were
//! weighed: redb's count of allocated pages walks every tree (too dear per write), and the
//! file's allocated blocks lag by whatever redb holds in its write buffer between durable
//! commits. The length's cost is its coarseness: redb grows the file by doubling it (up to
//! its 4 GiB regions) and shrinks it when a commit leaves the trailing half free, so the file
//! can pass the quota by up to the growth that passed it, and writes stop while what the
//! file holds may be a little over half the quota (about 1.2 GB under the 2 GiB default).
//! Compaction frees pages inside the file, and defragmentation gives them back and shrinks
//! the file.

use crate::pb::etcdserverpb::{PutRequest, RequestOp, TxnRequest, request_op};

/// The quota when `--quota-backend-bytes` is 0 or not given: etcd's `DefaultQuotaBytes`.
pub const QUOTA_BYTES_DEFAULT: u64 = 2 * 1024 * 1024 * 1024;

/// Above this quota etcd warns that performance may degrade (`MaxQuotaBytes`); skerry warns
/// too but takes it.
pub const QUOTA_BYTES_SUGGESTED_MAX: u64 = 8 * 1024 * 1024 * 1024;

/// etcd's estimate of a key's metadata in the backend (`kvOverhead`).
const KV_OVERHEAD_BYTES: u64 = 256;

/// etcd's estimate of a lease in the backend (`leaseOverhead`): the cost of a lease grant.
pub const LEASE_GRANT_COST: u64 = 64;

/// The quota `--quota-backend-bytes` asks for, as etcd reads it: negative disables the
/// quota, 0 means [`QUOTA_BYTES_DEFAULT`].
pub fn quota_from_flag(bytes: i64) -> Option<u64> {
    match bytes {
        ..0 => None,
        0 => Some(QUOTA_BYTES_DEFAULT),
        n => Some(n.unsigned_abs()),
    }
}

/// What a put costs against the quota (etcd's `costPut`).
pub fn put_cost(req: &PutRequest) -> u64 {
    KV_OVERHEAD_BYTES + req.key.len() as u64 + req.value.len() as u64
}

/// What a txn costs (etcd's `costTxn`): the puts at the top level of the costlier branch.
/// Puts inside nested txns are not counted, as etcd does not count them.
pub fn txn_cost(req: &TxnRequest) -> u64 {
    let branch = |ops: &[RequestOp]| -> u64 {
        ops.iter()
            .map(|op| match &op.request {
                Some(request_op::Request::RequestPut(put)) => put_cost(put),
                _ => 0,
            })
            .sum()
    };
    branch(&req.success).max(branch(&req.failure))
}

/// Whether every op at a txn's top level is a range (etcd's `isTxnReadonly`). etcd serves
/// such a txn without the log, so no alarm applier ever sees it.
pub fn txn_is_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .all(|op| matches!(op.request, Some(request_op::Request::RequestRange(_))))
}

/// One member's quota and backend size as the apply path sees them for one batch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QuotaCheck {
    /// `None`: no quota (disabled, or a replay whose results nobody reads).
    pub(crate) limit: Option<u64>,
    /// The backend's size before the batch.
    pub(crate) size: u64,
}

impl QuotaCheck {
    /// etcd's `backendQuota.Available`: a command that costs nothing (a txn of ranges and
    /// deletes) always passes; otherwise the size plus the cost stays strictly below the
    /// quota. (etcd 3.4.23 passes a read-only txn on a member past its quota; the
    /// `quota.go` of 3.4's first releases did not, and later ones carry the same rule.)
    pub(crate) fn available(&self, cost: u64) -> bool {
        cost == 0
            || self
                .limit
                .is_none_or(|limit| self.size.saturating_add(cost) < limit)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::pb::etcdserverpb::{DeleteRangeRequest, RangeRequest};

    fn put(key: &str, value: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: Bytes::copy_from_slice(key.as_bytes()),
                value: Bytes::copy_from_slice(value.as_bytes()),
                ..Default::default()
            })),
        }
    }

    fn range() -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest::default())),
        }
    }

    fn delete() -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest::default(),
            )),
        }
    }

    #[test]
    fn the_flag_reads_as_etcds() {
        assert_eq!(quota_from_flag(-1), None);
        assert_eq!(quota_from_flag(0), Some(QUOTA_BYTES_DEFAULT));
        assert_eq!(quota_from_flag(1 << 20), Some(1 << 20));
    }

    #[test]
    fn costs_are_etcds_estimates() {
        let Some(request_op::Request::RequestPut(p)) = put("key", "value").request else {
            unreachable!("built as a put")
        };
        assert_eq!(put_cost(&p), 256 + 3 + 5);
        let txn = TxnRequest {
            compare: vec![],
            success: vec![put("a", "1"), range(), put("bb", "")],
            failure: vec![put("c", "123456789")],
        };
        // success: 258 + 258; failure: 266: the costlier branch.
        assert_eq!(txn_cost(&txn), 516);
        let nested = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(txn)),
            }],
            ..Default::default()
        };
        assert_eq!(txn_cost(&nested), 0, "etcd does not look into nested txns");
        assert!(!txn_is_read_only(&nested));
        let reads = TxnRequest {
            success: vec![range()],
            failure: vec![range(), range()],
            ..Default::default()
        };
        assert!(txn_is_read_only(&reads));
        assert_eq!(txn_cost(&reads), 0);
        let deletes = TxnRequest {
            success: vec![delete()],
            ..Default::default()
        };
        assert!(!txn_is_read_only(&deletes));
        assert_eq!(txn_cost(&deletes), 0);
    }

    #[test]
    fn available_means_strictly_below_the_quota() {
        let check = QuotaCheck {
            limit: Some(1000),
            size: 900,
        };
        assert!(check.available(99));
        assert!(!check.available(100));
        assert!(QuotaCheck::default().available(u64::MAX));
        let past = QuotaCheck {
            limit: Some(1000),
            size: 1000,
        };
        assert!(!past.available(1));
        assert!(
            past.available(0),
            "nothing to write passes even past the quota"
        );
    }
}
