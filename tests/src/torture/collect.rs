//! The end of a run, read with faults healed and clients stopped: the final state (a
//! linearizable range over the key prefix) and each member's committed history (a watch of
//! the prefix from revision 1, or from the earliest revision a member retains, up to the final
//! revision), compared across members.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use skerry_store::pb::etcdserverpb::kv_client::KvClient;
use skerry_store::pb::etcdserverpb::watch_client::WatchClient;
use skerry_store::pb::etcdserverpb::watch_request::RequestUnion;
use skerry_store::pb::etcdserverpb::{RangeRequest, WatchCreateRequest, WatchRequest};
use skerry_store::pb::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};
use tokio_stream::wrappers::ReceiverStream;

use super::client::{KeySpace, lazy_channel};
use crate::check::history::show;
use crate::check::{CommittedEvent, CommittedHistory, EventKind, FinalState, Versioned};

/// How long the final read may keep retrying across members. The cluster was just found
/// healthy, so one attempt normally does; the margin covers an election right after.
const FINAL_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on one attempt of the final read, and on opening the history watch.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long reading one member's committed history may take: tens of thousands of events
/// from a debug build, and a lagging member catching up first.
const HISTORY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause between attempts.
const RETRY_INTERVAL: Duration = Duration::from_millis(200);

/// Requests queued on the history watch's stream: only the create is sent.
const WATCH_REQUESTS_MAX: usize = 2;

/// The final state of every key under the prefix and the revision it was read at.
pub async fn final_state(endpoints: &[String], keys: &KeySpace) -> Result<(FinalState, i64)> {
    let (start, end) = keys.range();
    let deadline = Instant::now() + FINAL_READ_TIMEOUT;
    let mut attempt = 0usize;
    loop {
        let endpoint = &endpoints[attempt % endpoints.len()];
        attempt += 1;
        let read = async {
            let request = RangeRequest {
                key: start.clone().into(),
                range_end: end.clone().into(),
                ..Default::default()
            };
            let response = KvClient::new(lazy_channel(endpoint)?)
                .range(request)
                .await
                .context("range")?
                .into_inner();
            let revision = response.header.context("no header")?.revision;
            let state: FinalState = response
                .kvs
                .iter()
                .map(|kv| {
                    let versioned = Versioned {
                        value: kv.value.to_vec(),
                        mod_revision: kv.mod_revision,
                    };
                    (kv.key.to_vec(), versioned)
                })
                .collect();
            anyhow::Ok((state, revision))
        };
        match timeout(ATTEMPT_TIMEOUT, read).await {
            Ok(Ok(read)) => return Ok(read),
            Ok(Err(e)) if Instant::now() > deadline => return Err(e),
            Err(_) if Instant::now() > deadline => bail!("final read timed out"),
            _ => sleep(RETRY_INTERVAL).await,
        }
    }
}

/// The committed events of the prefix on the member at `endpoint`, from revision 1 (or the
/// earliest it retains) up to `until`.
pub async fn committed_history(
    endpoint: &str,
    keys: &KeySpace,
    until: i64,
) -> Result<CommittedHistory> {
    let mut from = 1;
    let deadline = Instant::now() + HISTORY_READ_TIMEOUT;
    loop {
        match read_history(endpoint, keys, from, until, deadline).await? {
            Read::Done(events) => {
                return Ok(CommittedHistory {
                    from_revision: from,
                    events,
                    compactions: Vec::new(),
                });
            }
            Read::Compacted(compact_revision) if compact_revision > from => {
                from = compact_revision;
            }
            Read::Compacted(compact_revision) => {
                bail!("compacted at {compact_revision}, watching from {from}")
            }
        }
    }
}

enum Read {
    Done(Vec<CommittedEvent>),
    Compacted(i64),
}

async fn read_history(
    endpoint: &str,
    keys: &KeySpace,
    from: i64,
    until: i64,
    deadline: Instant,
) -> Result<Read> {
    let mut events = Vec::new();
    if until <= from {
        return Ok(Read::Done(events));
    }
    let (start, end) = keys.range();
    let (requests, requests_rx) = mpsc::channel(WATCH_REQUESTS_MAX);
    requests
        .send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: start.into(),
                range_end: end.into(),
                start_revision: from,
                progress_notify: true,
                ..Default::default()
            })),
        })
        .await
        .context("queue watch create")?;
    let mut client = WatchClient::new(lazy_channel(endpoint)?);
    let mut stream = timeout(
        ATTEMPT_TIMEOUT,
        client.watch(ReceiverStream::new(requests_rx)),
    )
    .await
    .context("watch open timed out")?
    .context("open watch")?
    .into_inner();
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let response = timeout(remaining, stream.message())
            .await
            .with_context(|| {
                format!(
                    "timed out with {} events, the last at {:?}",
                    events.len(),
                    events.last().map(|e: &CommittedEvent| e.revision)
                )
            })?
            .context("watch stream")?
            .context("watch stream ended")?;
        if response.canceled {
            if response.compact_revision > 0 {
                return Ok(Read::Compacted(response.compact_revision));
            }
            bail!("watch cancelled: {}", response.cancel_reason);
        }
        if response.created {
            continue;
        }
        let header_revision = response.header.map_or(0, |header| header.revision);
        if response.events.is_empty() && header_revision >= until {
            // A progress notification: everything up to `until` has arrived.
            return Ok(Read::Done(events));
        }
        for event in response.events {
            let Some(kv) = event.kv else {
                continue;
            };
            if kv.mod_revision > until {
                return Ok(Read::Done(events));
            }
            let kind = if event.r#type == EventType::Delete as i32 {
                EventKind::Delete
            } else {
                EventKind::Put
            };
            events.push(CommittedEvent {
                revision: kv.mod_revision,
                key: kv.key.to_vec(),
                kind,
                value: kv.value.to_vec(),
            });
            if kv.mod_revision == until {
                return Ok(Read::Done(events));
            }
        }
    }
}

/// Whether every member's committed history agrees where they overlap; `Err` names the first
/// difference.
pub fn compare_replicas(histories: &[(String, CommittedHistory)]) -> Result<(), String> {
    let Some(from) = histories.iter().map(|(_, h)| h.from_revision).max() else {
        return Ok(());
    };
    let overlap = |history: &CommittedHistory| -> Vec<CommittedEvent> {
        history
            .events
            .iter()
            .filter(|event| event.revision >= from)
            .cloned()
            .collect()
    };
    let Some((first_endpoint, first)) = histories.first() else {
        return Ok(());
    };
    let reference = overlap(first);
    for (endpoint, history) in &histories[1..] {
        let other = overlap(history);
        let differs = reference
            .iter()
            .zip(&other)
            .position(|(a, b)| a != b)
            .or_else(|| (reference.len() != other.len()).then(|| reference.len().min(other.len())));
        if let Some(index) = differs {
            let describe = |events: &[CommittedEvent]| {
                events.get(index).map_or("nothing".to_owned(), |event| {
                    format!(
                        "{:?} {} at {} = {}",
                        event.kind,
                        show(&event.key),
                        event.revision,
                        show(&event.value)
                    )
                })
            };
            return Err(format!(
                "committed histories differ at event {index} (from revision {from}): \
                 {first_endpoint} has {}, {endpoint} has {}",
                describe(&reference),
                describe(&other)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(revision: i64, value: &str) -> CommittedEvent {
        CommittedEvent {
            revision,
            key: b"k".to_vec(),
            kind: EventKind::Put,
            value: value.as_bytes().to_vec(),
        }
    }

    fn history(from: i64, events: Vec<CommittedEvent>) -> CommittedHistory {
        CommittedHistory {
            from_revision: from,
            events,
            compactions: Vec::new(),
        }
    }

    #[test]
    fn replicas_are_compared_where_they_overlap() {
        let full = history(1, vec![event(2, "a"), event(3, "b")]);
        let snapshot = history(3, vec![event(3, "b")]);
        let diverged = history(1, vec![event(2, "a"), event(3, "c")]);
        let short = history(1, vec![event(2, "a")]);
        assert!(compare_replicas(&[("x".into(), full.clone()), ("y".into(), snapshot)]).is_ok());
        assert!(compare_replicas(&[("x".into(), full.clone()), ("y".into(), diverged)]).is_err());
        assert!(compare_replicas(&[("x".into(), full), ("y".into(), short)]).is_err());
    }
}
