//! The client writes: put, delete-range, txn, compaction, lease grant and revoke, alarms and
//! member attributes, and lease keep-alives.
//!
//! Puts, txns and lease grants are checked against this member's space quota first (as
//! etcd's quota layer sits in front of its KV service); KV requests then against etcd's
//! request limits ([`crate::validate`]). A write is then proposed: to the writer's queue for
//! a single store, to the replicated log for a cluster member, waiting at most
//! [`super::REPLICATED_REQUEST_TIMEOUT`] for the cluster. A KV answer carries this member's
//! header.
//!
//! Invariants: nothing here writes a table (the writer applies what is proposed), and a
//! write a check refuses is not proposed. A quota refusal, or a write that applied past the
//! quota (answered `NoSpace`), raises `NOSPACE` for this member through the log, as etcd
//! does.

use std::sync::atomic::Ordering;

use tokio::sync::oneshot;
use tracing::warn;

use super::writer::{Pending, WriterMsg};
use super::{REPLICATED_REQUEST_TIMEOUT, Store, unexpected};
use crate::apply::CommandResult;
use crate::error::StoreError;
use crate::lease::{LEASE_TTL_MAX_SECONDS, LEASE_TTL_MIN_SECONDS};
use crate::pb::command::{Command, command::Command as Cmd};
use crate::pb::etcdserverpb::{
    AlarmRequest, AlarmResponse, AlarmType, CompactionRequest, DeleteRangeRequest,
    DeleteRangeResponse, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, PutResponse,
    ResponseHeader, TxnRequest, TxnResponse, alarm_request::AlarmAction,
};
use crate::quota::{self, QuotaCheck};

impl Store {
    /// A put, checked against this member's quota first (before the request's own checks,
    /// as etcd's quota layer sits in front of its KV service).
    pub async fn put(&self, req: PutRequest) -> Result<PutResponse, StoreError> {
        self.check_quota(quota::put_cost(&req)).await?;
        crate::validate::put(&req)?;
        let result = self.propose(Cmd::Put(req), false).await;
        match self.after_quota(result).await? {
            CommandResult::Put(mut resp) => {
                resp.header = Some(self.header(header_revision(&resp.header)));
                Ok(resp)
            }
            other => Err(unexpected(&other)),
        }
    }

    pub async fn delete_range(
        &self,
        req: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, StoreError> {
        crate::validate::delete_range(&req)?;
        match self.propose(Cmd::DeleteRange(req), false).await? {
            CommandResult::DeleteRange(mut resp) => {
                resp.header = Some(self.header(header_revision(&resp.header)));
                Ok(resp)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// A txn, checked against this member's quota first (one without puts costs nothing and
    /// always passes).
    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, StoreError> {
        self.check_quota(quota::txn_cost(&req)).await?;
        crate::validate::txn(&req)?;
        let result = self.propose(Cmd::Txn(req), false).await;
        match self.after_quota(result).await? {
            CommandResult::Txn(mut resp) => {
                resp.header = Some(self.header(header_revision(&resp.header)));
                Ok(resp)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Compacts history below `revision`. With `physical`, answers only once the old rows are
    /// gone from disk.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<i64, StoreError> {
        let req = CompactionRequest { revision, physical };
        match self.propose(Cmd::Compaction(req), physical).await? {
            CommandResult::Compact { revision } => Ok(revision),
            other => Err(unexpected(&other)),
        }
    }

    /// Grants a lease. `id == 0` lets the store choose; TTLs below the minimum are raised.
    /// Checked against this member's quota first.
    pub async fn lease_grant(&self, ttl: i64, id: i64) -> Result<(i64, i64), StoreError> {
        self.check_quota(quota::LEASE_GRANT_COST).await?;
        if ttl > LEASE_TTL_MAX_SECONDS {
            return Err(StoreError::LeaseTtlTooLarge);
        }
        let ttl = ttl.max(LEASE_TTL_MIN_SECONDS);
        let id = if id == 0 { self.fresh_lease_id() } else { id };
        let result = self
            .propose(Cmd::LeaseGrant(LeaseGrantRequest { ttl, id }), false)
            .await;
        match self.after_quota(result).await? {
            CommandResult::LeaseGrant { id, ttl, .. } => Ok((id, ttl)),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn lease_revoke(&self, id: i64) -> Result<i64, StoreError> {
        match self
            .propose(Cmd::LeaseRevoke(LeaseRevokeRequest { id }), false)
            .await?
        {
            CommandResult::LeaseRevoke { revision } => Ok(revision),
            other => Err(unexpected(&other)),
        }
    }

    /// Renews a lease; `None` if it does not exist (the client then sees TTL 0).
    pub fn lease_keep_alive(&self, id: i64) -> Option<i64> {
        let ttl = self.shared.mvcc.lessor.lock().keep_alive(id);
        if ttl.is_some()
            && !self.is_lease_authority()
            && let Some(replicator) = self.shared.replicator.get()
        {
            replicator.renew_lease(id);
        }
        ttl
    }

    /// A positive lease id not in use (etcd's are positive 63-bit numbers).
    fn fresh_lease_id(&self) -> i64 {
        let lessor = self.shared.mvcc.lessor.lock();
        loop {
            let id = rand::random::<i64>() & i64::MAX;
            if id != 0 && !lessor.contains(id) {
                return id;
            }
        }
    }

    /// Rewrites the database file without its free space.
    pub async fn defragment(&self) -> Result<(), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(WriterMsg::Defragment { reply }).await?;
        rx.await.map_err(|_| StoreError::Stopped)?
    }

    /// Records (through the log, in a cluster) how clients reach member `id`, so that every
    /// member's `MemberList` shows it.
    pub async fn publish_member(
        &self,
        id: u64,
        name: &str,
        client_urls: Vec<String>,
    ) -> Result<(), StoreError> {
        let attrs = crate::pb::command::MemberAttributes {
            id,
            name: name.to_string(),
            client_urls,
        };
        match self.propose(Cmd::MemberAttributes(attrs), false).await? {
            CommandResult::MemberPublished => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// etcd's `Maintenance.Alarm`: `GET` lists the active alarms of a type (`NONE`: all) as
    /// of a linearizable read; `ACTIVATE` and `DEACTIVATE` go through the log and answer
    /// with the alarm they concerned (none when there was nothing to clear). An unknown
    /// action is answered with nothing, as etcd's apply answers it.
    pub async fn alarm(&self, request: AlarmRequest) -> Result<AlarmResponse, StoreError> {
        match AlarmAction::try_from(request.action) {
            Ok(AlarmAction::Get) => {
                self.linearizable_barrier().await?;
                Ok(AlarmResponse {
                    header: None,
                    alarms: self.shared.alarms.read().list(request.alarm),
                })
            }
            Ok(AlarmAction::Activate | AlarmAction::Deactivate) => {
                match self.propose(Cmd::Alarm(request), false).await? {
                    CommandResult::Alarm(resp) => Ok(resp),
                    other => Err(unexpected(&other)),
                }
            }
            Err(_) => Ok(AlarmResponse::default()),
        }
    }

    /// etcd's quota check before a proposal (`quotaAlarmer.check`): if this member's backend
    /// plus `cost` is not below its quota, raise `NOSPACE` for this member and refuse.
    async fn check_quota(&self, cost: u64) -> Result<(), StoreError> {
        let check = QuotaCheck {
            limit: self.shared.quota,
            size: self.shared.backend_bytes.load(Ordering::Acquire),
        };
        if check.available(cost) {
            return Ok(());
        }
        self.raise_nospace().await;
        Err(StoreError::NoSpace)
    }

    /// A command applied past this member's quota answers `NoSpace` (etcd's quota applier);
    /// as etcd does then, raise `NOSPACE` for this member before answering, unless the alarm
    /// is active already (then the refusal came from it).
    async fn after_quota(
        &self,
        result: Result<CommandResult, StoreError>,
    ) -> Result<CommandResult, StoreError> {
        if matches!(result, Err(StoreError::NoSpace))
            && !self.shared.alarms.read().is_active(AlarmType::Nospace)
        {
            self.raise_nospace().await;
        }
        result
    }

    /// Raises `NOSPACE` for this member through the log and waits for it to apply; a failure
    /// is only logged, as etcd ignores it (the next refused write tries again). Nothing is
    /// proposed when this member's alarm is active already: applying it would change nothing.
    async fn raise_nospace(&self) {
        if self.shared.nospace_raised_here() {
            return;
        }
        warn!(
            quota = self.shared.quota,
            backend_bytes = self.shared.backend_bytes.load(Ordering::Acquire),
            "backend quota exceeded; raising the NOSPACE alarm"
        );
        let request = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: self.shared.member_id,
            alarm: AlarmType::Nospace as i32,
        };
        if let Err(e) = self.propose(Cmd::Alarm(request), false).await {
            warn!(error = %e, "raising the NOSPACE alarm failed");
        }
    }

    async fn propose(&self, command: Cmd, physical: bool) -> Result<CommandResult, StoreError> {
        let _pending = crate::metrics::Pending::start();
        let result = self.propose_inner(command, physical).await;
        if let Err(
            StoreError::NoLeader
            | StoreError::LeaderChanged
            | StoreError::Timeout
            | StoreError::Stopped,
        ) = &result
        {
            crate::metrics::PROPOSALS_FAILED.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn propose_inner(
        &self,
        command: Cmd,
        physical: bool,
    ) -> Result<CommandResult, StoreError> {
        let (reply, rx) = oneshot::channel();
        let command = Command {
            command: Some(command),
        };
        if self.shared.replicated {
            let replicator = self.shared.replicator.get().ok_or(StoreError::NoLeader)?;
            replicator.submit(command, reply);
            return match tokio::time::timeout(REPLICATED_REQUEST_TIMEOUT, rx).await {
                Ok(result) => result.map_err(|_| StoreError::Timeout)?,
                Err(_) => Err(StoreError::Timeout),
            };
        }
        self.send(WriterMsg::Command(Pending {
            index: None,
            command: Some(command),
            physical,
            reply: Some(reply),
        }))
        .await?;
        rx.await.map_err(|_| StoreError::Stopped)?
    }

    pub(super) async fn send(&self, msg: WriterMsg) -> Result<(), StoreError> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(StoreError::Stopped);
        }
        self.writer.send(msg).await.map_err(|_| StoreError::Stopped)
    }
}

fn header_revision(header: &Option<ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}
