//! The store's threads beside the writer: the watch syncer ([`run_syncer`]), the lessor's
//! expiry loop ([`run_lessor`]) and the checkpoint ticker ([`run_checkpoint_ticker`]). None
//! writes a table: the syncer reads history, the other two send the writer (or the
//! replicated log) messages.
//!
//! # Invariants
//! - A syncer round that a snapshot install overlapped delivers nothing (the install moved
//!   the rows, the index and the floor under it) and the next round starts over.
//! - Only the lease authority (a single store; a cluster's leader) proposes revocations, at
//!   most [`LEASE_REVOKES_PER_CHECK_MAX`] per check; a revocation that fails or is never
//!   answered gives the lease back to the lessor to try again.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redb::ReadableDatabase;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::writer::{Pending, WriterMsg};
use super::{CHECKPOINT_INTERVAL, REPLICATED_REQUEST_TIMEOUT, Shared};
use crate::error::StoreError;
use crate::mvcc::KV;
use crate::pb::command::{Command, command::Command as Cmd};
use crate::pb::etcdserverpb::LeaseRevokeRequest;
use crate::pb::mvccpb::Event;
use crate::read::read_events;

/// How often the checkpoint ticker wakes: short, so that it notices a stopping store
/// quickly; it asks for a checkpoint only every [`CHECKPOINT_INTERVAL`].
const CHECKPOINT_TICK: Duration = Duration::from_millis(100);

/// How often the syncer looks for watchers to replay when nothing woke it (etcd: 100 ms).
pub const WATCH_SYNC_INTERVAL: Duration = Duration::from_millis(100);

/// Revisions of history one syncer round reads from disk (etcd's `watchBatchMaxRevs`).
/// Bounds the memory one round holds; a watcher far behind catches up over several rounds.
pub const WATCH_SYNC_REVISIONS_MAX: i64 = 1_000;

/// Unsynced watchers served per round (etcd's `maxWatchersPerSync`).
pub const WATCH_SYNC_WATCHERS_MAX: usize = 512;

/// etcd's default `--experimental-watch-progress-notify-interval`.
pub const PROGRESS_NOTIFY_INTERVAL_DEFAULT: Duration = Duration::from_secs(600);

/// How often expired leases are looked for (etcd checks every 500 ms).
pub const LEASE_EXPIRY_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Revocations proposed per check: etcd's `leaseRevokeRate` of 1,000/s at two checks a
/// second. A mass expiry (a rebooted fleet) then cannot flood the write path.
pub const LEASE_REVOKES_PER_CHECK_MAX: usize = 500;

/// Replays history to unsynced watchers and sends periodic progress notifications.
pub(super) fn run_syncer(shared: &Shared) {
    let mut last_progress = Instant::now();
    while !shared.stopping.load(Ordering::Acquire) {
        {
            let (flag, condvar) = &shared.sync_wakeup;
            let mut woken = flag.lock();
            if !*woken {
                condvar.wait_for(&mut woken, WATCH_SYNC_INTERVAL);
            }
            *woken = false;
        }
        if let Err(e) = sync_round(shared) {
            warn!(error = %e, "watch sync round failed");
        }
        shared.hub.retry_progress();
        if last_progress.elapsed() >= shared.progress_notify_interval {
            shared.hub.progress_tick();
            last_progress = Instant::now();
        }
    }
}

/// One round: reads at most [`WATCH_SYNC_REVISIONS_MAX`] revisions of history once and hands
/// each unsynced watcher its part.
///
/// The round combines the hub's watchers, the compaction floor and the index (for `prev_kv`)
/// with rows of a read transaction; a snapshot install that overlaps it may have replaced any
/// of them, so such a round delivers nothing and the next one starts over (the install wakes
/// it). The hub's epoch covers an install that starts after the round's reads and is done
/// before a delivery.
fn sync_round(shared: &Shared) -> Result<(), StoreError> {
    let generation = shared.install_generation.load(Ordering::SeqCst);
    if !generation.is_multiple_of(2) {
        return Ok(());
    }
    let round = shared.hub.unsynced(WATCH_SYNC_WATCHERS_MAX);
    if round.watchers.is_empty() {
        return Ok(());
    }
    let current = round.current_rev;
    // The read transaction starts before the compaction floor is read: rows at or above the
    // floor this round sees are never deleted while the transaction lives.
    let txn = shared.db.read().begin_read()?;
    let compacted = shared.mvcc.compact_rev();
    let (gone, live): (Vec<_>, Vec<_>) = round
        .watchers
        .into_iter()
        .partition(|w| w.next_rev < compacted);
    let mut events = Vec::new();
    let mut through = current;
    if let Some(from) = live.iter().map(|w| w.next_rev).min() {
        through = current.min(from.saturating_add(WATCH_SYNC_REVISIONS_MAX - 1));
        let table = txn.open_table(KV)?;
        let with_prev = live.iter().any(|w| w.prev_kv);
        events = read_events(
            &table,
            &shared.mvcc.index,
            compacted,
            from,
            through,
            with_prev,
        )?;
    }
    drop(txn);
    if shared.install_generation.load(Ordering::SeqCst) != generation {
        shared.wake_syncer();
        return Ok(());
    }
    for w in gone {
        shared
            .hub
            .compacted(round.epoch, w.stream, w.watch_id, compacted);
    }
    let mut any_behind = false;
    for w in live {
        let mine: Vec<Event> = events
            .iter()
            .filter(|e| {
                e.kv.as_ref()
                    .is_some_and(|kv| kv.mod_revision >= w.next_rev && w.range.contains(&kv.key))
            })
            .map(|e| {
                if w.prev_kv {
                    e.clone()
                } else {
                    Event {
                        prev_kv: None,
                        ..e.clone()
                    }
                }
            })
            .collect();
        if !shared
            .hub
            .deliver_history(round.epoch, w.stream, w.watch_id, mine, through)
            || through < current
        {
            any_behind = true;
        }
    }
    if any_behind {
        shared.wake_syncer();
    }
    Ok(())
}

/// Proposes revocations of expired leases.
pub(super) fn run_lessor(shared: &Shared, writer: &mpsc::Sender<WriterMsg>) {
    while !shared.stopping.load(Ordering::Acquire) {
        std::thread::sleep(LEASE_EXPIRY_CHECK_INTERVAL);
        if !shared.lease_authority.load(Ordering::Acquire) {
            // Followers keep deadlines (so a new leader can promote them) but never revoke.
            continue;
        }
        let expired = shared
            .mvcc
            .lessor
            .lock()
            .take_expired(Instant::now(), LEASE_REVOKES_PER_CHECK_MAX);
        // All revocations go to the writer at once so they share one group commit.
        let mut pending = Vec::with_capacity(expired.len());
        for id in expired {
            let (reply, rx) = oneshot::channel();
            let command = Command {
                command: Some(Cmd::LeaseRevoke(LeaseRevokeRequest { id })),
            };
            if shared.replicated {
                match shared.replicator.get() {
                    Some(replicator) => replicator.submit(command, reply),
                    None => {
                        shared.mvcc.lessor.lock().revoke_failed(id);
                        continue;
                    }
                }
            } else if writer
                .blocking_send(WriterMsg::Command(Pending {
                    index: None,
                    command: Some(command),
                    physical: false,
                    reply: Some(reply),
                }))
                .is_err()
            {
                return;
            }
            pending.push((id, rx));
        }
        let deadline = Instant::now() + REPLICATED_REQUEST_TIMEOUT;
        for (id, mut rx) in pending {
            // Polled against a deadline: a replicated revocation lost in a leader change is
            // never answered.
            let answer = loop {
                match rx.try_recv() {
                    Ok(answer) => break Some(answer),
                    Err(oneshot::error::TryRecvError::Empty) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(oneshot::error::TryRecvError::Empty) => break None,
                    Err(oneshot::error::TryRecvError::Closed) => {
                        if shared.replicated {
                            break None;
                        }
                        return;
                    }
                }
            };
            match answer {
                Some(Ok(_)) | Some(Err(StoreError::LeaseNotFound)) => {}
                Some(Err(e)) => {
                    warn!(lease = id, error = %e, "revoking expired lease failed");
                    shared.mvcc.lessor.lock().revoke_failed(id);
                }
                None => shared.mvcc.lessor.lock().revoke_failed(id),
            }
        }
    }
}

/// Asks the writer for a checkpoint every [`CHECKPOINT_INTERVAL`]; the writer skips it when
/// a batch made one recently or nothing is pending.
pub(super) fn run_checkpoint_ticker(shared: &Shared, writer: &mpsc::Sender<WriterMsg>) {
    let mut last = Instant::now();
    while !shared.stopping.load(Ordering::Acquire) {
        std::thread::sleep(CHECKPOINT_TICK);
        if last.elapsed() >= CHECKPOINT_INTERVAL {
            last = Instant::now();
            // A full queue means the writer is busy and checkpoints by count anyway.
            let _ = writer.try_send(WriterMsg::Checkpoint);
        }
    }
}
