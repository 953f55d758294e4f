//! etcd's v3 gRPC API over the store: KV, Watch, Lease, Maintenance and Cluster, so that
//! `etcdctl` 3.4 and any etcd v3 client work unchanged.
//!
//! Every error crosses the wire here, in one place ([`status`]), with etcd's gRPC code and
//! message text, because clients match on both.

pub mod authority;
pub mod coalesce;
pub mod gateway;
mod kv;
mod lease;
mod maintenance;
mod watch;

use std::sync::Arc;

use tonic::transport::server::Router;

use crate::error::StoreError;
use crate::pb::etcdserverpb::{
    cluster_server::ClusterServer, kv_server::KvServer, lease_server::LeaseServer,
    maintenance_server::MaintenanceServer, watch_server::WatchServer,
};
use crate::store::Store;
use crate::validate::{GRPC_OVERHEAD_BYTES, REQUEST_BYTES_MAX};

/// The etcd version skerry reports in `Status`: the API level it implements and is tested
/// against (etcdctl 3.4.23). Clients gate features on it.
pub const ETCD_VERSION_REPORTED: &str = "3.4.23";

/// How this member describes itself in `MemberList`.
#[derive(Clone, Debug, Default)]
pub struct MemberInfo {
    pub name: String,
    pub client_urls: Vec<String>,
    pub peer_urls: Vec<String>,
}

/// The state behind every service.
#[derive(Clone)]
pub struct EtcdApi {
    store: Store,
    /// This member as its flags describe it. The cluster's members, this one included, are
    /// what the replicated log recorded (see `Store::members`).
    member: Arc<MemberInfo>,
}

impl EtcdApi {
    pub fn new(store: Store, member: MemberInfo) -> Self {
        Self {
            store,
            member: Arc::new(member),
        }
    }
}

/// A tonic router serving every etcd service this API has, with etcd's message size limits.
pub fn router(api: EtcdApi) -> Router {
    let decode_max = REQUEST_BYTES_MAX + GRPC_OVERHEAD_BYTES;
    tonic::transport::Server::builder()
        .add_service(KvServer::new(api.clone()).max_decoding_message_size(decode_max))
        .add_service(WatchServer::new(api.clone()).max_decoding_message_size(decode_max))
        .add_service(LeaseServer::new(api.clone()).max_decoding_message_size(decode_max))
        .add_service(MaintenanceServer::new(api.clone()).max_decoding_message_size(decode_max))
        .add_service(ClusterServer::new(api).max_decoding_message_size(decode_max))
}

/// The one mapping from store errors to gRPC statuses, with etcd's codes.
pub fn status(e: StoreError) -> tonic::Status {
    use tonic::Code;
    let code = match &e {
        StoreError::EmptyKey
        | StoreError::KeyNotFound
        | StoreError::ValueProvided
        | StoreError::LeaseProvided
        | StoreError::TooManyOps
        | StoreError::DuplicateKey
        | StoreError::RequestTooLarge => Code::InvalidArgument,
        StoreError::Compacted { .. }
        | StoreError::FutureRevision
        | StoreError::LeaseTtlTooLarge => Code::OutOfRange,
        StoreError::LeaseNotFound | StoreError::MemberNotFound => Code::NotFound,
        StoreError::LeaseExists
        | StoreError::PeerUrlExists
        | StoreError::NotEnoughStarted
        | StoreError::MemberNotLearner
        | StoreError::LearnerNotReady
        | StoreError::TooManyLearners
        | StoreError::NotLeader
        | StoreError::BadLeaderTransferee
        | StoreError::Unsupported(_) => Code::FailedPrecondition,
        // etcd's `togRPCError` has no entry for it, so it goes out as Unknown.
        StoreError::LeaderTransferTimeout => Code::Unknown,
        StoreError::MemberBadUrls => Code::InvalidArgument,
        StoreError::NoSpace => Code::ResourceExhausted,
        StoreError::Corrupt => Code::DataLoss,
        StoreError::Stopped
        | StoreError::NoLeader
        | StoreError::LeaderChanged
        | StoreError::Timeout => Code::Unavailable,
        StoreError::Storage(_) | StoreError::DataDir(_) => Code::Internal,
    };
    tonic::Status::new(code, e.to_string())
}
