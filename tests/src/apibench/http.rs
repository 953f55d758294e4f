//! The end-to-end level: an HTTP/2 client over TLS (hyper + rustls, the admin's client
//! certificate) against the real apiserver, with watches multiplexed as HTTP/2 streams over a
//! bounded number of connections, as client-go multiplexes a process's watches.
//!
//! A watcher here is one `GET ...?watch=true` stream read by one tokio task, which splits the
//! body into newline-delimited frames and timestamps each as its last byte arrives. The writer
//! is another client on its own connection, sending `PUT`s through the full request path
//! (authentication, RBAC, decoding, defaulting, validation, the store).
//!
//! Invariant: no connection carries more than [`STREAMS_PER_CONNECTION_MAX`] watches, the
//! server's own stream limit, so no watch ever waits for a stream slot that a never-ending
//! watch holds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;

use super::fanout::{
    Arrivals, CacheCounters, DELIVERY_TIMEOUT, FanoutRun, Target, WriteMark, finish, pace,
    wait_unregistered,
};
use super::fixture::{Harness, NAMESPACE, frame_resource_version};
use super::pki::SERVER_NAME;

/// Watch streams opened on one connection. This is the apiserver's HTTP/2
/// `SETTINGS_MAX_CONCURRENT_STREAMS`: `server::serve` keeps hyper's default of 200 (Go's
/// net/http default, which kube-apiserver starts from, is 250). Opening more would leave the
/// extra requests waiting for a slot that a watch never frees; fewer costs more connections
/// and TLS sessions for the same watchers.
pub const STREAMS_PER_CONNECTION_MAX: usize = 200;

/// The most connections one client opens: 10,000 watchers need 50 at
/// [`STREAMS_PER_CONNECTION_MAX`]; the bound turns a typo in the watcher count into an error
/// rather than thousands of TLS handshakes on a two-core machine.
pub const CONNECTIONS_MAX: usize = 64;

/// Bound on opening one connection (TCP + TLS + HTTP/2 preface) on the loopback.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on one request/response that is not a watch, a 20 MiB LIST included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// `timeoutSeconds` of the benchmark's watches: longer than any run, so the server never ends
/// one mid-run; the client drops each stream when it has all its events.
pub const WATCH_TIMEOUT_SECONDS: u64 = 600;

/// One HTTP/2 connection's handle for sending requests (clones share the connection).
pub type Sender = http2::SendRequest<Full<Bytes>>;

/// A client of the apiserver over a fixed set of HTTP/2 connections.
pub struct Client {
    /// `https://127.0.0.1:<port>`.
    base: String,
    senders: Vec<Sender>,
}

impl Client {
    /// Opens `connections` TLS + HTTP/2 connections to `addr` as the admin.
    pub async fn connect(
        addr: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        connections: usize,
    ) -> Result<Client> {
        ensure!(
            (1..=CONNECTIONS_MAX).contains(&connections),
            "{connections} connections asked for; 1 to {CONNECTIONS_MAX} allowed"
        );
        let mut senders = Vec::with_capacity(connections);
        for _ in 0..connections {
            let sender = tokio::time::timeout(CONNECT_TIMEOUT, connect_one(addr, tls.clone()))
                .await
                .context("connecting to the apiserver timed out")??;
            senders.push(sender);
        }
        Ok(Client {
            base: format!("https://{addr}"),
            senders,
        })
    }

    /// Connections held.
    pub fn connections(&self) -> usize {
        self.senders.len()
    }

    /// A request to `path_and_query` on this server, JSON in and out.
    fn request(
        &self,
        method: Method,
        path_and_query: &str,
        body: Bytes,
    ) -> Result<http::Request<Full<Bytes>>> {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("{}{path_and_query}", self.base))
            .header(header::ACCEPT, "application/json");
        if !body.is_empty() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        builder.body(Full::new(body)).context("build a request")
    }

    /// Sends one request on connection `connection` and returns the response head and body
    /// stream once the headers are in.
    async fn send(
        &self,
        connection: usize,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        let mut sender = self.senders[connection % self.senders.len()].clone();
        sender.ready().await.context("the connection closed")?;
        sender.send_request(request).await.context("send a request")
    }

    /// A request answered in full: status and body.
    pub async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes)> {
        self.call_with(method, path_and_query, &[], body).await
    }

    /// [`Client::call`] with extra headers, which replace the JSON defaults of the same name
    /// (`Content-Type` for a patch or a protobuf body, `Accept`).
    pub async fn call_with(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &[(header::HeaderName, &str)],
        body: Bytes,
    ) -> Result<(StatusCode, Bytes)> {
        let mut request = self.request(method, path_and_query, body)?;
        for (name, value) in headers {
            request
                .headers_mut()
                .insert(name.clone(), value.parse().context("a header value")?);
        }
        let exchange = async {
            let response = self.send(0, request).await?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .context("read a response body")?
                .to_bytes();
            Ok::<_, anyhow::Error>((status, body))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .with_context(|| format!("{path_and_query} timed out"))?
    }

    /// Opens a watch of the benchmark namespace's pods from `resource_version` on connection
    /// `connection`; returns once the server has answered the headers, which it does only
    /// after registering the watcher with its cache.
    pub async fn watch(
        &self,
        connection: usize,
        resource_version: i64,
    ) -> Result<hyper::body::Incoming> {
        let path = format!(
            "/api/v1/namespaces/{NAMESPACE}/pods?watch=true&resourceVersion={resource_version}\
             &timeoutSeconds={WATCH_TIMEOUT_SECONDS}"
        );
        let request = self.request(Method::GET, &path, Bytes::new())?;
        let response = self.send(connection, request).await?;
        let status = response.status();
        if status != StatusCode::OK {
            let body = response.into_body().collect().await.map(|b| b.to_bytes());
            bail!("watch answered {status}: {body:?}");
        }
        Ok(response.into_body())
    }
}

async fn connect_one(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> Result<Sender> {
    let tcp = TcpStream::connect(addr).await.context("connect TCP")?;
    tcp.set_nodelay(true).context("set TCP_NODELAY")?;
    let name = ServerName::try_from(SERVER_NAME).context("server name")?;
    let stream = TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    ensure!(
        stream.get_ref().1.alpn_protocol() == Some(b"h2"),
        "the server did not agree to HTTP/2"
    );
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .context("HTTP/2 handshake")?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "an HTTP/2 connection ended with an error");
        }
    });
    Ok(sender)
}

/// The connections `watchers` watches need at [`STREAMS_PER_CONNECTION_MAX`] each.
pub fn connections_for(watchers: usize) -> usize {
    watchers.div_ceil(STREAMS_PER_CONNECTION_MAX).max(1)
}

/// Reads newline-delimited watch frames from `body` until `updates` have arrived.
async fn collect_frames(mut body: hyper::body::Incoming, updates: usize) -> Result<Arrivals> {
    let mut got = Arrivals::with_capacity(updates);
    let mut pending = BytesMut::new();
    while got.len() < updates {
        let frame = body
            .frame()
            .await
            .ok_or_else(|| anyhow!("the watch ended after {} events", got.len()))?
            .context("read the watch stream")?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let at = Instant::now();
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line = pending.split_to(end + 1);
            let rv = frame_resource_version(&line).ok_or_else(|| {
                anyhow!(
                    "a watch frame without a resourceVersion: {}",
                    String::from_utf8_lossy(&line)
                )
            })?;
            got.push((rv, at));
        }
    }
    Ok(got)
}

/// One end-to-end run: `watchers` HTTP/2 watch streams spread over `watch_client`'s
/// connections, then `updates` sequential `PUT`s of `target` through `writer` (each awaited
/// before the next, started at most once per `interval`), then the analysis. Dropping the streams at the end unregisters the
/// watchers.
pub async fn run_http_level(
    harness: &Harness,
    watch_client: &Arc<Client>,
    writer: &Client,
    target: &mut Target,
    watchers: usize,
    updates: usize,
    interval: Duration,
) -> Result<FanoutRun> {
    ensure!(
        watchers <= watch_client.connections() * STREAMS_PER_CONNECTION_MAX,
        "{watchers} watchers over {} connections exceed {STREAMS_PER_CONNECTION_MAX} streams each",
        watch_client.connections()
    );
    let cache = harness.pods_cache();
    wait_unregistered(cache).await?;
    let start_rv = target.resource_version()?;
    // Each watcher reports once its watch is registered (or failed to open).
    let (registered_tx, mut registered) = mpsc::channel::<Result<()>>(watchers.max(1));
    let mut tasks = Vec::with_capacity(watchers);
    for i in 0..watchers {
        let client = watch_client.clone();
        let registered_tx = registered_tx.clone();
        // Watcher i rides connection i / STREAMS_PER_CONNECTION_MAX: connections fill up one
        // after another, none over the limit.
        let connection = i / STREAMS_PER_CONNECTION_MAX;
        tasks.push(tokio::spawn(async move {
            let run = async {
                let body = match client.watch(connection, start_rv).await {
                    Ok(body) => {
                        let _ = registered_tx.send(Ok(())).await;
                        body
                    }
                    Err(e) => {
                        let message = format!("{e:#}");
                        let _ = registered_tx.send(Err(e)).await;
                        bail!("open a watch: {message}");
                    }
                };
                collect_frames(body, updates).await
            };
            tokio::time::timeout(DELIVERY_TIMEOUT, run)
                .await
                .context("a watcher did not receive every event in time")?
        }));
    }
    drop(registered_tx);
    for _ in 0..watchers {
        let opened = tokio::time::timeout(DELIVERY_TIMEOUT, registered.recv())
            .await
            .context("watches took too long to open")?
            .ok_or_else(|| anyhow!("a watcher task ended without opening its watch"))?;
        opened?;
    }
    ensure!(
        cache.watchers() == watchers,
        "{} watchers registered with the cache, {watchers} opened",
        cache.watchers()
    );
    let before = CacheCounters::read(cache);
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{}", target.name);
    let mut writes: Vec<WriteMark> = Vec::with_capacity(updates);
    for _ in 0..updates {
        if let Some(previous) = writes.last() {
            pace(previous.started, interval).await;
        }
        let body =
            Bytes::from(serde_json::to_vec(&target.next_state()).context("encode the update")?);
        let started = Instant::now();
        let (status, reply) = writer.call(Method::PUT, &path, body).await?;
        let acked = Instant::now();
        ensure!(
            status == StatusCode::OK,
            "PUT {path} answered {status}: {}",
            String::from_utf8_lossy(&reply)
        );
        let stored: Value = serde_json::from_slice(&reply).context("decode the PUT reply")?;
        writes.push(WriteMark::of(started, acked, &stored)?);
        target.object = stored;
    }
    finish(cache, before, &writes, tasks).await
}
