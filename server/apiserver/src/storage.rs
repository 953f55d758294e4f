//! The store-facing side of the registry: decoding objects, paged LIST with continue
//! tokens, GET, and the create/update/delete transactions with their preconditions.
//!
//! This carries `docs/tricks.md` #8, doubling the LIST page size under a selector, capped at
//! 10,000: a LIST with a `limit` and a selective filter reads the store in pages, and every
//! page that leaves the result short doubles the next page's size, capped at
//! [`PAGE_SIZE_MAX`], so a filter matching 1 object in 1,000 costs about log2(1000/limit)
//! store reads instead of 1000/limit.
//!
//! Invariants:
//! - `metadata.resourceVersion` is never stored: it is the key's `mod_revision`, set by
//!   [`decode`] (the one place objects come out of the store) and cleared by
//!   [`encode_for_store`] (the one place they go in), as Kubernetes' versioner does.
//! - Every page of one LIST, and every continuation of it, reads the store at one revision,
//!   so a paged LIST is a consistent snapshot (or fails with 410 once that revision is
//!   compacted).
//! - Store errors reach the client through [`store_error`] only.

#![allow(
    clippy::result_large_err,
    reason = "ApiError is the crate's one wire error; boxing it is a crate-wide choice"
)]

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skerry_api::{ApiError, Cause, ResourceInfo};
use skerry_store::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    compare::{CompareResult, CompareTarget, TargetUnion},
    request_op, response_op,
};
use skerry_store::pb::mvccpb::KeyValue;
use skerry_store::{Store, StoreError};

use crate::watch_cache::object::{CachedObject, set_resource_version};

/// The largest page one LIST asks the store for (Kubernetes' `maxLimit = 10000` in its etcd3
/// storage). Doubling stops here: a larger page holds more decoded objects in memory at once
/// and makes one store read long enough to delay writers; a smaller cap brings back more
/// round trips for very selective filters.
pub const PAGE_SIZE_MAX: i64 = 10_000;

/// The version tag of continue tokens (Kubernetes' `continueToken.APIVersion`).
const CONTINUE_TOKEN_VERSION: &str = "meta.k8s.io/v1";

/// Kubernetes' message for a LIST at a compacted resourceVersion.
const EXPIRED_LIST: &str = "The resourceVersion for the provided list is too old.";

/// Kubernetes' message for a continue token whose revision was compacted.
const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a \
consistent list result. You can start a new list without the continue parameter.";

/// Kubernetes' optimistic-concurrency message (`OptimisticLockErrorMsg`).
pub const CONFLICT_MESSAGE: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// A caller-supplied predicate (label and field selectors); `None` where one is taken
/// means "everything matches", which is also what lets a LIST report `remainingItemCount`.
pub type Filter = Arc<dyn Fn(&CachedObject) -> bool + Send + Sync>;

/// `resourceVersionMatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceVersionMatch {
    NotOlderThan,
    Exact,
}

/// The options of a LIST, parsed from the query string by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// `resourceVersion`; `None` when absent or empty (a consistent read).
    pub resource_version: Option<i64>,
    pub resource_version_match: Option<ResourceVersionMatch>,
    /// `limit`; values of 0 or less mean no limit.
    pub limit: Option<i64>,
    /// `continue`.
    pub continue_token: Option<String>,
    /// The namespace of a namespaced request; `None` lists across all namespaces.
    pub namespace: Option<String>,
}

impl ListOptions {
    /// The positive limit, if any.
    pub fn page_limit(&self) -> Option<i64> {
        self.limit.filter(|l| *l > 0)
    }
}

/// One LIST's answer.
#[derive(Debug, Clone, Default)]
pub struct CachedList {
    pub items: Vec<CachedObject>,
    /// `metadata.resourceVersion` of the list: the revision it reflects.
    pub resource_version: i64,
    /// `metadata.continue`, when more items remain.
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount`: set only when paging without a filter, since with one
    /// the store's count includes objects the filter would drop (as Kubernetes).
    pub remaining_item_count: Option<i64>,
}

/// The object stored at `kv`, with `metadata.resourceVersion` set to its `mod_revision`.
/// Bytes that are not a JSON object are corrupt data: a 500, never a panic.
pub fn decode(kv: &KeyValue) -> Result<Value, ApiError> {
    let mut value: Value = serde_json::from_slice(&kv.value).map_err(|e| {
        ApiError::internal(format!(
            "object at {} is corrupt: {e}",
            String::from_utf8_lossy(&kv.key)
        ))
    })?;
    if !value.is_object() {
        return Err(ApiError::internal(format!(
            "object at {} is corrupt: not a JSON object",
            String::from_utf8_lossy(&kv.key)
        )));
    }
    set_resource_version(&mut value, kv.mod_revision);
    Ok(value)
}

/// The bytes stored for `value`: its JSON without `metadata.resourceVersion`.
pub fn encode_for_store(value: &mut Value) -> Vec<u8> {
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
    }
    serde_json::to_vec(value).expect("a serde_json::Value always serializes")
}

/// The one mapping of store errors to API errors for reads and writes that have no more
/// specific message (LIST's 410s are worded by the caller, as Kubernetes words them).
pub fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Compacted { .. } => ApiError::expired(EXPIRED_LIST),
        StoreError::NoLeader | StoreError::LeaderChanged | StoreError::Stopped => {
            ApiError::service_unavailable(e.to_string())
        }
        StoreError::Timeout => ApiError::timeout(e.to_string(), 1),
        StoreError::RequestTooLarge => {
            ApiError::request_entity_too_large(skerry_store::validate::REQUEST_BYTES_MAX)
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// Kubernetes' "Too large resource version" (`NewTooLargeResourceVersionError`): a 504
/// Timeout telling the client to retry in a second, with cause `ResourceVersionTooLarge`.
pub fn too_large_resource_version(requested: i64, current: i64) -> ApiError {
    let mut e = ApiError::timeout(
        format!("Timeout: Too large resource version: {requested}, current: {current}"),
        1,
    );
    e.causes = vec![Cause::new(
        "ResourceVersionTooLarge",
        "",
        "Too large resource version",
    )];
    e
}

#[derive(Serialize, Deserialize)]
struct ContinueToken {
    #[serde(rename = "v")]
    version: String,
    #[serde(rename = "rv")]
    resource_version: i64,
    #[serde(rename = "start")]
    start: String,
}

/// A continue token as Kubernetes encodes it: unpadded URL-safe base64 of
/// `{"v":"meta.k8s.io/v1","rv":R,"start":"<key after the last, relative to the prefix>"}`.
pub fn encode_continue(next_key: &[u8], key_prefix: &str, resource_version: i64) -> String {
    let next = String::from_utf8_lossy(next_key);
    let start = next.strip_prefix(key_prefix).unwrap_or(&next).to_string();
    let token = ContinueToken {
        version: CONTINUE_TOKEN_VERSION.into(),
        resource_version,
        start,
    };
    let json = serde_json::to_vec(&token).expect("a continue token always serializes");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// The store key to continue from and the revision to read at. A token is client input:
/// anything malformed is a 400, and the start key is confined under `key_prefix` (no `..`
/// or empty segments), as Kubernetes' `DecodeContinue` does.
pub fn decode_continue(token: &str, key_prefix: &str) -> Result<(String, i64), ApiError> {
    let invalid = |detail: &str| {
        ApiError::bad_request(format!(
            "invalid continue token: continue key is not valid{detail}"
        ))
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|e| invalid(&format!(": {e}")))?;
    let token: ContinueToken =
        serde_json::from_slice(&bytes).map_err(|e| invalid(&format!(": {e}")))?;
    if token.version != CONTINUE_TOKEN_VERSION {
        return Err(invalid(": server does not recognize this encoded version"));
    }
    if token.resource_version == 0 {
        return Err(invalid(&format!(
            ": incorrect encoded start resourceVersion (version {CONTINUE_TOKEN_VERSION})"
        )));
    }
    if token.start.is_empty() {
        return Err(invalid(&format!(
            ": encoded start key empty (version {CONTINUE_TOKEN_VERSION})"
        )));
    }
    let start = token.start.strip_prefix('/').unwrap_or(&token.start);
    let clean = start.is_empty()
        || start
            .split('/')
            .all(|segment| !segment.is_empty() && segment != "." && segment != "..");
    if !clean {
        return Err(invalid(&format!(": {}", token.start)));
    }
    Ok((format!("{key_prefix}{start}"), token.resource_version))
}

/// The end of the key range of everything under `prefix` (etcd's prefix range end).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Where a store LIST reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadAt {
    /// The latest revision, optionally required to be at least `not_older_than`.
    Latest {
        not_older_than: Option<i64>,
    },
    Exact(i64),
}

/// A LIST answered from the store, Kubernetes' etcd3 `GetList`:
/// - `continue`: from the token's key at the token's revision (`resourceVersion` must be
///   unset or "0"); a compacted revision is 410 "The provided continue parameter is too
///   old ...".
/// - `resourceVersionMatch=Exact`, or a legacy non-zero `resourceVersion` with a `limit`: at
///   that revision; compacted is 410, future is 504 "Too large resource version".
/// - `NotOlderThan`/legacy without limit: the latest revision, which must be at least the
///   one asked for. Unset: the latest after a linearizable barrier.
pub async fn list(
    store: &Store,
    resource: &ResourceInfo,
    opts: &ListOptions,
    filter: Option<&Filter>,
) -> Result<CachedList, ApiError> {
    list_reading(store, resource, opts, filter, &mut |req| store.range(req)).await
}

/// One store range read of the paging loop.
type RangeRead<'a> = dyn FnMut(&RangeRequest) -> Result<RangeResponse, StoreError> + Send + 'a;

/// [`list`], with every range read of its pages going through `read` (`store.range` in
/// production): the seam through which a test sees the page sizes the loop asks the store
/// for.
async fn list_reading(
    store: &Store,
    resource: &ResourceInfo,
    opts: &ListOptions,
    filter: Option<&Filter>,
    read: &mut RangeRead<'_>,
) -> Result<CachedList, ApiError> {
    let key_prefix = resource.prefix(opts.namespace.as_deref());
    let (start, at, paging_continue) = match &opts.continue_token {
        Some(token) => {
            if !matches!(opts.resource_version, None | Some(0)) {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (start, rv) = decode_continue(token, &key_prefix)?;
            // A token from a 410 answer carries -1: continue at the latest revision.
            let at = if rv < 0 {
                ReadAt::Latest {
                    not_older_than: None,
                }
            } else {
                ReadAt::Exact(rv)
            };
            (start.into_bytes(), at, true)
        }
        None => {
            let at = match (opts.resource_version_match, opts.resource_version) {
                (Some(ResourceVersionMatch::Exact), Some(rv)) if rv > 0 => ReadAt::Exact(rv),
                (Some(ResourceVersionMatch::Exact), _) => {
                    return Err(ApiError::bad_request(
                        "resourceVersionMatch \"Exact\" requires a non-zero resourceVersion",
                    ));
                }
                (None, Some(rv)) if rv > 0 && opts.page_limit().is_some() => ReadAt::Exact(rv),
                (_, Some(rv)) => ReadAt::Latest {
                    not_older_than: (rv > 0).then_some(rv),
                },
                (_, None) => {
                    store.linearizable_barrier().await.map_err(store_error)?;
                    ReadAt::Latest {
                        not_older_than: None,
                    }
                }
            };
            (key_prefix.clone().into_bytes(), at, false)
        }
    };
    let revision = match at {
        ReadAt::Exact(rv) => rv,
        ReadAt::Latest { .. } => 0,
    };
    let result = read_pages(
        read,
        &key_prefix,
        start,
        revision,
        opts.page_limit(),
        filter,
    );
    let list = match result {
        Ok(list) => list,
        Err(PageError::Store(StoreError::Compacted { .. })) if paging_continue => {
            return Err(ApiError::expired(EXPIRED_CONTINUE));
        }
        Err(PageError::Store(StoreError::Compacted { .. })) => {
            return Err(ApiError::expired(EXPIRED_LIST));
        }
        Err(PageError::Store(StoreError::FutureRevision)) => {
            return Err(too_large_resource_version(revision, store.revision()));
        }
        Err(PageError::Store(e)) => return Err(store_error(e)),
        Err(PageError::Api(e)) => return Err(e),
    };
    if let ReadAt::Latest {
        not_older_than: Some(minimum),
    } = at
        && list.resource_version < minimum
    {
        return Err(too_large_resource_version(minimum, list.resource_version));
    }
    Ok(list)
}

/// Why reading pages failed: the store said no, or an object was corrupt.
#[derive(Debug)]
enum PageError {
    Store(StoreError),
    Api(ApiError),
}

/// The paging loop of a store LIST. `read` is one store round trip; `revision` 0 reads the
/// latest and pins it for the following pages.
fn read_pages(
    read: &mut RangeRead<'_>,
    key_prefix: &str,
    start: Vec<u8>,
    revision: i64,
    limit: Option<i64>,
    filter: Option<&Filter>,
) -> Result<CachedList, PageError> {
    let range_end = Bytes::from(prefix_end(key_prefix));
    let mut page_size = limit.unwrap_or(0);
    let mut key = Bytes::from(start);
    let mut revision = revision;
    let mut items = Vec::new();
    let mut last_key: Option<Bytes> = None;
    loop {
        let resp = read(&RangeRequest {
            key: key.clone(),
            range_end: range_end.clone(),
            limit: page_size,
            revision,
            ..Default::default()
        })
        .map_err(PageError::Store)?;
        if revision == 0 {
            revision = resp.header.as_ref().map_or(0, |h| h.revision);
        }
        let mut has_more = resp.more;
        if resp.kvs.is_empty() && resp.more {
            return Err(PageError::Api(ApiError::internal(
                "no results were found, but the store indicated there were more values remaining",
            )));
        }
        for kv in &resp.kvs {
            if let Some(limit) = limit
                && items.len() as i64 >= limit
            {
                has_more = true;
                break;
            }
            last_key = Some(kv.key.clone());
            let object = CachedObject::new(decode(kv).map_err(PageError::Api)?, None);
            if filter.is_none_or(|f| f(&object)) {
                items.push(object);
            }
        }
        let Some(limit) = limit else {
            // Not paging: the one read returned everything.
            return Ok(CachedList {
                items,
                resource_version: revision,
                ..Default::default()
            });
        };
        if !has_more || items.len() as i64 >= limit {
            let continue_token = match (&last_key, has_more) {
                (Some(last), true) => {
                    let mut next = last.to_vec();
                    next.push(0);
                    Some(encode_continue(&next, key_prefix, revision))
                }
                _ => None,
            };
            // The store's count covers the range from this read's start key, filter or not.
            let remaining_item_count = (continue_token.is_some() && filter.is_none())
                .then(|| resp.count - items.len() as i64);
            return Ok(CachedList {
                items,
                resource_version: revision,
                continue_token,
                remaining_item_count,
            });
        }
        // The filter dropped objects and the page came back short: ask for twice as many
        // next time, so a selective filter does not walk the keyspace in tiny steps.
        page_size = (page_size * 2).min(PAGE_SIZE_MAX);
        let mut next = last_key.as_deref().unwrap_or_default().to_vec();
        next.push(0);
        key = Bytes::from(next);
    }
}

/// One object at the latest revision, after a linearizable barrier; `None` if absent.
pub async fn get(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<CachedObject>, ApiError> {
    store.linearizable_barrier().await.map_err(store_error)?;
    let resp = store
        .range(&RangeRequest {
            key: Bytes::from(resource.key(namespace, name)),
            ..Default::default()
        })
        .map_err(store_error)?;
    resp.kvs
        .first()
        .map(|kv| decode(kv).map(|v| CachedObject::new(v, None)))
        .transpose()
}

/// Why a write did not happen.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// Create: the key exists.
    #[error("object already exists")]
    AlreadyExists,
    /// Update or delete: the key does not exist.
    #[error("object not found")]
    NotFound,
    /// Update or delete: the object changed since the expected revision; here is what is
    /// stored now, so the caller can retry its read-modify-write or answer 409.
    #[error("object was modified (now at {})", current.resource_version())]
    Conflict { current: CachedObject },
    /// A key the write claims alongside the object (a ClusterIP) is held by another object.
    #[error("{key} is already claimed")]
    ClaimTaken { key: String },
    /// The store failed.
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl WriteError {
    /// The error as Kubernetes answers it for `name` of `resource`.
    pub fn into_api_error(self, resource: &ResourceInfo, name: &str) -> ApiError {
        match self {
            WriteError::AlreadyExists => {
                ApiError::already_exists(resource.group, resource.resource, name)
            }
            WriteError::NotFound => ApiError::not_found(resource.group, resource.resource, name),
            WriteError::Conflict { .. } => {
                ApiError::conflict(resource.group, resource.resource, name, CONFLICT_MESSAGE)
            }
            WriteError::ClaimTaken { key } => {
                ApiError::internal(format!("{key} is already claimed by another object"))
            }
            WriteError::Api(e) => e,
        }
    }
}

fn compare(
    key: &Bytes,
    target: CompareTarget,
    result: CompareResult,
    value: TargetUnion,
) -> Compare {
    Compare {
        result: result as i32,
        target: target as i32,
        key: key.clone(),
        target_union: Some(value),
        range_end: Bytes::new(),
    }
}

fn get_op(key: &Bytes) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.clone(),
            ..Default::default()
        })),
    }
}

/// The object the failure branch of a txn read back, if any.
fn read_back(
    resp: &skerry_store::pb::etcdserverpb::TxnResponse,
) -> Result<Option<CachedObject>, ApiError> {
    for op in &resp.responses {
        if let Some(response_op::Response::ResponseRange(range)) = &op.response
            && let Some(kv) = range.kvs.first()
        {
            return decode(kv).map(|v| Some(CachedObject::new(v, None)));
        }
    }
    Ok(None)
}

/// Stores a new object (txn: `create_revision == 0` → put). Returns it with its
/// resourceVersion.
pub async fn create(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    value: Value,
) -> Result<Value, WriteError> {
    create_claiming(store, resource, namespace, name, value, &[]).await
}

/// Creates an object and, in the same transaction, the `claims` (key, value) that must not
/// exist yet either — an allocation (a ClusterIP) is taken exactly when its object is
/// created, never one without the other. A claim held by someone else fails the whole write
/// with [`WriteError::ClaimTaken`].
pub async fn create_claiming(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    value: Value,
    claims: &[(String, Bytes)],
) -> Result<Value, WriteError> {
    create_with(store, resource, namespace, name, value, claims, 0).await
}

/// Creates an object with its `claims` ([`create_claiming`]), attached to store lease `lease`
/// (0 for none: the object lives until deleted; otherwise it goes when the lease expires,
/// Events and their TTL).
pub async fn create_with(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    mut value: Value,
    claims: &[(String, Bytes)],
    lease: i64,
) -> Result<Value, WriteError> {
    let key = Bytes::from(resource.key(namespace, name));
    let bytes = Bytes::from(encode_for_store(&mut value));
    let mut compares = vec![compare(
        &key,
        CompareTarget::Create,
        CompareResult::Equal,
        TargetUnion::CreateRevision(0),
    )];
    let mut success = vec![RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.clone(),
            value: bytes,
            lease,
            ..Default::default()
        })),
    }];
    for (claim, claim_value) in claims {
        let claim = Bytes::from(claim.clone());
        compares.push(compare(
            &claim,
            CompareTarget::Create,
            CompareResult::Equal,
            TargetUnion::CreateRevision(0),
        ));
        success.push(RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: claim,
                value: claim_value.clone(),
                ..Default::default()
            })),
        });
    }
    let resp = store
        .txn(TxnRequest {
            compare: compares,
            success,
            failure: vec![get_op(&key)],
        })
        .await
        .map_err(store_error)?;
    if !resp.succeeded {
        if read_back(&resp)?.is_some() || claims.is_empty() {
            return Err(WriteError::AlreadyExists);
        }
        let taken = claims.first().map(|(k, _)| k.clone()).unwrap_or_default();
        return Err(WriteError::ClaimTaken { key: taken });
    }
    set_resource_version(&mut value, resp.header.map_or(0, |h| h.revision));
    Ok(value)
}

pub async fn update(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    value: Value,
    expected_resource_version: i64,
) -> Result<Value, WriteError> {
    update_leased(
        store,
        resource,
        namespace,
        name,
        value,
        expected_resource_version,
        0,
    )
    .await
}

/// [`update`], attaching the new value to store lease `lease` (0 for none).
pub async fn update_leased(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    value: Value,
    expected_resource_version: i64,
    lease: i64,
) -> Result<Value, WriteError> {
    let at = Revisions {
        expected: expected_resource_version,
        lease,
    };
    update_claiming(store, resource, namespace, name, value, at, &[], &[]).await
}

/// The revision an update is conditional on and the lease its value rides.
#[derive(Clone, Copy, Debug)]
pub struct Revisions {
    /// The `mod_revision` the object must still be at.
    pub expected: i64,
    /// The store lease to attach the value to (0 for none).
    pub lease: i64,
}

/// [`update_leased`] that, in the same transaction, creates the `claims` (which must not
/// exist yet) and deletes the `releases` (which the object held): a Service whose node
/// ports change claims the new ones and gives back the old ones in the write that changes
/// them. A claim held by someone else fails the whole write with
/// [`WriteError::ClaimTaken`].
#[allow(
    clippy::too_many_arguments,
    reason = "the object's address, its value and the three parts of the transaction"
)]
pub async fn update_claiming(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    mut value: Value,
    at: Revisions,
    claims: &[(String, Bytes)],
    releases: &[String],
) -> Result<Value, WriteError> {
    let key = Bytes::from(resource.key(namespace, name));
    let bytes = Bytes::from(encode_for_store(&mut value));
    let mut compares = vec![compare(
        &key,
        CompareTarget::Mod,
        CompareResult::Equal,
        TargetUnion::ModRevision(at.expected),
    )];
    let mut success = vec![RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.clone(),
            value: bytes,
            lease: at.lease,
            ..Default::default()
        })),
    }];
    for (claim, claim_value) in claims {
        let claim = Bytes::from(claim.clone());
        compares.push(compare(
            &claim,
            CompareTarget::Create,
            CompareResult::Equal,
            TargetUnion::CreateRevision(0),
        ));
        success.push(RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: claim,
                value: claim_value.clone(),
                ..Default::default()
            })),
        });
    }
    success.extend(releases.iter().map(|k| RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: Bytes::from(k.clone()),
                ..Default::default()
            },
        )),
    }));
    let resp = store
        .txn(TxnRequest {
            compare: compares,
            success,
            failure: vec![get_op(&key)],
        })
        .await
        .map_err(store_error)?;
    if !resp.succeeded {
        return match read_back(&resp)? {
            Some(current) if current.resource_version() == at.expected && !claims.is_empty() => {
                let taken = claims.first().map(|(k, _)| k.clone()).unwrap_or_default();
                Err(WriteError::ClaimTaken { key: taken })
            }
            Some(current) => Err(WriteError::Conflict { current }),
            None => Err(WriteError::NotFound),
        };
    }
    set_resource_version(&mut value, resp.header.map_or(0, |h| h.revision));
    Ok(value)
}

/// Deletes an object, if it is at `expected_resource_version` when one is given (txn with a
/// `mod_revision` precondition, else "exists"). Returns its last state carrying the delete's
/// revision as resourceVersion, as Kubernetes does.
pub async fn delete(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    expected_resource_version: Option<i64>,
) -> Result<Value, WriteError> {
    delete_releasing(
        store,
        resource,
        namespace,
        name,
        expected_resource_version,
        &[],
    )
    .await
}

/// Deletes an object and, in the same transaction, the claim keys it held (its ClusterIP),
/// so an allocation is released exactly when its object goes.
pub async fn delete_releasing(
    store: &Store,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    expected_resource_version: Option<i64>,
    releases: &[String],
) -> Result<Value, WriteError> {
    let key = Bytes::from(resource.key(namespace, name));
    let precondition = match expected_resource_version {
        Some(rv) => compare(
            &key,
            CompareTarget::Mod,
            CompareResult::Equal,
            TargetUnion::ModRevision(rv),
        ),
        None => compare(
            &key,
            CompareTarget::Create,
            CompareResult::Greater,
            TargetUnion::CreateRevision(0),
        ),
    };
    let resp = store
        .txn(TxnRequest {
            compare: vec![precondition],
            success: std::iter::once(RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(
                    DeleteRangeRequest {
                        key: key.clone(),
                        prev_kv: true,
                        ..Default::default()
                    },
                )),
            })
            .chain(releases.iter().map(|k| RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(
                    DeleteRangeRequest {
                        key: Bytes::from(k.clone()),
                        ..Default::default()
                    },
                )),
            }))
            .collect(),
            failure: vec![get_op(&key)],
        })
        .await
        .map_err(store_error)?;
    if !resp.succeeded {
        return match read_back(&resp)? {
            Some(current) => Err(WriteError::Conflict { current }),
            None => Err(WriteError::NotFound),
        };
    }
    let revision = resp.header.as_ref().map_or(0, |h| h.revision);
    let prev = resp.responses.iter().find_map(|op| match &op.response {
        Some(response_op::Response::ResponseDeleteRange(d)) => d.prev_kvs.first().cloned(),
        _ => None,
    });
    let Some(prev) = prev else {
        // The precondition held, so the key existed in this same transaction.
        return Err(WriteError::Api(ApiError::internal(
            "the store deleted the object but returned no previous value",
        )));
    };
    let mut value = decode(&prev)?;
    set_resource_version(&mut value, revision);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use skerry_api::selector::LabelSelector;
    use skerry_store::StoreConfig;

    use super::*;

    fn pods() -> &'static ResourceInfo {
        skerry_api::catalogue::lookup("", "v1", "pods").expect("pods are served")
    }

    fn pod(ns: &str, name: &str, app: &str) -> Value {
        json!({"kind": "Pod", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    }

    fn open() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(StoreConfig::new(dir.path())).expect("open store");
        (dir, store)
    }

    #[test]
    fn continue_tokens_round_trip_in_kubernetes_format() {
        let token = encode_continue(b"/registry/pods/default/web\0", "/registry/pods/", 42);
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&token)
            .expect("unpadded url-safe base64");
        let json: Value = serde_json::from_slice(&raw).expect("json");
        assert_eq!(
            json,
            json!({"v": "meta.k8s.io/v1", "rv": 42, "start": "default/web\u{0}"})
        );
        let (key, rv) = decode_continue(&token, "/registry/pods/").expect("valid");
        assert_eq!(key, "/registry/pods/default/web\0");
        assert_eq!(rv, 42);
    }

    #[test]
    fn hostile_continue_tokens_are_bad_requests() {
        let enc = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        for bad in [
            "!!!".to_string(),
            enc(json!({"v": "meta.k8s.io/v1", "rv": 5, "start": "../secrets/x"})),
            enc(json!({"v": "meta.k8s.io/v1", "rv": 5, "start": "a//b"})),
            enc(json!({"v": "meta.k8s.io/v1", "rv": 0, "start": "a"})),
            enc(json!({"v": "meta.k8s.io/v1", "rv": 5, "start": ""})),
            enc(json!({"v": "v2", "rv": 5, "start": "a"})),
        ] {
            let e = decode_continue(&bad, "/registry/pods/").expect_err("rejected");
            assert_eq!(e.code, 400, "{bad}: {e}");
            assert!(
                e.message
                    .starts_with("invalid continue token: continue key is not valid")
            );
        }
    }

    #[test]
    fn stored_bytes_carry_no_resource_version_and_decoding_sets_it() {
        let mut v = pod("ns", "a", "x");
        v["metadata"]["resourceVersion"] = json!("99");
        let bytes = encode_for_store(&mut v);
        let stored: Value = serde_json::from_slice(&bytes).expect("json");
        assert!(stored["metadata"].get("resourceVersion").is_none());
        let kv = KeyValue {
            key: Bytes::from_static(b"/registry/pods/ns/a"),
            value: Bytes::from(bytes),
            mod_revision: 7,
            ..Default::default()
        };
        assert_eq!(
            decode(&kv).expect("decodes")["metadata"]["resourceVersion"],
            "7"
        );
        let corrupt = KeyValue {
            value: Bytes::from_static(b"\x00garbage"),
            ..kv
        };
        assert_eq!(decode(&corrupt).expect_err("corrupt").code, 500);
    }

    async fn fill(store: &Store, n: usize, matching_every: usize) {
        for i in 0..n {
            let app = if i % matching_every == matching_every - 1 {
                "rare"
            } else {
                "common"
            };
            create(
                store,
                pods(),
                Some("ns"),
                &format!("p{i:05}"),
                pod("ns", &format!("p{i:05}"), app),
            )
            .await
            .expect("create");
        }
    }

    /// Reference: `docs/tricks.md` #8; Kubernetes' etcd3 `GetList` loop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn selective_filter_doubles_the_page_size() {
        let (_dir, store) = open();
        fill(&store, 1_000, 1_000).await; // exactly one "rare" pod, the last one
        let rare: Filter = Arc::new(|o: &CachedObject| o.label("app") == Some("rare"));
        let mut reads = 0;
        let mut sizes = Vec::new();
        let prefix = pods().prefix(None);
        let list = read_pages(
            &mut |req| {
                reads += 1;
                sizes.push(req.limit);
                store.range(req)
            },
            &prefix,
            prefix.clone().into_bytes(),
            0,
            Some(10),
            Some(&rare),
        )
        .expect("list");
        assert_eq!(list.items.len(), 1);
        assert_eq!(list.items[0].name(), "p00999");
        assert_eq!(list.continue_token, None);
        // 10+20+40+80+160+320+640 >= 1000: seven reads, where fixed pages of 10 take 100.
        assert_eq!(sizes, vec![10, 20, 40, 80, 160, 320, 640]);
        assert_eq!(reads, 7);
    }

    /// Reference: Kubernetes' etcd3 store `GetList`
    /// (`staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go`), whose loop doubles the
    /// page after a short filtered page up to `maxLimit = 10000`. A LIST through the real
    /// path (options, selector, paging loop, the store) with `limit=3000` and a label
    /// selector matching one pod in 1,000 of 10,000: the store is asked for 3,000, then
    /// 6,000, then 10,000 where doubling alone would ask for 12,000. Without the cap the
    /// third read asks for 12,000; without the doubling every read asks for 3,000.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn selective_list_doubles_its_page_size_up_to_the_cap() {
        let (_dir, store) = open();
        let objects = 10_000;
        // Concurrent creates, so the store group-commits them instead of syncing each.
        let creates: Vec<_> = (0..objects)
            .map(|i| {
                let name = format!("p{i:05}");
                let app = if i % 1_000 == 999 { "rare" } else { "common" };
                let object = pod("ns", &name, app);
                let store = &store;
                async move { create(store, pods(), Some("ns"), &name, object).await }
            })
            .collect();
        for created in futures::future::join_all(creates).await {
            created.expect("create");
        }
        let selector = LabelSelector::parse("app=rare").expect("selector");
        let rare: Filter = Arc::new(move |o: &CachedObject| selector.matches_object(o.value()));
        let opts = ListOptions {
            limit: Some(3_000),
            ..Default::default()
        };
        let mut sizes = Vec::new();
        let list = list_reading(&store, pods(), &opts, Some(&rare), &mut |req| {
            sizes.push(req.limit);
            store.range(req)
        })
        .await
        .expect("list");
        assert_eq!(list.items.len(), 10, "one pod in 1,000 matches");
        assert!(list.items.iter().all(|o| o.label("app") == Some("rare")));
        assert_eq!(list.continue_token, None, "the third read reached the end");
        assert_eq!(sizes, vec![3_000, 6_000, PAGE_SIZE_MAX]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn paged_list_is_one_snapshot_with_counts() {
        let (_dir, store) = open();
        fill(&store, 25, 1).await;
        let opts = ListOptions {
            limit: Some(10),
            ..Default::default()
        };
        let first = list(&store, pods(), &opts, None).await.expect("page 1");
        assert_eq!(first.items.len(), 10);
        assert_eq!(first.remaining_item_count, Some(15));
        let rv = first.resource_version;
        // A write after the first page is not seen by its continuations.
        create(&store, pods(), Some("ns"), "zzz", pod("ns", "zzz", "x"))
            .await
            .expect("create");
        let mut names: Vec<String> = first.items.iter().map(|o| o.name().to_string()).collect();
        let mut token = first.continue_token.clone();
        while let Some(t) = token {
            let page = list(
                &store,
                pods(),
                &ListOptions {
                    limit: Some(10),
                    continue_token: Some(t),
                    ..Default::default()
                },
                None,
            )
            .await
            .expect("next page");
            assert_eq!(page.resource_version, rv);
            names.extend(page.items.iter().map(|o| o.name().to_string()));
            token = page.continue_token;
        }
        let expected: Vec<String> = (0..25).map(|i| format!("p{i:05}")).collect();
        assert_eq!(names, expected);
        // Without a limit, one read returns everything including the later write.
        let all = list(&store, pods(), &ListOptions::default(), None)
            .await
            .expect("all");
        assert_eq!(all.items.len(), 26);
        assert!(all.continue_token.is_none());
        assert!(all.items.iter().all(|o| o.resource_version() > 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn compacted_continue_is_expired_and_future_rv_is_too_large() {
        let (_dir, store) = open();
        fill(&store, 5, 1).await;
        let opts = ListOptions {
            limit: Some(2),
            ..Default::default()
        };
        let first = list(&store, pods(), &opts, None).await.expect("page");
        fill_more(&store).await;
        store
            .compact(store.revision(), true)
            .await
            .expect("compact");
        let e = list(
            &store,
            pods(),
            &ListOptions {
                limit: Some(2),
                continue_token: first.continue_token.clone(),
                ..Default::default()
            },
            None,
        )
        .await
        .expect_err("compacted");
        assert_eq!(e.code, 410);
        assert_eq!(e.reason, "Expired");
        assert!(
            e.message
                .starts_with("The provided continue parameter is too old")
        );

        let future = store.revision() + 100;
        let e = list(
            &store,
            pods(),
            &ListOptions {
                resource_version: Some(future),
                resource_version_match: Some(ResourceVersionMatch::Exact),
                ..Default::default()
            },
            None,
        )
        .await
        .expect_err("future");
        assert_eq!(e.code, 504);
        assert_eq!(e.causes[0].reason, "ResourceVersionTooLarge");
        assert_eq!(e.retry_after_seconds, Some(1));
        let e = list(
            &store,
            pods(),
            &ListOptions {
                resource_version: Some(future),
                resource_version_match: Some(ResourceVersionMatch::NotOlderThan),
                ..Default::default()
            },
            None,
        )
        .await
        .expect_err("not older than the future");
        assert!(
            e.message
                .starts_with("Timeout: Too large resource version: ")
        );
    }

    async fn fill_more(store: &Store) {
        for i in 0..3 {
            create(
                store,
                pods(),
                Some("other"),
                &format!("x{i}"),
                pod("other", "x", "y"),
            )
            .await
            .expect("create");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_check_their_preconditions() {
        let (_dir, store) = open();
        let created = create(&store, pods(), Some("ns"), "a", pod("ns", "a", "x"))
            .await
            .expect("create");
        let rv: i64 = created["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("rv set");
        assert_eq!(
            create(&store, pods(), Some("ns"), "a", pod("ns", "a", "x")).await,
            Err(WriteError::AlreadyExists)
        );
        let updated = update(&store, pods(), Some("ns"), "a", pod("ns", "a", "y"), rv)
            .await
            .expect("update at the expected rv");
        let rv2: i64 = updated["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("rv set");
        assert!(rv2 > rv);
        match update(&store, pods(), Some("ns"), "a", pod("ns", "a", "z"), rv).await {
            Err(WriteError::Conflict { current }) => {
                assert_eq!(current.resource_version(), rv2);
                assert_eq!(current.label("app"), Some("y"));
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(
            update(
                &store,
                pods(),
                Some("ns"),
                "nope",
                pod("ns", "nope", "z"),
                1
            )
            .await,
            Err(WriteError::NotFound)
        );
        let e = WriteError::Conflict {
            current: CachedObject::new(updated.clone(), None),
        }
        .into_api_error(pods(), "a");
        assert_eq!(e.code, 409);
        assert!(e.message.ends_with(CONFLICT_MESSAGE));
        assert!(matches!(
            delete(&store, pods(), Some("ns"), "a", Some(rv)).await,
            Err(WriteError::Conflict { .. })
        ));
        let deleted = delete(&store, pods(), Some("ns"), "a", Some(rv2))
            .await
            .expect("delete");
        assert_eq!(deleted["metadata"]["labels"]["app"], "y", "the last state");
        assert_eq!(
            deleted["metadata"]["resourceVersion"],
            store.revision().to_string(),
            "carrying the delete's revision"
        );
        assert_eq!(
            delete(&store, pods(), Some("ns"), "a", None).await,
            Err(WriteError::NotFound)
        );
        assert!(
            get(&store, pods(), Some("ns"), "a")
                .await
                .expect("get")
                .is_none()
        );
    }
}
