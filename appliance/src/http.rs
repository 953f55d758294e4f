//! The client port's HTTP/1 face, as etcd 3.4 answers plain HTTP next to gRPC: `/health`
//! and `/metrics` (`etcdserver/api/etcdhttp/metrics.go`), `/version`
//! (`etcdserver/api/etcdhttp/base.go`), and the JSON gateway under `/v3/` and `/v3beta/`
//! (`skerry_store::grpc::gateway`), with the CORS headers etcd's access controller adds and
//! Go's text answers for what is not there (`404 page not found`, `Method Not Allowed`).
//!
//! A `--listen-metrics-urls` listener has the same face with only `/metrics` and `/health`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use skerry_store::Store;
use skerry_store::grpc::gateway::{self, BodyError, Call, Reply};
use skerry_store::grpc::{ETCD_VERSION_REPORTED, EtcdApi};
use skerry_store::metrics::{self as m, Exposition, Kind};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::client_port::{FirstRequest, HTTP1_HEADER_TIMEOUT};

/// How long `/health`'s quorum read may take before the member is reported unhealthy: etcd
/// 3.4's `checkHealth` gives its `QGET` one second.
pub const HEALTH_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the body of a unary gateway call may take to arrive. A client trickling a body
/// must not hold a connection and a buffer forever; the largest body
/// ([`gateway::JSON_BODY_BYTES_MAX`], 4 MiB) takes under a second on a slow LAN.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a scrape waits for the store's sizes (asked of its writer, behind the writes
/// queued before): Prometheus' default scrape timeout is 10 s; a second keeps a scrape quick
/// while the writer works through a long batch.
pub const METRICS_STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// Prometheus' text format, what Go's `promhttp` serves by default.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What the HTTP face serves, for one listener.
pub struct HttpFace {
    api: EtcdApi,
    store: Store,
    /// Everything (a client URL), or only `/metrics` and `/health` (a metrics URL).
    full: bool,
    /// Server shutdown: streamed answers end with it.
    stop: watch::Receiver<bool>,
}

impl HttpFace {
    pub fn new(api: EtcdApi, store: Store, full: bool, stop: watch::Receiver<bool>) -> Self {
        Self {
            api,
            store,
            full,
            stop,
        }
    }

    /// Serves HTTP/1.1 on one connection until the client closes it, an idle or head
    /// deadline passes, or the server stops. `permit` counts the connection as unproven
    /// until its first request head has arrived.
    pub async fn serve_http1<IO>(
        self: Arc<Self>,
        io: IO,
        remote: SocketAddr,
        permit: skerry_tls::accept::HandshakeSlot,
        mut stop: watch::Receiver<bool>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let first = Arc::new(FirstRequest::new(permit));
        let face = self.clone();
        let service = hyper::service::service_fn(move |req| {
            first.arrived();
            let face = face.clone();
            async move { Ok::<_, Infallible>(face.handle(req).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HTTP1_HEADER_TIMEOUT);
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let mut conn = std::pin::pin!(conn);
        let result = tokio::select! {
            result = conn.as_mut() => result,
            _ = async { drop(stop.wait_for(|s| *s).await) } => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = result {
            tracing::debug!(%remote, error = %e, "HTTP/1 client connection ended");
        }
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let mut resp = self.route(req).await;
        // etcd's access controller writes these on every answer (`--cors` defaults to `*`).
        let headers = resp.headers_mut();
        headers.insert(
            "access-control-allow-methods",
            HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
        );
        headers.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        headers.insert(
            "access-control-allow-headers",
            HeaderValue::from_static("accept, content-type, authorization"),
        );
        resp
    }

    async fn route(&self, req: Request<Incoming>) -> Response<Body> {
        if req.method() == Method::OPTIONS {
            return bytes(StatusCode::OK, None, Bytes::new());
        }
        let path = req.uri().path().to_string();
        match path.as_str() {
            "/metrics" => bytes(
                StatusCode::OK,
                Some(METRICS_CONTENT_TYPE),
                Bytes::from(self.metrics().await),
            ),
            "/health" => {
                if req.method() != Method::GET {
                    return method_not_allowed(true);
                }
                let healthy = self.healthy().await;
                let body = format!("{{\"health\":\"{healthy}\"}}");
                if healthy {
                    bytes(StatusCode::OK, Some(TEXT), Bytes::from(body))
                } else {
                    // Go's `http.Error`, which adds a newline.
                    text(StatusCode::SERVICE_UNAVAILABLE, &body)
                }
            }
            "/version" if self.full => {
                if req.method() != Method::GET {
                    return method_not_allowed(true);
                }
                bytes(
                    StatusCode::OK,
                    Some("application/json"),
                    Bytes::from(version_body()),
                )
            }
            _ if self.full
                && (path.starts_with(gateway::PREFIX)
                    || path.starts_with(gateway::PREFIX_BETA)) =>
            {
                let Some(call) = Call::from_path(&path) else {
                    // grpc-gateway's mux answers an unknown path in Go's text.
                    return text(StatusCode::NOT_FOUND, "Not Found");
                };
                if req.method() != Method::POST {
                    return method_not_allowed(false);
                }
                self.gateway(call, req.into_body()).await
            }
            _ => text(StatusCode::NOT_FOUND, "404 page not found"),
        }
    }

    async fn gateway(&self, call: Call, body: Incoming) -> Response<Body> {
        let reply = if call.streams_requests() {
            let body = body
                .into_data_stream()
                .map(|chunk| chunk.map_err(|e| BodyError::Io(e.to_string())));
            self.api.gateway_stream(call, Box::pin(body))
        } else {
            let limited = Limited::new(body, gateway::JSON_BODY_BYTES_MAX);
            match tokio::time::timeout(BODY_READ_TIMEOUT, limited.collect()).await {
                Ok(Ok(collected)) => self.api.gateway_unary(call, &collected.to_bytes()).await,
                Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                    gateway::too_large(gateway::JSON_BODY_BYTES_MAX + 1)
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "gateway: reading a request body failed");
                    return text(StatusCode::BAD_REQUEST, "request body could not be read");
                }
                Err(_) => {
                    return text(StatusCode::REQUEST_TIMEOUT, "request body too slow");
                }
            }
        };
        let mut resp = match reply {
            Reply::Whole { status, body } => bytes(
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                Some("application/json"),
                Bytes::from(body),
            ),
            Reply::Lines(lines) => {
                // A streamed answer lasts until the service ends it or the client goes; the
                // server's shutdown ends it too.
                let mut stop = self.stop.clone();
                let stopped = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                let frames = lines
                    .take_until(Box::pin(stopped))
                    .map(|line| Ok::<_, Infallible>(Frame::data(line)));
                let mut resp = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                resp
            }
        };
        // grpc-gateway forwards the gRPC response's headers as `Grpc-Metadata-*`.
        resp.headers_mut().insert(
            "grpc-metadata-content-type",
            HeaderValue::from_static("application/grpc"),
        );
        resp
    }

    /// etcd 3.4's health rules (`checkHealth`), in its order: unhealthy while any alarm is
    /// active, without a leader, or when a quorum read does not finish within
    /// [`HEALTH_READ_TIMEOUT`]. Counted in `etcd_server_health_success` / `_failures`.
    async fn healthy(&self) -> bool {
        // The alarms as `etcdctl alarm list` shows them.
        let alarms = self.api.active_alarms().len();
        let healthy = health(alarms, self.store.replica_status().leader, || async {
            matches!(
                tokio::time::timeout(HEALTH_READ_TIMEOUT, self.store.linearizable_barrier()).await,
                Ok(Ok(()))
            )
        })
        .await;
        let counter = if healthy {
            &m::HEALTH_SUCCESS
        } else {
            &m::HEALTH_FAILURES
        };
        counter.fetch_add(1, Ordering::Relaxed);
        healthy
    }

    /// `/metrics`: the process-wide counters and histograms, and the member's state read now.
    async fn metrics(&self) -> String {
        let store = &self.store;
        let replica = store.replica_status();
        let me = store.member_id();
        // The sizes come from the writer; a writer busy past the bound leaves them out of
        // this scrape rather than hold it.
        let status = tokio::time::timeout(METRICS_STATUS_TIMEOUT, store.status())
            .await
            .ok()
            .and_then(Result::ok);
        let learner = store.is_replicated()
            && store
                .members()
                .map(|ms| ms.iter().any(|mm| mm.id == me && mm.is_learner))
                .unwrap_or(false);
        let (watchers, unsynced, streams) = store.hub().counts();
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        let mut e = Exposition::new();
        e.family(
            "etcd_cluster_version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            Kind::Gauge,
        )
        .sample(
            "etcd_cluster_version",
            &[("cluster_version", &cluster_version())],
            1.0,
        );
        if let Some(s) = &status {
            e.single(
                "etcd_debugging_mvcc_compact_revision",
                "The revision of the last compaction in store.",
                Kind::Gauge,
                s.compact_revision as f64,
            )
            .single(
                "etcd_debugging_mvcc_current_revision",
                "The current revision of store.",
                Kind::Gauge,
                s.revision as f64,
            )
            .single(
                "etcd_debugging_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
                Kind::Gauge,
                s.db_size as f64,
            );
        }
        e.single(
            "etcd_debugging_mvcc_keys_total",
            "Total number of keys.",
            Kind::Gauge,
            store.key_count() as f64,
        )
        .single(
            "etcd_debugging_mvcc_slow_watcher_total",
            "Total number of unsynced slow watchers.",
            Kind::Gauge,
            unsynced as f64,
        )
        .single(
            "etcd_debugging_mvcc_watch_stream_total",
            "Total number of watch streams.",
            Kind::Gauge,
            streams as f64,
        )
        .single(
            "etcd_debugging_mvcc_watcher_total",
            "Total number of watchers.",
            Kind::Gauge,
            watchers as f64,
        )
        .family(
            "etcd_disk_backend_commit_duration_seconds",
            "The latency distributions of commit called by backend.",
            Kind::Histogram,
        )
        .histogram(
            "etcd_disk_backend_commit_duration_seconds",
            &[],
            &m::BACKEND_COMMIT,
        )
        .family(
            "etcd_disk_wal_fsync_duration_seconds",
            "The latency distributions of fsync called by WAL.",
            Kind::Histogram,
        )
        .histogram("etcd_disk_wal_fsync_duration_seconds", &[], &m::WAL_FSYNC)
        .single(
            "skerry_disk_wal_slow_fsyncs_total",
            "Log fsyncs that took 100 ms or more: the disk is too slow for the log.",
            Kind::Counter,
            m::WAL_SLOW_FSYNCS.load(Ordering::Relaxed) as f64,
        )
        .single(
            "skerry_disk_stall_handovers_total",
            "Times this member, leading, handed leadership over because its log's sync stalled \
             for a second or more.",
            Kind::Counter,
            m::DISK_STALL_HANDOVERS.load(Ordering::Relaxed) as f64,
        );
        if let Some(s) = &status {
            e.single(
                "etcd_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
                Kind::Gauge,
                s.db_size as f64,
            )
            .single(
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Total size of the underlying database logically in use in bytes.",
                Kind::Gauge,
                s.db_size_in_use as f64,
            );
        }
        let rtts = m::peer_rtts();
        if !rtts.is_empty() {
            e.family(
                "etcd_network_peer_round_trip_time_seconds",
                "Round-Trip-Time histogram between peers",
                Kind::Histogram,
            );
            for (peer, h) in &rtts {
                e.histogram(
                    "etcd_network_peer_round_trip_time_seconds",
                    &[("To", &format!("{peer:x}"))],
                    h,
                );
            }
        }
        e.single(
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not.",
            Kind::Gauge,
            flag(replica.leader != 0),
        )
        .single(
            "etcd_server_health_failures",
            "The total number of failed health checks",
            Kind::Counter,
            m::HEALTH_FAILURES.load(Ordering::Relaxed) as f64,
        )
        .single(
            "etcd_server_health_success",
            "The total number of successful health checks",
            Kind::Counter,
            m::HEALTH_SUCCESS.load(Ordering::Relaxed) as f64,
        )
        .family(
            "etcd_server_id",
            "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
            Kind::Gauge,
        )
        .sample("etcd_server_id", &[("server_id", &format!("{me:x}"))], 1.0)
        .single(
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            Kind::Gauge,
            flag(replica.leader == me),
        )
        .single(
            "etcd_server_is_learner",
            "Whether or not this member is a learner. 1 if is, 0 otherwise.",
            Kind::Gauge,
            flag(learner),
        )
        .single(
            "etcd_server_leader_changes_seen_total",
            "The number of leader changes seen.",
            Kind::Counter,
            m::LEADER_CHANGES.load(Ordering::Relaxed) as f64,
        )
        .single(
            "etcd_server_proposals_applied_total",
            "The total number of consensus proposals applied.",
            Kind::Gauge,
            store.applied_index() as f64,
        )
        .single(
            "etcd_server_proposals_committed_total",
            "The total number of consensus proposals committed.",
            Kind::Gauge,
            replica.commit_index as f64,
        )
        .single(
            "etcd_server_proposals_failed_total",
            "The total number of failed proposals seen.",
            Kind::Counter,
            m::PROPOSALS_FAILED.load(Ordering::Relaxed) as f64,
        )
        .single(
            "etcd_server_proposals_pending",
            "The current number of pending proposals to commit.",
            Kind::Gauge,
            m::PROPOSALS_PENDING.load(Ordering::Relaxed).max(0) as f64,
        )
        .single(
            "etcd_server_read_indexes_failed_total",
            "The total number of failed read indexes seen.",
            Kind::Counter,
            m::READ_INDEXES_FAILED.load(Ordering::Relaxed) as f64,
        )
        .family(
            "etcd_server_version",
            "Which version is running. 1 for 'server_version' label with current version.",
            Kind::Gauge,
        )
        .sample(
            "etcd_server_version",
            &[("server_version", ETCD_VERSION_REPORTED)],
            1.0,
        )
        .grpc()
        .process();
        e.finish()
    }
}

/// etcd's health decision over its three inputs, in its order (etcd 3.4
/// `etcdserver/api/etcdhttp/metrics.go`, `checkHealth`): any active alarm, no leader, or a
/// failed quorum read makes the member unhealthy; the read is tried only when the rest pass.
pub async fn health<F, Fut>(active_alarms: usize, leader: u64, quorum_read: F) -> bool
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = bool>,
{
    if active_alarms > 0 || leader == 0 {
        return false;
    }
    quorum_read().await
}

/// The cluster version etcd reports: the server's major and minor version, patch 0
/// (etcd 3.4's `/version` says `"etcdcluster":"3.4.0"`).
fn cluster_version() -> String {
    let mut parts = ETCD_VERSION_REPORTED.split('.');
    let major = parts.next().unwrap_or("3");
    let minor = parts.next().unwrap_or("4");
    format!("{major}.{minor}.0")
}

/// `/version`'s body, etcd's `version.Versions` as JSON.
fn version_body() -> String {
    format!(
        "{{\"etcdserver\":\"{ETCD_VERSION_REPORTED}\",\"etcdcluster\":\"{}\"}}",
        cluster_version()
    )
}

fn bytes(status: StatusCode, content_type: Option<&'static str>, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(BodyExt::boxed_unsync(Full::new(body)));
    *resp.status_mut() = status;
    if let Some(ct) = content_type {
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    resp
}

/// Go's `http.Error`: the text and a newline, as plain text that must not be sniffed.
fn text(status: StatusCode, message: &str) -> Response<Body> {
    let mut resp = bytes(status, Some(TEXT), Bytes::from(format!("{message}\n")));
    resp.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// 405 as etcd answers it; `/health` and `/version` name the one method they take.
fn method_not_allowed(get_only: bool) -> Response<Body> {
    let mut resp = text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    if get_only {
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_follows_etcds_order_and_reads_only_when_the_rest_pass() {
        let read_ok = || async { true };
        assert!(health(0, 7, read_ok).await);
        assert!(!health(1, 7, read_ok).await, "an alarm");
        assert!(!health(0, 0, read_ok).await, "no leader");
        assert!(
            !health(0, 7, || async { false }).await,
            "quorum read failed"
        );
        let read_must_not_run = || async { panic!("read without a leader") };
        assert!(!health(0, 0, read_must_not_run).await);
    }

    #[test]
    fn version_is_etcds_shape() {
        assert_eq!(
            version_body(),
            format!("{{\"etcdserver\":\"{ETCD_VERSION_REPORTED}\",\"etcdcluster\":\"3.4.0\"}}")
        );
    }
}
