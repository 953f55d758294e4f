//! The Maintenance and Cluster services.

use std::io::{Read, Seek, SeekFrom};
use std::pin::Pin;

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{ETCD_VERSION_REPORTED, EtcdApi, status};
use crate::alarm::alarm_text;
use crate::error::StoreError;
use crate::metrics::grpc::{self as metrics, Method};
use crate::pb::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, HashKvRequest,
    HashKvResponse, HashRequest, HashResponse, Member, MemberAddRequest, MemberAddResponse,
    MemberListRequest, MemberListResponse, MemberPromoteRequest, MemberPromoteResponse,
    MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest, MemberUpdateResponse,
    MoveLeaderRequest, MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest,
    StatusResponse, cluster_server::Cluster, maintenance_server::Maintenance,
};
use crate::replication::MembershipChange;

/// Bytes per snapshot message (etcd's `snapshotSendBufferSize`).
pub const SNAPSHOT_CHUNK_BYTES: usize = 32 * 1024;

/// Snapshot chunks read ahead of the client. Bounds memory per snapshot stream.
const SNAPSHOT_CHUNKS_AHEAD_MAX: usize = 16;

/// `member update` (new peer URLs for a member in place) is not built: a box that changes
/// address is removed and added again, which the appliance's runbook does anyway.
const MEMBER_UPDATE_UNSUPPORTED: &str = "skerry: changing a member's peer URLs in place is not \
     supported; remove the member and add it again with its new URLs";

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for EtcdApi {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        metrics::unary(Method::Alarm, async move {
            // etcd 3.4 answers alarm requests without a header.
            let response = self
                .store
                .alarm(request.into_inner())
                .await
                .map_err(status)?;
            Ok(Response::new(response))
        })
        .await
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        metrics::unary(Method::Status, async move {
            let s = self.store.status().await.map_err(status)?;
            let replica = self.store.replica_status();
            // etcd lists every active alarm among the errors, in protobuf's text form.
            let errors = self.store.alarms().iter().map(alarm_text).collect();
            Ok(Response::new(StatusResponse {
                header: Some(self.store.header(s.revision)),
                version: ETCD_VERSION_REPORTED.into(),
                db_size: i64::try_from(s.db_size).unwrap_or(i64::MAX),
                leader: replica.leader,
                raft_index: replica.commit_index,
                raft_term: replica.term,
                raft_applied_index: s.applied_index,
                errors,
                db_size_in_use: i64::try_from(s.db_size_in_use).unwrap_or(i64::MAX),
                is_learner: false,
            }))
        })
        .await
    }

    async fn defragment(
        &self,
        _request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        metrics::unary(Method::Defragment, async move {
            self.store.defragment().await.map_err(status)?;
            Ok(Response::new(DefragmentResponse {
                header: Some(self.store.header(self.store.revision())),
            }))
        })
        .await
    }

    async fn hash(&self, _request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        metrics::unary(Method::Hash, async move {
            let store = self.store.clone();
            let (hash, _) = tokio::task::spawn_blocking(move || store.hash_kv(0))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(status)?;
            Ok(Response::new(HashResponse {
                header: Some(self.store.header(self.store.revision())),
                hash,
            }))
        })
        .await
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        metrics::unary(Method::HashKv, async move {
            let store = self.store.clone();
            let revision = request.get_ref().revision;
            let (hash, compact_revision) =
                tokio::task::spawn_blocking(move || store.hash_kv(revision))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
                    .map_err(status)?;
            Ok(Response::new(HashKvResponse {
                header: Some(self.store.header(self.store.revision())),
                hash,
                compact_revision,
            }))
        })
        .await
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        _request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let store = self.store.clone();
        // The snapshot is written to an unnamed temporary file first: the stream must say how
        // many bytes remain, and a client reading slowly must not hold a read transaction
        // (and with it the file's old pages) open for the whole transfer.
        let (file, revision, total) =
            tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
                let mut file = tempfile::tempfile_in(store.data_dir())?;
                let revision = store.snapshot(&mut file)?;
                let total = file.seek(SeekFrom::End(0))?;
                file.seek(SeekFrom::Start(0))?;
                Ok((file, revision, total))
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(status)?;
        let (tx, rx) = mpsc::channel(SNAPSHOT_CHUNKS_AHEAD_MAX);
        let header = self.store.header(revision);
        tokio::task::spawn_blocking(move || {
            let mut file = file;
            let mut sent: u64 = 0;
            let mut first = true;
            loop {
                let mut buf = vec![0u8; SNAPSHOT_CHUNK_BYTES];
                let n = match file.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => n,
                    Err(e) => {
                        let _ =
                            tx.blocking_send(Err(Status::internal(format!("snapshot read: {e}"))));
                        return;
                    }
                };
                buf.truncate(n);
                sent += n as u64;
                let resp = SnapshotResponse {
                    header: first.then_some(header),
                    remaining_bytes: total - sent,
                    blob: Bytes::from(buf),
                };
                first = false;
                if tx.blocking_send(Ok(resp)).is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(metrics::Counted::new(
            Method::Snapshot,
            ReceiverStream::new(rx),
        ))))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        metrics::unary(Method::MoveLeader, async move {
            self.store
                .move_leader(request.get_ref().target_id)
                .await
                .map_err(status)?;
            // etcd answers with an empty response, no header.
            Ok(Response::new(MoveLeaderResponse { header: None }))
        })
        .await
    }
}

impl EtcdApi {
    /// The alarms active in the cluster (the store's alarm table, as the log left it): what
    /// `Alarm` GET lists and what makes `/health` false.
    pub fn active_alarms(&self) -> Vec<AlarmMember> {
        self.store.alarms()
    }

    /// The members as the log recorded them (membership changes, and the names and client
    /// URLs each member published at start); a single store is its own only member.
    fn members(&self) -> Result<Vec<Member>, StoreError> {
        let me = self.store.member_id();
        let recorded = if self.store.is_replicated() {
            self.store.members()?
        } else {
            Vec::new()
        };
        let mut members: Vec<Member> = recorded
            .into_iter()
            .map(|m| Member {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                is_learner: m.is_learner,
            })
            .collect();
        match members.iter_mut().find(|m| m.id == me) {
            // Until our own publication is applied, say what our flags say.
            Some(mine) => {
                if mine.client_urls.is_empty() {
                    mine.client_urls = self.member.client_urls.clone();
                }
                if mine.name.is_empty() {
                    mine.name = self.member.name.clone();
                }
            }
            None => members.push(Member {
                id: me,
                name: self.member.name.clone(),
                peer_urls: self.member.peer_urls.clone(),
                client_urls: self.member.client_urls.clone(),
                is_learner: false,
            }),
        }
        members.sort_by_key(|m| m.id);
        Ok(members)
    }

    /// Applies a membership change and answers with the members after it.
    async fn change(&self, change: MembershipChange) -> Result<Vec<Member>, Status> {
        self.store.change_membership(change).await.map_err(status)?;
        self.members().map_err(status)
    }
}

#[tonic::async_trait]
impl Cluster for EtcdApi {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        metrics::unary(Method::MemberAdd, async move {
            let request = request.into_inner();
            let members = self
                .change(MembershipChange::Add {
                    peer_urls: request.peer_urls.clone(),
                    learner: request.is_learner,
                })
                .await?;
            let member = members
                .iter()
                .find(|m| m.peer_urls == request.peer_urls)
                .cloned();
            Ok(Response::new(MemberAddResponse {
                header: Some(self.store.header(0)),
                member,
                members,
            }))
        })
        .await
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        metrics::unary(Method::MemberRemove, async move {
            let members = self
                .change(MembershipChange::Remove {
                    id: request.get_ref().id,
                })
                .await?;
            Ok(Response::new(MemberRemoveResponse {
                header: Some(self.store.header(0)),
                members,
            }))
        })
        .await
    }

    async fn member_update(
        &self,
        _r: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        metrics::unary(Method::MemberUpdate, async move {
            Err(Status::failed_precondition(MEMBER_UPDATE_UNSUPPORTED))
        })
        .await
    }

    async fn member_list(
        &self,
        _r: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        metrics::unary(Method::MemberList, async move {
            // etcd's Cluster service leaves the revision out of its headers.
            Ok(Response::new(MemberListResponse {
                header: Some(self.store.header(0)),
                members: self.members().map_err(status)?,
            }))
        })
        .await
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        metrics::unary(Method::MemberPromote, async move {
            let members = self
                .change(MembershipChange::Promote {
                    id: request.get_ref().id,
                })
                .await?;
            Ok(Response::new(MemberPromoteResponse {
                header: Some(self.store.header(0)),
                members,
            }))
        })
        .await
    }
}
