//! The client's side of a streaming session: a WebSocket on a hyper upgrade, with the
//! Kubernetes sub-protocols (`apimachinery/pkg/util/remotecommand/constants.go`,
//! `apimachinery/pkg/util/httpstream/wsstream/conn.go`): each binary message of
//! `v5.channel.k8s.io` / `v4.channel.k8s.io` starts with its channel (0 stdin, 1 stdout,
//! 2 stderr, 3 error, 4 resize); v5 adds 255, `[255, channel]` half-closing that channel.
//! `SPDY/3.1+portforward.k8s.io` carries SPDY frames in binary messages
//! (`client-go/tools/portforward/tunneling_connection.go`).

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;

use super::idle::{Idle, IdleIo};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// The remote-command protocol with the close channel (Kubernetes 1.29+).
pub const V5: &str = "v5.channel.k8s.io";
/// The remote-command protocol without it.
pub const V4: &str = "v4.channel.k8s.io";
/// WebSocket port-forward's channel protocol, as the Python client and other pre-tunnel
/// clients speak it (`kubelet/cri/streaming/portforward/websocket.go`
/// `v4BinaryWebsocketProtocol`): a data and an error channel per `?port=`, each opened by
/// the port in 2 little-endian bytes. (Its base64 text variant, `v4.base64.channel.k8s.io`,
/// is not served.)
pub const PORTFORWARD_V4: &str = V4;
/// Port-forward's SPDY tunnelled in WebSocket (Kubernetes 1.30+).
pub const PORTFORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

/// Channel ids.
pub const STDIN: u8 = 0;
/// See [`STDIN`].
pub const STDOUT: u8 = 1;
/// See [`STDIN`].
pub const STDERR: u8 = 2;
/// See [`STDIN`].
pub const ERROR: u8 = 3;
/// See [`STDIN`].
pub const RESIZE: u8 = 4;
/// v5's close signal: `[CLOSE, channel]`.
pub const CLOSE: u8 = 255;

/// The largest message read from a client: stdin arrives in 32 KiB writes (kubectl copies
/// with Go's `io.Copy`), a port-forward tunnel's SPDY frames are bounded by
/// [`super::spdy::MAX_FRAME`]; this bounds what one message makes the kubelet hold.
pub const MAX_MESSAGE: usize = super::spdy::MAX_FRAME + 64 * 1024;

/// The upgraded connection, its traffic counted on the session's idle clock.
pub type WebSocket = WebSocketStream<IdleIo<TokioIo<Upgraded>>>;

/// Whether the request asks for a WebSocket.
pub fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The first of `supported` the client offers, in the client's order of preference.
pub fn negotiate(headers: &HeaderMap, supported: &[&'static str]) -> Option<&'static str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|offered| supported.iter().copied().find(|s| *s == offered))
}

/// The `101 Switching Protocols` answer to a WebSocket request choosing `protocol`, or why
/// the request is not a valid WebSocket handshake.
pub fn accept<B: Default>(headers: &HeaderMap, protocol: &str) -> Result<Response<B>, String> {
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or("missing Sec-WebSocket-Key")?;
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err("unsupported Sec-WebSocket-Version (13 is)".to_string());
    }
    let mut r = Response::new(B::default());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&derive_accept_key(key.as_bytes())).map_err(|e| e.to_string())?,
    );
    // An empty protocol: the client offered none (upstream's `""` entry).
    if !protocol.is_empty() {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_str(protocol).map_err(|e| e.to_string())?,
        );
    }
    Ok(r)
}

/// The WebSocket once hyper hands the connection over, counting its traffic on `idle`.
pub async fn upgraded(on: OnUpgrade, idle: Arc<Idle>) -> Result<WebSocket, hyper::Error> {
    let io = IdleIo::new(TokioIo::new(on.await?), idle);
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    Ok(WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await)
}
