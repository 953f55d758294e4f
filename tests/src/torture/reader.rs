//! The history readers: watches of the whole key prefix from revision 1 that run for the whole
//! run and record the committed history as it happens, so a compaction during the run does
//! not take away what the checkers judge against.
//!
//! - The *following* reader reads from whichever member answers, moving on when its stream
//!   fails or brings no event for `FOLLOW_STALL` (a member cut off from the leader still
//!   sends progress notifications at its stale revision). Its history is the committed
//!   history the checkers use. The compactor never compacts above what this reader has
//!   confirmed (`confirmed`: everything up to it was received, by events or a progress
//!   notification), so it is never cut off: a compacted error here means the store compacted
//!   what nobody asked it to, and the run is not checked.
//! - One *pinned* reader per member reads from that member only, waiting for it through
//!   kills and membership changes, for the replicas check. The compactor does not wait for
//!   pinned readers: a member down or cut off for a while would hold compaction back for the
//!   whole cluster, which is what this harness wants to exercise. So a pinned reader can be
//!   cut off; it resumes from the compact revision and records the revisions it lost as a
//!   hole (up to and including the compact revision, whose deletes compaction drops), which
//!   the replicas check skips.
//!
//! The trade-off against reading every member's history from revision 1 at the end, with no
//! compaction: the committed history is as complete as before (every revision, read live),
//! but the replicas check compares each member only where its pinned reader did not lose
//! revisions to a compaction; the report says how many revisions each comparison covered.
//!
//! Invariant: `next` (the lowest revision not yet received) only grows, and every recorded
//! event is at or above the `next` of the moment it arrived, so events are in revision order
//! and unique; an event below it is recorded as an anomaly instead (the store delivered it
//! twice or out of order).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use skerry_store::pb::etcdserverpb::watch_client::WatchClient;
use skerry_store::pb::etcdserverpb::watch_request::RequestUnion;
use skerry_store::pb::etcdserverpb::{WatchCreateRequest, WatchRequest};
use skerry_store::pb::mvccpb::event::EventType;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep, timeout};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tracing::{debug, warn};

use super::client::{KeySpace, lazy_channel};
use crate::check::{CommittedEvent, EventKind};

/// A stream with no message for this long is taken for dead and reopened. Progress
/// notifications come every second (`cluster::PROGRESS_NOTIFY_INTERVAL`), so a live stream is
/// never this quiet; the same bound as the watchers'.
const READER_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// The following reader moves to another member when no event arrived for this long. Clients
/// write hundreds of times a second, so a member that delivers nothing for two seconds is
/// most likely cut off or lagging; moving costs one stream reopen. Twice the progress
/// notification interval, so a healthy but idle cluster (the end of a run) is not left before
/// a notification could confirm it.
const FOLLOW_STALL: Duration = Duration::from_secs(2);

/// Bound on opening a watch stream.
const READER_OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause after a failed stream before the next attempt, so a dead member is not hammered.
const READER_RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Requests queued on a reader's stream: only the create is sent.
const READER_REQUESTS_MAX: usize = 2;

/// Anomalies kept per reader; more are counted. One is enough to fail a run.
const ANOMALIES_MAX: usize = 10;

/// Which members a reader reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderMode {
    /// Any member, moving on when one fails or stalls.
    Follow,
    /// Only member `index`.
    Pinned(usize),
}

/// What one reader needs.
#[derive(Debug, Clone)]
pub struct ReaderSpec {
    pub mode: ReaderMode,
    /// Every member's client URL.
    pub endpoints: Vec<String>,
    pub keys: KeySpace,
    /// The highest revision up to which the reader has received everything (0 before the
    /// first), published as it advances.
    pub confirmed: Arc<AtomicI64>,
}

/// The history one reader recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadHistory {
    /// Everything up to this revision was received, except `holes`.
    pub confirmed: i64,
    /// In revision order, each once.
    pub events: Vec<CommittedEvent>,
    /// Revision ranges `(low, high)`, inclusive, lost because the stream was compacted while
    /// it still needed them.
    pub holes: Vec<(i64, i64)>,
    /// Streams opened after the first.
    pub resumes: usize,
    /// What the store should never do to a reader (see the module invariant), at most
    /// `ANOMALIES_MAX`, and how many there were.
    pub anomalies: Vec<String>,
    pub anomaly_count: usize,
}

impl ReadHistory {
    /// Whether `revision` was received (it lies at or below `confirmed` and in no hole).
    pub fn covers(&self, revision: i64) -> bool {
        revision >= 1
            && revision <= self.confirmed
            && !self
                .holes
                .iter()
                .any(|(low, high)| (*low..=*high).contains(&revision))
    }

    fn anomaly(&mut self, text: String) {
        warn!(anomaly = %text, "history reader");
        if self.anomalies.len() < ANOMALIES_MAX {
            self.anomalies.push(text);
        }
        self.anomaly_count += 1;
    }
}

/// How one stream ended.
enum StreamEnd {
    Stopped,
    Failed,
    Stalled,
    Compacted(i64),
}

/// Runs one reader until `stop` turns true; returns what it read.
pub async fn run_reader(spec: ReaderSpec, mut stop: watch::Receiver<bool>) -> ReadHistory {
    let mut history = ReadHistory::default();
    let channels: Vec<Channel> = match spec.endpoints.iter().map(|url| lazy_channel(url)).collect()
    {
        Ok(channels) => channels,
        Err(e) => {
            history.anomaly(format!("could not set up channels: {e:#}"));
            return history;
        }
    };
    if channels.is_empty() {
        return history;
    }
    let mut current = match spec.mode {
        ReaderMode::Follow => 0,
        ReaderMode::Pinned(index) => index.min(channels.len() - 1),
    };
    let (start, end) = spec.keys.range();
    let mut next = 1i64;
    let mut first = true;
    loop {
        if *stop.borrow() {
            break;
        }
        if !first {
            history.resumes += 1;
        }
        first = false;
        let stream = Stream {
            channel: &channels[current],
            range: (&start, &end),
            follow: spec.mode == ReaderMode::Follow,
        };
        let end = stream
            .read(&mut history, &mut next, &spec.confirmed, &mut stop)
            .await;
        match end {
            StreamEnd::Stopped => break,
            StreamEnd::Compacted(compact_revision) => {
                if compact_revision > next {
                    // The compact revision itself is part of the hole: etcd 3.4.23's
                    // compaction drops a tombstone at exactly the compact revision, so a watch
                    // resumed there gets that revision's puts without its deletes
                    // (etcd-io/etcd#18089, fixed by #18274 in later releases; seen here as
                    // "compact 3913", then no `Delete` at 3913 on the resumed reader). skerry
                    // keeps that tombstone, as fixed etcd does. Events at the compact revision
                    // are still recorded, just not compared.
                    history.holes.push((next, compact_revision));
                    next = compact_revision;
                } else {
                    history.anomaly(format!(
                        "compacted at {compact_revision} while reading from {next}"
                    ));
                }
                if spec.mode == ReaderMode::Follow {
                    history.anomaly(format!(
                        "the following reader was compacted at {compact_revision}, above what \
                         it had confirmed"
                    ));
                }
            }
            StreamEnd::Failed | StreamEnd::Stalled => {
                if spec.mode == ReaderMode::Follow {
                    current = (current + 1) % channels.len();
                }
                sleep(READER_RETRY_BACKOFF).await;
            }
        }
    }
    history
}

/// One watch stream of a reader.
struct Stream<'a> {
    channel: &'a Channel,
    range: (&'a [u8], &'a [u8]),
    follow: bool,
}

impl Stream<'_> {
    /// Reads from `next` into `history` until the stream ends; see `StreamEnd`.
    async fn read(
        &self,
        history: &mut ReadHistory,
        next: &mut i64,
        confirmed: &AtomicI64,
        stop: &mut watch::Receiver<bool>,
    ) -> StreamEnd {
        let (requests, requests_rx) = mpsc::channel(READER_REQUESTS_MAX);
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: self.range.0.to_vec().into(),
                range_end: self.range.1.to_vec().into(),
                start_revision: *next,
                progress_notify: true,
                ..Default::default()
            })),
        };
        if requests.send(create).await.is_err() {
            return StreamEnd::Failed;
        }
        let mut client = WatchClient::new(self.channel.clone());
        let opened = timeout(
            READER_OPEN_TIMEOUT,
            client.watch(ReceiverStream::new(requests_rx)),
        )
        .await;
        let mut stream = match opened {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                debug!(message = status.message(), "history reader: open failed");
                return StreamEnd::Failed;
            }
            Err(_) => return StreamEnd::Failed,
        };
        let mut last_event_at = Instant::now();
        loop {
            let stall_at = last_event_at + FOLLOW_STALL;
            let message = tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => return StreamEnd::Stopped,
                _ = tokio::time::sleep_until(stall_at), if self.follow => {
                    return StreamEnd::Stalled;
                }
                message = timeout(READER_IDLE_TIMEOUT, stream.message()) => message,
            };
            let response = match message {
                Ok(Ok(Some(response))) => response,
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return StreamEnd::Failed,
            };
            if response.canceled {
                if response.compact_revision > 0 {
                    return StreamEnd::Compacted(response.compact_revision);
                }
                return StreamEnd::Failed;
            }
            if response.created {
                continue;
            }
            if response.events.is_empty() {
                // A progress notification: everything up to its revision was delivered.
                if let Some(header) = response.header
                    && header.revision >= *next
                {
                    *next = header.revision + 1;
                    confirmed.fetch_max(header.revision, Ordering::Relaxed);
                    history.confirmed = history.confirmed.max(header.revision);
                }
                continue;
            }
            last_event_at = Instant::now();
            let mut highest = None;
            for event in response.events {
                let Some(kv) = event.kv else {
                    continue;
                };
                if kv.mod_revision < *next {
                    history.anomaly(format!(
                        "event at {} arrived while reading from {}",
                        kv.mod_revision, *next
                    ));
                    continue;
                }
                let kind = if event.r#type == EventType::Delete as i32 {
                    EventKind::Delete
                } else {
                    EventKind::Put
                };
                highest = highest.max(Some(kv.mod_revision));
                history.events.push(CommittedEvent {
                    revision: kv.mod_revision,
                    key: kv.key.to_vec(),
                    kind,
                    value: kv.value.to_vec(),
                });
            }
            // A revision's events arrive in one response, so after it the revision is whole.
            if let Some(highest) = highest {
                *next = highest + 1;
                confirmed.fetch_max(highest, Ordering::Relaxed);
                history.confirmed = history.confirmed.max(highest);
            }
        }
    }
}

/// Whether the members' histories agree with `reference` (the following reader's) on every
/// revision up to `until` that both read; `Err` names the first difference, or a member whose
/// reader never reached `until`. On success, how many revisions each member was compared on.
pub fn compare_replicas(
    reference: &ReadHistory,
    members: &[(String, ReadHistory)],
    until: i64,
) -> Result<Vec<(String, i64)>, String> {
    let mut compared = Vec::new();
    for (name, member) in members {
        if member.confirmed < until {
            return Err(format!(
                "{name}'s history reader reached only revision {} of {until}",
                member.confirmed
            ));
        }
        let both = |event: &&CommittedEvent| {
            event.revision <= until
                && reference.covers(event.revision)
                && member.covers(event.revision)
        };
        let ours: Vec<&CommittedEvent> = reference.events.iter().filter(both).collect();
        let theirs: Vec<&CommittedEvent> = member.events.iter().filter(both).collect();
        let differs = ours
            .iter()
            .zip(&theirs)
            .position(|(a, b)| a != b)
            .or_else(|| (ours.len() != theirs.len()).then(|| ours.len().min(theirs.len())));
        if let Some(index) = differs {
            let describe = |events: &[&CommittedEvent]| {
                events.get(index).map_or("nothing".to_owned(), |event| {
                    format!(
                        "{:?} {} at {} = {}",
                        event.kind,
                        crate::check::history::show(&event.key),
                        event.revision,
                        crate::check::history::show(&event.value)
                    )
                })
            };
            return Err(format!(
                "committed histories differ at compared event {index}: the cluster's has {}, \
                 {name} has {}",
                describe(&ours),
                describe(&theirs)
            ));
        }
        let covered = (1..=until)
            .filter(|revision| reference.covers(*revision) && member.covers(*revision))
            .count();
        compared.push((name.clone(), i64::try_from(covered).unwrap_or(i64::MAX)));
    }
    Ok(compared)
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

    fn read(confirmed: i64, holes: Vec<(i64, i64)>, events: Vec<CommittedEvent>) -> ReadHistory {
        ReadHistory {
            confirmed,
            events,
            holes,
            ..ReadHistory::default()
        }
    }

    #[test]
    fn replicas_are_compared_where_both_read() {
        let full = read(4, vec![], vec![event(2, "a"), event(3, "b"), event(4, "c")]);
        // Cut off by a compaction at 4 while it needed 2: only 4 is compared.
        let cut = read(4, vec![(2, 3)], vec![event(4, "c")]);
        let diverged = read(4, vec![], vec![event(2, "a"), event(3, "x"), event(4, "c")]);
        let lost = read(4, vec![], vec![event(2, "a"), event(4, "c")]);
        let behind = read(3, vec![], vec![event(2, "a"), event(3, "b")]);
        let members = |history: ReadHistory| vec![("n2".to_owned(), history)];
        assert_eq!(
            compare_replicas(&full, &members(full.clone()), 4),
            Ok(vec![("n2".to_owned(), 4)])
        );
        assert_eq!(
            compare_replicas(&full, &members(cut), 4),
            Ok(vec![("n2".to_owned(), 2)])
        );
        assert!(compare_replicas(&full, &members(diverged), 4).is_err());
        assert!(compare_replicas(&full, &members(lost), 4).is_err());
        assert!(compare_replicas(&full, &members(behind), 4).is_err());
    }

    #[test]
    fn coverage_excludes_holes_and_what_was_not_reached() {
        let history = read(10, vec![(3, 5)], vec![]);
        assert!(history.covers(2));
        assert!(!history.covers(4));
        assert!(history.covers(6));
        assert!(!history.covers(11));
        assert!(!history.covers(0));
    }
}
