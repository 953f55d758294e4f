//! The KV service.

use tonic::{Request, Response, Status};

use super::{EtcdApi, status};
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
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        self.store
            .put(request.into_inner())
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        self.store
            .delete_range(request.into_inner())
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        self.store
            .txn(request.into_inner())
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let req = request.into_inner();
        let revision = self
            .store
            .compact(req.revision, req.physical)
            .await
            .map_err(status)?;
        Ok(Response::new(CompactionResponse {
            header: Some(self.store.header(revision)),
        }))
    }
}
