//! Joins a client's WebSocket to the runtime's SPDY session.
//!
//! Remote commands ([`remote_command`]): stdin (and v5's `[255, 0]` as its FIN) and resize
//! go to the runtime's streams; its stdout and stderr come back on their channels; once
//! both are finished and the error stream is too, its `Status` (the exit code) goes out on
//! channel 3 and the WebSocket is closed normally, which is when kubectl stops reading.
//!
//! Port-forward ([`port_forward`]): the client's SPDY session (tunnelled in the WebSocket)
//! opens an error and a data stream per forwarded connection, named by `requestid` and
//! `port`; each pair gets its own runtime session (CRI `PortForward` URLs are single use)
//! and bytes are copied both ways, FIN for FIN.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;

use super::channel;
use super::idle::Idle;
use super::runtime;
use super::spdy::{self, Headers, Session, Stream, StreamWriter};

/// The most of the runtime's error stream kept (a `Status` JSON is far smaller).
const ERROR_STREAM_MAX: usize = 64 * 1024;

/// Messages queued for the WebSocket writer.
const WS_QUEUE: usize = 32;

/// Which streams a remote command has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    /// The client sends stdin.
    pub stdin: bool,
    /// The client reads stdout.
    pub stdout: bool,
    /// The client reads stderr (never with a tty: its output is stdout).
    pub stderr: bool,
    /// A terminal: the resize stream.
    pub tty: bool,
}

/// The runtime's streams of one remote command, opened before the client's upgrade is
/// answered so a failure is still an HTTP error.
pub struct RuntimeStreams {
    session: Session,
    error: Stream,
    stdin: Option<Stream>,
    stdout: Option<Stream>,
    stderr: Option<Stream>,
    resize: Option<Stream>,
}

/// Opens the streams of `streams` on the runtime's `session`, in client-go's order (error,
/// stdin, stdout, stderr, resize: `streamProtocolV4.createStreams`).
pub async fn open_streams(
    session: Session,
    streams: Streams,
) -> Result<RuntimeStreams, spdy::SpdyError> {
    let open = |kind: &'static str| {
        let session = session.clone();
        async move { session.open(Headers::of(&[("streamType", kind)])).await }
    };
    let error = open("error").await?;
    let stdin = maybe(streams.stdin, || open("stdin")).await?;
    let stdout = maybe(streams.stdout, || open("stdout")).await?;
    let stderr = maybe(streams.stderr && !streams.tty, || open("stderr")).await?;
    let resize = maybe(streams.tty, || open("resize")).await?;
    Ok(RuntimeStreams {
        session,
        error,
        stdin,
        stdout,
        stderr,
        resize,
    })
}

async fn maybe<F, Fut>(wanted: bool, f: F) -> Result<Option<Stream>, spdy::SpdyError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Stream, spdy::SpdyError>>,
{
    if wanted {
        f().await.map(Some)
    } else {
        Ok(None)
    }
}

/// Runs one remote command between the client's `ws` (speaking `protocol`) and the
/// runtime's streams, until the command ends or the client goes.
pub async fn remote_command<S>(
    ws: WebSocketStream<S>,
    protocol: &str,
    runtime: RuntimeStreams,
    idle: Arc<Idle>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let RuntimeStreams {
        session,
        error,
        stdin,
        stdout,
        stderr,
        resize,
    } = runtime;
    let (mut sink, mut source) = ws.split();
    let (tx, mut rx) = mpsc::channel::<Message>(WS_QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let closing = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || closing {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let gone = CancellationToken::new();
    // The client's messages: stdin, its close, resizes. Pings are answered by tungstenite.
    let v5 = protocol == channel::V5;
    let stdin = stdin.map(|s| s.split().1);
    let resize = resize.map(|s| s.split().1);
    let reader = {
        let gone = gone.clone();
        tokio::spawn(async move {
            let mut stdin = stdin;
            while let Some(Ok(m)) = source.next().await {
                // Text frames carry channel data too (the Python client writes a `str` as text;
                // upstream's `wsstream` reads either kind of frame).
                let data = match m {
                    Message::Binary(_) | Message::Text(_) => m.into_data(),
                    Message::Close(_) => break,
                    _ => continue,
                };
                let Some((&ch, payload)) = data.split_first() else {
                    continue;
                };
                let ok = match ch {
                    channel::STDIN => match &stdin {
                        Some(w) => w.send(payload).await.is_ok(),
                        None => true,
                    },
                    channel::RESIZE => match &resize {
                        Some(w) => w.send(payload).await.is_ok(),
                        None => true,
                    },
                    channel::CLOSE if v5 && payload.first() == Some(&channel::STDIN) => {
                        if let Some(w) = stdin.take() {
                            let _ = w.close().await;
                        }
                        true
                    }
                    _ => true,
                };
                if !ok {
                    break;
                }
            }
            gone.cancel();
        })
    };
    let forward = |stream: Option<Stream>, ch: u8| {
        let tx = tx.clone();
        async move {
            let Some(mut s) = stream else { return };
            while let Some(b) = s.recv().await {
                let mut m = BytesMut::with_capacity(b.len() + 1);
                m.extend_from_slice(&[ch]);
                m.extend_from_slice(&b);
                if tx.send(Message::Binary(m.freeze())).await.is_err() {
                    return;
                }
            }
        }
    };
    let status = async move {
        let mut error = error;
        let mut status = Vec::new();
        while let Some(b) = error.recv().await {
            if status.len() + b.len() <= ERROR_STREAM_MAX {
                status.extend_from_slice(&b);
            }
        }
        status
    };
    let finished = async {
        let (_, _, status) = tokio::join!(
            forward(stdout, channel::STDOUT),
            forward(stderr, channel::STDERR),
            status
        );
        status
    };
    tokio::select! {
        status = finished => {
            if !status.is_empty() {
                let mut m = Vec::with_capacity(status.len() + 1);
                m.push(channel::ERROR);
                m.extend_from_slice(&status);
                let _ = tx.send(Message::Binary(Bytes::from(m))).await;
            }
            let _ = tx
                .send(Message::Close(Some(CloseFrame {
                    code: CloseCode::Normal,
                    reason: "".into(),
                })))
                .await;
        }
        () = gone.cancelled() => {}
        () = idle.expired() => tracing::debug!("kubelet: streaming session idle; closed"),
    }
    drop(tx);
    let _ = writer.await;
    reader.abort();
    session.close().await;
}

/// What a forwarded connection needs from the kubelet: a fresh runtime session for `port`.
pub trait Forwarder: Send + Sync + 'static {
    /// A URL of the runtime's streaming server forwarding to `port`.
    fn url(&self, port: u16) -> impl Future<Output = Result<String, String>> + Send;
}

/// Runs a port-forward tunnel: SPDY frames in the WebSocket's binary messages, this side the
/// SPDY server. Ends when the client closes the WebSocket.
pub async fn port_forward<S, F>(ws: WebSocketStream<S>, forwarder: Arc<F>, idle: Arc<Idle>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Forwarder,
{
    let (tunnel, ours) = tokio::io::duplex(spdy::MAX_FRAME);
    let (mut sink, mut source) = ws.split();
    let (mut tunnel_read, mut tunnel_write) = tokio::io::split(tunnel);
    // WebSocket messages in, tunnel bytes out.
    let inbound = tokio::spawn(async move {
        while let Some(Ok(m)) = source.next().await {
            match m {
                Message::Binary(b) if tunnel_write.write_all(&b).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = tunnel_write.shutdown().await;
    });
    let outbound = tokio::spawn(async move {
        let mut buf = vec![0u8; spdy::DATA_CHUNK + 64];
        loop {
            match tunnel_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink
                        .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = sink.close().await;
    });
    let (session, mut incoming) = Session::new(ours, true);
    // Streams wait here for their partner (same `requestid`): error first, then data.
    let mut pending: HashMap<String, Stream> = HashMap::new();
    loop {
        let stream = tokio::select! {
            s = incoming.recv() => match s {
                Some(s) => s,
                None => break,
            },
            () = idle.expired() => {
                tracing::debug!("kubelet: port-forward tunnel idle; closed");
                break;
            }
        };
        let id = stream.headers.get("requestid").unwrap_or("").to_string();
        let Some(other) = pending.remove(&id) else {
            if pending.len() >= spdy::MAX_STREAMS {
                let _ = stream.writer().reset().await;
                continue;
            }
            pending.insert(id, stream);
            continue;
        };
        let (error, data) = if other.headers.get("streamtype") == Some("error") {
            (other, stream)
        } else {
            (stream, other)
        };
        tokio::spawn(forward_one(forwarder.clone(), error, data));
    }
    session.close().await;
    inbound.abort();
    let _ = outbound.await;
}

/// Runs a WebSocket port-forward of the channel protocol (upstream
/// `kubelet/cri/streaming/portforward/websocket.go`, what the Python client and clients
/// before the SPDY tunnel speak): for the `i`-th of `ports`, channel `2i` carries data both
/// ways and `2i+1` the runtime's errors, each opened by the port in two little-endian
/// bytes. Each port is one connection into the pod, through a runtime session of its own;
/// the WebSocket is closed once every port's connection has ended (the protocol has no
/// per-channel close), when the client goes, or when the session is idle.
pub async fn port_forward_channels<S, F>(
    ws: WebSocketStream<S>,
    forwarder: Arc<F>,
    ports: Vec<u16>,
    idle: Arc<Idle>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Forwarder,
{
    let (mut sink, mut source) = ws.split();
    let (tx, mut rx) = mpsc::channel::<Message>(WS_QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let closing = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || closing {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut inputs: Vec<Option<StreamWriter>> = Vec::with_capacity(ports.len());
    let mut sessions = Vec::new();
    let mut copies = tokio::task::JoinSet::new();
    for (i, &port) in ports.iter().enumerate() {
        let (data_ch, error_ch) = channel_pair(i);
        for ch in [data_ch, error_ch] {
            let [lo, hi] = port.to_le_bytes();
            let _ = tx
                .send(Message::Binary(Bytes::copy_from_slice(&[ch, lo, hi])))
                .await;
        }
        match runtime_pair(forwarder.as_ref(), port, &i.to_string()).await {
            Ok((session, r_error, r_data)) => {
                let (data_rx, data_w) = r_data.split();
                inputs.push(Some(data_w));
                sessions.push(session);
                copies.spawn(to_channel(data_rx, data_ch, tx.clone()));
                copies.spawn(to_channel(r_error.split().0, error_ch, tx.clone()));
            }
            Err(e) => {
                inputs.push(None);
                let message = format!("error forwarding port {port}: {e}");
                let mut m = vec![error_ch];
                m.extend_from_slice(message.as_bytes());
                let _ = tx.send(Message::Binary(Bytes::from(m))).await;
            }
        }
    }
    // The client's data to each port's connection; its error channels are write-only.
    let mut reader = tokio::spawn(async move {
        while let Some(Ok(m)) = source.next().await {
            // Text frames carry channel data too (the Python client writes a `str` as text;
            // upstream's `wsstream` reads either kind of frame).
            let data = match m {
                Message::Binary(_) | Message::Text(_) => m.into_data(),
                Message::Close(_) => break,
                _ => continue,
            };
            let Some((&ch, payload)) = data.split_first() else {
                continue;
            };
            if ch % 2 != 0 || payload.is_empty() {
                continue;
            }
            if let Some(Some(w)) = inputs.get(usize::from(ch / 2))
                && w.send(payload).await.is_err()
            {
                break;
            }
        }
    });
    let all_done = async { while copies.join_next().await.is_some() {} };
    tokio::select! {
        () = all_done => {
            let _ = tx
                .send(Message::Close(Some(CloseFrame {
                    code: CloseCode::Normal,
                    reason: "".into(),
                })))
                .await;
        }
        _ = &mut reader => {}
        () = idle.expired() => tracing::debug!("kubelet: port-forward session idle; closed"),
    }
    drop(tx);
    let _ = writer.await;
    reader.abort();
    for s in sessions {
        s.close().await;
    }
}

/// The data and error channels of the `i`-th forwarded port (the protocol has 256
/// channels: the 128th port on wraps, and the apiserver's query bounds the count long
/// before).
fn channel_pair(i: usize) -> (u8, u8) {
    let data = u8::try_from((i * 2) % 256).unwrap_or(0);
    (data, data.wrapping_add(1))
}

/// Copies a runtime stream's data to the client's channel `ch`.
async fn to_channel(mut from: mpsc::Receiver<Bytes>, ch: u8, tx: mpsc::Sender<Message>) {
    while let Some(b) = from.recv().await {
        let mut m = BytesMut::with_capacity(b.len() + 1);
        m.extend_from_slice(&[ch]);
        m.extend_from_slice(&b);
        if tx.send(Message::Binary(m.freeze())).await.is_err() {
            return;
        }
    }
}

/// A runtime session forwarding to `port` and its error and data streams, named by
/// `request_id` as client-go names them.
async fn runtime_pair<F: Forwarder>(
    forwarder: &F,
    port: u16,
    request_id: &str,
) -> Result<(Session, Stream, Stream), String> {
    let url = forwarder.url(port).await?;
    let session = runtime::connect(&url, runtime::PORTFORWARD_V1)
        .await
        .map_err(|e| e.to_string())?;
    let port = port.to_string();
    let headers = |kind: &str| {
        Headers::of(&[
            ("streamType", kind),
            ("port", &port),
            ("requestID", request_id),
        ])
    };
    let error = session
        .open(headers("error"))
        .await
        .map_err(|e| e.to_string())?;
    let data = session
        .open(headers("data"))
        .await
        .map_err(|e| e.to_string())?;
    Ok((session, error, data))
}

/// One forwarded connection: the runtime's pair of streams for the same port, bytes copied
/// both ways; a failure is written to the client's error stream as upstream's kubelet does
/// (`error forwarding port <port> to pod ...`).
async fn forward_one<F: Forwarder>(forwarder: Arc<F>, error: Stream, data: Stream) {
    let port_header = data.headers.get("port").unwrap_or("").to_string();
    let request_id = data.headers.get("requestid").unwrap_or("").to_string();
    let fail = |message: String| {
        let w = error.writer();
        async move {
            let _ = w.send(message.as_bytes()).await;
            let _ = w.close().await;
        }
    };
    let Ok(port) = port_header.parse::<u16>() else {
        fail(format!("invalid port {port_header:?}")).await;
        let _ = data.writer().reset().await;
        return;
    };
    let (session, r_error, r_data) = match runtime_pair(forwarder.as_ref(), port, &request_id).await
    {
        Ok(p) => p,
        Err(e) => {
            fail(format!("error forwarding port {port}: {e}")).await;
            let _ = data.writer().reset().await;
            return;
        }
    };
    let (client_rx, client_w) = data.split();
    let (runtime_rx, runtime_w) = r_data.split();
    let up = pipe(client_rx, runtime_w);
    let down = pipe(runtime_rx, client_w);
    let errors = pipe(r_error.split().0, error.writer());
    tokio::join!(up, down, errors);
    session.close().await;
}

/// Copies a stream's data into a writer, then half-closes it.
async fn pipe(mut from: mpsc::Receiver<Bytes>, to: StreamWriter) {
    while let Some(b) = from.recv().await {
        if to.send(&b).await.is_err() {
            return;
        }
    }
    let _ = to.close().await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// A runtime that upper-cases stdin to stdout once stdin ends, says `e` on stderr and
    /// reports exit code 7, as containerd's v4 server writes it.
    async fn fake_runtime(mut incoming: mpsc::Receiver<Stream>) {
        let mut by_type = HashMap::new();
        while by_type.len() < 4 {
            let s = incoming.recv().await.unwrap();
            by_type.insert(s.headers.get("streamtype").unwrap().to_string(), s);
        }
        let mut stdin = by_type.remove("stdin").unwrap();
        let mut got = Vec::new();
        while let Some(b) = stdin.recv().await {
            got.extend_from_slice(&b);
        }
        let stdout = by_type.remove("stdout").unwrap().writer();
        stdout.send(&got.to_ascii_uppercase()).await.unwrap();
        stdout.close().await.unwrap();
        let stderr = by_type.remove("stderr").unwrap().writer();
        stderr.send(b"e").await.unwrap();
        stderr.close().await.unwrap();
        let error = by_type.remove("error").unwrap().writer();
        error.send(STATUS_7.as_bytes()).await.unwrap();
        error.close().await.unwrap();
    }

    const STATUS_7: &str = r#"{"metadata":{},"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#;

    #[tokio::test]
    async fn v5_stdin_close_reaches_the_runtime_and_the_status_precedes_a_normal_close() {
        let (kubelet_io, runtime_io) = tokio::io::duplex(64 * 1024);
        let (kubelet_session, _) = Session::new(kubelet_io, false);
        let (_runtime_session, incoming) = Session::new(runtime_io, true);
        let runtime = tokio::spawn(fake_runtime(incoming));
        let streams = open_streams(
            kubelet_session,
            Streams {
                stdin: true,
                stdout: true,
                stderr: true,
                tty: false,
            },
        )
        .await
        .unwrap();
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = WebSocketStream::from_raw_socket(server_io, Role::Server, None).await;
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        let idle = Idle::new(Duration::ZERO);
        let bridge = tokio::spawn(remote_command(server, channel::V5, streams, idle));
        client
            .send(Message::Binary(Bytes::from_static(b"\x00hello")))
            .await
            .unwrap();
        client
            .send(Message::Binary(Bytes::from_static(&[
                channel::CLOSE,
                channel::STDIN,
            ])))
            .await
            .unwrap();
        let mut by_channel: HashMap<u8, Vec<u8>> = HashMap::new();
        let mut order = Vec::new();
        // Without the close reaching stdin the runtime never answers: a bounded wait fails.
        let wait = std::time::Duration::from_secs(10);
        let close = loop {
            match tokio::time::timeout(wait, client.next())
                .await
                .expect("an answer")
                .unwrap()
                .unwrap()
            {
                Message::Binary(b) => {
                    order.push(b[0]);
                    by_channel
                        .entry(b[0])
                        .or_default()
                        .extend_from_slice(&b[1..]);
                }
                Message::Close(c) => break c,
                _ => {}
            }
        };
        assert_eq!(by_channel[&channel::STDOUT], b"HELLO");
        assert_eq!(by_channel[&channel::STDERR], b"e");
        assert_eq!(by_channel[&channel::ERROR], STATUS_7.as_bytes());
        assert_eq!(order.last(), Some(&channel::ERROR), "the status comes last");
        assert_eq!(close.unwrap().code, CloseCode::Normal);
        runtime.await.unwrap();
        bridge.await.unwrap();
    }
}
