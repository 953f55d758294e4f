//! The watch hub: every watcher of every stream, and the delivery of committed events to them.
//!
//! A watcher is *synced* when everything up to the published revision has been queued to its
//! stream; the writer then hands it new events directly ([`WatchHub::notify`]). A watcher is
//! *unsynced* when it starts in the past or fell behind because its stream's queue was full;
//! the syncer ([`crate::store`]) replays its history from disk in bounded rounds and moves it
//! back to synced once caught up. This is etcd's watchable store: a slow watcher never blocks
//! the writer or the other watchers, it only falls back to reading history.
//!
//! Invariants: events reach each watcher in revision order with no gap or duplicate, because
//! exactly one of the writer (synced) or the syncer (unsynced) queues to a watcher at a time,
//! under the hub lock; a progress notification queued for a stream claims the published
//! revision only when every watcher of that stream is synced, so no event at or below it is
//! still to come.
//!
//! When a snapshot install replaces the history under the hub, [`WatchHub::jump`] sends every
//! synced watcher to the syncer, which replays the new history from where each watcher
//! stands; the hub's epoch makes the syncer drop a replay it prepared before the jump.

use std::collections::{BTreeSet, HashMap, HashSet};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::index::KeyRange;
use crate::pb::etcdserverpb::{
    ResponseHeader, WatchCreateRequest, WatchResponse, watch_create_request,
};
use crate::pb::mvccpb::{Event, event::EventType};

/// Responses queued per watch stream before its watchers are treated as slow (etcd's
/// `chanBufLen` is 128). Larger absorbs longer bursts per stream at the cost of memory per
/// stream; smaller sends slow watchers to the disk-replay path sooner.
pub const WATCH_STREAM_QUEUE_MAX: usize = 128;

/// The watch id etcd puts on a progress notification that answers `WatchProgressRequest`:
/// it belongs to no single watcher (clientv3's `InvalidWatchID`).
pub const STREAM_PROGRESS_WATCH_ID: i64 = -1;

/// What the hub queues for a stream: one response, and whether its watcher accepts fragments.
#[derive(Debug)]
pub struct WatchOut {
    pub response: WatchResponse,
    pub fragment: bool,
}

type WatcherKey = (u64, i64);

#[derive(Debug)]
struct Watcher {
    range: KeyRange,
    /// Events below this revision are not for this watcher (its start revision, or what it
    /// has already been sent while unsynced).
    next_rev: i64,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    progress_notify: bool,
    fragment: bool,
    synced: bool,
}

impl Watcher {
    /// Whether this member's store has reached the watcher's start: a watcher that asked to
    /// start beyond the published revision (it saw later revisions on another member, and
    /// this one is behind) gets no progress notification until it has, since a progress
    /// revision below what the client already saw would move its view backwards.
    fn reached(&self, published: i64) -> bool {
        self.next_rev <= published.saturating_add(1)
    }

    fn wants(&self, event: &Event) -> bool {
        let Some(kv) = &event.kv else { return false };
        if kv.mod_revision < self.next_rev || !self.range.contains(&kv.key) {
            return false;
        }
        if event.r#type == EventType::Delete as i32 {
            !self.no_delete
        } else {
            !self.no_put
        }
    }

    fn shape(&self, event: &Event) -> Event {
        if self.prev_kv {
            event.clone()
        } else {
            Event {
                r#type: event.r#type,
                kv: event.kv.clone(),
                prev_kv: None,
            }
        }
    }
}

#[derive(Debug)]
struct Stream {
    /// Bounded: a full queue marks the stream's watchers as slow instead of blocking.
    tx: mpsc::Sender<WatchOut>,
    watch_ids: BTreeSet<i64>,
    next_watch_id: i64,
    /// A `WatchProgressRequest` arrived while a watcher was unsynced; answer it when all are.
    progress_pending: bool,
}

#[derive(Debug, Default)]
struct HubInner {
    current_rev: i64,
    /// Bumped by every [`WatchHub::jump`]: history the syncer read in an earlier epoch may
    /// be history the jump replaced, and is not delivered.
    epoch: u64,
    next_stream_id: u64,
    streams: HashMap<u64, Stream>,
    watchers: HashMap<WatcherKey, Watcher>,
    synced_keys: HashMap<Bytes, HashSet<WatcherKey>>,
    synced_ranges: HashSet<WatcherKey>,
    unsynced: BTreeSet<WatcherKey>,
}

/// Why a watch could not be created.
#[derive(Debug, PartialEq, Eq)]
pub enum CreateError {
    /// The requested watch id is in use on this stream.
    DuplicateId,
    /// The stream is gone.
    StreamClosed,
}

/// What one syncer round serves: unsynced watchers, as of one published revision and epoch.
#[derive(Debug, Clone)]
pub struct UnsyncedRound {
    pub watchers: Vec<UnsyncedWatcher>,
    /// The published revision: the round replays history up to it.
    pub current_rev: i64,
    /// The hub's epoch; pass it back to [`WatchHub::deliver_history`] and
    /// [`WatchHub::compacted`], which ignore a round from an earlier epoch.
    pub epoch: u64,
}

/// One unsynced watcher's state, as the syncer needs it to read its history.
#[derive(Debug, Clone)]
pub struct UnsyncedWatcher {
    pub stream: u64,
    pub watch_id: i64,
    pub next_rev: i64,
    pub range: KeyRange,
    pub prev_kv: bool,
}

pub struct WatchHub {
    /// One lock for all watcher state: the writer's notify and the syncer's hand-over must be
    /// atomic with respect to each other. Sections are short and never await.
    inner: Mutex<HubInner>,
    header: ResponseHeader,
    /// Wakes the syncer when a watcher becomes unsynced.
    pub(crate) sync_wakeup: tokio::sync::Notify,
}

impl WatchHub {
    pub fn new(current_rev: i64, cluster_id: u64, member_id: u64, raft_term: u64) -> Self {
        Self {
            inner: Mutex::new(HubInner {
                current_rev,
                ..Default::default()
            }),
            header: ResponseHeader {
                cluster_id,
                member_id,
                revision: 0,
                raft_term,
            },
            sync_wakeup: tokio::sync::Notify::new(),
        }
    }

    fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            ..self.header
        })
    }

    /// Opens a stream; its responses arrive on the receiver.
    pub fn open_stream(&self) -> (u64, mpsc::Sender<WatchOut>, mpsc::Receiver<WatchOut>) {
        let (tx, rx) = mpsc::channel(WATCH_STREAM_QUEUE_MAX);
        let mut inner = self.inner.lock();
        let id = inner.next_stream_id;
        inner.next_stream_id += 1;
        inner.streams.insert(
            id,
            Stream {
                tx: tx.clone(),
                watch_ids: BTreeSet::new(),
                next_watch_id: 0,
                progress_pending: false,
            },
        );
        (id, tx, rx)
    }

    /// Removes a stream and all its watchers.
    pub fn close_stream(&self, stream: u64) {
        let mut inner = self.inner.lock();
        if let Some(s) = inner.streams.remove(&stream) {
            for watch_id in s.watch_ids {
                inner.remove_watcher((stream, watch_id));
            }
        }
    }

    /// Creates a watcher and queues its `created` response through `permit`, under the hub
    /// lock, so that no event can be queued for it before that response.
    pub fn create(
        &self,
        stream: u64,
        req: &WatchCreateRequest,
        permit: mpsc::Permit<'_, WatchOut>,
    ) -> Result<i64, CreateError> {
        let mut inner = self.inner.lock();
        let current = inner.current_rev;
        let s = inner
            .streams
            .get_mut(&stream)
            .ok_or(CreateError::StreamClosed)?;
        let watch_id = if req.watch_id != 0 {
            if s.watch_ids.contains(&req.watch_id) {
                return Err(CreateError::DuplicateId);
            }
            req.watch_id
        } else {
            while s.watch_ids.contains(&s.next_watch_id) {
                s.next_watch_id += 1;
            }
            s.next_watch_id
        };
        s.watch_ids.insert(watch_id);
        let filters = |f: watch_create_request::FilterType| req.filters.contains(&(f as i32));
        // A start revision at or below the published one needs history; anything else (0 is
        // "from now") is served live from the next revision.
        let synced = req.start_revision <= 0 || req.start_revision > current;
        let next_rev = if req.start_revision <= 0 {
            current + 1
        } else {
            req.start_revision
        };
        let watcher = Watcher {
            // Copies: a watch lives for hours, and the request's key fields are slices of its
            // whole receive buffer (see `KeyIndex::push`).
            range: KeyRange::new(
                &Bytes::copy_from_slice(&req.key),
                &Bytes::copy_from_slice(&req.range_end),
            ),
            next_rev,
            no_put: filters(watch_create_request::FilterType::Noput),
            no_delete: filters(watch_create_request::FilterType::Nodelete),
            prev_kv: req.prev_kv,
            progress_notify: req.progress_notify,
            fragment: req.fragment,
            synced,
        };
        permit.send(WatchOut {
            response: WatchResponse {
                header: self.header(current),
                watch_id,
                created: true,
                ..Default::default()
            },
            fragment: false,
        });
        let key = (stream, watch_id);
        inner.insert_watcher(key, watcher);
        drop(inner);
        if !synced {
            self.sync_wakeup.notify_one();
        }
        Ok(watch_id)
    }

    /// Cancels a watcher; returns whether it existed.
    pub fn cancel(&self, stream: u64, watch_id: i64) -> bool {
        let mut inner = self.inner.lock();
        let existed = inner
            .streams
            .get_mut(&stream)
            .is_some_and(|s| s.watch_ids.remove(&watch_id));
        if existed {
            inner.remove_watcher((stream, watch_id));
        }
        existed
    }

    /// Answers `WatchProgressRequest`: at once if every watcher of the stream is synced,
    /// otherwise as soon as they are.
    pub fn request_progress(&self, stream: u64) {
        let mut inner = self.inner.lock();
        if let Some(s) = inner.streams.get_mut(&stream) {
            s.progress_pending = true;
        }
        inner.answer_progress(stream, &self.header);
    }

    /// Hands committed events (ordered by revision) to synced watchers and publishes
    /// `revision` as the hub's current revision.
    pub fn notify(&self, events: &[Event], revision: i64) {
        let mut inner = self.inner.lock();
        let mut batches: HashMap<WatcherKey, Vec<Event>> = HashMap::new();
        if !inner.watchers.is_empty() {
            for event in events {
                let Some(kv) = &event.kv else { continue };
                let single = inner.synced_keys.get(kv.key.as_ref());
                for key in single
                    .into_iter()
                    .flatten()
                    .chain(inner.synced_ranges.iter())
                {
                    if let Some(w) = inner.watchers.get(key)
                        && w.wants(event)
                    {
                        batches.entry(*key).or_default().push(w.shape(event));
                    }
                }
            }
        }
        inner.current_rev = revision;
        let mut closed = Vec::new();
        let mut fell_behind = false;
        for (key, events) in batches {
            let Some(stream) = inner.streams.get(&key.0) else {
                continue;
            };
            let Some(w) = inner.watchers.get(&key) else {
                continue;
            };
            let first_rev = events
                .first()
                .and_then(|e| e.kv.as_ref())
                .map_or(revision, |kv| kv.mod_revision);
            let out = WatchOut {
                response: WatchResponse {
                    header: self.header(revision),
                    watch_id: key.1,
                    events,
                    ..Default::default()
                },
                fragment: w.fragment,
            };
            match stream.tx.try_send(out) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    inner.unsync(key, first_rev);
                    fell_behind = true;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => closed.push(key.0),
            }
        }
        for stream in closed {
            if let Some(s) = inner.streams.remove(&stream) {
                for watch_id in s.watch_ids {
                    inner.remove_watcher((stream, watch_id));
                }
            }
        }
        drop(inner);
        if fell_behind {
            self.sync_wakeup.notify_one();
        }
    }

    /// Periodic progress: every synced watcher that asked for it hears the current revision.
    pub fn progress_tick(&self) {
        let inner = self.inner.lock();
        let revision = inner.current_rev;
        for (key, w) in &inner.watchers {
            if w.synced
                && w.progress_notify
                && w.reached(revision)
                && let Some(s) = inner.streams.get(&key.0)
            {
                // A full queue means events are flowing: progress is implied, skip it.
                let _ = s.tx.try_send(WatchOut {
                    response: WatchResponse {
                        header: self.header(revision),
                        watch_id: key.1,
                        ..Default::default()
                    },
                    fragment: false,
                });
            }
        }
    }

    /// The unsynced watchers to replay (at most `limit`), the published revision and epoch.
    pub fn unsynced(&self, limit: usize) -> UnsyncedRound {
        let inner = self.inner.lock();
        let watchers = inner
            .unsynced
            .iter()
            .take(limit)
            .filter_map(|key| {
                inner.watchers.get(key).map(|w| UnsyncedWatcher {
                    stream: key.0,
                    watch_id: key.1,
                    next_rev: w.next_rev,
                    range: w.range.clone(),
                    prev_kv: w.prev_kv,
                })
            })
            .collect();
        UnsyncedRound {
            watchers,
            current_rev: inner.current_rev,
            epoch: inner.epoch,
        }
    }

    /// The history under the hub was replaced (a snapshot install) and now reaches
    /// `revision`. Every event through the old published revision was already queued to each
    /// synced watcher, so each moves to the syncer with `next_rev` one past it, and replays
    /// the new history from there (or hears that it was compacted away). Unsynced watchers
    /// keep their place. Call it after the new history and index are readable.
    pub fn jump(&self, revision: i64) {
        let mut inner = self.inner.lock();
        let next_rev = inner.current_rev + 1;
        let synced: Vec<WatcherKey> = inner
            .watchers
            .iter()
            .filter(|(_, w)| w.synced)
            .map(|(key, _)| *key)
            .collect();
        for key in synced {
            // A watcher that starts in the future keeps its start.
            let start = inner.watchers.get(&key).map_or(next_rev, |w| w.next_rev);
            inner.unsync(key, start.max(next_rev));
        }
        inner.current_rev = revision;
        inner.epoch += 1;
        drop(inner);
        self.sync_wakeup.notify_one();
    }

    /// The watcher asked for history below the compacted revision: tell it and drop it, as
    /// etcd does (a `canceled` response carrying `compact_revision`).
    ///
    /// Ignored when the hub jumped since `epoch` ([`UnsyncedRound::epoch`]): the next round
    /// decides again against the new history.
    pub fn compacted(&self, epoch: u64, stream: u64, watch_id: i64, compact_revision: i64) {
        let mut inner = self.inner.lock();
        if inner.epoch != epoch {
            return;
        }
        let revision = inner.current_rev;
        let Some(s) = inner.streams.get_mut(&stream) else {
            return;
        };
        let sent = s.tx.try_send(WatchOut {
            response: WatchResponse {
                header: self.header(revision),
                watch_id,
                canceled: true,
                compact_revision,
                cancel_reason: crate::error::StoreError::Compacted { compact_revision }.to_string(),
                ..Default::default()
            },
            fragment: false,
        });
        // If the queue is full the watcher stays unsynced and the next round tries again.
        if sent.is_ok() {
            s.watch_ids.remove(&watch_id);
            inner.remove_watcher((stream, watch_id));
        }
    }

    /// Queues replayed history (`events`, every one at or after the watcher's `next_rev`, up
    /// to revision `through`) and, when nothing newer was published meanwhile, moves the
    /// watcher back to synced. Returns false if the queue was full, or the hub jumped since
    /// `epoch` ([`UnsyncedRound::epoch`]) so the events may be of replaced history: retry
    /// with a new round.
    pub fn deliver_history(
        &self,
        epoch: u64,
        stream: u64,
        watch_id: i64,
        events: Vec<Event>,
        through: i64,
    ) -> bool {
        let mut inner = self.inner.lock();
        if inner.epoch != epoch {
            return false;
        }
        let key = (stream, watch_id);
        let current = inner.current_rev;
        let Some(w) = inner.watchers.get(&key) else {
            return true;
        };
        if w.synced {
            return true;
        }
        if !events.is_empty() {
            let Some(s) = inner.streams.get(&stream) else {
                return true;
            };
            let out = WatchOut {
                response: WatchResponse {
                    header: self.header(current),
                    watch_id,
                    events,
                    ..Default::default()
                },
                fragment: w.fragment,
            };
            if s.tx.try_send(out).is_err() {
                return false;
            }
        }
        if let Some(w) = inner.watchers.get_mut(&key) {
            w.next_rev = w.next_rev.max(through + 1);
        }
        if through >= current {
            inner.resync(key);
            inner.answer_progress(stream, &self.header);
        }
        true
    }

    /// Streams whose progress request is still owed (the syncer retries them).
    pub fn retry_progress(&self) {
        let mut inner = self.inner.lock();
        let pending: Vec<u64> = inner
            .streams
            .iter()
            .filter(|(_, s)| s.progress_pending)
            .map(|(id, _)| *id)
            .collect();
        for stream in pending {
            inner.answer_progress(stream, &self.header);
        }
    }

    /// Counts for tests and status: (watchers, unsynced watchers, streams).
    pub fn counts(&self) -> (usize, usize, usize) {
        let inner = self.inner.lock();
        (
            inner.watchers.len(),
            inner.unsynced.len(),
            inner.streams.len(),
        )
    }
}

impl HubInner {
    fn insert_watcher(&mut self, key: WatcherKey, w: Watcher) {
        if w.synced {
            self.index_synced(key, &w.range);
        } else {
            self.unsynced.insert(key);
        }
        self.watchers.insert(key, w);
    }

    fn index_synced(&mut self, key: WatcherKey, range: &KeyRange) {
        match range {
            KeyRange::Single(k) => {
                self.synced_keys.entry(k.clone()).or_default().insert(key);
            }
            KeyRange::Span { .. } => {
                self.synced_ranges.insert(key);
            }
        }
    }

    fn unindex_synced(&mut self, key: WatcherKey, range: &KeyRange) {
        match range {
            KeyRange::Single(k) => {
                if let Some(set) = self.synced_keys.get_mut(k.as_ref()) {
                    set.remove(&key);
                    if set.is_empty() {
                        self.synced_keys.remove(k.as_ref());
                    }
                }
            }
            KeyRange::Span { .. } => {
                self.synced_ranges.remove(&key);
            }
        }
    }

    fn remove_watcher(&mut self, key: WatcherKey) {
        if let Some(w) = self.watchers.remove(&key) {
            if w.synced {
                self.unindex_synced(key, &w.range);
            } else {
                self.unsynced.remove(&key);
            }
        }
    }

    fn unsync(&mut self, key: WatcherKey, next_rev: i64) {
        let Some(w) = self.watchers.get_mut(&key) else {
            return;
        };
        if !w.synced {
            return;
        }
        w.synced = false;
        w.next_rev = next_rev;
        let range = w.range.clone();
        self.unindex_synced(key, &range);
        self.unsynced.insert(key);
    }

    fn resync(&mut self, key: WatcherKey) {
        let Some(w) = self.watchers.get_mut(&key) else {
            return;
        };
        if w.synced {
            return;
        }
        w.synced = true;
        let range = w.range.clone();
        self.unsynced.remove(&key);
        self.index_synced(key, &range);
    }

    fn answer_progress(&mut self, stream: u64, header: &ResponseHeader) {
        let revision = self.current_rev;
        let Some(s) = self.streams.get(&stream) else {
            return;
        };
        if !s.progress_pending {
            return;
        }
        let all_synced = s.watch_ids.iter().all(|id| {
            self.watchers
                .get(&(stream, *id))
                .is_none_or(|w| w.synced && w.reached(revision))
        });
        if !all_synced {
            return;
        }
        let sent = s.tx.try_send(WatchOut {
            response: WatchResponse {
                header: Some(ResponseHeader {
                    revision,
                    ..*header
                }),
                watch_id: STREAM_PROGRESS_WATCH_ID,
                ..Default::default()
            },
            fragment: false,
        });
        if sent.is_ok()
            && let Some(s) = self.streams.get_mut(&stream)
        {
            s.progress_pending = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(hub: &WatchHub, stream: u64, tx: &mpsc::Sender<WatchOut>, start: i64) -> i64 {
        let req = WatchCreateRequest {
            key: Bytes::from_static(b"a"),
            range_end: Bytes::from_static(b"z"),
            start_revision: start,
            ..Default::default()
        };
        let permit = tx.try_reserve().expect("room");
        hub.create(stream, &req, permit).expect("create")
    }

    fn next_revs(hub: &WatchHub) -> Vec<(i64, i64)> {
        let mut revs: Vec<_> = hub
            .unsynced(usize::MAX)
            .watchers
            .iter()
            .map(|w| (w.watch_id, w.next_rev))
            .collect();
        revs.sort_unstable();
        revs
    }

    #[test]
    fn a_jump_sends_synced_watchers_to_replay_from_past_the_old_revision() {
        let hub = WatchHub::new(5, 1, 1, 1);
        let (stream, tx, _rx) = hub.open_stream();
        let live = create(&hub, stream, &tx, 0);
        let future = create(&hub, stream, &tx, 20);
        let behind = create(&hub, stream, &tx, 3);
        let before = hub.unsynced(usize::MAX);
        assert_eq!(next_revs(&hub), vec![(behind, 3)]);

        hub.jump(12);
        let round = hub.unsynced(usize::MAX);
        assert_eq!(round.current_rev, 12);
        assert_ne!(round.epoch, before.epoch);
        // Everything through 5 was queued to the live watcher; the future one keeps its
        // start; the one already replaying keeps its place.
        assert_eq!(next_revs(&hub), vec![(live, 6), (future, 20), (behind, 3)]);
        // A replay prepared before the jump is refused and changes nothing.
        assert!(!hub.deliver_history(before.epoch, stream, behind, vec![], 5));
        hub.compacted(before.epoch, stream, behind, 4);
        assert_eq!(hub.counts(), (3, 3, 1));
        // One prepared after it is taken, and a caught-up watcher is synced again.
        assert!(hub.deliver_history(round.epoch, stream, live, vec![], 12));
        assert_eq!(hub.counts(), (3, 2, 1));
    }

    #[test]
    fn a_watcher_starting_beyond_this_member_gets_no_progress_until_it_is_reached() {
        let hub = WatchHub::new(5, 1, 1, 1);
        let (stream, tx, mut rx) = hub.open_stream();
        // The client saw revision 9 on another member and resumes here from 10.
        let req = WatchCreateRequest {
            key: Bytes::from_static(b"a"),
            range_end: Bytes::from_static(b"z"),
            start_revision: 10,
            progress_notify: true,
            ..Default::default()
        };
        let permit = tx.try_reserve().expect("room");
        let id = hub.create(stream, &req, permit).expect("create");
        let created = rx.try_recv().expect("created response");
        assert!(created.response.created);
        let progress_revisions = |rx: &mut mpsc::Receiver<WatchOut>| {
            let mut out = Vec::new();
            while let Ok(o) = rx.try_recv() {
                // The watcher's own notification, or the stream's answer to the request.
                assert!([id, STREAM_PROGRESS_WATCH_ID].contains(&o.response.watch_id));
                out.push(o.response.header.map_or(0, |h| h.revision));
            }
            out
        };
        // This member is at 5: a progress at 5 would tell the client it is behind what it saw.
        hub.progress_tick();
        hub.request_progress(stream);
        assert_eq!(progress_revisions(&mut rx), Vec::<i64>::new());
        // Once the member reaches 9 (everything before the watcher's start), it may speak.
        hub.notify(&[], 9);
        hub.progress_tick();
        hub.retry_progress();
        assert_eq!(progress_revisions(&mut rx), vec![9, 9]);
    }
}
