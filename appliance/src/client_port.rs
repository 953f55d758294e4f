//! The client port's accept path: one port, two protocols, as etcd 3.4 serves it with `cmux`
//! (`embed/serve.go`): HTTP/2 goes to the gRPC server, HTTP/1.x to the HTTP face
//! ([`crate::http`]: `/health`, `/version`, `/metrics`, the JSON gateway).
//!
//! On a plain port each new connection is *peeked* (`MSG_PEEK`), not read: its first bytes
//! are compared with HTTP/2's client preface, and a connection that sends the preface goes to
//! tonic as the untouched socket in exactly the wrappers the gRPC path always had
//! (`AuthorityFix<CoalesceWrites<TcpStream>>`), so the hot path gains nothing per request.
//! Anything else is HTTP/1.x and is served by hyper on the connection's own task. With TLS
//! the handshake offers ALPN `h2` and `http/1.1` and the negotiated protocol decides.
//!
//! Every connection is untrusted until it has spoken: the sniff and the TLS handshake are
//! bounded by [`FIRST_BYTES_TIMEOUT`] and [`crate::tls::HANDSHAKE_TIMEOUT`], and so are the
//! first bytes after a handshake that chose `h2` (`TlsConn`); an HTTP/1 connection's first
//! request head by [`HTTP1_HEADER_TIMEOUT`]; at most
//! [`UNPROVEN_CONNECTIONS_MAX`] connections may be at any of these stages at once, and one
//! accepted over that is closed at once ([`HandshakeGate`]); and a failing `accept` (out of
//! file descriptors) backs off instead of spinning (`AcceptBackoff`), as every listener of
//! `skerry server` does: the loop is `skerry_tls::accept::serve`.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use skerry_store::grpc::authority::AuthorityFix;
use skerry_store::grpc::coalesce::CoalesceWrites;
use skerry_tls::accept::{self, HandshakeGate, HandshakeSlot};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

use crate::http::HttpFace;
use crate::tls::{HANDSHAKE_TIMEOUT, TlsConn};

/// How long a new plain connection gets to send its first bytes (the HTTP/2 preface or an
/// HTTP/1 request line) before it is closed. etcd's `cmux` waits forever (etcd 3.4 sets no
/// `SetReadTimeout`), which lets idle connections pile up; 10 s is the TLS handshake's bound
/// here, far above any client's first-write delay on a LAN.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1 connection may take to send a request's head, and how long it may sit
/// idle between requests (hyper's header read timer runs from the moment it waits for a
/// head). Go's `http.Server` in etcd sets neither; hyper's default is 30 s. 10 s keeps an
/// idle keep-alive connection for a while (curl, a scraper every 15 s reconnects) and drops
/// a silent one at the same deadline as a connection that never spoke.
pub const HTTP1_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections accepted on one port that have not yet proven themselves: no preface or
/// request line yet, TLS handshake unfinished, or an HTTP/1 connection before its first
/// request head. Each
/// holds a socket, a task and a timer until its deadline, so this bounds what a flood of
/// idle connections can pin (file descriptors above all): at [`FIRST_BYTES_TIMEOUT`] a
/// client must open more than 400 connections a second to reach it. One accepted over the
/// bound is closed at once, so a client that retries gets in as the idle ones expire, and
/// connections that already spoke are never affected.
pub const UNPROVEN_CONNECTIONS_MAX: usize = 4_096;

/// The pause before peeking again at a connection that has sent part of the HTTP/2 preface:
/// the rest is normally in the same segment, so this almost never runs.
const PARTIAL_PREFACE_RETRY: Duration = Duration::from_millis(2);

/// Connections routed to gRPC, waiting for tonic to take them. Bounds memory if tonic lags
/// behind a burst of connections.
pub const GRPC_ACCEPTED_QUEUE: usize = 128;

/// The client connection preface every HTTP/2 connection starts with (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a plain connection's first bytes said.
#[derive(Debug, PartialEq, Eq)]
enum Sniffed {
    Http2,
    Http1,
}

/// Serves one plain (`http://`) client URL: returns the connections for tonic; HTTP/1
/// connections are served by `face` on their own tasks. `face` with no gRPC (a
/// `--listen-metrics-urls` listener) closes HTTP/2 connections instead.
pub fn serve_plain(
    listener: TcpListener,
    face: Arc<HttpFace>,
    grpc: bool,
    stop: watch::Receiver<bool>,
) -> mpsc::Receiver<std::io::Result<AuthorityFix<CoalesceWrites<TcpStream>>>> {
    let (tx, rx) = mpsc::channel(GRPC_ACCEPTED_QUEUE);
    tokio::spawn(accept::serve(
        listener,
        gate(),
        stopped(stop.clone()),
        move |stream, remote, permit| {
            let (tx, face, stop) = (tx.clone(), face.clone(), stop.clone());
            async move {
                match tokio::time::timeout(FIRST_BYTES_TIMEOUT, sniff(&stream)).await {
                    Ok(Ok(Some(Sniffed::Http2))) if grpc => {
                        drop(permit);
                        let _ = tx
                            .send(Ok(AuthorityFix::new(CoalesceWrites::new(stream))))
                            .await;
                    }
                    Ok(Ok(Some(Sniffed::Http1))) => {
                        face.serve_http1(stream, remote, permit, stop).await;
                    }
                    Ok(Ok(Some(Sniffed::Http2))) => {
                        tracing::debug!(%remote, "HTTP/2 on a metrics listener; closing");
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => tracing::debug!(%remote, error = %e, "client connection failed"),
                    Err(_) => tracing::debug!(%remote, "client sent nothing in time; closing"),
                }
            }
        },
    ));
    rx
}

/// Serves one `https://` client URL: the TLS handshake offers `h2` and `http/1.1`; `h2`
/// connections go to tonic, the rest to `face`.
pub fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    face: Arc<HttpFace>,
    grpc: bool,
    stop: watch::Receiver<bool>,
) -> mpsc::Receiver<std::io::Result<AuthorityFix<CoalesceWrites<TlsConn>>>> {
    let (tx, rx) = mpsc::channel(GRPC_ACCEPTED_QUEUE);
    tokio::spawn(accept::serve(
        listener,
        gate(),
        stopped(stop.clone()),
        move |stream, remote, permit| {
            let (tx, face, stop, acceptor) =
                (tx.clone(), face.clone(), stop.clone(), acceptor.clone());
            async move {
                let stream = match accept::accept_tls(&acceptor, stream, HANDSHAKE_TIMEOUT).await {
                    Ok(stream) => stream,
                    Err(e) => {
                        tracing::debug!(%remote, error = %e, "client connection failed");
                        return;
                    }
                };
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                if h2 && grpc {
                    drop(permit);
                    let conn = TlsConn::new(stream, FIRST_BYTES_TIMEOUT);
                    let conn = AuthorityFix::new(CoalesceWrites::new(conn));
                    let _ = tx.send(Ok(conn)).await;
                } else if h2 {
                    tracing::debug!(%remote, "HTTP/2 on a metrics listener; closing");
                } else {
                    face.serve_http1(stream, remote, permit, stop).await;
                }
            }
        },
    ));
    rx
}

/// The gate of one client port: [`UNPROVEN_CONNECTIONS_MAX`] connections at a time.
fn gate() -> HandshakeGate {
    HandshakeGate::new("etcd-client", UNPROVEN_CONNECTIONS_MAX)
}

/// Completes once `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Peeks at a new connection until its first bytes tell HTTP/2 from HTTP/1; `None` if it
/// closed first. Nothing is consumed: the server that gets it reads from the start.
async fn sniff(stream: &TcpStream) -> std::io::Result<Option<Sniffed>> {
    let mut buf = [0u8; H2_PREFACE.len()];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        if buf[..n] != H2_PREFACE[..n] {
            return Ok(Some(Sniffed::Http1));
        }
        if n == H2_PREFACE.len() {
            return Ok(Some(Sniffed::Http2));
        }
        // A prefix of the preface so far: `peek` would answer the same bytes at once, so
        // wait a moment for the rest.
        tokio::time::sleep(PARTIAL_PREFACE_RETRY).await;
    }
}

/// The unproven-connection permit of an HTTP/1 connection, given back when its first request
/// head has arrived (the service is called).
pub struct FirstRequest(Mutex<Option<HandshakeSlot>>);

impl FirstRequest {
    pub fn new(permit: HandshakeSlot) -> Self {
        FirstRequest(Mutex::new(Some(permit)))
    }

    /// The connection has sent a request: it no longer counts as unproven.
    pub fn arrived(&self) {
        self.0.lock().take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("bound address");
        let client = TcpStream::connect(addr).await.expect("connect loopback");
        let (server, _) = listener.accept().await.expect("accept loopback");
        (client, server)
    }

    #[tokio::test]
    async fn the_preface_is_http2_anything_else_http1_and_nothing_is_consumed() {
        let (mut client, server) = pair().await;
        client.write_all(H2_PREFACE).await.expect("write");
        assert_eq!(sniff(&server).await.ok().flatten(), Some(Sniffed::Http2));
        let mut buf = [0u8; 24];
        assert_eq!(server.peek(&mut buf).await.ok(), Some(24));

        let (mut client, server) = pair().await;
        client
            .write_all(b"GET /health HTTP/1.1\r\n")
            .await
            .expect("write");
        assert_eq!(sniff(&server).await.ok().flatten(), Some(Sniffed::Http1));

        // "PRI" alone is a prefix: the sniff waits for the rest.
        let (mut client, server) = pair().await;
        client.write_all(b"PRI * HT").await.expect("write");
        let sniffing = tokio::spawn(async move { sniff(&server).await.ok().flatten() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!sniffing.is_finished());
        client.write_all(&H2_PREFACE[8..]).await.expect("write");
        assert_eq!(sniffing.await.ok().flatten(), Some(Sniffed::Http2));

        let (client, server) = pair().await;
        drop(client);
        assert_eq!(sniff(&server).await.ok().flatten(), None);
    }
}
