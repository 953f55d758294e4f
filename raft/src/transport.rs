//! Peer transport: one TCP connection per ordered pair of members, length-prefixed frames of
//! raft `Message`s, batched per write, reconnected with capped backoff.
//!
//! Each member dials every peer once and sends only on its own connection; it receives on the
//! connections its peers dialled. A connection opens with a hello naming the cluster, the
//! sender and the receiver; a connection for another cluster or another member is closed.
//! Frames are bounded ([`FRAME_BYTES_MAX`]); a peer that sends more is cut off. Raft tolerates
//! lost messages, so a full queue or a broken connection drops messages rather than blocking
//! the Raft loop; raft-rs is told the peer is unreachable and probes again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use protobuf::Message as _;
use raft::eraftpb::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::error::RaftError;
use crate::tls::PeerTls;

/// Messages queued for one peer. At 10 heartbeats a second plus appends this is seconds of
/// traffic; beyond it the peer is not keeping up and raft-rs is better told so.
pub const PEER_QUEUE_MAX: usize = 4_096;
/// Largest frame accepted: raft-rs caps an append at `max_size_per_msg` (1 MiB here), and a
/// request is at most 1.5 MiB; anything near this is not a skerry peer.
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Bytes gathered into one write before it is flushed: many small messages (heartbeats,
/// appends to several followers) share a syscall.
pub const WRITE_BATCH_BYTES: usize = 256 << 10;
/// First and longest pause between reconnection attempts. The cap stays well under the
/// election timeout so a peer that comes back is heard from before it is voted out.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Bound on a TCP connect to a peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

const HELLO_MAGIC: &[u8; 8] = b"skryraf1";
const HELLO_BYTES: usize = 32;

/// What the transport hands the node.
pub enum Received {
    Message(Message),
    /// Leases a follower's clients renewed (for the leader's lessor).
    LeaseRenewals(Vec<i64>),
    /// The connection a peer had opened to us closed: the peer process is gone or restarting
    /// (a crashed process's sockets are closed by its kernel at once), or the link broke.
    PeerDown(u64),
}

/// Where received messages go; returns false when the node is gone.
pub type Inbound = std::sync::Arc<dyn Fn(Received) -> bool + Send + Sync>;

/// The sending side, cheap to share with the Raft loop.
/// What goes to a peer.
pub enum Outbound {
    Raft(Message),
    LeaseRenewals(Vec<i64>),
}

/// Frame kinds: a raft message, or lease ids renewed by a follower's clients.
const FRAME_RAFT: u8 = 0;
const FRAME_LEASE_RENEWALS: u8 = 1;

/// Peers cut off by fault injection (see [`Transport::cut`]).
type Cut = std::sync::Arc<parking_lot::RwLock<std::collections::HashSet<u64>>>;

#[derive(Clone)]
pub struct Transport {
    peers: HashMap<u64, mpsc::Sender<Outbound>>,
    /// Peers whose traffic is dropped both ways: a network partition, for tests and the
    /// torture suite's nemesis. Empty in normal operation.
    cut: Cut,
    /// The listener and sender tasks, stopped by [`Transport::shutdown`].
    tasks: std::sync::Arc<Vec<tokio::task::AbortHandle>>,
}

/// How long a (re)starting member retries its peer port while the previous incarnation's
/// listener is still being torn down.
const BIND_RETRY_FOR: Duration = Duration::from_secs(2);

impl Transport {
    /// Binds the peer listener and starts one sender task per peer on the current runtime.
    pub async fn start(
        cluster_id: u64,
        self_id: u64,
        listen: SocketAddr,
        peers: Vec<(u64, SocketAddr)>,
        inbound: Inbound,
        tls: Option<PeerTls>,
    ) -> Result<Transport, RaftError> {
        let deadline = std::time::Instant::now() + BIND_RETRY_FOR;
        let listener = loop {
            match TcpListener::bind(listen).await {
                Ok(listener) => break listener,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(RECONNECT_BACKOFF_MIN).await;
                }
                Err(e) => {
                    return Err(RaftError::Config(format!(
                        "--listen-peer-urls: cannot listen on {listen}: {e}"
                    )));
                }
            }
        };
        info!(%listen, "listening for peers");
        let cut = Cut::default();
        let mut tasks = vec![
            tokio::spawn(accept_loop(
                listener,
                cluster_id,
                self_id,
                inbound,
                cut.clone(),
                tls.clone(),
            ))
            .abort_handle(),
        ];
        let mut senders = HashMap::new();
        for (id, addr) in peers {
            let (tx, rx) = mpsc::channel(PEER_QUEUE_MAX);
            tasks.push(
                tokio::spawn(send_loop(cluster_id, self_id, id, addr, rx, tls.clone()))
                    .abort_handle(),
            );
            senders.insert(id, tx);
        }
        Ok(Transport {
            peers: senders,
            cut,
            tasks: std::sync::Arc::new(tasks),
        })
    }

    /// Passes lease renewals to `peer` (the leader); dropped if its queue is full, as the
    /// client's next keep-alive (a third of the TTL later) renews again.
    pub fn send_lease_renewals(&self, peer: u64, ids: Vec<i64>) {
        if self.cut.read().contains(&peer) {
            return;
        }
        if let Some(tx) = self.peers.get(&peer) {
            let _ = tx.try_send(Outbound::LeaseRenewals(ids));
        }
    }

    /// Fault injection: drops all traffic to and from `peers` (replacing any earlier cut),
    /// as a network partition would. `&[]` heals.
    pub fn cut(&self, peers: &[u64]) {
        let mut cut = self.cut.write();
        cut.clear();
        cut.extend(peers.iter().copied());
    }

    /// Stops listening and sending; connections close.
    pub fn shutdown(&self) {
        for task in self.tasks.iter() {
            task.abort();
        }
    }

    /// Queues messages for their peers without blocking. Returns the peers a message could
    /// not be queued for (unknown, or their queue is full).
    pub fn send(&self, messages: Vec<Message>) -> Vec<u64> {
        let mut unreachable = Vec::new();
        let cut = self.cut.read();
        for m in messages {
            let to = m.to;
            if cut.contains(&to) {
                continue;
            }
            match self.peers.get(&to) {
                Some(tx) if tx.try_send(Outbound::Raft(m)).is_ok() => {}
                _ => {
                    if !unreachable.contains(&to) {
                        unreachable.push(to);
                    }
                }
            }
        }
        unreachable
    }
}

fn hello(cluster_id: u64, from: u64, to: u64) -> [u8; HELLO_BYTES] {
    let mut out = [0u8; HELLO_BYTES];
    out[..8].copy_from_slice(HELLO_MAGIC);
    out[8..16].copy_from_slice(&cluster_id.to_le_bytes());
    out[16..24].copy_from_slice(&from.to_le_bytes());
    out[24..32].copy_from_slice(&to.to_le_bytes());
    out
}

async fn send_loop(
    cluster_id: u64,
    self_id: u64,
    peer: u64,
    addr: SocketAddr,
    mut rx: mpsc::Receiver<Outbound>,
    tls: Option<PeerTls>,
) {
    let mut backoff = RECONNECT_BACKOFF_MIN;
    let mut buf = BytesMut::new();
    'connect: loop {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                debug!(peer = format_args!("{peer:x}"), %addr, error = %e, "peer connect failed");
                if rx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                // Messages queued while the peer was away are stale; raft-rs resends.
                while rx.try_recv().is_ok() {}
                continue;
            }
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                while rx.try_recv().is_ok() {}
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let mut stream: Box<dyn AsyncWrite + Unpin + Send> = match &tls {
            None => Box::new(stream),
            Some(tls) => {
                // The peer's certificate must be valid for the IP its peer URL names.
                let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
                match tls.connector.connect(name, stream).await {
                    Ok(stream) => Box::new(stream),
                    Err(e) => {
                        warn!(peer = format_args!("{peer:x}"), %addr, error = %e, "peer TLS handshake failed");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                        while rx.try_recv().is_ok() {}
                        continue;
                    }
                }
            }
        };
        if stream
            .write_all(&hello(cluster_id, self_id, peer))
            .await
            .is_err()
        {
            continue;
        }
        backoff = RECONNECT_BACKOFF_MIN;
        debug!(peer = format_args!("{peer:x}"), %addr, "connected to peer");
        loop {
            let Some(first) = rx.recv().await else {
                return;
            };
            buf.clear();
            let mut next = Some(first);
            while let Some(out) = next.take() {
                match out {
                    Outbound::Raft(m) => match m.write_to_bytes() {
                        Ok(bytes) => {
                            buf.put_u32_le(bytes.len() as u32 + 1);
                            buf.put_u8(FRAME_RAFT);
                            buf.put_slice(&bytes);
                        }
                        Err(e) => warn!(error = %e, "cannot encode raft message"),
                    },
                    Outbound::LeaseRenewals(ids) => {
                        buf.put_u32_le(ids.len() as u32 * 8 + 1);
                        buf.put_u8(FRAME_LEASE_RENEWALS);
                        for id in ids {
                            buf.put_i64_le(id);
                        }
                    }
                }
                if buf.len() < WRITE_BATCH_BYTES {
                    next = rx.try_recv().ok();
                }
            }
            if let Err(e) = async {
                stream.write_all(&buf).await?;
                stream.flush().await
            }
            .await
            {
                debug!(peer = format_args!("{peer:x}"), error = %e, "peer connection lost");
                continue 'connect;
            }
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    cluster_id: u64,
    self_id: u64,
    inbound: Inbound,
    cut: Cut,
    tls: Option<PeerTls>,
) {
    // Owned here so that stopping this task stops every connection it accepted.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!(error = %e, "peer accept failed");
                tokio::time::sleep(RECONNECT_BACKOFF_MIN).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let inbound = inbound.clone();
        let cut = cut.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let stream: Box<dyn AsyncRead + Unpin + Send> = match tls {
                None => Box::new(stream),
                Some(tls) => match tls.acceptor.accept(stream).await {
                    Ok(stream) => Box::new(stream),
                    Err(e) => {
                        warn!(%remote, error = %e, "refused a peer: TLS handshake failed");
                        return;
                    }
                },
            };
            let mut from = None;
            if let Err(why) = receive(stream, cluster_id, self_id, &inbound, &cut, &mut from).await
            {
                debug!(%remote, why, "peer connection closed");
            }
            if let Some(peer) = from {
                inbound(Received::PeerDown(peer));
            }
        });
    }
}

/// Reads one peer connection until it closes; `from` learns the peer's id from its hello.
async fn receive(
    mut stream: Box<dyn AsyncRead + Unpin + Send>,
    cluster_id: u64,
    self_id: u64,
    inbound: &Inbound,
    cut: &Cut,
    from: &mut Option<u64>,
) -> Result<(), String> {
    let mut hello_buf = [0u8; HELLO_BYTES];
    stream
        .read_exact(&mut hello_buf)
        .await
        .map_err(|e| e.to_string())?;
    let expect_from_any = hello(cluster_id, 0, self_id);
    if hello_buf[..16] != expect_from_any[..16] || hello_buf[24..] != expect_from_any[24..] {
        warn!("refused a peer connection for another cluster or member");
        return Err("hello mismatch".into());
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&hello_buf[16..24]);
    *from = Some(u64::from_le_bytes(word));
    let mut len_buf = [0u8; 4];
    let mut frame = Vec::new();
    loop {
        stream
            .read_exact(&mut len_buf)
            .await
            .map_err(|e| e.to_string())?;
        let len = u32::from_le_bytes(len_buf) as usize;
        if len == 0 || len > FRAME_BYTES_MAX {
            warn!(len, "peer sent an oversized frame; closing");
            return Err("oversized frame".into());
        }
        frame.resize(len, 0);
        stream
            .read_exact(&mut frame)
            .await
            .map_err(|e| e.to_string())?;
        if from.is_some_and(|peer| cut.read().contains(&peer)) {
            continue;
        }
        let (kind, body) = (frame[0], &frame[1..]);
        if kind == FRAME_LEASE_RENEWALS {
            if body.len() % 8 != 0 {
                return Err("bad lease renewal frame".into());
            }
            let ids = body
                .chunks_exact(8)
                .map(|c| {
                    let mut word = [0u8; 8];
                    word.copy_from_slice(c);
                    i64::from_le_bytes(word)
                })
                .collect();
            if !inbound(Received::LeaseRenewals(ids)) {
                return Ok(());
            }
            continue;
        }
        if kind != FRAME_RAFT {
            return Err(format!("unknown frame kind {kind}"));
        }
        let message = Message::parse_from_bytes(body).map_err(|e| e.to_string())?;
        if message.to != self_id || Some(message.from) != *from {
            return Err("message for another member, or from another than said hello".into());
        }
        if !inbound(Received::Message(message)) {
            return Ok(());
        }
    }
}
