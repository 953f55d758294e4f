//! The deterministic apply: every way the store's tables change, as code that
//! [`crate::Store`]'s writer thread and [`crate::sync_store::SyncStore`] (the simulation's
//! store) both run, so a simulated member changes its tables exactly as a real one does.
//!
//! - [`apply_commands`]: a batch of commands in one redb write transaction, each through the
//!   applier the active alarms call for, with the applied index and revision recorded in the
//!   same transaction. The writer's live batches, the replay of the write-ahead log at open
//!   and the simulation's entries all go through it.
//! - [`check_entry_order`]: a batch of log entries must follow the applied index with no gap.
//! - [`compaction_step`]: one bounded step of physical compaction.
//! - [`stage_install`]: a snapshot install's table replacement and the state rebuilt from it,
//!   before the caller commits.
//!
//! Nothing here starts a thread or draws a random number, and the one clock read (the
//! lessor's deadline for a granted lease) reaches no table: what the tables hold after a call
//! depends only on what they held before and on the call's arguments.
//!
//! # Invariants
//! - A command's validation that needs state (lease exists, key exists for `ignore_value`)
//!   runs before its first write, so a failing command changes nothing. A command that fails
//!   after writing poisons the batch ([`crate::mvcc::Apply::poisoned`]): the caller drops the
//!   transaction, and memory is ahead of the tables until a restart.
//! - The quota changes a command's answer, never the state: every member applies alike.
//! - The applied index and the revision are written in the transaction that applies the
//!   commands, so a commit is always a consistent `(applied index, rows)` pair.

use bytes::Bytes;
use prost::Message;
use redb::{Database, Durability, WriteTransaction};
use tracing::{info, warn};

use crate::alarm::{Alarms, Applier};
use crate::error::StoreError;
use crate::mvcc::{
    self, ALARMS, Apply, KV, LEASES, MEMBERS, META, META_APPLIED_INDEX, META_COMPACT_FINISHED,
    META_REVISION, Mvcc, RAFT,
};
use crate::pb::command::{Command, command::Command as Cmd};
use crate::pb::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, DeleteRangeResponse, PutResponse, TxnResponse,
    alarm_request::AlarmAction,
};
use crate::pb::mvccpb::Event;
use crate::quota::{self, QuotaCheck};
use crate::state::{State, read_state};

/// Keys whose history one physical-compaction step drops (etcd's `compactionBatchLimit`).
/// Each step is one redb transaction between client batches, so writes never wait behind
/// more than one step.
pub const COMPACTION_BATCH_KEYS: usize = 1_000;

/// The result of one applied command.
#[derive(Debug, Clone)]
pub enum CommandResult {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact {
        revision: i64,
    },
    LeaseGrant {
        id: i64,
        ttl: i64,
        revision: i64,
    },
    LeaseRevoke {
        revision: i64,
    },
    /// A member's attributes were recorded.
    MemberPublished,
    /// A membership change was recorded (members and `ConfState`).
    Membership,
    /// An alarm was raised or cleared: the alarms it concerned, as etcd answers (no header).
    Alarm(AlarmResponse),
}

/// Where applying stands: the last applied command, the last revision, the compaction floor.
/// The writer's moves while a batch is applied and equals what is published between batches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ApplyCursor {
    pub(crate) applied_index: u64,
    pub(crate) rev: i64,
    pub(crate) floor: i64,
}

/// What applying a batch of commands produced.
pub(crate) struct Applied {
    pub(crate) results: Vec<Result<CommandResult, StoreError>>,
    pub(crate) events: Vec<Event>,
    /// The compaction revision a command of the batch moved the floor to.
    pub(crate) new_compaction: Option<i64>,
    /// The positions of commands that applied while this member was past its quota, so
    /// answered `NoSpace`: this member must raise `NOSPACE` for them (etcd's
    /// `applyEntryNormal`).
    pub(crate) over_quota: Vec<usize>,
    /// A command of the batch raised or cleared an alarm.
    pub(crate) alarms_changed: bool,
}

/// Applies `commands` in order inside `txn`, numbering them from `applied_index + 1`, and
/// records the applied index and revision in the same transaction. The one apply path for
/// live batches and for replay at startup, so replay gives exactly what the first run gave.
///
/// Each command goes through the applier the active alarms call for ([`Applier`]): refused
/// whole under an alarm, or applied and, with no alarm, checked against this member's
/// `quota` (which changes the answer, never the state: every member applies alike).
///
/// Fails only when a command failed after writing (see [`Apply::poisoned`]): the transaction
/// must then be dropped, and memory (index, lessor) is ahead of disk until a restart.
pub(crate) fn apply_commands<'c>(
    mvcc: &Mvcc,
    txn: &WriteTransaction,
    cursor: &mut ApplyCursor,
    commands: impl Iterator<Item = Option<&'c Command>>,
    quota: QuotaCheck,
) -> Result<Applied, StoreError> {
    let mut events = Vec::new();
    let mut results = Vec::new();
    let mut new_compaction = None;
    let mut over_quota = Vec::new();
    let mut alarms_changed = false;
    let mut table = txn.open_table(KV)?;
    let mut leases = txn.open_table(LEASES)?;
    let mut meta = txn.open_table(META)?;
    for (position, command) in commands.enumerate() {
        cursor.applied_index += 1;
        let mut apply = Apply {
            mvcc,
            table: &mut table,
            leases: &mut leases,
            meta: &mut meta,
            rev: &mut cursor.rev,
            floor: &mut cursor.floor,
            events: &mut events,
            poisoned: false,
        };
        let Some(command) = command else {
            // A log entry without a command: it only takes an index.
            results.push(Err(StoreError::Storage(
                "log entry without a command".into(),
            )));
            continue;
        };
        let applier = mvcc.alarms.lock().applier();
        // What the quota applier checks, and the cost, for the commands it checks; etcd
        // computes availability before applying.
        let quota_cost = match &command.command {
            Some(Cmd::Put(req)) => Some(quota::put_cost(req)),
            Some(Cmd::Txn(req)) if !quota::txn_is_read_only(req) => Some(quota::txn_cost(req)),
            Some(Cmd::LeaseGrant(_)) => Some(quota::LEASE_GRANT_COST),
            _ => None,
        };
        let within_quota = quota_cost.is_none_or(|cost| quota.available(cost));
        let result = match (&command.command, applier) {
            // Refusals under an alarm, before anything is written.
            (Some(Cmd::Put(_) | Cmd::LeaseGrant(_)), Applier::Capped) => Err(StoreError::NoSpace),
            (Some(Cmd::Txn(req)), Applier::Capped) if quota::txn_cost(req) > 0 => {
                Err(StoreError::NoSpace)
            }
            (
                Some(
                    Cmd::Put(_)
                    | Cmd::DeleteRange(_)
                    | Cmd::Compaction(_)
                    | Cmd::LeaseGrant(_)
                    | Cmd::LeaseRevoke(_),
                ),
                Applier::Corrupt,
            ) => Err(StoreError::Corrupt),
            // A read-only txn never reaches etcd's appliers (it is served without the log).
            (Some(Cmd::Txn(req)), Applier::Corrupt) if !quota::txn_is_read_only(req) => {
                Err(StoreError::Corrupt)
            }
            (Some(Cmd::Put(req)), _) => apply.put(req).map(CommandResult::Put),
            (Some(Cmd::DeleteRange(req)), _) => {
                apply.delete_range(req).map(CommandResult::DeleteRange)
            }
            (Some(Cmd::Txn(req)), _) => apply.txn(req).map(CommandResult::Txn),
            (Some(Cmd::LeaseGrant(req)), _) => {
                apply
                    .lease_grant(req.id, req.ttl)
                    .map(|revision| CommandResult::LeaseGrant {
                        id: req.id,
                        ttl: req.ttl,
                        revision,
                    })
            }
            (Some(Cmd::LeaseRevoke(req)), _) => apply
                .lease_revoke(req.id)
                .map(|revision| CommandResult::LeaseRevoke { revision }),
            // Member rows are read before anything is written, so a row that cannot be read
            // fails the command alone; a failed write after that leaves the transaction
            // half-written, and the batch is abandoned (`?`).
            (Some(Cmd::MemberAttributes(attrs)), _) => {
                let mut members = txn.open_table(MEMBERS)?;
                match mvcc::read_member(&members, attrs.id) {
                    Ok(existing) => {
                        let row = mvcc::merge_attributes(existing, attrs);
                        members.insert(row.id, row.encode_to_vec().as_slice())?;
                        Ok(CommandResult::MemberPublished)
                    }
                    Err(e) => Err(e),
                }
            }
            (Some(Cmd::Membership(change)), _) => {
                let mut members = txn.open_table(MEMBERS)?;
                match mvcc::membership_rows(&members, change) {
                    Ok(rows) => {
                        let mut raft = txn.open_table(RAFT)?;
                        mvcc::write_membership(&mut members, &mut raft, &rows, change)?;
                        Ok(CommandResult::Membership)
                    }
                    Err(e) => Err(e),
                }
            }
            (Some(Cmd::Compaction(req)), _) => apply.compact(req.revision).map(|revision| {
                new_compaction = Some(req.revision);
                CommandResult::Compact { revision }
            }),
            (Some(Cmd::Alarm(req)), _) => {
                let mut table = txn.open_table(ALARMS)?;
                let (response, changed) = apply_alarm(&mut table, &mut mvcc.alarms.lock(), req)?;
                alarms_changed |= changed;
                Ok(CommandResult::Alarm(response))
            }
            (None, _) => Err(StoreError::Storage("empty command".into())),
        };
        if apply.poisoned {
            return Err(result
                .err()
                .unwrap_or_else(|| StoreError::Storage("command left partial writes".into())));
        }
        // etcd's quota applier: the command applied, but this member was past its quota.
        let result = match result {
            Ok(_) if applier == Applier::Normal && !within_quota => {
                over_quota.push(position);
                Err(StoreError::NoSpace)
            }
            other => other,
        };
        results.push(result);
    }
    meta.insert(META_APPLIED_INDEX, cursor.applied_index)?;
    meta.insert(META_REVISION, cursor.rev as u64)?;
    Ok(Applied {
        results,
        events,
        new_compaction,
        over_quota,
        alarms_changed,
    })
}

/// Applies an alarm request (etcd's `applierV3backend.Alarm`): `ACTIVATE` records the alarm
/// (answering with it, new or not), `DEACTIVATE` clears it (answering with it if it was
/// active), `GET` lists them; anything else is answered with nothing. The table is written
/// first, memory after; a failed write abandons the batch. Returns whether an alarm changed.
fn apply_alarm(
    table: &mut mvcc::AlarmsTable<'_>,
    alarms: &mut Alarms,
    req: &AlarmRequest,
) -> Result<(AlarmResponse, bool), StoreError> {
    let member = AlarmMember {
        member_id: req.member_id,
        alarm: req.alarm,
    };
    let mut response = AlarmResponse::default();
    let mut changed = false;
    match AlarmAction::try_from(req.action) {
        Ok(AlarmAction::Get) => response.alarms = alarms.list(req.alarm),
        Ok(AlarmAction::Activate) => {
            let first_of_its_type = alarms.list(req.alarm).is_empty();
            if !alarms.list(req.alarm).contains(&member) {
                table.insert((req.alarm, req.member_id), ())?;
                alarms.activate(req.alarm, req.member_id);
                changed = true;
                if first_of_its_type {
                    warn!(alarm = %crate::alarm::alarm_text(&member), "alarm raised");
                }
            }
            response.alarms.push(member);
        }
        Ok(AlarmAction::Deactivate) => {
            if alarms.list(req.alarm).contains(&member) {
                table.remove((req.alarm, req.member_id))?;
                alarms.deactivate(req.alarm, req.member_id);
                changed = true;
                if alarms.list(req.alarm).is_empty() {
                    info!(alarm = %crate::alarm::alarm_text(&member), "alarm disarmed");
                }
                response.alarms.push(member);
            }
        }
        Err(_) => {}
    }
    Ok((response, changed))
}

/// Checks that the entries of a batch (their log indexes; `None` for a command a single store
/// numbers itself) follow `applied_index` with no gap. Entries already applied must have been
/// dropped first.
pub(crate) fn check_entry_order(
    applied_index: u64,
    indexes: impl Iterator<Item = Option<u64>>,
) -> Result<(), StoreError> {
    let first_index = applied_index + 1;
    for (offset, index) in indexes.enumerate() {
        let due = first_index + offset as u64;
        if let Some(index) = index
            && index != due
        {
            return Err(StoreError::Storage(format!(
                "log entry {index} arrived where entry {due} was due"
            )));
        }
    }
    Ok(())
}

/// The first half of a snapshot install (see [`Store::install_snapshot`]), before the commit:
/// refuses a snapshot at a log `index` behind `applied_index`, begins a durable write
/// transaction, lets `write` replace the tables in it (returning the snapshot's revision) and
/// rebuilds the in-memory state from it. The caller commits and swaps that state in; dropping
/// the transaction instead leaves the store as it was.
///
/// # Panics
/// If the tables `write` left disagree with `index` or with the revision it returned.
pub(crate) fn stage_install(
    db: &Database,
    applied_index: u64,
    index: u64,
    write: impl FnOnce(&WriteTransaction) -> Result<i64, StoreError>,
) -> Result<(WriteTransaction, State), StoreError> {
    if index < applied_index {
        return Err(StoreError::Storage(format!(
            "snapshot at log index {index} is behind applied index {applied_index}"
        )));
    }
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)
        .map_err(StoreError::storage)?;
    let snapshot_revision = write(&txn)?;
    let state = read_state(
        &txn.open_table(META)?,
        &txn.open_table(KV)?,
        &txn.open_table(LEASES)?,
        &txn.open_table(ALARMS)?,
    )?;
    assert_eq!(
        state.applied_index, index,
        "install wrote applied index {} for snapshot index {index}",
        state.applied_index
    );
    assert_eq!(
        state.revision, snapshot_revision,
        "install wrote revision {} for a snapshot at revision {snapshot_revision}",
        state.revision
    );
    Ok((txn, state))
}

/// One bounded step of physical compaction at revision `at`: drops the superseded history of
/// the next [`COMPACTION_BATCH_KEYS`] keys after `after` (`None`: from the first key), or,
/// when no key is left, records the compaction as finished. Returns the last key it
/// compacted, or `None` once finished. Its commit need not be durable: after a crash the
/// recorded compaction revision is still there and compaction simply runs again.
pub(crate) fn compaction_step(
    db: &Database,
    mvcc: &Mvcc,
    at: i64,
    after: Option<&Bytes>,
) -> Result<Option<Bytes>, StoreError> {
    let keys = mvcc.index.read().keys_after(after, COMPACTION_BATCH_KEYS);
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::None)
        .map_err(StoreError::storage)?;
    {
        let mut table = txn.open_table(KV)?;
        if keys.is_empty() {
            let mut meta = txn.open_table(META)?;
            meta.insert(META_COMPACT_FINISHED, at as u64)?;
        } else {
            let mut removed = Vec::new();
            {
                let mut index = mvcc.index.write();
                for key in &keys {
                    index.compact_key(key, at, &mut removed);
                }
            }
            for rev in removed {
                table.remove(rev.to_row_key())?;
            }
        }
    }
    txn.commit()?;
    Ok(keys.last().cloned())
}

#[cfg(test)]
mod tests {
    use redb::backends::InMemoryBackend;
    use redb::{ReadableDatabase, ReadableTable};

    use super::*;
    use crate::pb::etcdserverpb::{
        AlarmType, CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest,
        PutRequest, RangeRequest, RequestOp, TxnRequest, request_op,
    };
    use crate::rev::Rev;
    use crate::state::load;

    /// A fresh store's tables in memory, its shared state and its apply cursor.
    fn fresh() -> (Database, Mvcc, ApplyCursor) {
        let db = Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .expect("in-memory database");
        let loaded = load(&db, Some((1, 2))).expect("load");
        let cursor = loaded.state.cursor();
        (db, loaded.state.into_mvcc(), cursor)
    }

    fn apply(
        db: &Database,
        mvcc: &Mvcc,
        cursor: &mut ApplyCursor,
        commands: &[Cmd],
        quota: QuotaCheck,
    ) -> Applied {
        let commands: Vec<Command> = commands
            .iter()
            .map(|c| Command {
                command: Some(c.clone()),
            })
            .collect();
        let txn = db.begin_write().expect("begin");
        let applied =
            apply_commands(mvcc, &txn, cursor, commands.iter().map(Some), quota).expect("apply");
        txn.commit().expect("commit");
        applied
    }

    fn put(key: &str) -> PutRequest {
        PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        }
    }

    fn op(request: request_op::Request) -> RequestOp {
        RequestOp {
            request: Some(request),
        }
    }

    fn alarm(action: AlarmAction, member: u64, kind: AlarmType) -> Cmd {
        Cmd::Alarm(AlarmRequest {
            action: action as i32,
            member_id: member,
            alarm: kind as i32,
        })
    }

    /// Each result as `Ok` or the error, for comparing with what etcd answers.
    fn outcomes(applied: &Applied) -> Vec<Result<(), StoreError>> {
        applied
            .results
            .iter()
            .map(|r| r.as_ref().map(|_| ()).map_err(Clone::clone))
            .collect()
    }

    #[test]
    fn nospace_refuses_puts_txns_with_puts_and_grants_and_applies_the_rest() {
        let (db, mvcc, mut cursor) = fresh();
        let none = QuotaCheck::default();
        apply(&db, &mvcc, &mut cursor, &[Cmd::Put(put("a"))], none);
        let raised = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[alarm(AlarmAction::Activate, 7, AlarmType::Nospace)],
            none,
        );
        assert!(raised.alarms_changed);
        let revision = cursor.rev;
        let nested = TxnRequest {
            success: vec![op(request_op::Request::RequestPut(put("n")))],
            ..Default::default()
        };
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                Cmd::Put(put("b")),
                Cmd::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 5 }),
                Cmd::Txn(TxnRequest {
                    failure: vec![op(request_op::Request::RequestPut(put("c")))],
                    ..Default::default()
                }),
                // etcd's cost of a txn counts top-level puts only: a nested put gets through.
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestTxn(nested))],
                    ..Default::default()
                }),
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestRange(RangeRequest {
                        key: Bytes::from_static(b"a"),
                        ..Default::default()
                    }))],
                    ..Default::default()
                }),
                Cmd::DeleteRange(DeleteRangeRequest {
                    key: Bytes::from_static(b"a"),
                    ..Default::default()
                }),
                Cmd::Compaction(CompactionRequest {
                    revision: 2,
                    physical: false,
                }),
            ],
            QuotaCheck::default(),
        );
        assert_eq!(
            outcomes(&applied),
            [
                Err(StoreError::NoSpace),
                Err(StoreError::NoSpace),
                Err(StoreError::NoSpace),
                Ok(()),
                Ok(()),
                Ok(()),
                Ok(()),
            ]
        );
        assert!(
            !mvcc.lessor.lock().contains(5),
            "a refused grant grants nothing"
        );
        // The nested put and the delete each took a revision; the refusals none.
        assert_eq!(cursor.rev, revision + 2);
        assert!(applied.over_quota.is_empty());
        // Cleared: writes apply again.
        apply(
            &db,
            &mvcc,
            &mut cursor,
            &[alarm(AlarmAction::Deactivate, 7, AlarmType::Nospace)],
            none,
        );
        let applied = apply(&db, &mvcc, &mut cursor, &[Cmd::Put(put("b"))], none);
        assert_eq!(outcomes(&applied), [Ok(())]);
    }

    #[test]
    fn corrupt_refuses_every_write_but_serves_read_only_txns() {
        let (db, mvcc, mut cursor) = fresh();
        let none = QuotaCheck::default();
        apply(&db, &mvcc, &mut cursor, &[Cmd::Put(put("a"))], none);
        apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                alarm(AlarmAction::Activate, 7, AlarmType::Nospace),
                alarm(AlarmAction::Activate, 8, AlarmType::Corrupt),
            ],
            none,
        );
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                Cmd::Put(put("b")),
                Cmd::DeleteRange(DeleteRangeRequest {
                    key: Bytes::from_static(b"a"),
                    ..Default::default()
                }),
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestDeleteRange(
                        DeleteRangeRequest {
                            key: Bytes::from_static(b"a"),
                            ..Default::default()
                        },
                    ))],
                    ..Default::default()
                }),
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestRange(
                        RangeRequest::default(),
                    ))],
                    ..Default::default()
                }),
                Cmd::Compaction(CompactionRequest {
                    revision: 2,
                    physical: false,
                }),
                Cmd::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 5 }),
                Cmd::LeaseRevoke(LeaseRevokeRequest { id: 5 }),
            ],
            none,
        );
        assert_eq!(
            outcomes(&applied),
            [
                Err(StoreError::Corrupt),
                Err(StoreError::Corrupt),
                Err(StoreError::Corrupt),
                Ok(()),
                Err(StoreError::Corrupt),
                Err(StoreError::Corrupt),
                Err(StoreError::Corrupt),
            ]
        );
        // CORRUPT cleared, NOSPACE still active: capped, not plain.
        apply(
            &db,
            &mvcc,
            &mut cursor,
            &[alarm(AlarmAction::Deactivate, 8, AlarmType::Corrupt)],
            none,
        );
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                Cmd::Put(put("b")),
                Cmd::DeleteRange(DeleteRangeRequest {
                    key: Bytes::from_static(b"a"),
                    ..Default::default()
                }),
            ],
            none,
        );
        assert_eq!(outcomes(&applied), [Err(StoreError::NoSpace), Ok(())]);
    }

    #[test]
    fn past_the_quota_a_write_applies_but_answers_nospace() {
        let (db, mvcc, mut cursor) = fresh();
        let past = QuotaCheck {
            limit: Some(1_000),
            size: 900,
        };
        let revision = cursor.rev;
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                // 256 + 1 + 1: over.
                Cmd::Put(put("a")),
                // A txn of deletes costs nothing: fine.
                Cmd::Txn(TxnRequest {
                    success: vec![op(request_op::Request::RequestDeleteRange(
                        DeleteRangeRequest {
                            key: Bytes::from_static(b"zz"),
                            ..Default::default()
                        },
                    ))],
                    ..Default::default()
                }),
                // 64: within.
                Cmd::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 5 }),
            ],
            past,
        );
        assert_eq!(
            outcomes(&applied),
            [Err(StoreError::NoSpace), Ok(()), Ok(())]
        );
        assert_eq!(applied.over_quota, [0]);
        // etcd's quota applier applies first, then answers: the put is there.
        assert_eq!(cursor.rev, revision + 1);
        assert_eq!(
            mvcc.index.read().get(b"a", cursor.rev),
            Some(Rev::new(cursor.rev, 0))
        );
    }

    #[test]
    fn alarm_requests_answer_as_etcds() {
        let (db, mvcc, mut cursor) = fresh();
        let none = QuotaCheck::default();
        let responses = |applied: &Applied| -> Vec<Vec<(u64, i32)>> {
            applied
                .results
                .iter()
                .map(|r| match r {
                    Ok(CommandResult::Alarm(resp)) => {
                        assert_eq!(resp.header, None, "etcd 3.4 answers without a header");
                        resp.alarms.iter().map(|a| (a.member_id, a.alarm)).collect()
                    }
                    other => panic!("not an alarm answer: {other:?}"),
                })
                .collect()
        };
        let applied = apply(
            &db,
            &mvcc,
            &mut cursor,
            &[
                alarm(AlarmAction::Activate, 7, AlarmType::Nospace),
                // Again: answered with the alarm, nothing changes.
                alarm(AlarmAction::Activate, 7, AlarmType::Nospace),
                alarm(AlarmAction::Activate, 3, AlarmType::Corrupt),
                alarm(AlarmAction::Get, 0, AlarmType::None),
                alarm(AlarmAction::Get, 0, AlarmType::Corrupt),
                // Not active: answered with nothing.
                alarm(AlarmAction::Deactivate, 8, AlarmType::Nospace),
                alarm(AlarmAction::Deactivate, 7, AlarmType::Nospace),
                alarm(AlarmAction::Get, 0, AlarmType::None),
            ],
            none,
        );
        assert_eq!(
            responses(&applied),
            [
                vec![(7, 1)],
                vec![(7, 1)],
                vec![(3, 2)],
                vec![(7, 1), (3, 2)],
                vec![(3, 2)],
                vec![],
                vec![(7, 1)],
                vec![(3, 2)],
            ]
        );
        assert!(applied.alarms_changed);
        // The table holds what memory holds, so a restart reads it back.
        let txn = db.begin_read().expect("read");
        let rows: Vec<(i32, u64)> = txn
            .open_table(ALARMS)
            .expect("alarms table")
            .iter()
            .expect("iterate")
            .map(|row| row.expect("row").0.value())
            .collect();
        assert_eq!(rows, [(2, 3)]);
        assert_eq!(mvcc.alarms.lock().all().len(), 1);
    }
}
