//! SPDY clients passed through to the runtime (upstream `pkg/kubelet/server/server.go`
//! `proxyStream`, an `UpgradeAwareHandler` of `apimachinery/pkg/util/proxy`): a client that
//! asks for `Upgrade: SPDY/3.1` (kubectl with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` or
//! `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`, older kubectl, client-go programs) speaks
//! remotecommand or portforward straight to containerd's streaming server, which speaks
//! both over SPDY itself. The kubelet forwards the request with its upgrade headers to the
//! CRI URL, hands the runtime's `101` and negotiated `X-Stream-Protocol-Version` back, and
//! joins the two connections byte for byte, under the idle timeout ([`super::idle`]).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use std::sync::Arc;

use super::idle::{Idle, IdleIo};
use super::runtime::{ERROR_BODY_MAX, RuntimeStreamError, UPGRADE_TIMEOUT, dial};

/// The header naming the stream protocols a SPDY client offers and the server chose
/// (`apimachinery/pkg/util/httpstream` `HeaderProtocolVersion`).
pub const PROTOCOL_VERSION: &str = "X-Stream-Protocol-Version";

/// The upgrade token of a SPDY request (`httpstream/spdy` `HeaderSpdy31`).
pub const SPDY_31: &str = "SPDY/3.1";

/// Whether the request asks for a SPDY/3.1 upgrade.
pub fn is_spdy(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case(SPDY_31))
}

/// The runtime's answer to a forwarded upgrade.
pub enum Answer {
    /// `101`: the headers for the client and the runtime's side of the connection.
    Switched(HeaderMap, Upgraded),
    /// Any other answer, as the runtime gave it (status, content type, body).
    Refused(StatusCode, Option<HeaderValue>, Bytes),
}

/// Sends the client's SPDY upgrade (its `X-Stream-Protocol-Version` offers) to `url`.
pub async fn forward(url: &str, client: &HeaderMap) -> Result<Answer, RuntimeStreamError> {
    tokio::time::timeout(UPGRADE_TIMEOUT, forward_inner(url, client))
        .await
        .map_err(|_| RuntimeStreamError(format!("streaming server {url}: timed out")))?
}

async fn forward_inner(url: &str, client: &HeaderMap) -> Result<Answer, RuntimeStreamError> {
    let fail =
        |e: &dyn std::fmt::Display| RuntimeStreamError(format!("streaming server {url}: {e}"));
    let (mut sender, authority, path) = dial(url).await?;
    let mut request = http::Request::post(path)
        .header(header::HOST, authority.as_str())
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, SPDY_31);
    for v in client.get_all(PROTOCOL_VERSION) {
        request = request.header(PROTOCOL_VERSION, v);
    }
    let request = request.body(Empty::<Bytes>::new()).map_err(|e| fail(&e))?;
    let response = sender.send_request(request).await.map_err(|e| fail(&e))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let body = Limited::new(response.into_body(), ERROR_BODY_MAX)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        return Ok(Answer::Refused(status, content_type, body));
    }
    let mut headers = HeaderMap::new();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(SPDY_31));
    if let Some(v) = response.headers().get(PROTOCOL_VERSION) {
        headers.insert(PROTOCOL_VERSION, v.clone());
    }
    let upgraded = hyper::upgrade::on(response).await.map_err(|e| fail(&e))?;
    Ok(Answer::Switched(headers, upgraded))
}

/// Joins the client's upgraded connection to the runtime's until either ends or the session
/// has been idle for `idle`'s timeout.
pub async fn join(client: OnUpgrade, runtime: Upgraded, idle: Arc<Idle>) {
    let client = match client.await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "kubelet: streaming upgrade failed");
            return;
        }
    };
    let mut client = IdleIo::new(TokioIo::new(client), idle.clone());
    let mut runtime = TokioIo::new(runtime);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut runtime) => {}
        () = idle.expired() => tracing::debug!("kubelet: streaming session idle; closed"),
    }
}

/// The client's `101`, with the runtime's chosen protocol.
pub fn switching<B: Default>(headers: HeaderMap) -> Response<B> {
    let mut r = Response::new(B::default());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *r.headers_mut() = headers;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdy_is_recognised_by_its_upgrade_token() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("spdy/3.1"));
        assert!(is_spdy(&h));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!is_spdy(&h));
        assert!(!is_spdy(&HeaderMap::new()));
    }
}
