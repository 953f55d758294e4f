//! The API listener's bounds over real TLS on the loopback (`server::serve_with_limits` with
//! shortened [`ConnLimits`]): a connection silent before its TLS handshake, silent after it
//! (HTTP/1.1, HTTP/2, a bare HTTP/2 preface), trickling its first request, or trickling a
//! later request's headers is closed at its deadline; beyond the cap on connections in their
//! handshake, a new one is closed at once while a connection that already made a request is
//! still served.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use skerry_apiserver::auth::x509;
use skerry_apiserver::server::{ConnLimits, serve_with_limits};
use skerry_tls::pki::{Ca, Names};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The test's bounds: short, so the suite is quick, and apart, so a close tells which fired.
const LIMITS: ConnLimits = ConnLimits {
    tls_handshake: Duration::from_secs(1),
    read_header: Duration::from_secs(2),
    unauthenticated_max: 8,
};
/// Slack after a deadline: a loaded 2-core machine runs the timer late.
const MARGIN: Duration = Duration::from_secs(2);
/// A connection refused over the cap is closed at accept, far sooner than any deadline.
const AT_ONCE: Duration = Duration::from_millis(500);
/// Pause between the bytes of a trickled request.
const TRICKLE: Duration = Duration::from_millis(200);

/// An apiserver served over TLS with [`LIMITS`], and a client configuration trusting it.
struct Fixture {
    addr: std::net::SocketAddr,
    client: rustls::ClientConfig,
    _stop: watch::Sender<bool>,
    _server: common::Server,
}

async fn fixture() -> Fixture {
    let server = common::start().await;
    let ca = Ca::generate("listener test CA").expect("CA");
    let serving = ca
        .serving_cert("kube-apiserver", &Names::of(["localhost", "127.0.0.1"]))
        .expect("serving certificate");
    let tls = x509::server_tls_config(
        ca.cert_der().clone(),
        serving.cert_chain().expect("chain"),
        serving.private_key().expect("key"),
    )
    .expect("server TLS");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(serve_with_limits(
        server.api.clone(),
        listener,
        Arc::new(tls),
        stopped,
        LIMITS,
    ));

    let client = skerry_tls::config::client_config(Arc::new(ca.roots().expect("roots")), None, &[])
        .expect("client TLS");
    Fixture {
        addr,
        client,
        _stop: stop,
        _server: server,
    }
}

impl Fixture {
    /// A TLS connection offering `alpn`; returns it with the moment its handshake ended.
    async fn tls(&self, alpn: &[u8]) -> (TlsStream<TcpStream>, Instant) {
        let mut config = self.client.clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        let tcp = TcpStream::connect(self.addr).await.expect("connect");
        let stream = TlsConnector::from(Arc::new(config))
            .connect(ServerName::IpAddress(self.addr.ip().into()), tcp)
            .await
            .expect("TLS handshake");
        (stream, Instant::now())
    }
}

/// How long after `since` the server closed `stream` (EOF or an error), reading and dropping
/// whatever it sends (an HTTP/2 server's SETTINGS); `None` if still open at `since + limit`.
async fn closed_after(
    stream: &mut (impl AsyncRead + Unpin),
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((since + limit).into(), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Some(since.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

/// Asserts a close came at `deadline` (not before, and within [`MARGIN`] after).
fn assert_closed_at(closed: Option<Duration>, deadline: Duration, what: &str) {
    let closed =
        closed.unwrap_or_else(|| panic!("{what}: still open {MARGIN:?} past {deadline:?}"));
    assert!(
        closed >= deadline - Duration::from_millis(100),
        "{what}: closed after {closed:?}, before the {deadline:?} deadline"
    );
}

/// Writes `bytes` one at a time, [`TRICKLE`] apart, until the server closes the connection
/// or `bytes` run out; never blocks on the server.
async fn trickle(stream: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) {
    for byte in bytes {
        if stream.write_all(&[*byte]).await.is_err() || stream.flush().await.is_err() {
            return;
        }
        tokio::time::sleep(TRICKLE).await;
    }
}

/// Sends an HTTP/1.1 GET of `path` and reads the whole response; returns its status line.
async fn get(stream: &mut TlsStream<TcpStream>, path: &str) -> String {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .expect("send the request");
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = tokio::time::timeout(MARGIN, stream.read(&mut buf))
            .await
            .expect("a response")
            .expect("read the response");
        assert!(n > 0, "the connection closed before a response");
        response.extend_from_slice(&buf[..n]);
        if let Some(at) = response.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&response[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().expect("a content length"))
        .expect("the answer has a Content-Length");
    while response.len() < head_end + length {
        let n = stream.read(&mut buf).await.expect("read the body");
        assert!(n > 0, "the connection closed inside the body");
        response.extend_from_slice(&buf[..n]);
    }
    head.lines().next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_before_its_tls_handshake_is_closed_at_the_handshake_deadline() {
    let f = fixture().await;
    let opened = Instant::now();
    let mut silent = TcpStream::connect(f.addr).await.expect("connect");
    let mut hello_only = TcpStream::connect(f.addr).await.expect("connect");
    // Half a record header: a ClientHello that never completes.
    hello_only.write_all(&[0x16, 0x03]).await.expect("write");
    let limit = LIMITS.tls_handshake + MARGIN;
    let (silent, hello_only) = tokio::join!(
        closed_after(&mut silent, opened, limit),
        closed_after(&mut hello_only, opened, limit),
    );
    assert_closed_at(silent, LIMITS.tls_handshake, "no ClientHello");
    assert_closed_at(hello_only, LIMITS.tls_handshake, "a partial ClientHello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_first_request_after_tls_is_closed_at_the_header_deadline() {
    let f = fixture().await;
    let limit = LIMITS.read_header + MARGIN;
    let (mut h1, h1_since) = f.tls(b"http/1.1").await;
    let (mut h2, h2_since) = f.tls(b"h2").await;
    let (mut preface, preface_since) = f.tls(b"h2").await;
    // The HTTP/2 connection preface and an empty SETTINGS frame, then nothing.
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .expect("preface");
    let (mut slow, slow_since) = f.tls(b"http/1.1").await;
    let (h1, h2, preface, slow) = tokio::join!(
        closed_after(&mut h1, h1_since, limit),
        closed_after(&mut h2, h2_since, limit),
        closed_after(&mut preface, preface_since, limit),
        async {
            // A request line and headers a byte every 200 ms: 60 bytes would take 12 s.
            let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaa\r\n\r\n";
            let (mut read, mut write) = tokio::io::split(&mut slow);
            tokio::select! {
                closed = closed_after(&mut read, slow_since, limit) => closed,
                _ = trickle(&mut write, request) => None,
            }
        },
    );
    assert_closed_at(h1, LIMITS.read_header, "HTTP/1.1, no request");
    assert_closed_at(h2, LIMITS.read_header, "HTTP/2, no preface");
    assert_closed_at(preface, LIMITS.read_header, "HTTP/2 preface, no request");
    assert_closed_at(slow, LIMITS.read_header, "a trickled first request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_request_whose_headers_trickle_is_closed_at_the_header_deadline() {
    let f = fixture().await;
    let (mut conn, _) = f.tls(b"http/1.1").await;
    let status = get(&mut conn, "/healthz").await;
    assert!(status.starts_with("http/1.1 "), "{status}");
    let since = Instant::now();
    let limit = LIMITS.read_header + MARGIN;
    let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaa\r\n\r\n";
    let (mut read, mut write) = tokio::io::split(&mut conn);
    let closed = tokio::select! {
        closed = closed_after(&mut read, since, limit) => closed,
        _ = trickle(&mut write, request) => None,
    };
    assert_closed_at(
        closed,
        LIMITS.read_header,
        "trickled headers of a second request",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_a_connection_is_closed_at_once_while_a_served_one_keeps_working() {
    let f = fixture().await;
    let (mut served, _) = f.tls(b"http/1.1").await;
    get(&mut served, "/healthz").await;

    let opened = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..LIMITS.unauthenticated_max {
        idle.push(TcpStream::connect(f.addr).await.expect("connect"));
    }
    let mut over = TcpStream::connect(f.addr).await.expect("connect");
    assert!(
        closed_after(&mut over, opened, AT_ONCE).await.is_some(),
        "a connection over the cap was not closed at once"
    );
    // The cap is full, and the connection that already made a request is still served.
    let status = get(&mut served, "/healthz").await;
    assert!(status.starts_with("http/1.1 "), "{status}");
    assert!(
        opened.elapsed() < LIMITS.tls_handshake,
        "the test ran too slowly"
    );

    for mut stream in idle {
        let closed = closed_after(&mut stream, opened, LIMITS.tls_handshake + MARGIN).await;
        assert_closed_at(
            closed,
            LIMITS.tls_handshake,
            "an idle connection under the cap",
        );
    }
    // The slots came back: a new client gets through.
    let (mut fresh, _) = f.tls(b"http/1.1").await;
    let status = get(&mut fresh, "/healthz").await;
    assert!(status.starts_with("http/1.1 "), "{status}");
}
