//! The checks etcd's gRPC layer makes before a request reaches the store, with etcd's limits.

use prost::Message;

use crate::error::StoreError;
use crate::pb::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, request_op,
};

/// The largest request etcd accepts (`--max-request-bytes` default, 1.5 MiB). Bigger requests
/// would make one Raft entry, and one fsync, arbitrarily large.
pub const REQUEST_BYTES_MAX: usize = 3 * 512 * 1024;

/// gRPC framing allowance on top of [`REQUEST_BYTES_MAX`] (etcd's `grpcOverheadBytes`): a
/// message past both is refused by the transport before it is decoded.
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// The most operations in one txn branch (etcd's `--max-txn-ops` default).
pub const TXN_OPS_MAX: usize = 128;

pub fn range(req: &RangeRequest) -> Result<(), StoreError> {
    if req.key.is_empty() {
        return Err(StoreError::EmptyKey);
    }
    Ok(())
}

pub fn put(req: &PutRequest) -> Result<(), StoreError> {
    check_put(req)?;
    size(req)
}

pub fn delete_range(req: &DeleteRangeRequest) -> Result<(), StoreError> {
    if req.key.is_empty() {
        return Err(StoreError::EmptyKey);
    }
    size(req)
}

pub fn txn(req: &TxnRequest) -> Result<(), StoreError> {
    check_txn(req, TXN_OPS_MAX)?;
    crate::mvcc::check_intervals(&req.success)?;
    crate::mvcc::check_intervals(&req.failure)?;
    size(req)
}

fn size(req: &impl Message) -> Result<(), StoreError> {
    if req.encoded_len() > REQUEST_BYTES_MAX {
        return Err(StoreError::RequestTooLarge);
    }
    Ok(())
}

fn check_put(req: &PutRequest) -> Result<(), StoreError> {
    if req.key.is_empty() {
        return Err(StoreError::EmptyKey);
    }
    if req.ignore_value && !req.value.is_empty() {
        return Err(StoreError::ValueProvided);
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(StoreError::LeaseProvided);
    }
    Ok(())
}

/// etcd's `checkTxnRequest`: the op budget shrinks with nesting.
fn check_txn(req: &TxnRequest, ops_max: usize) -> Result<(), StoreError> {
    let ops = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    if ops > ops_max {
        return Err(StoreError::TooManyOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(StoreError::EmptyKey);
    }
    for op in req.success.iter().chain(req.failure.iter()) {
        check_op(op, ops_max - ops)?;
    }
    Ok(())
}

fn check_op(op: &RequestOp, ops_max: usize) -> Result<(), StoreError> {
    match &op.request {
        Some(request_op::Request::RequestRange(r)) => range(r),
        Some(request_op::Request::RequestPut(p)) => check_put(p),
        Some(request_op::Request::RequestDeleteRange(d)) => {
            if d.key.is_empty() {
                return Err(StoreError::EmptyKey);
            }
            Ok(())
        }
        Some(request_op::Request::RequestTxn(t)) => check_txn(t, ops_max),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn etcd_limits_are_enforced() {
        let op = RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: Bytes::from_static(b"k"),
                ..Default::default()
            })),
        };
        let ok = TxnRequest {
            success: vec![op.clone(); TXN_OPS_MAX],
            ..Default::default()
        };
        assert_eq!(txn(&ok), Ok(()));
        let too_many = TxnRequest {
            success: vec![op; TXN_OPS_MAX + 1],
            ..Default::default()
        };
        assert_eq!(txn(&too_many), Err(StoreError::TooManyOps));
        let big = PutRequest {
            key: Bytes::from_static(b"k"),
            value: Bytes::from(vec![0u8; REQUEST_BYTES_MAX]),
            ..Default::default()
        };
        assert_eq!(put(&big), Err(StoreError::RequestTooLarge));
        assert_eq!(put(&PutRequest::default()), Err(StoreError::EmptyKey));
        let both = PutRequest {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            ignore_value: true,
            ..Default::default()
        };
        assert_eq!(put(&both), Err(StoreError::ValueProvided));
    }
}
