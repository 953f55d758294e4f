//! The listener: TLS (rustls) in front of hyper, HTTP/1.1 and HTTP/2 on one port (ALPN),
//! with kube-apiserver's in-flight limits.
//!
//! Each connection's verified client certificate chain is read once after the handshake and
//! handed to every request on it. Long-running requests (watches) are not counted against
//! the in-flight limits, as in Kubernetes; everything else is, and a request over the limit
//! gets 429 with `Retry-After: 1` at once instead of queueing.
//!
//! Nothing a connection holds is unbounded before its first request: the TLS handshake has
//! [`TLS_HANDSHAKE_TIMEOUT`], then the first request's headers (an HTTP/1.1 request line and
//! headers, or the HTTP/2 preface and a HEADERS frame: hyper's version detection and h2's
//! preface read have no timeout of their own) must arrive within [`READ_HEADER_TIMEOUT`], and
//! at most [`UNAUTHENTICATED_CONNECTIONS_MAX`] connections may be at either stage at once (one
//! beyond is closed at accept; `skerry_tls::accept`). Later HTTP/1.1 requests get
//! [`READ_HEADER_TIMEOUT`] for their headers from hyper. Failed accepts (out of descriptors)
//! back off from 5 ms to 1 s.

use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use skerry_tls::accept::{self, HandshakeGate};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
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
/// connections cannot pile up. Go's server would allow the shortest of its read timeouts,
/// kube-apiserver's 32 s `ReadHeaderTimeout` (`net/http` `(*Server).tlsHandshakeTimeout`);
/// 10 s is what Go's clients themselves wait (`TLSHandshakeTimeout` of `http.DefaultTransport`
/// and of client-go's `transport/cache.go`), so no Kubernetes client gives up later than we
/// do, and an idle connection holds its slot a third as long.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for a request's headers: the first request's from the end of the TLS handshake, each
/// later HTTP/1.1 request's from the end of the previous response (hyper's
/// `header_read_timeout`, which so also closes an HTTP/1.1 connection idle that long).
/// kube-apiserver sets `ReadHeaderTimeout: 32 * time.Second` on its `http.Server`
/// (`staging/src/k8s.io/apiserver/pkg/server/secure_serving.go`, `Serve`), "just shy of" the
/// 34 s `requestTimeoutUpperBound` of `endpoints/handlers/rest.go`. Go bounds an HTTP/2
/// preface by 10 s and a first HTTP/2 request only by the 90 s idle timeout
/// (`golang.org/x/net/http2` `prefaceTimeout`, kube's `IdleTimeout`); one bound for both
/// protocols keeps the unauthenticated window the same whatever ALPN chose, and a client
/// opens a connection to send a request at once.
pub const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(32);
/// Connections in their TLS handshake or waiting for their first request at once; more are
/// closed at accept. kube-apiserver has no such cap (the descriptor limit is its bound). The
/// clients of a three-box cluster (kubelets, controllers, in-cluster clients, kubectl users)
/// reconnecting together after a restart are hundreds at most, each through its handshake in
/// milliseconds; a flood holds at most this many tasks, descriptors and TLS states (tens of
/// KiB each, so tens of MiB) for the deadlines above.
pub const UNAUTHENTICATED_CONNECTIONS_MAX: usize = 1_024;

/// The bounds a listener puts on connections before their first request; [`Default`] is
/// what `skerry server` serves with (the constants above). Tests shrink them.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// See [`TLS_HANDSHAKE_TIMEOUT`].
    pub tls_handshake: Duration,
    /// See [`READ_HEADER_TIMEOUT`].
    pub read_header: Duration,
    /// See [`UNAUTHENTICATED_CONNECTIONS_MAX`].
    pub unauthenticated_max: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            tls_handshake: TLS_HANDSHAKE_TIMEOUT,
            read_header: READ_HEADER_TIMEOUT,
            unauthenticated_max: UNAUTHENTICATED_CONNECTIONS_MAX,
        }
    }
}

/// Serves `listener` until `shutdown` turns true, with the default [`ConnLimits`].
pub async fn serve(
    server: Arc<ApiServer>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: watch::Receiver<bool>,
) {
    serve_with_limits(server, listener, tls, shutdown, ConnLimits::default()).await
}

/// Serves `listener` until `shutdown` turns true, bounding connections by `limits`.
pub async fn serve_with_limits(
    server: Arc<ApiServer>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: watch::Receiver<bool>,
    limits: ConnLimits,
) {
    let acceptor = TlsAcceptor::from(tls);
    let reads = Arc::new(Semaphore::new(REQUESTS_INFLIGHT_MAX));
    let writes = Arc::new(Semaphore::new(MUTATING_REQUESTS_INFLIGHT_MAX));
    let gate = HandshakeGate::new("kubernetes-api", limits.unauthenticated_max);
    let mut stop = shutdown.clone();
    let stop = async move {
        let _ = stop.changed().await;
    };
    accept::serve(listener, gate, stop, move |tcp, peer, slot| {
        let acceptor = acceptor.clone();
        let server = server.clone();
        let reads = reads.clone();
        let writes = writes.clone();
        let mut conn_shutdown = shutdown.clone();
        async move {
            let tls = match accept::accept_tls(&acceptor, tcp, limits.tls_handshake).await {
                Ok(tls) => tls,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "no connection");
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
            // Told by the first request (a permit is kept if nobody waits yet).
            let first_request = Arc::new(Notify::new());
            let requested = first_request.clone();
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                requested.notify_one();
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
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.read_header);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::pin!(conn);
            // Until its first request the connection keeps its slot under the cap, and has
            // until this deadline to send it.
            let mut slot = Some(slot);
            let first_deadline = tokio::time::sleep(limits.read_header);
            tokio::pin!(first_deadline);
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                        return;
                    }
                    _ = first_request.notified(), if slot.is_some() => slot = None,
                    _ = &mut first_deadline, if slot.is_some() => {
                        tracing::debug!(
                            %peer,
                            "no request within {:?} of the TLS handshake; closing",
                            limits.read_header
                        );
                        return;
                    }
                    _ = conn_shutdown.changed() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
                        return;
                    }
                }
            }
        }
    })
    .await
}
