//! The Lease service.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::{EtcdApi, status};
use crate::metrics::grpc::{self as metrics, Method};
use crate::pb::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, lease_server::Lease,
};

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for EtcdApi {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        metrics::unary(Method::LeaseGrant, async move {
            let req = request.into_inner();
            let (id, ttl) = self
                .store
                .lease_grant(req.ttl, req.id)
                .await
                .map_err(status)?;
            Ok(Response::new(LeaseGrantResponse {
                header: Some(self.store.header(self.store.revision())),
                id,
                ttl,
                error: String::new(),
            }))
        })
        .await
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        metrics::unary(Method::LeaseRevoke, async move {
            let revision = self
                .store
                .lease_revoke(request.into_inner().id)
                .await
                .map_err(status)?;
            Ok(Response::new(LeaseRevokeResponse {
                header: Some(self.store.header(revision)),
            }))
        })
        .await
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let store = self.store.clone();
        let responses = request.into_inner().map(move |req| {
            req.map(|req| {
                metrics::received(Method::LeaseKeepAlive);
                keep_alive(&store, req.id)
            })
        });
        Ok(Response::new(Box::pin(metrics::Counted::new(
            Method::LeaseKeepAlive,
            responses,
        ))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        metrics::unary(Method::LeaseTimeToLive, async move {
            let req = request.into_inner();
            let header = Some(self.store.header(self.store.revision()));
            // etcd answers an unknown lease with TTL -1 rather than an error.
            let resp = match self.store.lease_time_to_live(req.id, req.keys) {
                Some((ttl, granted_ttl, keys)) => LeaseTimeToLiveResponse {
                    header,
                    id: req.id,
                    ttl,
                    granted_ttl,
                    keys,
                },
                None => LeaseTimeToLiveResponse {
                    header,
                    id: req.id,
                    ttl: -1,
                    ..Default::default()
                },
            };
            Ok(Response::new(resp))
        })
        .await
    }

    async fn lease_leases(
        &self,
        _request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        metrics::unary(Method::LeaseLeases, async move {
            let leases = self
                .store
                .lease_ids()
                .into_iter()
                .map(|id| LeaseStatus { id })
                .collect();
            Ok(Response::new(LeaseLeasesResponse {
                header: Some(self.store.header(self.store.revision())),
                leases,
            }))
        })
        .await
    }
}

/// Renews lease `id` and says how long it now has. An unknown or expired lease answers TTL 0;
/// the client then stops renewing it.
pub(crate) fn keep_alive(store: &crate::store::Store, id: i64) -> LeaseKeepAliveResponse {
    let ttl = store.lease_keep_alive(id).unwrap_or(0);
    LeaseKeepAliveResponse {
        header: Some(store.header(store.revision())),
        id,
        ttl,
    }
}
