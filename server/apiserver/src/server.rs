//! The listener: TLS (rustls) in front of hyper, HTTP/1.1 and HTTP/2 on one port (ALPN),
//! with kube-apiserver's in-flight limits.
//!
//! Each connection's verified client certificate chain is read once after the handshake and
//! handed to every request on it. Long-running requests (watches) are not counted against
//! the in-flight limits, as in Kubernetes; everything else is, and a request over the limit
//! gets 429 with `Retry-After: 1` at once instead of queueing.

use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use crate::handler::ApiServer;
use crate::request::{RequestInfo, parse_query};
use crate::response;

/// Read-only requests served at once (kube-apiserver's `--max-requests-inflight` default).
pub const REQUESTS_INFLIGHT_MAX: usize = 400;
/// Mutating requests served at once (`--max-mutating-requests-inflight` default): writes
/// cost a Raft round each, so they get their own, smaller budget and cannot starve reads.
pub const MUTATING_REQUESTS_INFLIGHT_MAX: usize = 200;
/// A client that has not finished its TLS handshake by then is dropped, so half-open
/// connections cannot pile up (Go's net/http servers use 10 s too).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `listener` until `shutdown` turns true.
pub async fn serve(
    server: Arc<ApiServer>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let reads = Arc::new(Semaphore::new(REQUESTS_INFLIGHT_MAX));
    let writes = Arc::new(Semaphore::new(MUTATING_REQUESTS_INFLIGHT_MAX));
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let server = server.clone();
        let reads = reads.clone();
        let writes = writes.clone();
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let certs: Arc<Vec<rustls_pki_types::CertificateDer<'static>>> = Arc::new(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default(),
            );
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let server = server.clone();
                let certs = certs.clone();
                let reads = reads.clone();
                let writes = writes.clone();
                async move {
                    let query = parse_query(req.uri().query());
                    let info = RequestInfo::parse(req.method(), req.uri().path(), &query);
                    let long_running = info.verb == "watch";
                    let mutating = !matches!(info.verb.as_str(), "get" | "list" | "watch" | "head");
                    let _permit = if long_running {
                        None
                    } else {
                        let pool = if mutating { &writes } else { &reads };
                        match pool.clone().try_acquire_owned() {
                            Ok(p) => Some(p),
                            Err(_) => {
                                return Ok::<_, std::convert::Infallible>(response::error(
                                    &skerry_api::ApiError::too_many_requests(
                                        "Too many requests, please try again later.",
                                        1,
                                    ),
                                ));
                            }
                        }
                    };
                    Ok(server.handle(req, certs).await)
                }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                }
                _ = conn_shutdown.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
                }
            }
        });
    }
}
