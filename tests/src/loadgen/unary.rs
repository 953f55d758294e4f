//! A lean gRPC unary client straight over `h2`, for the load generator's hot loops (put,
//! get, txn).
//!
//! Why not tonic's client here: the load generator shares the machine's two cores with the
//! server it measures, so every microsecond it spends per request is taken from that
//! server. tonic's `Channel` hands each call through two tasks before it reaches the HTTP/2
//! connection (tower's `Buffer` worker, then hyper's dispatcher), and hyper's connection,
//! seeing a socket with vectored writes, ends a write at every DATA frame over 256 bytes, so
//! each 256-byte put went out in a `writev` of its own (1.3 per put under put64). Here a
//! client task frames its request and queues HEADERS and DATA on the shared `h2` connection
//! itself, and the connection task writes whatever the round queued in one `write`.
//!
//! The requests on the wire are the same gRPC calls a tonic or grpc-go client makes (POST
//! to `/<service>/<method>`, `content-type: application/grpc`, `te: trailers`, one
//! length-prefixed uncompressed message), so skerry and etcd are measured by the same
//! client, as before. Watches and one-off setup calls keep tonic.
//!
//! Invariants: nothing from the server is unwrapped. A non-200 status, a `grpc-status` other
//! than 0, a compressed or truncated message, or one that does not decode is an `Err` with
//! the server's words in it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use http::uri::{Authority, Scheme};
use http::{HeaderMap, Method, Request, Uri};
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tracing::debug;

/// gRPC's message prefix: a compression flag byte and a big-endian u32 length.
const GRPC_PREFIX_BYTES: usize = 5;

/// Largest response message accepted, as tonic's default decoding limit: a paged range of
/// 500 small keys is far below it, and a server sending more is refused, not buffered.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// One HTTP/2 connection to a server's gRPC port; clone it to share the connection among
/// several clients, each with its own requests in flight.
#[derive(Clone)]
pub struct UnaryConn {
    send: SendRequest<Bytes>,
    /// `host:port`, each request's `:authority`.
    authority: Authority,
    timeout: Duration,
}

/// A gRPC method: its path, e.g. `/etcdserverpb.KV/Put`.
pub struct GrpcMethod(pub &'static str);

/// `/etcdserverpb.KV/Put`.
pub const KV_PUT: GrpcMethod = GrpcMethod("/etcdserverpb.KV/Put");
/// `/etcdserverpb.KV/Range`.
pub const KV_RANGE: GrpcMethod = GrpcMethod("/etcdserverpb.KV/Range");
/// `/etcdserverpb.KV/Txn`.
pub const KV_TXN: GrpcMethod = GrpcMethod("/etcdserverpb.KV/Txn");

impl UnaryConn {
    /// Opens one plain-TCP HTTP/2 connection to `endpoint` (`http://host:port`); its driver
    /// task ends when every clone is dropped or the server closes the connection.
    pub async fn connect(
        endpoint: &str,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Result<Self> {
        let uri: Uri = endpoint
            .parse()
            .with_context(|| format!("parse endpoint {endpoint}"))?;
        if uri.scheme_str() != Some("http") {
            bail!("endpoint {endpoint}: only plain http:// is measured");
        }
        let authority = uri
            .authority()
            .cloned()
            .with_context(|| format!("endpoint {endpoint}: no host"))?;
        let host = authority.host().trim_matches(['[', ']']);
        let port = uri.port_u16().unwrap_or(80);
        let stream = tokio::time::timeout(connect_timeout, TcpStream::connect((host, port)))
            .await
            .with_context(|| format!("connect to {endpoint}: timed out"))?
            .with_context(|| format!("connect to {endpoint}"))?;
        // Requests are small and latency-bound: do not wait to coalesce segments.
        stream.set_nodelay(true)?;
        let (send, connection) = h2::client::handshake(CopyingWrites(stream))
            .await
            .with_context(|| format!("HTTP/2 handshake with {endpoint}"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(error = %e, "load generator connection ended");
            }
        });
        Ok(Self {
            send,
            authority,
            timeout,
        })
    }

    /// One unary call, bounded by the connection's timeout.
    pub async fn call<Q: Message, R: Message + Default>(
        &mut self,
        method: &GrpcMethod,
        request: &Q,
    ) -> Result<R, String> {
        match tokio::time::timeout(self.timeout, self.call_unbounded(method, request)).await {
            Ok(result) => result,
            Err(_) => Err(format!("{}: no answer within {:?}", method.0, self.timeout)),
        }
    }

    async fn call_unbounded<Q: Message, R: Message + Default>(
        &mut self,
        method: &GrpcMethod,
        request: &Q,
    ) -> Result<R, String> {
        std::future::poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(|e| format!("connection: {e}"))?;
        let head = Request::builder()
            .method(Method::POST)
            .uri(
                Uri::builder()
                    .scheme(Scheme::HTTP)
                    .authority(self.authority.clone())
                    .path_and_query(method.0)
                    .build()
                    .map_err(|e| format!("request uri: {e}"))?,
            )
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(())
            .map_err(|e| format!("request head: {e}"))?;
        let (response, mut body_tx) = self
            .send
            .send_request(head, false)
            .map_err(|e| format!("send request: {e}"))?;
        body_tx
            .send_data(frame(request), true)
            .map_err(|e| format!("send message: {e}"))?;

        let response = response.await.map_err(|e| format!("response: {e}"))?;
        let (parts, mut body) = response.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(format!("HTTP status {}", parts.status));
        }
        // A failed call may come as headers only ("trailers-only"), grpc-status among them.
        if parts.headers.contains_key("grpc-status") {
            grpc_ok(&parts.headers)?;
            return Err("response without a message".into());
        }
        let mut message = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| format!("response body: {e}"))?;
            // Give the window back at once: the whole message is read before it is decoded.
            let _ = body.flow_control().release_capacity(chunk.len());
            if message.len() + chunk.len() > GRPC_PREFIX_BYTES + MAX_RESPONSE_BYTES {
                return Err(format!("response over {MAX_RESPONSE_BYTES} bytes"));
            }
            message.extend_from_slice(&chunk);
        }
        let trailers = body
            .trailers()
            .await
            .map_err(|e| format!("response trailers: {e}"))?
            .ok_or("response without trailers")?;
        grpc_ok(&trailers)?;
        unframe(message.freeze())
    }
}

/// `request` as one uncompressed, length-prefixed gRPC message.
fn frame<Q: Message>(request: &Q) -> Bytes {
    let len = request.encoded_len();
    let mut buf = BytesMut::with_capacity(GRPC_PREFIX_BYTES + len);
    buf.put_u8(0);
    // The load generator's own requests are a few hundred bytes: far below u32::MAX.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    request.encode_raw(&mut buf);
    buf.freeze()
}

/// The one message of a unary response.
fn unframe<R: Message + Default>(mut data: Bytes) -> Result<R, String> {
    if data.len() < GRPC_PREFIX_BYTES {
        return Err(format!("response of {} bytes: no message", data.len()));
    }
    let compressed = data.get_u8();
    if compressed != 0 {
        return Err("compressed response, none was asked for".into());
    }
    let len = data.get_u32() as usize;
    if len != data.len() {
        return Err(format!(
            "response message of {} bytes, its prefix says {len}",
            data.len()
        ));
    }
    R::decode(data).map_err(|e| format!("decode response: {e}"))
}

/// `Ok` for `grpc-status: 0`, else the status and message as the error.
fn grpc_ok(headers: &HeaderMap) -> Result<(), String> {
    let status = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .ok_or("response without grpc-status")?;
    if status == "0" {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .map(|v| percent_decode(v.as_bytes()))
        .unwrap_or_default();
    Err(format!("grpc-status {status}: {message}"))
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2: tonic encodes spaces, grpc-go only
/// unprintable bytes). A `%` not followed by two hex digits stays as it is.
fn percent_decode(raw: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            )
        {
            // Two hex digits: at most 0xff, so the cast loses nothing.
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A TCP stream that reports no vectored writes, so that `h2` copies every frame under
/// 1 KiB into its write buffer (its `CHAIN_THRESHOLD_WITHOUT_VECTORED_IO`) and writes a
/// round's requests in one `write`, instead of ending the write at each DATA frame over
/// 256 bytes (`CHAIN_THRESHOLD`, with vectored writes). Measured under put64 (20,000 puts):
/// tonic's client made 1.3 `writev`s per put, this one 0.14 `sendto`s.
struct CopyingWrites(TcpStream);

impl AsyncRead for CopyingWrites {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for CopyingWrites {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use skerry_store::grpc::{EtcdApi, MemberInfo, router};
    use skerry_store::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
    use skerry_store::pb::etcdserverpb::{
        Compare, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, TxnRequest,
        TxnResponse, request_op,
    };
    use skerry_store::{Store, StoreConfig};
    use tokio_stream::wrappers::TcpListenerStream;

    use super::super::server::{Flavor, Server, ServerSpec};
    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    fn put(key: &str, value: &str) -> PutRequest {
        PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            ..Default::default()
        }
    }

    /// Put, get, a CAS txn both ways, many calls in flight on one connection, and a request
    /// the server refuses, all through `UnaryConn` against `endpoint`.
    async fn exercise(endpoint: &str) {
        let mut conn = UnaryConn::connect(endpoint, WAIT, WAIT)
            .await
            .expect("connect");
        let put_response: PutResponse = conn.call(&KV_PUT, &put("k", "v1")).await.expect("put");
        let revision = put_response.header.expect("header").revision;

        let got: RangeResponse = conn
            .call(
                &KV_RANGE,
                &RangeRequest {
                    key: Bytes::from_static(b"k"),
                    ..Default::default()
                },
            )
            .await
            .expect("range");
        assert_eq!(got.kvs.len(), 1);
        assert_eq!(got.kvs[0].value, Bytes::from_static(b"v1"));
        assert_eq!(got.kvs[0].mod_revision, revision);

        let cas = |expected: i64| TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Mod as i32,
                key: Bytes::from_static(b"k"),
                range_end: Bytes::new(),
                target_union: Some(TargetUnion::ModRevision(expected)),
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(put("k", "v2"))),
            }],
            failure: Vec::new(),
        };
        let won: TxnResponse = conn.call(&KV_TXN, &cas(revision)).await.expect("txn");
        assert!(won.succeeded);
        let lost: TxnResponse = conn.call(&KV_TXN, &cas(revision)).await.expect("txn");
        assert!(!lost.succeeded);

        // 64 calls in flight on clones of the one connection, as put64 runs them.
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..64 {
            let mut conn = conn.clone();
            tasks.spawn(async move {
                conn.call::<_, PutResponse>(&KV_PUT, &put(&format!("many/{i:02}"), "v"))
                    .await
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.expect("task").expect("concurrent put");
        }
        let many: RangeResponse = conn
            .call(
                &KV_RANGE,
                &RangeRequest {
                    key: Bytes::from_static(b"many/"),
                    range_end: Bytes::from_static(b"many0"),
                    count_only: true,
                    ..Default::default()
                },
            )
            .await
            .expect("count");
        assert_eq!(many.count, 64);

        // An empty key is refused with etcd's InvalidArgument (3), and the error says so.
        let refused = conn
            .call::<_, PutResponse>(&KV_PUT, &put("", "v"))
            .await
            .expect_err("empty key refused");
        assert!(
            refused.contains("grpc-status 3") && refused.contains("key is not provided"),
            "{refused}"
        );
        // The connection still serves after the refusal.
        conn.call::<_, PutResponse>(&KV_PUT, &put("after", "v"))
            .await
            .expect("put after a refusal");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_round_trip_against_skerry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(StoreConfig::new(dir.path())).expect("open");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let api = EtcdApi::new(store, MemberInfo::default());
        let server =
            tokio::spawn(router(api).serve_with_incoming(TcpListenerStream::new(listener)));
        exercise(&endpoint).await;
        server.abort();
    }

    /// The same calls against a real etcd 3.4 (grpc-go's framing and trailers).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_round_trip_against_etcd() {
        let bin = PathBuf::from("/usr/bin/etcd");
        assert!(
            bin.exists(),
            "this test calls a real etcd 3.4: apt-get install etcd-server"
        );
        let server = Server::start(&ServerSpec {
            label: "etcd".into(),
            bin,
            flavor: Flavor::Etcd,
            members: 1,
        })
        .await
        .expect("start etcd");
        exercise(server.endpoint()).await;
        server.stop().await.expect("stop etcd");
    }

    #[tokio::test]
    async fn a_closed_port_is_an_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        assert!(UnaryConn::connect(&endpoint, WAIT, WAIT).await.is_err());
        assert!(
            UnaryConn::connect("https://127.0.0.1:1", WAIT, WAIT)
                .await
                .is_err()
        );
    }

    #[test]
    fn frames_round_trip_and_bad_frames_are_errors() {
        let request = put("key", "value");
        let framed = frame(&request);
        assert_eq!(framed[0], 0);
        assert_eq!(framed.len(), GRPC_PREFIX_BYTES + request.encoded_len());
        let back: PutRequest = unframe(framed.clone()).expect("unframe");
        assert_eq!(back, request);

        assert!(unframe::<PutRequest>(framed.slice(..3)).is_err(), "short");
        assert!(
            unframe::<PutRequest>(framed.slice(..framed.len() - 1)).is_err(),
            "truncated"
        );
        let mut compressed = BytesMut::from(&framed[..]);
        compressed[0] = 1;
        assert!(
            unframe::<PutRequest>(compressed.freeze()).is_err(),
            "compressed"
        );
        let mut garbage = BytesMut::from(&[0u8, 0, 0, 0, 2][..]);
        garbage.extend_from_slice(&[0xff, 0xff]);
        assert!(
            unframe::<PutRequest>(garbage.freeze()).is_err(),
            "undecodable"
        );
    }

    #[test]
    fn grpc_status_is_read_from_headers() {
        let mut headers = HeaderMap::new();
        assert!(grpc_ok(&headers).is_err(), "missing status");
        headers.insert("grpc-status", "0".parse().expect("value"));
        assert!(grpc_ok(&headers).is_ok());
        headers.insert("grpc-status", "9".parse().expect("value"));
        headers.insert("grpc-message", "not leader".parse().expect("value"));
        assert_eq!(
            grpc_ok(&headers).expect_err("status 9"),
            "grpc-status 9: not leader"
        );
        headers.insert("grpc-message", "a%20b%25c%2%zz%".parse().expect("value"));
        assert_eq!(
            grpc_ok(&headers).expect_err("status 9"),
            "grpc-status 9: a b%c%2%zz%"
        );
    }
}
