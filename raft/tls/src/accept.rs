//! What every listener of `skerry server` puts around `accept`: a pause that grows while
//! accepting fails, a cap on the connections that have not yet shown who they are, the accept
//! loop that applies both ([`serve`]), and a TLS handshake bounded by the listener's deadline
//! ([`accept_tls`], and [`connect_tls`] for the dialling side).
//!
//! `accept(2)` fails while the process is out of file descriptors (`EMFILE`), the machine is
//! (`ENFILE`), or the kernel is short of socket memory. The pending connection stays in the
//! backlog, so the listener is readable again at once: a loop that retries straight away
//! spins a core and floods the log until a descriptor frees. [`AcceptBackoff`] pauses 5 ms
//! after the first failure, doubling up to 1 s, as Go's `net/http` `Server.Serve` does, and
//! logs one warning per run of failures and one line when accepting works again.
//!
//! From the moment it is accepted a connection holds a task, a descriptor and handshake
//! state, before it has proved anything (a TLS handshake, then a first frame or request).
//! [`HandshakeGate`] gives at most a fixed number of such connections a slot; one beyond it is
//! closed at once. The trick: refusing at accept, instead of letting a flood queue, means the
//! connections that already authenticated never wait behind it, and a flood costs its sender
//! a refused connection rather than us a task per socket. A slot comes back when its
//! connection authenticates or closes, and every listener bounds that time with its own
//! deadline (its named constants live beside it: the peer port's, the API port's and the
//! client port's differ on purpose), so no slot is held for good.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::{TlsAcceptor, TlsConnector, client, server};
use tracing::{debug, info, warn};

/// First pause after a failed accept. Go's `net/http` `(*Server).Serve` (`server.go`): 5 ms,
/// short enough that a descriptor freed by a closing connection is used almost at once.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between accepts while they keep failing (Go's `Serve` caps it at 1 s): a
/// listener out of descriptors tries once a second, costing nothing, and resumes within a
/// second of one freeing.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The backoff state of one accept loop (see the module docs).
pub struct AcceptBackoff {
    /// Names the listener in the log: `peer`, `kubernetes-api`, ...
    listener: &'static str,
    /// The last pause; zero while accepting succeeds.
    delay: Duration,
    /// Failures since the last success.
    failures: u64,
}

impl AcceptBackoff {
    pub fn new(listener: &'static str) -> Self {
        Self {
            listener,
            delay: Duration::ZERO,
            failures: 0,
        }
    }

    /// The next connection `accept` yields, pausing with backoff after each failure. Safe
    /// to cancel (in a `select!`) when `accept` is, as `TcpListener::accept` is.
    pub async fn accept<T, F, Fut>(&mut self, mut accept: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = io::Result<T>>,
    {
        loop {
            match accept().await {
                Ok(conn) => {
                    if self.failures > 0 {
                        info!(
                            listener = self.listener,
                            failures = self.failures,
                            "accepting connections again"
                        );
                    }
                    self.failures = 0;
                    self.delay = Duration::ZERO;
                    return conn;
                }
                // The client reset the connection while it waited in the backlog: that
                // connection is gone from the queue and the next is unaffected (Go's poller
                // retries at once too, `internal/poll/fd_unix.go` `Accept`).
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    self.delay = if self.delay.is_zero() {
                        ACCEPT_BACKOFF_MIN
                    } else {
                        (self.delay * 2).min(ACCEPT_BACKOFF_MAX)
                    };
                    if self.failures == 0 {
                        warn!(
                            listener = self.listener,
                            error = %e,
                            "accepting a connection failed; retrying every 5 ms, doubling to 1 s, \
                             until it works"
                        );
                    }
                    self.failures += 1;
                    tokio::time::sleep(self.delay).await;
                }
            }
        }
    }
}

/// The cap on one listener's connections still in their handshake (see the module docs).
/// Cheap to clone: the clones share the slots.
#[derive(Clone)]
pub struct HandshakeGate {
    inner: Arc<GateInner>,
}

struct GateInner {
    listener: &'static str,
    max: usize,
    slots: Arc<Semaphore>,
    /// Connections refused since one was last admitted: the first of a run is logged, and
    /// the count when admitting resumes.
    refused: AtomicU64,
}

/// A connection's place under the cap; dropping it (the connection authenticated, or it
/// closed) makes room for another.
pub struct HandshakeSlot {
    _permit: OwnedSemaphorePermit,
}

impl HandshakeGate {
    /// A gate letting at most `max` connections of `listener` handshake at once.
    pub fn new(listener: &'static str, max: usize) -> Self {
        Self {
            inner: Arc::new(GateInner {
                listener,
                max,
                slots: Arc::new(Semaphore::new(max)),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// A slot for a connection just accepted, or `None` when `max` are already handshaking:
    /// the caller then closes the connection at once.
    pub fn admit(&self) -> Option<HandshakeSlot> {
        let inner = &self.inner;
        match inner.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let refused = inner.refused.swap(0, Ordering::Relaxed);
                if refused > 0 {
                    info!(
                        listener = inner.listener,
                        refused, "admitting connections again after refusing some over the cap"
                    );
                }
                Some(HandshakeSlot { _permit: permit })
            }
            Err(_) => {
                if inner.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                    warn!(
                        listener = inner.listener,
                        max = inner.max,
                        "too many connections still in their handshake; closing new ones at \
                         once until some finish"
                    );
                }
                None
            }
        }
    }

    /// Connections holding a slot now.
    pub fn handshaking(&self) -> usize {
        self.inner.max - self.inner.slots.available_permits()
    }
}

/// Accepts connections on `listener` until `stop` completes, each admitted by `gate` (one
/// over its cap is closed at once) and handed with its slot to `handle` on a task of its own;
/// `accept` failures back off ([`AcceptBackoff`], named after the gate's listener).
/// Connections get `TCP_NODELAY`: every protocol served here is request/response and
/// latency-bound.
///
/// The connection tasks are owned by this future: when `stop` completes it returns and leaves
/// them to finish by themselves (each watches its own shutdown signal and closes gracefully);
/// when the future is dropped instead (its task aborted, as the peer transport stops), they
/// are aborted with it.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    gate: HandshakeGate,
    stop: impl Future<Output = ()>,
    mut handle: F,
) where
    F: FnMut(TcpStream, SocketAddr, HandshakeSlot) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut backoff = AcceptBackoff::new(gate.inner.listener);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, remote) = tokio::select! {
            accepted = backoff.accept(|| listener.accept()) => accepted,
            () = &mut stop => {
                connections.detach_all();
                return;
            }
        };
        // Over the cap the stream is dropped here: closed at once.
        let Some(slot) = gate.admit() else {
            debug!(listener = gate.inner.listener, %remote, "over the handshake cap; closing");
            continue;
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(handle(stream, remote, slot));
    }
}

/// Why a bounded TLS handshake gave no connection.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The other side did not finish its part within the deadline.
    #[error("TLS handshake: no answer within {0:?}")]
    TimedOut(Duration),
    /// The handshake failed (a certificate refused, not TLS, the connection closed).
    #[error("TLS handshake: {0}")]
    Failed(io::Error),
}

/// The server side of a TLS handshake on an accepted connection, given `within` to finish.
pub async fn accept_tls(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    within: Duration,
) -> Result<server::TlsStream<TcpStream>, HandshakeError> {
    match tokio::time::timeout(within, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(HandshakeError::Failed(e)),
        Err(_) => Err(HandshakeError::TimedOut(within)),
    }
}

/// The client side of a TLS handshake with `name` on a connected stream, given `within` to
/// finish (a server that accepts TCP but never answers TLS must not hold the dialler).
pub async fn connect_tls(
    connector: &TlsConnector,
    name: ServerName<'static>,
    stream: TcpStream,
    within: Duration,
) -> Result<client::TlsStream<TcpStream>, HandshakeError> {
    match tokio::time::timeout(within, connector.connect(name, stream)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(HandshakeError::Failed(e)),
        Err(_) => Err(HandshakeError::TimedOut(within)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// A `tracing` writer into a shared buffer, to count what was logged.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn count(&self, needle: &str) -> usize {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .matches(needle)
                .count()
        }
    }

    fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    /// Failing accepts pause 5 ms, doubling to 1 s, start again at 5 ms after a success, and
    /// log one warning per run of failures.
    #[tokio::test(start_paused = true)]
    async fn failures_back_off_from_5_ms_doubling_to_1_s_and_log_once_per_run() {
        let (log, _guard) = capture();
        let mut backoff = AcceptBackoff::new("test");
        let mut calls = Vec::new();
        let start = Instant::now();
        let mut fail_for = 11;
        let got = backoff
            .accept(|| {
                calls.push(start.elapsed());
                fail_for -= 1;
                let result = if fail_for >= 0 {
                    Err(io::Error::from_raw_os_error(24)) // EMFILE
                } else {
                    Ok(7)
                };
                async move { result }
            })
            .await;
        assert_eq!(got, 7);
        let pauses: Vec<u64> = calls
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert_eq!(log.count("accepting a connection failed"), 1);
        assert_eq!(log.count("accepting connections again"), 1);

        // A new run starts from the shortest pause and warns again.
        let mut calls = Vec::new();
        let mut fail_for = 2;
        backoff
            .accept(|| {
                calls.push(Instant::now());
                fail_for -= 1;
                let result = if fail_for >= 0 {
                    Err(io::Error::from_raw_os_error(24))
                } else {
                    Ok(())
                };
                async move { result }
            })
            .await;
        assert_eq!(calls[1] - calls[0], ACCEPT_BACKOFF_MIN);
        assert_eq!(calls[2] - calls[1], ACCEPT_BACKOFF_MIN * 2);
        assert_eq!(log.count("accepting a connection failed"), 2);
    }

    /// A connection aborted in the backlog is skipped without a pause or a warning.
    #[tokio::test(start_paused = true)]
    async fn an_aborted_connection_is_skipped_at_once() {
        let (log, _guard) = capture();
        let mut backoff = AcceptBackoff::new("test");
        let start = Instant::now();
        let mut first = true;
        backoff
            .accept(|| {
                let result = if std::mem::take(&mut first) {
                    Err(io::Error::from(io::ErrorKind::ConnectionAborted))
                } else {
                    Ok(())
                };
                async move { result }
            })
            .await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(log.count("failed"), 0);
    }

    /// The gate admits `max` at once, refuses the next (logging once per run), and admits
    /// again when a slot is given back.
    #[test]
    fn the_gate_refuses_beyond_its_cap_until_a_slot_is_given_back() {
        let (log, _guard) = capture();
        let gate = HandshakeGate::new("test", 3);
        let mut slots: Vec<HandshakeSlot> = (0..3).map(|_| gate.admit().unwrap()).collect();
        assert_eq!(gate.handshaking(), 3);
        assert!(gate.admit().is_none());
        assert!(gate.clone().admit().is_none(), "clones share the slots");
        assert_eq!(log.count("too many connections"), 1);
        slots.pop();
        assert_eq!(gate.handshaking(), 2);
        slots.push(gate.admit().unwrap());
        assert_eq!(log.count("refused=2"), 1);
        assert!(gate.admit().is_none());
        assert_eq!(log.count("too many connections"), 2);
    }

    use crate::config::{ClientAuth, client_config, server_config};
    use crate::pki::{Ca, Names};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    /// Slack after a deadline: a loaded 2-core machine runs the timer late.
    const MARGIN: Duration = Duration::from_secs(2);

    async fn listener() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    /// How long after `since` the other side closed `stream`; `None` if open at `limit`.
    async fn closed_after(
        stream: &mut (impl tokio::io::AsyncRead + Unpin),
        since: std::time::Instant,
        limit: Duration,
    ) -> Option<Duration> {
        let mut buf = [0u8; 64];
        loop {
            match tokio::time::timeout_at((since + limit).into(), stream.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return Some(since.elapsed()),
                Ok(Ok(_)) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Over the cap a connection is closed at accept; a connection that proves itself (here:
    /// sends a byte) gives its slot back, and the next one is admitted.
    #[tokio::test]
    async fn the_loop_closes_connections_over_the_cap_and_a_proven_one_frees_a_slot() {
        let (listener, addr) = listener().await;
        let (proven_tx, mut proven_rx) = mpsc::unbounded_channel();
        tokio::spawn(serve(
            listener,
            HandshakeGate::new("test", 2),
            std::future::pending(),
            move |mut stream, _, slot| {
                let proven_tx = proven_tx.clone();
                async move {
                    let mut byte = [0u8; 1];
                    if stream.read(&mut byte).await.ok() == Some(1) {
                        drop(slot);
                        let _ = proven_tx.send(stream);
                    }
                }
            },
        ));
        let mut first = TcpStream::connect(addr).await.unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        let at_once = closed_after(&mut third, std::time::Instant::now(), MARGIN).await;
        assert!(at_once.is_some(), "the third, over the cap, is closed");
        first.write_all(b"x").await.unwrap();
        let _proven = proven_rx.recv().await.unwrap();
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        fourth.write_all(b"y").await.unwrap();
        let routed = tokio::time::timeout(MARGIN, proven_rx.recv()).await;
        assert!(matches!(routed, Ok(Some(_))), "the fourth got a slot");
    }

    /// `stop` ends the loop (no new connection is taken) but not the connections it had;
    /// dropping the loop instead aborts them.
    #[tokio::test]
    async fn stop_leaves_connections_running_and_dropping_the_loop_aborts_them() {
        for abort in [false, true] {
            let (listener, addr) = listener().await;
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let looping = tokio::spawn(serve(
                listener,
                HandshakeGate::new("test", 8),
                async move {
                    let _ = stop_rx.await;
                },
                |mut stream, _, _| async move {
                    // Echo one byte after a pause, then close.
                    let mut byte = [0u8; 1];
                    if stream.read_exact(&mut byte).await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let _ = stream.write_all(&byte).await;
                    }
                },
            ));
            let mut client = TcpStream::connect(addr).await.unwrap();
            client.write_all(b"z").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            if abort {
                looping.abort();
            } else {
                stop_tx.send(()).unwrap();
            }
            let _ = looping.await;
            let mut byte = [0u8; 1];
            let answer = tokio::time::timeout(MARGIN, client.read(&mut byte)).await;
            if abort {
                assert!(matches!(answer, Ok(Ok(0)) | Ok(Err(_))), "{answer:?}");
            } else {
                assert!(matches!(answer, Ok(Ok(1))), "{answer:?}");
                assert_eq!(&byte, b"z");
                assert!(
                    TcpStream::connect(addr).await.is_err(),
                    "the listener is closed"
                );
            }
        }
    }

    /// A bounded handshake: a client silent before its ClientHello is closed at the
    /// deadline, not before; a client that speaks TLS is served; and a dial to a listener that
    /// never answers TLS gives up at its own deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tls_handshake_is_bounded_on_both_sides() {
        const DEADLINE: Duration = Duration::from_millis(800);
        let ca = Ca::generate("cluster").unwrap();
        let leaf = ca
            .serving_cert("server", &Names::of(["127.0.0.1"]))
            .unwrap();
        let server = server_config(
            leaf.cert_chain().unwrap(),
            leaf.private_key().unwrap(),
            ClientAuth::Off,
            &[],
        )
        .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(server));
        let (listener, addr) = listener().await;
        tokio::spawn(serve(
            listener,
            HandshakeGate::new("test", 8),
            std::future::pending(),
            move |stream, _, _slot| {
                let acceptor = acceptor.clone();
                async move {
                    if let Ok(mut tls) = accept_tls(&acceptor, stream, DEADLINE).await {
                        let _ = tls.write_all(b"hi").await;
                        let _ = tls.flush().await;
                        let mut rest = [0u8; 1];
                        let _ = tls.read(&mut rest).await;
                    }
                }
            },
        ));
        let opened = std::time::Instant::now();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let closed = closed_after(&mut silent, opened, DEADLINE + MARGIN).await;
        let closed = closed.expect("a silent client is closed");
        assert!(closed >= DEADLINE - Duration::from_millis(50), "{closed:?}");

        let connector = TlsConnector::from(Arc::new(
            client_config(Arc::new(ca.roots().unwrap()), None, &[]).unwrap(),
        ));
        let name = ServerName::IpAddress(addr.ip().into());
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut tls = connect_tls(&connector, name.clone(), tcp, DEADLINE)
            .await
            .unwrap();
        let mut hi = [0u8; 2];
        tls.read_exact(&mut hi).await.unwrap();
        assert_eq!(&hi, b"hi");

        // A listener whose backlog completes TCP connects but which never answers TLS.
        let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = TcpStream::connect(mute.local_addr().unwrap())
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let dial = connect_tls(&connector, name, tcp, DEADLINE).await;
        match dial {
            Err(e @ HandshakeError::TimedOut(_)) => {
                assert!(e.to_string().contains("no answer"), "{e}");
            }
            other => panic!("a mute listener: {:?}", other.map(|_| ())),
        }
        assert!(started.elapsed() >= DEADLINE - Duration::from_millis(50));
    }
}
