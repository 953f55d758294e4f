//! The Watch service: one bidirectional stream multiplexing many watchers.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use prost::Message;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

use super::EtcdApi;
use crate::metrics::grpc::{self as metrics, Method};
use crate::pb::etcdserverpb::{
    WatchRequest, WatchResponse, watch_request::RequestUnion, watch_server::Watch,
};
use crate::store::Store;
use crate::validate::REQUEST_BYTES_MAX;
use crate::watch::{CreateError, WatchOut};

#[tonic::async_trait]
impl Watch for EtcdApi {
    type WatchStream = WatchResponses;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let inbound = request.into_inner();
        // A read error ends the request side, as the client's end would.
        let inbound = tokio_stream::StreamExt::map_while(inbound, Result::ok);
        Ok(Response::new(self.watch_stream(inbound)))
    }
}

impl EtcdApi {
    /// Serves one watch stream whose requests come from `inbound`: the gRPC stream's, or the
    /// JSON objects of an HTTP gateway request's body.
    pub(crate) fn watch_stream(
        &self,
        inbound: impl Stream<Item = WatchRequest> + Send + 'static,
    ) -> WatchResponses {
        let call = metrics::StreamCall::start(Method::Watch);
        let (stream_id, tx, rx) = self.store.hub().open_stream();
        let store = self.store.clone();
        tokio::spawn(async move {
            let inbound =
                futures::StreamExt::inspect(inbound, |_| metrics::received(Method::Watch));
            let mut inbound = std::pin::pin!(inbound);
            // A client that half-closes its side keeps its watchers, as with etcd; the stream
            // ends when the response side is dropped.
            while let Some(req) = futures::StreamExt::next(&mut inbound).await {
                if !handle(&store, stream_id, &tx, req).await {
                    break;
                }
            }
        });
        WatchResponses {
            rx,
            pending: Vec::new(),
            store: self.store.clone(),
            stream_id,
            call,
        }
    }
}

/// Handles one request of a stream; false once the stream is gone.
async fn handle(
    store: &Store,
    stream_id: u64,
    tx: &mpsc::Sender<WatchOut>,
    req: WatchRequest,
) -> bool {
    let hub = store.hub();
    match req.request_union {
        Some(RequestUnion::CreateRequest(create)) => {
            let Ok(permit) = tx.reserve().await else {
                return false;
            };
            match hub.create(stream_id, &create, permit) {
                Ok(watch_id) => debug!(stream_id, watch_id, "created watch"),
                Err(CreateError::StreamClosed) => return false,
                Err(CreateError::DuplicateId) => {
                    let resp = WatchResponse {
                        created: true,
                        cancel_reason: "etcdserver: duplicate watch ID".into(),
                        ..canceled(store, create.watch_id)
                    };
                    return send(tx, resp).await;
                }
            }
        }
        Some(RequestUnion::CancelRequest(cancel)) if hub.cancel(stream_id, cancel.watch_id) => {
            return send(tx, canceled(store, cancel.watch_id)).await;
        }
        Some(RequestUnion::ProgressRequest(_)) => hub.request_progress(stream_id),
        // Cancelling an unknown watch id: etcd says nothing.
        Some(RequestUnion::CancelRequest(_)) | None => {}
    }
    true
}

/// A `canceled` response for `watch_id` at the current revision.
fn canceled(store: &Store, watch_id: i64) -> WatchResponse {
    WatchResponse {
        header: Some(store.header(store.revision())),
        watch_id,
        canceled: true,
        ..Default::default()
    }
}

/// Queues a control response; false once the stream is gone.
async fn send(tx: &mpsc::Sender<WatchOut>, response: WatchResponse) -> bool {
    tx.send(WatchOut {
        response,
        fragment: false,
    })
    .await
    .is_ok()
}

/// The response side of a watch stream. Dropping it (the client went away) removes the
/// stream's watchers from the hub.
pub struct WatchResponses {
    rx: mpsc::Receiver<WatchOut>,
    /// Fragments of a split response still to send, last first.
    pending: Vec<WatchResponse>,
    store: Store,
    stream_id: u64,
    /// The call, for `grpc_server_*`: counted handled when the stream goes.
    call: metrics::StreamCall,
}

impl Drop for WatchResponses {
    fn drop(&mut self) {
        self.store.hub().close_stream(self.stream_id);
    }
}

impl Stream for WatchResponses {
    type Item = Result<WatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.poll_response(cx);
        match &polled {
            Poll::Ready(Some(_)) => metrics::sent(Method::Watch),
            Poll::Ready(None) => self.call.ended = Some(tonic::Code::Ok),
            Poll::Pending => {}
        }
        polled
    }
}

impl WatchResponses {
    fn poll_response(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<WatchResponse, Status>>> {
        if let Some(next) = self.pending.pop() {
            return Poll::Ready(Some(Ok(next)));
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(out)) => {
                if out.fragment {
                    let mut fragments = fragment(out.response, REQUEST_BYTES_MAX);
                    fragments.reverse();
                    let first = fragments.pop();
                    self.pending = fragments;
                    Poll::Ready(first.map(Ok))
                } else {
                    Poll::Ready(Some(Ok(out.response)))
                }
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Splits a response larger than `max_bytes` into several, each under it (unless one event
/// alone is larger), all but the last marked `fragment`, as etcd does for watchers that asked
/// for fragmentation. Events are never split.
pub fn fragment(response: WatchResponse, max_bytes: usize) -> Vec<WatchResponse> {
    if response.encoded_len() < max_bytes || response.events.len() < 2 {
        return vec![response];
    }
    let mut template = response.clone();
    template.events = Vec::new();
    template.fragment = true;
    let mut out = Vec::new();
    let mut current = template.clone();
    for event in response.events {
        current.events.push(event);
        if current.events.len() > 1 && current.encoded_len() >= max_bytes {
            let overflow = current.events.pop();
            out.push(std::mem::replace(&mut current, template.clone()));
            current.events.extend(overflow);
        }
    }
    current.fragment = false;
    out.push(current);
    out
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::pb::mvccpb::{Event, KeyValue};

    #[test]
    fn large_responses_fragment_without_splitting_events() {
        let event = |i: u8| Event {
            kv: Some(KeyValue {
                key: Bytes::from(vec![i]),
                value: Bytes::from(vec![0u8; 400]),
                mod_revision: 5,
                ..Default::default()
            }),
            ..Default::default()
        };
        let response = WatchResponse {
            watch_id: 3,
            events: (0..10).map(event).collect(),
            ..Default::default()
        };
        let parts = fragment(response.clone(), 1_000);
        assert!(parts.len() > 1);
        assert!(parts[..parts.len() - 1].iter().all(|p| p.fragment));
        assert!(!parts[parts.len() - 1].fragment);
        let rejoined: Vec<Event> = parts.iter().flat_map(|p| p.events.clone()).collect();
        assert_eq!(rejoined, response.events);
        assert!(
            parts
                .iter()
                .all(|p| p.encoded_len() < 1_000 || p.events.len() == 1)
        );
        assert_eq!(fragment(response.clone(), usize::MAX).len(), 1);
    }
}
