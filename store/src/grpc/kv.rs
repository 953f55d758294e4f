//! The KV service.

use tonic::{Request, Response, Status};

use super::{EtcdApi, status};
use crate::metrics::grpc::{self as metrics, Method};
use crate::pb::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse, kv_server::Kv,
};

#[tonic::async_trait]
impl Kv for EtcdApi {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        metrics::unary(Method::Range, async move {
            // A serializable read is served from this member's store as it stands; any other
            // waits for a ReadIndex round first (a no-op on a single store, where a write is
            // readable once acknowledged).
            if !request.get_ref().serializable {
                self.store.linearizable_barrier().await.map_err(status)?;
            }
            self.store
                .range(request.get_ref())
                .map(Response::new)
                .map_err(status)
        })
        .await
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        metrics::unary(Method::Put, async move {
            self.store
                .put(request.into_inner())
                .await
                .map(Response::new)
                .map_err(status)
        })
        .await
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        metrics::unary(Method::DeleteRange, async move {
            self.store
                .delete_range(request.into_inner())
                .await
                .map(Response::new)
                .map_err(status)
        })
        .await
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        metrics::unary(Method::Txn, async move {
            self.store
                .txn(request.into_inner())
                .await
                .map(Response::new)
                .map_err(status)
        })
        .await
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        metrics::unary(Method::Compact, async move {
            let req = request.into_inner();
            let revision = self
                .store
                .compact(req.revision, req.physical)
                .await
                .map_err(status)?;
            Ok(Response::new(CompactionResponse {
                header: Some(self.store.header(revision)),
            }))
        })
        .await
    }
}
