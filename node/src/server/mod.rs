//! The kubelet's HTTPS API on `--kubelet-port` (10250), upstream `pkg/kubelet/server/server.go`:
//! `/healthz`, `/pods` (the pods this kubelet runs, a PodList) and
//! `/containerLogs/{namespace}/{pod}/{container}` (what the apiserver proxies `pods/log` to,
//! read by [`logs`]), and the streaming paths `/exec`, `/attach`, `/portForward`
//! ([`streaming`]), and `/stats/summary`, `/metrics/resource`, `/metrics` ([`stats`]).
//!
//! Every request is authenticated and authorized as upstream's webhook modes do it
//! ([`auth`]): a client certificate the cluster CA signed (user and groups from its CN and
//! O), else a bearer token through the apiserver's TokenReview; then a SubjectAccessReview
//! of `nodes/<subresource>` on this node's name (`proxy` for most paths). No credentials is
//! a 401 `Unauthorized`, a refusal a 403 `Forbidden (user=..., verb=..., resource=nodes,
//! subresource=...)`, both plain text as the kubelet writes them.
//!
//! Bounds: connections still in their TLS handshake (capped, 10 s each), every open
//! connection (capped), each request head (32 s, 1 MiB as Go's `MaxHeaderBytes`), requests
//! in flight (capped, 429 beyond).

pub mod auth;
pub mod logs;
pub mod stats;
pub mod streaming;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{Method, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::Pod;
use rustls_pki_types::CertificateDer;
use skerry_tls::accept::{HandshakeGate, accept_tls, serve};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::kubelet::Kubelet;
use crate::kubelet::runtime::{self, RuntimePod};
use crate::kubelet::sandbox::pod_logs_dir;

use self::auth::{Attributes, Auth, Authenticated};
use self::logs::{LogOptions, Next};

/// The kubelet's port (upstream `ports.KubeletPort`).
pub const DEFAULT_PORT: u16 = 10250;

/// Time a connection has for its TLS handshake (as the apiserver's listener, 10 s: a client
/// that connects and says nothing must not hold a slot).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Time for a request's head (kube-apiserver's `ReadHeaderTimeout`, 32 s; the kubelet's Go
/// server bounds the whole read by its 4-minute `ReadTimeout`, which a streaming answer
/// cannot have here without cutting `follow`).
pub const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(32);

/// Connections still in their handshake; one more is closed at accept (the apiserver's cap).
pub const HANDSHAKE_MAX: usize = 1024;

/// Open connections; one more is closed at accept. Each follower holds one for as long as
/// it follows, and a file descriptor and a task; the apiserver multiplexes nothing here
/// (one connection per `kubectl logs`).
pub const CONNECTIONS_MAX: usize = 1024;

/// Requests served at once; more get a 429. Each log request holds an open file and a reader
/// task; the kubelet's Go server has no such cap, this one bounds what a caller can make it
/// hold.
pub const INFLIGHT_MAX: usize = 256;

/// The largest request head (Go's `http.DefaultMaxHeaderBytes`, 1 MiB, which the kubelet's
/// server keeps).
pub const MAX_HEADER_BYTES: usize = 1 << 20;

/// Streaming sessions (exec, attach, port-forward) open at once; one more is a 429. Each
/// holds a WebSocket, a runtime connection and a few tasks for as long as it lasts.
pub const SESSIONS_MAX: usize = 128;

/// Log chunks buffered between a file reader and its connection.
const LOG_CHANNEL: usize = 16;

/// A response body.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The server's shared state.
pub struct KubeletServer {
    node_name: String,
    kubelet: Arc<Kubelet>,
    auth: Auth,
    inflight: Arc<Semaphore>,
    sessions: Arc<Semaphore>,
    stats: Arc<crate::stats::StatsProvider>,
}

impl KubeletServer {
    /// A server for `kubelet` (whose node it names in its access reviews), asking `auth`.
    pub fn new(kubelet: Arc<Kubelet>, auth: Auth) -> Arc<Self> {
        let config = kubelet.config();
        crate::metrics::metrics().set_node_name(&config.node_name);
        let stats = Arc::new(crate::stats::StatsProvider::new(
            &config.node_name,
            config.root_dir.clone(),
            config.root_dir.join(crate::kubelet::POD_LOGS_DIR),
            kubelet.cri().clone(),
            config.cgroups.clone(),
            u64::try_from(config.memory_capacity).unwrap_or(0),
        ));
        Arc::new(KubeletServer {
            stats,
            node_name: kubelet.config().node_name.clone(),
            kubelet,
            auth,
            inflight: Arc::new(Semaphore::new(INFLIGHT_MAX)),
            sessions: Arc::new(Semaphore::new(SESSIONS_MAX)),
        })
    }

    /// Serves HTTPS on `listener` with `tls` (the node's serving certificate, client
    /// certificates asked for and verified against the cluster CA) until `stop`.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        stop: CancellationToken,
    ) {
        tokio::spawn(self.stats.clone().housekeeping(stop.clone()));
        let acceptor = TlsAcceptor::from(tls);
        let gate = HandshakeGate::new("kubelet", HANDSHAKE_MAX);
        let open = Arc::new(Semaphore::new(CONNECTIONS_MAX));
        let token = stop.clone();
        serve(
            listener,
            gate,
            token.cancelled_owned(),
            move |stream, remote, slot| {
                let acceptor = acceptor.clone();
                let server = self.clone();
                let stop = stop.clone();
                let permit = open.clone().try_acquire_owned();
                async move {
                    let Ok(_permit) = permit else {
                        debug!(%remote, "kubelet: over the connection cap; closing");
                        return;
                    };
                    let tls = match accept_tls(&acceptor, stream, TLS_HANDSHAKE_TIMEOUT).await {
                        Ok(s) => s,
                        Err(e) => {
                            debug!(%remote, error = %e, "kubelet: handshake failed");
                            return;
                        }
                    };
                    drop(slot);
                    let peer: Arc<Vec<CertificateDer<'static>>> = Arc::new(
                        tls.get_ref()
                            .1
                            .peer_certificates()
                            .map(<[_]>::to_vec)
                            .unwrap_or_default(),
                    );
                    server.connection(tls, remote, peer, stop).await;
                }
            },
        )
        .await;
    }

    async fn connection<S>(
        self: Arc<Self>,
        stream: S,
        remote: SocketAddr,
        peer: Arc<Vec<CertificateDer<'static>>>,
        stop: CancellationToken,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |req| {
            let server = self.clone();
            let peer = peer.clone();
            async move { Ok::<_, Infallible>(server.handle(req, &peer).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(READ_HEADER_TIMEOUT)
            .max_buf_size(MAX_HEADER_BYTES);
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => if let Err(e) = r { debug!(%remote, error = %e, "kubelet: connection ended") },
            () = stop.cancelled() => conn.as_mut().graceful_shutdown(),
        }
    }

    async fn handle(
        &self,
        req: hyper::Request<Incoming>,
        peer: &[CertificateDer<'static>],
    ) -> Response<Body> {
        let Ok(_permit) = self.inflight.try_acquire() else {
            let mut r = text(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests, please try again later.\n",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return r;
        };
        let user = match self.auth.authenticate(peer, req.headers()).await {
            Authenticated::User(u) => u,
            Authenticated::Anonymous => return text(StatusCode::UNAUTHORIZED, "Unauthorized"),
            Authenticated::Error(e) => {
                tracing::warn!(error = %e, "kubelet: authentication failed");
                return text(StatusCode::UNAUTHORIZED, "Unauthorized");
            }
        };
        let attrs = Attributes::of(req.method(), req.uri().path(), &self.node_name);
        match self.auth.authorize(&user, &attrs).await {
            Ok(true) => {}
            Ok(false) => {
                return text(
                    StatusCode::FORBIDDEN,
                    &format!(
                        "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
                        user.name, attrs.verb, attrs.subresource
                    ),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "kubelet: authorization failed");
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!(
                        "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
                        user.name, attrs.verb, attrs.subresource
                    ),
                );
            }
        }
        let query = parse_query(req.uri().query());
        let path = req.uri().path().to_string();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let method = req.method().clone();
        match (&method, segments.as_slice()) {
            (&Method::GET | &Method::POST, ["exec", ns, pod, container]) => {
                self.remote_command(req, streaming::Kind::Exec, ns, pod, container)
                    .await
            }
            (&Method::GET | &Method::POST, ["attach", ns, pod, container]) => {
                self.remote_command(req, streaming::Kind::Attach, ns, pod, container)
                    .await
            }
            (&Method::GET | &Method::POST, ["portForward", ns, pod]) => {
                self.port_forward(req, ns, pod).await
            }
            (&Method::GET, ["healthz"]) => text(StatusCode::OK, "ok"),
            (&Method::GET, ["stats", "summary"]) => {
                stats::summary(&self.stats, &self.kubelet.pods(), &query).await
            }
            (&Method::GET, ["metrics", "resource"]) => stats::resource_metrics(&self.stats).await,
            (&Method::GET, ["metrics"]) => stats::metrics(),
            (&Method::GET, ["pods"] | ["pods", ""]) => self.pods(),
            (&Method::GET, ["containerLogs", ns, pod, container]) => {
                self.container_logs(ns, pod, container, &query).await
            }
            _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
        }
    }

    /// `/pods`: the pods bound to this node, as the pod source has them.
    fn pods(&self) -> Response<Body> {
        let items: Vec<Pod> = self.kubelet.pods().iter().map(|p| Pod::clone(p)).collect();
        let list = serde_json::json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": items,
        });
        let body = serde_json::to_vec(&list).unwrap_or_default();
        let mut r = Response::new(full(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        r
    }

    /// `/containerLogs/{namespace}/{pod}/{container}` (upstream `getContainerLogs` and
    /// `GetKubeletContainerLogs`, with their errors and codes).
    async fn container_logs(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        query: &HashMap<String, String>,
    ) -> Response<Body> {
        let options = match LogOptions::from_query(query, jiff::Timestamp::now()) {
            Ok(o) => o,
            Err(e) => return text(StatusCode::BAD_REQUEST, &e),
        };
        let Some(pod) = self.kubelet.pods().into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        }) else {
            return text(
                StatusCode::NOT_FOUND,
                &format!("pod {name:?} does not exist\n"),
            );
        };
        let in_spec = pod.spec.as_ref().is_some_and(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .any(|c| c.name == container)
        });
        if !in_spec {
            return text(
                StatusCode::NOT_FOUND,
                &format!("container {container:?} not found in pod {name:?}\n"),
            );
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let cri = self.kubelet.cri().clone();
        let runtime_pod = match runtime::pod_status(&cri, &uid).await {
            Ok(p) => p,
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
        };
        let instance = if options.previous {
            runtime_pod.previous(container)
        } else {
            runtime_pod.latest(container)
        };
        let Some(instance) = instance else {
            let message = if options.previous {
                format!("previous terminated container {container:?} in pod {name:?} not found")
            } else {
                format!(
                    "container {container:?} in pod {name:?} is waiting to start: ContainerCreating"
                )
            };
            return text(StatusCode::BAD_REQUEST, &message);
        };
        let logs_dir = pod_logs_dir(
            &self
                .kubelet
                .config()
                .root_dir
                .join(crate::kubelet::POD_LOGS_DIR),
            &pod,
        );
        let path = log_file(&logs_dir, &instance.log_path);
        let current = instance.id.clone();
        let (tx, rx) = mpsc::channel(LOG_CHANNEL);
        let name = container.to_string();
        let follow = options.follow && !options.previous;
        let options = LogOptions { follow, ..options };
        tokio::spawn(async move {
            let current = std::sync::Mutex::new(current);
            logs::stream(path, options, tx, || {
                let cri = cri.clone();
                let uid = uid.clone();
                let name = name.clone();
                let logs_dir = logs_dir.clone();
                let id = current.lock().map(|c| c.clone()).unwrap_or_default();
                let current = &current;
                async move {
                    let Ok(pod) = runtime::pod_status(&cri, &uid).await else {
                        return Next::Wait;
                    };
                    next_of(&pod, &name, &id, &logs_dir, current)
                }
            })
            .await;
        });
        let body = StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx).map(|b| Ok(Frame::data(b))),
        );
        let mut r = Response::new(body.boxed_unsync());
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain"),
        );
        r
    }
}

/// What a follower of instance `id` does next: wait while it runs, switch to a newer
/// instance's file once the container was restarted, end when it stopped.
fn next_of(
    pod: &RuntimePod,
    name: &str,
    id: &str,
    logs_dir: &std::path::Path,
    current: &std::sync::Mutex<String>,
) -> Next {
    match pod.latest(name) {
        Some(c) if c.id == id => {
            if c.running() {
                Next::Wait
            } else {
                Next::End
            }
        }
        Some(c) => {
            if let Ok(mut cur) = current.lock() {
                cur.clone_from(&c.id);
            }
            Next::Switch(log_file(logs_dir, &c.log_path))
        }
        None => Next::End,
    }
}

/// The log file of an instance: CRI's `log_path` is the full path as containerd reports it,
/// or relative to the pod's log directory.
fn log_file(logs_dir: &std::path::Path, log_path: &str) -> PathBuf {
    let p = PathBuf::from(log_path);
    if p.is_absolute() { p } else { logs_dir.join(p) }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// A plain-text answer, as Go's `http.Error` and go-restful's `WriteErrorString` write them.
fn text(code: StatusCode, message: &str) -> Response<Body> {
    let mut r = Response::new(full(message.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The query's parameters, the first of each name, percent-decoded.
pub fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.entry(decode(k)).or_insert_with(|| decode(v));
    }
    out
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_decoded() {
        let q = parse_query(Some(
            "sinceTime=2024-01-01T00%3A00%3A00Z&follow=true&x=%zz&y=%4",
        ));
        assert_eq!(q["sinceTime"], "2024-01-01T00:00:00Z");
        assert_eq!(q["follow"], "true");
        assert_eq!(q["x"], "%zz");
        assert_eq!(q["y"], "%4");
    }
}
