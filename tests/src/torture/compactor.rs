//! The compactor: compacts the store during the run, as Kubernetes' apiserver does, and reads
//! at past revisions around the compaction floor, recording both for `check::compaction`.
//!
//! Every `Config::compact_interval` (jittered) it picks a random member, learns the current
//! revision from the first member that answers a serializable read (one cut off from the
//! leader still knows roughly where the store is), and sends etcd `Compact` through the member
//! it picked, with `physical = false` (what Kubernetes' compactor sends) to `latest - COMPACT_KEEP_REVISIONS`, but never above what the following
//! history reader has confirmed (`reader`), so the committed history stays whole. Now and then
//! it asks again for the floor it already reached, which the store must refuse as compacted.
//! Then it reads the key prefix at a few past revisions around the floor, some below it
//! (which must answer compacted) and some at or above it (which must answer, with the state
//! of that revision). Requests go through the nemesis like any client's: to a member that may
//! be cut off, frozen or dead, with the clients' op timeout.
//!
//! Invariant: every request sent is recorded, with its outcome classified as the clients'
//! are (`client::classify`): an answer lost to a timeout or a broken connection makes a
//! compaction `Unknown`, since it may still be applied.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::{CompactionRequest, RangeRequest};
use tokio::sync::watch;
use tokio::time::{sleep, timeout};
use tonic::Status;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use super::Clock;
use super::client::{KeySpace, classify, lazy_channel};
use crate::check::{CompactOutcome, Compaction, KeyValue, Outcome, PastRead, PastReadOutcome};

/// How often the compactor runs by default. Kubernetes compacts every 5 minutes
/// (`--etcd-compaction-interval`), far longer than a run; every 5 s gives the 40 s CI runs
/// several compactions and a long run dozens, each landing in a different fault. Shorter
/// crowds the history with compactions that find nothing new to compact.
pub const COMPACT_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);

/// How far below the latest revision the compactor compacts. Kubernetes compacts to the
/// revision it saw one interval earlier, which leaves every live watcher alone; this keeps
/// less so that watchers are sometimes cut off: a debug build on the 2-core CI machine writes
/// about 150 revisions a second, so 100 revisions is under a second of history. A streaming
/// watcher (a few revisions behind) or one that just resumed voluntarily is not cut off, one
/// stuck on a dead member for `client::WATCH_IDLE_TIMEOUT` (4 s) usually is.
pub const COMPACT_KEEP_REVISIONS: i64 = 100;

/// Chance that a round asks again for the floor already reached, so the store's refusal
/// ("required revision has been compacted") is exercised and judged. Semi-arbitrary: about
/// one round in five.
const REASK_PROBABILITY: f64 = 0.2;

/// Reads at past revisions per round. Each reads the whole key prefix (a few hundred keys at
/// most in a long run), so a handful is cheap; more would only repeat what they show.
const PAST_READS_PER_ROUND: usize = 3;

/// Past reads pick revisions from this far below the floor up to the latest, so about half
/// fall below the floor when compactions keep up. The same span as the compaction keeps.
const PAST_READ_SPAN_BELOW_FLOOR: i64 = COMPACT_KEEP_REVISIONS;

/// The key the revision probe reads: outside the clients' prefix, never written, so the
/// answer is only a header.
const PROBE_KEY: &str = "torture-compactor-probe";

/// etcd's error text (`ErrCompacted`, skerry copies it) for a request at a compacted
/// revision, on ranges and compactions alike.
const COMPACTED_ERROR: &str = "required revision has been compacted";

/// What the compactor needs.
#[derive(Debug, Clone)]
pub struct CompactorSpec {
    pub endpoints: Vec<String>,
    pub clock: Clock,
    /// Bound on each request, as for the clients.
    pub op_timeout: Duration,
    pub interval: Duration,
    pub seed: u64,
    pub keys: KeySpace,
    /// What the following history reader has confirmed; compactions stay at or below it.
    pub confirmed: Arc<AtomicI64>,
}

/// What the compactor recorded, and for each request the member it went to (for the report).
#[derive(Debug, Default)]
pub struct CompactorRecord {
    pub compactions: Vec<Compaction>,
    pub compaction_members: Vec<usize>,
    pub past_reads: Vec<PastRead>,
    pub past_read_members: Vec<usize>,
}

/// Runs the compactor until `stop` turns true (finishing the round in progress).
pub async fn run_compactor(
    spec: CompactorSpec,
    mut stop: watch::Receiver<bool>,
) -> CompactorRecord {
    let mut record = CompactorRecord::default();
    let channels: Vec<Channel> = match spec.endpoints.iter().map(|url| lazy_channel(url)).collect()
    {
        Ok(channels) => channels,
        Err(e) => {
            warn!("compactor: failed to set up channels: {e:#}");
            return record;
        }
    };
    if channels.is_empty() || spec.interval.is_zero() {
        return record;
    }
    let mut rng = StdRng::seed_from_u64(spec.seed);
    // The highest revision the compactor has seen acknowledged or refused as compacted.
    let mut floor = 0i64;
    loop {
        let pause = spec.interval.mul_f64(rng.random_range(0.5..1.5));
        tokio::select! {
            _ = sleep(pause) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
        let member = rng.random_range(0..channels.len());
        let mut latest = None;
        for offset in 0..channels.len() {
            let channel = &channels[(member + offset) % channels.len()];
            latest = probe(channel, spec.op_timeout).await;
            if latest.is_some() {
                break;
            }
        }
        let Some(latest) = latest else {
            debug!("compactor: no member told its revision; round skipped");
            continue;
        };
        let confirmed = spec.confirmed.load(Ordering::Relaxed);
        let target = (latest - COMPACT_KEEP_REVISIONS).min(confirmed);
        let revision = if floor > 1 && rng.random_bool(REASK_PROBABILITY) {
            Some(floor)
        } else {
            (target > floor).then_some(target)
        };
        if let Some(revision) = revision {
            let compaction = compact(
                &channels[member],
                &spec,
                record.compactions.len() as u64 + 1,
                revision,
            )
            .await;
            if compaction.proven_floor().is_some() {
                floor = floor.max(revision);
            }
            info!(revision, outcome = ?compaction.outcome, member, "compaction");
            record.compactions.push(compaction);
            record.compaction_members.push(member);
        }
        for _ in 0..PAST_READS_PER_ROUND {
            let low = (floor - PAST_READ_SPAN_BELOW_FLOOR).max(1);
            let revision = rng.random_range(low..=latest.max(low));
            let member = rng.random_range(0..channels.len());
            let id = record.past_reads.len() as u64 + 1;
            let read = past_read(&channels[member], &spec, id, revision).await;
            record.past_reads.push(read);
            record.past_read_members.push(member);
        }
    }
    record
}

/// The member's current revision, from the header of a serializable read: what the member
/// has applied, which is all the compactor needs to stay below the latest revision.
async fn probe(channel: &Channel, limit: Duration) -> Option<i64> {
    let request = RangeRequest {
        key: PROBE_KEY.into(),
        serializable: true,
        ..Default::default()
    };
    let response = timeout(limit, KvClient::new(channel.clone()).range(request))
        .await
        .ok()?
        .ok()?;
    response.into_inner().header.map(|header| header.revision)
}

fn is_compacted(status: &Status) -> bool {
    status.message().contains(COMPACTED_ERROR)
}

/// Sends one compaction and records how it ended.
async fn compact(channel: &Channel, spec: &CompactorSpec, id: u64, revision: i64) -> Compaction {
    let request = CompactionRequest {
        revision,
        physical: false,
    };
    let invoke = spec.clock.now_ns();
    let answered = timeout(
        spec.op_timeout,
        KvClient::new(channel.clone()).compact(request),
    )
    .await;
    let now = spec.clock.now_ns();
    let (outcome, complete) = match answered {
        Ok(Ok(_)) => (CompactOutcome::Ok, Some(now)),
        Ok(Err(status)) if is_compacted(&status) => (CompactOutcome::AlreadyCompacted, Some(now)),
        Ok(Err(status)) => {
            debug!(code = ?status.code(), message = status.message(), "compaction failed");
            match classify(&status, true) {
                Outcome::Failed => (CompactOutcome::Failed, Some(now)),
                _ => (CompactOutcome::Unknown, None),
            }
        }
        Err(_) => (CompactOutcome::Unknown, None),
    };
    Compaction {
        id,
        revision,
        invoke,
        complete,
        outcome,
    }
}

/// Reads the whole key prefix at `revision` and records what came back.
async fn past_read(channel: &Channel, spec: &CompactorSpec, id: u64, revision: i64) -> PastRead {
    let (start, end) = spec.keys.range();
    let request = RangeRequest {
        key: start.clone().into(),
        range_end: end.clone().into(),
        revision,
        ..Default::default()
    };
    let invoke = spec.clock.now_ns();
    let answered = timeout(
        spec.op_timeout,
        KvClient::new(channel.clone()).range(request),
    )
    .await;
    let complete = spec.clock.now_ns();
    let outcome = match answered {
        Ok(Ok(response)) => {
            let response = response.into_inner();
            match response.header {
                Some(header) => PastReadOutcome::Ok {
                    header_revision: header.revision,
                    kvs: response
                        .kvs
                        .iter()
                        .map(|kv| KeyValue {
                            key: kv.key.to_vec(),
                            value: kv.value.to_vec(),
                            mod_revision: kv.mod_revision,
                        })
                        .collect(),
                },
                // A server must always send a header; judge it as an answer with none.
                None => PastReadOutcome::Ok {
                    header_revision: 0,
                    kvs: Vec::new(),
                },
            }
        }
        Ok(Err(status)) if is_compacted(&status) => PastReadOutcome::Compacted,
        Ok(Err(_)) | Err(_) => PastReadOutcome::Failed,
    };
    PastRead {
        id,
        revision,
        range: (start, end),
        invoke,
        complete,
        outcome,
    }
}
