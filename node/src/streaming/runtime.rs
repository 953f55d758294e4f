//! The client of containerd's streaming server (the CRI `Exec`, `Attach` and `PortForward`
//! URLs): an HTTP/1.1 `POST` upgraded to `SPDY/3.1` with the sub-protocol in
//! `X-Stream-Protocol-Version`, as client-go's `spdy.RoundTripper` asks for it
//! (`apimachinery/pkg/util/httpstream/spdy/roundtripper.go`), then a SPDY client session.
//! containerd's server listens on loopback only (`stream_server_address`), without TLS.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;

use super::spdy::Session;

/// The remote-command protocol asked of the runtime: v4 has the JSON `Status` on the error
/// stream (exit codes) and the resize stream (`kubelet/cri/streaming/remotecommand`).
pub const REMOTECOMMAND_V4: &str = "v4.channel.k8s.io";

/// The port-forward protocol (`kubelet/cri/streaming/portforward`, `PortForwardProtocolV1Name`).
pub const PORTFORWARD_V1: &str = "portforward.k8s.io";

/// Time to connect to the runtime's streaming server and have its upgrade answer; it is on
/// loopback, so a slow answer means a stuck runtime (client-go dials with 30 s).
pub const UPGRADE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of an error answer kept for the message.
pub const ERROR_BODY_MAX: usize = 16 * 1024;

/// Why the runtime's streaming server could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RuntimeStreamError(pub String);

/// Connects to `url` (what CRI returned) and upgrades to SPDY with `protocol`.
pub async fn connect(url: &str, protocol: &str) -> Result<Session, RuntimeStreamError> {
    tokio::time::timeout(UPGRADE_TIMEOUT, upgrade(url, protocol))
        .await
        .map_err(|_| RuntimeStreamError(format!("streaming server {url}: timed out")))?
}

/// A connection to the streaming server of `url` (what CRI returned): the request sender,
/// the authority for `Host` and the path with its query.
pub async fn dial(
    url: &str,
) -> Result<
    (
        hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
        http::uri::Authority,
        String,
    ),
    RuntimeStreamError,
> {
    let fail =
        |e: &dyn std::fmt::Display| RuntimeStreamError(format!("streaming server {url}: {e}"));
    let uri: http::Uri = url.parse().map_err(|e| fail(&e))?;
    if uri.scheme_str() != Some("http") {
        return Err(fail(&"only plain-HTTP streaming servers are supported"));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| fail(&"no host in the URL"))?
        .clone();
    let port = authority.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((authority.host().trim_matches(['[', ']']), port))
        .await
        .map_err(|e| fail(&e))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail(&e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let path = uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str)
        .to_string();
    Ok((sender, authority, path))
}

async fn upgrade(url: &str, protocol: &str) -> Result<Session, RuntimeStreamError> {
    let fail =
        |e: &dyn std::fmt::Display| RuntimeStreamError(format!("streaming server {url}: {e}"));
    let (mut sender, authority, path) = dial(url).await?;
    let request = http::Request::post(path)
        .header(http::header::HOST, authority.as_str())
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", protocol)
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(&e))?;
    let response = sender.send_request(request).await.map_err(|e| fail(&e))?;
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let body = Limited::new(response.into_body(), ERROR_BODY_MAX)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        return Err(fail(&format!(
            "{status}: {}",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    let negotiated = response
        .headers()
        .get("X-Stream-Protocol-Version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if negotiated != protocol {
        return Err(fail(&format!(
            "negotiated protocol {negotiated:?}, not {protocol:?}"
        )));
    }
    let upgraded = hyper::upgrade::on(response).await.map_err(|e| fail(&e))?;
    let (session, _incoming) = Session::new(TokioIo::new(upgraded), false);
    Ok(session)
}
