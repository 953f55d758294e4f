//! One watcher's stream of wire frames, and the WatchList state machine.
//!
//! This carries the second half of `docs/tricks.md` #6, the WatchList three-state machine:
//! the WatchList protocol (`sendInitialEvents=true`) moves through three states, so no client
//! can miss or double an event:
//!
//! 1. [`Phase::InitialEvents`]: synthetic ADDED frames for the objects of the snapshot the
//!    cache took at revision S, under the same lock that registered the watcher's queue;
//! 2. [`Phase::EndBookmark`]: one BOOKMARK at S annotated `k8s.io/initial-events-end`;
//! 3. [`Phase::Live`]: the queue, which holds exactly the events after S (and the ticker's
//!    bookmarks) in revision order.
//!
//! Every object at S is sent once in state 1, every change after S once in state 3, and the
//! bookmark between them claims S, which no live frame precedes. A plain watch resuming from
//! a revision goes straight from its backlog (state 1 with events instead of objects) to
//! state 3.
//!
//! Every frame of a stream is in the watcher's one [`Encoding`]: the cache frames its events,
//! backlog and bookmarks so, and the snapshot's ADDED frames are framed here in it.
//!
//! The stream ends when the cache drops the watcher's queue (it was too slow, the watch
//! reached its deadline, or the cache relisted); dropping the stream unregisters the watcher.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;

use super::Shared;
use super::object::{CachedObject, Encoding, EventType};

/// Where a stream is in the WatchList protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Sending the snapshot (ADDED frames) or the backlog of a resumed watch.
    InitialEvents,
    /// The snapshot is out; the end-of-initial-events bookmark is next.
    EndBookmark,
    /// Relaying the watcher's queue.
    Live,
    /// The stream has ended.
    Done,
}

/// One frame of the initial phase, framed lazily so a large snapshot is not encoded before
/// the client reads it.
#[derive(Debug)]
pub(crate) enum Initial {
    /// An object of the snapshot, sent as ADDED (its frame is memoized on the object and
    /// shared with every other WatchList client of the same state).
    Added(CachedObject),
    /// An already-framed event of a resumed watch's backlog.
    Frame(Bytes),
}

/// Unregisters the watcher from its cache when the stream is dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(crate) shared: Weak<Shared>,
    pub(crate) watcher_id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.unregister(self.watcher_id);
        }
    }
}

/// The frames of one watch, ready to write to the response body.
#[derive(Debug)]
pub struct WatchStream {
    phase: Phase,
    /// The encoding of the snapshot's frames (the other frames arrive already framed).
    encoding: Encoding,
    initial: VecDeque<Initial>,
    end_bookmark: Option<Bytes>,
    live: Option<mpsc::Receiver<Bytes>>,
    _registration: Option<Registration>,
}

impl WatchStream {
    pub(crate) fn new(
        encoding: Encoding,
        initial: VecDeque<Initial>,
        end_bookmark: Option<Bytes>,
        live: mpsc::Receiver<Bytes>,
        registration: Registration,
    ) -> Self {
        Self {
            phase: Phase::InitialEvents,
            encoding,
            initial,
            end_bookmark,
            live: Some(live),
            _registration: Some(registration),
        }
    }

    /// A stream of one frame (an in-stream ERROR) that then ends.
    pub(crate) fn single(frame: Bytes) -> Self {
        Self {
            phase: Phase::InitialEvents,
            encoding: Encoding::default(),
            initial: VecDeque::from([Initial::Frame(frame)]),
            end_bookmark: None,
            live: None,
            _registration: None,
        }
    }

    /// The current phase (for tests and debugging).
    pub fn phase(&self) -> Phase {
        self.phase
    }
}

impl Stream for WatchStream {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = &mut *self;
        loop {
            match this.phase {
                Phase::InitialEvents => match this.initial.pop_front() {
                    Some(Initial::Added(object)) => {
                        return Poll::Ready(Some(object.frame(EventType::Added, this.encoding)));
                    }
                    Some(Initial::Frame(frame)) => return Poll::Ready(Some(frame)),
                    None => {
                        this.phase = if this.end_bookmark.is_some() {
                            Phase::EndBookmark
                        } else {
                            Phase::Live
                        };
                    }
                },
                Phase::EndBookmark => {
                    this.phase = Phase::Live;
                    if let Some(frame) = this.end_bookmark.take() {
                        return Poll::Ready(Some(frame));
                    }
                }
                Phase::Live => {
                    let Some(live) = this.live.as_mut() else {
                        this.phase = Phase::Done;
                        continue;
                    };
                    return match live.poll_recv(cx) {
                        Poll::Ready(Some(frame)) => Poll::Ready(Some(frame)),
                        Poll::Ready(None) => {
                            this.phase = Phase::Done;
                            Poll::Ready(None)
                        }
                        Poll::Pending => Poll::Pending,
                    };
                }
                Phase::Done => return Poll::Ready(None),
            }
        }
    }
}
