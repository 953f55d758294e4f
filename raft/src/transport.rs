//! Peer transport: one TCP connection per ordered pair of members, length-prefixed frames of
//! raft `Message`s, batched per write, reconnected with capped backoff.
//!
//! Three other kinds of connection share the peer port, told apart by their hello:
//! - a *snapshot stream* carries one raft snapshot message and then the store's data in
//!   chunks, on its own connection so that heartbeats and appends to the other members never
//!   queue behind it; the receiver writes it to a file, checks its digest, hands the message
//!   to its node and acknowledges; the sender then reports the outcome to raft-rs;
//! - a *join query* lets a member started with `--initial-cluster-state existing` learn the
//!   cluster id, its own member id (given by `member add`) and the other members' addresses;
//! - membership requests a follower's clients made are forwarded to the leader on the
//!   ordinary connection (frame kinds below), since only the leader knows whether a learner
//!   has caught up.
//!
//! Each member dials every peer once and sends only on its own connection; it receives on the
//! connections its peers dialled. A connection opens with a hello naming the cluster, the
//! sender and the receiver; a connection for another cluster or another member is closed.
//! Frames are bounded ([`FRAME_BYTES_MAX`]); a peer that sends more is cut off. Raft tolerates
//! lost messages, so a full queue or a broken connection drops messages rather than blocking
//! the Raft loop; raft-rs is told the peer is unreachable and probes again.
//!
//! The listener trusts nobody until the hello: a connection gets [`HELLO_TIMEOUT`] from accept
//! to finish its TLS handshake and send its hello (a join query, which no hello
//! authenticates, to be answered), and at most [`UNAUTHENTICATED_PEERS_MAX`] connections may
//! be at that stage at once; one beyond is closed at accept (`skerry_tls::accept`), so a
//! flood of idle connections neither holds tasks for good nor delays the peers already
//! talking. Failed accepts (out of descriptors) back off from 5 ms to 1 s.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use skerry_store::replication::MembershipChange;
use skerry_tls::accept::{self, HandshakeGate, HandshakeSlot};
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
/// Read buffer of a peer's message connection. Under load a peer writes many small frames
/// at once (append responses, forwarded proposals, heartbeats); reading them through one
/// buffer takes one `recv` for the lot instead of two (length, then body) per frame.
pub const RECEIVE_BUFFER_BYTES: usize = 64 << 10;
/// First and longest pause between reconnection attempts. The cap stays well under the
/// election timeout so a peer that comes back is heard from before it is voted out.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Bound on a TCP connect to a peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// From accept to a complete hello, TLS handshake included (and, on our side, the TLS
/// handshake of a dial): a connection that has not said who it is by then is closed. etcd
/// serves its peer port through the timeout listener of `rafthttp.NewListener`
/// (`etcdserver/api/rafthttp/util.go`), which puts `ConnReadTimeout`, 5 s
/// (`etcdserver/api/rafthttp/peer.go`), on every read, and so on its TLS handshake and first
/// request. A member's handshake and hello take a few round trips; a flood of idle
/// connections holds each slot of [`UNAUTHENTICATED_PEERS_MAX`] this long at most.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Peer connections allowed to be in their handshake (before a checked hello, or a whole
/// join query) at once; more are closed at accept. A member receives one message connection
/// per peer, a snapshot stream now and then and join queries while a member is added: a
/// handful at once even in a cluster of seven (etcd's recommended largest), so 128 leaves room
/// for every peer reconnecting together many times over, while a flood holds at most 128
/// tasks and descriptors for [`HELLO_TIMEOUT`] each. etcd has no such cap: the process's
/// descriptor limit is its only bound.
pub const UNAUTHENTICATED_PEERS_MAX: usize = 128;

const HELLO_MAGIC: &[u8; 8] = b"skryraf1";
/// Hello of a connection that carries one snapshot.
const HELLO_SNAPSHOT_MAGIC: &[u8; 8] = b"skrysnp1";
/// Hello of a join query.
const HELLO_JOIN_MAGIC: &[u8; 8] = b"skryjoi1";
const HELLO_BYTES: usize = 32;

/// Bytes of store data per snapshot chunk: large enough that framing costs nothing, small
/// enough that a few chunks in flight bound the memory a transfer takes.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// Chunks produced ahead of the socket: the store is read while the network sends.
const SNAPSHOT_CHUNKS_AHEAD: usize = 4;
/// Largest snapshot a member accepts: far above any edge cluster's store (etcd's default
/// quota is 2 GiB, its maximum 8 GiB), and a bound on what a hostile peer can make us write.
pub const SNAPSHOT_BYTES_MAX: u64 = 16 << 30;
/// A snapshot stream that makes no progress for this long is abandoned (and retried by
/// raft-rs): a dead peer must not hold the leader's snapshot forever.
pub const SNAPSHOT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest join answer or peer URL accepted.
const JOIN_BYTES_MAX: usize = 64 << 10;

/// What the transport hands the node.
pub enum Received {
    /// A raft message. A snapshot message arrives only once its data is on disk: its
    /// `snapshot.data` is then the path of the file (see [`snapshot_file`]).
    Message(Message),
    /// How a snapshot we sent to `peer` ended: `true` once the peer has it on disk.
    SnapshotSent { peer: u64, ok: bool },
    /// A membership change a follower's client asked for, forwarded to us (the leader);
    /// `proposal` is the follower's id for it.
    Membership {
        from: u64,
        proposal: u64,
        change: MembershipChange,
    },
    /// The leader refused a membership change we forwarded.
    MembershipRefused { proposal: u64, reason: String },
    /// Leases a follower's clients renewed (for the leader's lessor).
    LeaseRenewals(Vec<i64>),
    /// Peer `by` applied our removal from the cluster.
    Removed { by: u64 },
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
    Membership {
        proposal: u64,
        change: MembershipChange,
    },
    MembershipRefused {
        proposal: u64,
        reason: String,
    },
    /// The receiver was removed from the cluster (see [`Transport::remove_peer`]).
    Removed,
}

/// Frame kinds: a raft message, lease ids renewed by a follower's clients, a forwarded
/// membership change and its refusal.
const FRAME_RAFT: u8 = 0;
const FRAME_LEASE_RENEWALS: u8 = 1;
const FRAME_MEMBERSHIP: u8 = 2;
const FRAME_MEMBERSHIP_REFUSED: u8 = 3;
/// The sender applied the receiver's removal (etcd answers a removed member's requests with
/// `410 Gone` for the same reason).
const FRAME_REMOVED: u8 = 4;

/// How long a removed member's sending task may take to deliver the removal notice before it
/// is aborted: a member that is away does not hold a task and a socket for long.
pub const REMOVED_NOTICE_TIMEOUT: Duration = Duration::from_secs(5);

/// Membership change kinds in a forwarded frame.
const CHANGE_ADD: u8 = 1;
const CHANGE_ADD_LEARNER: u8 = 2;
const CHANGE_PROMOTE: u8 = 3;
const CHANGE_REMOVE: u8 = 4;

/// What a join query learns from a member of the running cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinAnswer {
    pub cluster_id: u64,
    /// The id `member add` gave the asking member's peer URL; 0 if none has.
    pub member_id: u64,
    /// Every member's id and first peer URL.
    pub members: Vec<(u64, String)>,
}

/// Answers join queries: the asker's peer URL in, what the cluster knows of it out.
pub type JoinDirectory = Arc<dyn Fn(&str) -> Option<JoinAnswer> + Send + Sync>;

/// The store data of snapshots this member is about to send, by receiving peer: filled when
/// raft-rs asks the node's storage for a snapshot, taken when the message goes out.
pub type OutgoingSnapshots = Arc<parking_lot::Mutex<HashMap<u64, skerry_store::PinnedSnapshot>>>;

/// Where a member receives snapshots, and what the transport needs to send its own.
#[derive(Clone)]
pub struct SnapshotSetup {
    /// Directory for incoming snapshot files.
    pub dir: PathBuf,
    pub outgoing: OutgoingSnapshots,
    pub directory: JoinDirectory,
}

/// Anything a peer connection runs over: TCP, or TLS over TCP.
trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerIo for T {}

/// Peers cut off by fault injection (see [`Transport::cut`]).
type Cut = Arc<parking_lot::RwLock<std::collections::HashSet<u64>>>;

/// One peer we send to: its queue, its address, its sender task.
struct Peer {
    tx: mpsc::Sender<Outbound>,
    addr: SocketAddr,
    task: tokio::task::AbortHandle,
}

struct Inner {
    cluster_id: u64,
    self_id: u64,
    peers: parking_lot::RwLock<HashMap<u64, Peer>>,
    /// Peers whose traffic is dropped both ways: a network partition, for tests and the
    /// torture suite's nemesis. Empty in normal operation.
    cut: Cut,
    tls: Option<PeerTls>,
    snapshots: SnapshotSetup,
    inbound: Inbound,
    /// The runtime the transport's tasks run on (the Raft thread adds peers from outside it).
    runtime: tokio::runtime::Handle,
    /// The listener task, stopped by [`Transport::shutdown`].
    accept: parking_lot::Mutex<Option<tokio::task::AbortHandle>>,
}

#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
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
        snapshots: SnapshotSetup,
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
        std::fs::create_dir_all(&snapshots.dir).map_err(RaftError::storage)?;
        info!(%listen, "listening for peers");
        let transport = Transport {
            inner: Arc::new(Inner {
                cluster_id,
                self_id,
                peers: Default::default(),
                cut: Cut::default(),
                tls,
                snapshots,
                inbound,
                runtime: tokio::runtime::Handle::current(),
                accept: Default::default(),
            }),
        };
        let accept = tokio::spawn(accept_loop(listener, transport.inner.clone())).abort_handle();
        *transport.inner.accept.lock() = Some(accept);
        for (id, addr) in peers {
            transport.add_peer(id, addr);
        }
        Ok(transport)
    }

    /// Starts sending to member `id` at `addr` (a member added at run time, or one whose
    /// address changed); a no-op for a known peer at the same address or for ourselves.
    pub fn add_peer(&self, id: u64, addr: SocketAddr) {
        let inner = &self.inner;
        if id == inner.self_id {
            return;
        }
        let mut peers = inner.peers.write();
        if peers.get(&id).is_some_and(|p| p.addr == addr) {
            return;
        }
        if let Some(old) = peers.remove(&id) {
            old.task.abort();
        }
        let (tx, rx) = mpsc::channel(PEER_QUEUE_MAX);
        let task = inner
            .runtime
            .spawn(send_loop(
                inner.cluster_id,
                inner.self_id,
                id,
                addr,
                rx,
                inner.tls.clone(),
            ))
            .abort_handle();
        peers.insert(id, Peer { tx, addr, task });
    }

    /// Stops sending to member `id` (removed from the cluster), telling it first.
    ///
    /// A removed member learns of its removal by applying the configuration change that
    /// removes it, and only the leader's next append carries the commit of that entry; once
    /// the leader has applied the change, raft-rs sends that member nothing more. Under load
    /// the leader can apply before that append is out, and the removed member would then
    /// wait for a leader forever. So every member that applies the removal sends it one last
    /// frame saying so, the last on its connection; the sending task ends once it is written,
    /// or is aborted after [`REMOVED_NOTICE_TIMEOUT`].
    pub fn remove_peer(&self, id: u64) {
        let Some(peer) = self.inner.peers.write().remove(&id) else {
            return;
        };
        let Peer { tx, task, .. } = peer;
        let _ = tx.try_send(Outbound::Removed);
        // With the sender gone the loop drains what is queued and returns.
        drop(tx);
        self.inner.runtime.spawn(async move {
            tokio::time::sleep(REMOVED_NOTICE_TIMEOUT).await;
            task.abort();
        });
    }

    /// The peers we send to, by id.
    pub fn peer_ids(&self) -> Vec<u64> {
        self.inner.peers.read().keys().copied().collect()
    }

    fn queue(&self, peer: u64, out: Outbound) -> bool {
        if self.inner.cut.read().contains(&peer) {
            return true;
        }
        match self.inner.peers.read().get(&peer) {
            Some(p) => p.tx.try_send(out).is_ok(),
            None => false,
        }
    }

    /// Passes lease renewals to `peer` (the leader); dropped if its queue is full, as the
    /// client's next keep-alive (a third of the TTL later) renews again.
    pub fn send_lease_renewals(&self, peer: u64, ids: Vec<i64>) {
        let _ = self.queue(peer, Outbound::LeaseRenewals(ids));
    }

    /// Forwards a client's membership change to the leader; false if it cannot be queued.
    pub fn forward_membership(&self, leader: u64, proposal: u64, change: MembershipChange) -> bool {
        self.queue(leader, Outbound::Membership { proposal, change })
    }

    /// Tells a follower the leader refused the membership change it forwarded.
    pub fn refuse_membership(&self, peer: u64, proposal: u64, reason: String) {
        let _ = self.queue(peer, Outbound::MembershipRefused { proposal, reason });
    }

    /// Fault injection: drops all traffic to and from `peers` (replacing any earlier cut),
    /// as a network partition would. `&[]` heals.
    pub fn cut(&self, peers: &[u64]) {
        let mut cut = self.inner.cut.write();
        cut.clear();
        cut.extend(peers.iter().copied());
    }

    /// Stops listening and sending; connections close.
    pub fn shutdown(&self) {
        if let Some(accept) = self.inner.accept.lock().take() {
            accept.abort();
        }
        for (_, peer) in self.inner.peers.write().drain() {
            peer.task.abort();
        }
    }

    /// Queues messages for their peers without blocking. Returns the peers a message could
    /// not be queued for (unknown, or their queue is full). Snapshot messages go out on
    /// their own connection with the store's data.
    pub fn send(&self, messages: Vec<Message>) -> Vec<u64> {
        let mut unreachable = Vec::new();
        let cut = self.inner.cut.read();
        let peers = self.inner.peers.read();
        for m in messages {
            let to = m.to;
            if cut.contains(&to) {
                if m.get_msg_type() == MessageType::MsgSnapshot {
                    self.snapshot_failed(to);
                }
                continue;
            }
            if m.get_msg_type() == MessageType::MsgSnapshot {
                match peers.get(&to) {
                    Some(peer) => self.send_snapshot(m, peer.addr),
                    None => unreachable.push(to),
                }
                continue;
            }
            match peers.get(&to) {
                Some(p) if p.tx.try_send(Outbound::Raft(m)).is_ok() => {}
                _ => {
                    if !unreachable.contains(&to) {
                        unreachable.push(to);
                    }
                }
            }
        }
        unreachable
    }

    fn snapshot_failed(&self, peer: u64) {
        self.inner.snapshots.outgoing.lock().remove(&peer);
        (self.inner.inbound)(Received::SnapshotSent { peer, ok: false });
    }

    /// Streams a snapshot to its peer on a connection of its own, then reports the outcome.
    fn send_snapshot(&self, message: Message, addr: SocketAddr) {
        let to = message.to;
        let index = message.get_snapshot().get_metadata().index;
        let pinned = self.inner.snapshots.outgoing.lock().remove(&to);
        let Some(pinned) = pinned.filter(|p| p.applied_index == index) else {
            warn!(
                peer = format_args!("{to:x}"),
                index, "no store data pinned for this snapshot; raft-rs will ask again"
            );
            (self.inner.inbound)(Received::SnapshotSent {
                peer: to,
                ok: false,
            });
            return;
        };
        let inner = self.inner.clone();
        inner.runtime.clone().spawn(async move {
            let started = std::time::Instant::now();
            let result = stream_snapshot(&inner, addr, message, pinned).await;
            let ok = match result {
                Ok(bytes) => {
                    info!(
                        peer = format_args!("{to:x}"),
                        index,
                        bytes,
                        ms = started.elapsed().as_millis() as u64,
                        "sent a snapshot"
                    );
                    true
                }
                Err(why) => {
                    warn!(
                        peer = format_args!("{to:x}"),
                        index, why, "sending a snapshot failed"
                    );
                    false
                }
            };
            (inner.inbound)(Received::SnapshotSent { peer: to, ok });
        });
    }
}

fn hello(cluster_id: u64, from: u64, to: u64) -> [u8; HELLO_BYTES] {
    hello_with(HELLO_MAGIC, cluster_id, from, to)
}

fn hello_with(magic: &[u8; 8], cluster_id: u64, from: u64, to: u64) -> [u8; HELLO_BYTES] {
    let mut out = [0u8; HELLO_BYTES];
    out[..8].copy_from_slice(magic);
    out[8..16].copy_from_slice(&cluster_id.to_le_bytes());
    out[16..24].copy_from_slice(&from.to_le_bytes());
    out[24..32].copy_from_slice(&to.to_le_bytes());
    out
}

/// Opens a connection to a peer: TCP, then TLS when the cluster uses it.
async fn connect(addr: SocketAddr, tls: &Option<PeerTls>) -> Result<Box<dyn PeerIo>, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    match tls {
        None => Ok(Box::new(stream)),
        Some(tls) => {
            // The peer's certificate must be valid for the IP its peer URL names.
            let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
            let stream = accept::connect_tls(&tls.connector, name, stream, HELLO_TIMEOUT)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Box::new(stream))
        }
    }
}

/// Bounds one step of a snapshot transfer by [`SNAPSHOT_STALL_TIMEOUT`].
async fn within<T>(
    step: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(SNAPSHOT_STALL_TIMEOUT, step).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err("peer stalled".into()),
    }
}

/// The sending side of a snapshot stream: hello, the raft message, the store's data in
/// chunks (`u32 length | bytes`, a zero length ends it), then the receiver's one-byte answer.
/// Returns the data bytes sent.
async fn stream_snapshot(
    inner: &Inner,
    addr: SocketAddr,
    message: Message,
    pinned: skerry_store::PinnedSnapshot,
) -> Result<u64, String> {
    let mut stream = connect(addr, &inner.tls).await?;
    let head = message.write_to_bytes().map_err(|e| e.to_string())?;
    let mut buf = BytesMut::with_capacity(HELLO_BYTES + 4 + head.len());
    buf.put_slice(&hello_with(
        HELLO_SNAPSHOT_MAGIC,
        inner.cluster_id,
        inner.self_id,
        message.to,
    ));
    buf.put_u32_le(head.len() as u32);
    buf.put_slice(&head);
    within(stream.write_all(&buf)).await?;
    // The store is read on a blocking thread (redb reads block) while this task sends.
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(SNAPSHOT_CHUNKS_AHEAD);
    let producer = tokio::task::spawn_blocking(move || {
        let mut writer = ChunkWriter {
            tx,
            buf: Vec::with_capacity(SNAPSHOT_CHUNK_BYTES),
        };
        pinned
            .write(&mut writer)
            .map_err(|e| e.to_string())
            .and_then(|_| writer.finish())
    });
    let mut sent = 0u64;
    while let Some(chunk) = rx.recv().await {
        let mut frame = BytesMut::with_capacity(4 + chunk.len());
        frame.put_u32_le(chunk.len() as u32);
        frame.put_slice(&chunk);
        within(stream.write_all(&frame)).await?;
        sent += chunk.len() as u64;
    }
    producer
        .await
        .map_err(|e| format!("snapshot reader: {e}"))??;
    within(stream.write_all(&0u32.to_le_bytes())).await?;
    within(stream.flush()).await?;
    let mut answer = [0u8; 1];
    within(stream.read_exact(&mut answer)).await?;
    if answer[0] != 0 {
        return Err("the peer refused the snapshot".into());
    }
    Ok(sent)
}

/// Cuts the store's snapshot stream into chunks for the sending task.
struct ChunkWriter {
    tx: mpsc::Sender<Vec<u8>>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn flush_chunk(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(SNAPSHOT_CHUNK_BYTES));
        self.tx
            .blocking_send(chunk)
            .map_err(|_| std::io::Error::other("snapshot stream closed"))
    }

    fn finish(mut self) -> Result<(), String> {
        self.flush_chunk().map_err(|e| e.to_string())
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let room = SNAPSHOT_CHUNK_BYTES - self.buf.len();
        let take = room.min(bytes.len());
        self.buf.extend_from_slice(&bytes[..take]);
        if self.buf.len() == SNAPSHOT_CHUNK_BYTES {
            self.flush_chunk()?;
        }
        Ok(take)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where a snapshot from `from` at `index` is received.
pub fn snapshot_file(dir: &std::path::Path, from: u64, index: u64) -> PathBuf {
    dir.join(format!("{from:016x}-{index:016x}.snap"))
}

fn encode_change(change: &MembershipChange, out: &mut BytesMut) {
    match change {
        MembershipChange::Add { peer_urls, learner } => {
            out.put_u8(if *learner {
                CHANGE_ADD_LEARNER
            } else {
                CHANGE_ADD
            });
            out.put_u16_le(peer_urls.len() as u16);
            for url in peer_urls {
                out.put_u16_le(url.len() as u16);
                out.put_slice(url.as_bytes());
            }
        }
        MembershipChange::Promote { id } => {
            out.put_u8(CHANGE_PROMOTE);
            out.put_u64_le(*id);
        }
        MembershipChange::Remove { id } => {
            out.put_u8(CHANGE_REMOVE);
            out.put_u64_le(*id);
        }
    }
}

/// Reads little-endian fields off a frame body, refusing short input.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("truncated frame".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    fn string(&mut self, len: usize) -> Result<String, String> {
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| "text is not UTF-8".into())
    }
}

fn decode_change(fields: &mut Fields<'_>) -> Result<MembershipChange, String> {
    match fields.u8()? {
        kind @ (CHANGE_ADD | CHANGE_ADD_LEARNER) => {
            let count = fields.u16()? as usize;
            let mut peer_urls = Vec::with_capacity(count.min(16));
            for _ in 0..count {
                let len = fields.u16()? as usize;
                peer_urls.push(fields.string(len)?);
            }
            Ok(MembershipChange::Add {
                peer_urls,
                learner: kind == CHANGE_ADD_LEARNER,
            })
        }
        CHANGE_PROMOTE => Ok(MembershipChange::Promote { id: fields.u64()? }),
        CHANGE_REMOVE => Ok(MembershipChange::Remove { id: fields.u64()? }),
        other => Err(format!("unknown membership change {other}")),
    }
}

impl JoinAnswer {
    fn encode(&self) -> Vec<u8> {
        let mut out = BytesMut::new();
        out.put_u64_le(self.cluster_id);
        out.put_u64_le(self.member_id);
        out.put_u16_le(self.members.len() as u16);
        for (id, url) in &self.members {
            out.put_u64_le(*id);
            out.put_u16_le(url.len() as u16);
            out.put_slice(url.as_bytes());
        }
        out.to_vec()
    }

    fn decode(body: &[u8]) -> Result<JoinAnswer, String> {
        let mut f = Fields(body);
        let cluster_id = f.u64()?;
        let member_id = f.u64()?;
        let count = f.u16()? as usize;
        let mut members = Vec::with_capacity(count.min(16));
        for _ in 0..count {
            let id = f.u64()?;
            let len = f.u16()? as usize;
            members.push((id, f.string(len)?));
        }
        Ok(JoinAnswer {
            cluster_id,
            member_id,
            members,
        })
    }
}

/// Asks a running cluster's member at `addr` what it knows of the member whose peer URL is
/// `my_url` (see [`JoinAnswer`]).
pub async fn ask_to_join(
    addr: SocketAddr,
    my_url: &str,
    tls: &Option<PeerTls>,
) -> Result<JoinAnswer, String> {
    let mut stream = connect(addr, tls).await?;
    let mut buf = BytesMut::new();
    buf.put_slice(&hello_with(HELLO_JOIN_MAGIC, 0, 0, 0));
    buf.put_u16_le(my_url.len() as u16);
    buf.put_slice(my_url.as_bytes());
    within(stream.write_all(&buf)).await?;
    within(stream.flush()).await?;
    let mut len = [0u8; 4];
    within(stream.read_exact(&mut len)).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > JOIN_BYTES_MAX {
        return Err("oversized join answer".into());
    }
    let mut body = vec![0u8; len];
    within(stream.read_exact(&mut body)).await?;
    if body.is_empty() {
        return Err("the member does not know the cluster yet".into());
    }
    JoinAnswer::decode(&body)
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
        let mut stream = match connect(addr, &tls).await {
            Ok(stream) => stream,
            Err(e) => {
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
                encode_outbound(out, &mut buf);
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

/// Appends one frame: `u32 length | u8 kind | body`.
fn encode_outbound(out: Outbound, buf: &mut BytesMut) {
    let start = buf.len();
    buf.put_u32_le(0);
    match out {
        Outbound::Raft(m) => match m.write_to_bytes() {
            Ok(bytes) => {
                buf.put_u8(FRAME_RAFT);
                buf.put_slice(&bytes);
            }
            Err(e) => {
                warn!(error = %e, "cannot encode raft message");
                buf.truncate(start);
                return;
            }
        },
        Outbound::LeaseRenewals(ids) => {
            buf.put_u8(FRAME_LEASE_RENEWALS);
            for id in ids {
                buf.put_i64_le(id);
            }
        }
        Outbound::Membership { proposal, change } => {
            buf.put_u8(FRAME_MEMBERSHIP);
            buf.put_u64_le(proposal);
            encode_change(&change, buf);
        }
        Outbound::MembershipRefused { proposal, reason } => {
            buf.put_u8(FRAME_MEMBERSHIP_REFUSED);
            buf.put_u64_le(proposal);
            buf.put_slice(reason.as_bytes());
        }
        Outbound::Removed => buf.put_u8(FRAME_REMOVED),
    }
    let len = (buf.len() - start - 4) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// The peer port's accept loop; aborting its task closes every connection it accepted.
async fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    let gate = HandshakeGate::new("peer", UNAUTHENTICATED_PEERS_MAX);
    accept::serve(
        listener,
        gate,
        std::future::pending(),
        move |stream, remote, slot| {
            let inner = inner.clone();
            async move {
                if let Err(why) = serve_connection(stream, remote, slot, &inner).await {
                    debug!(%remote, why, "peer connection closed");
                }
            }
        },
    )
    .await
}

/// One accepted connection: the handshake and hello within [`HELLO_TIMEOUT`] while `slot`
/// counts it against [`UNAUTHENTICATED_PEERS_MAX`], then what its hello announced.
async fn serve_connection(
    stream: TcpStream,
    remote: SocketAddr,
    slot: HandshakeSlot,
    inner: &Inner,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
    let (stream, hello_buf) = tokio::time::timeout_at(deadline, greet(stream, remote, inner))
        .await
        .map_err(|_| format!("no hello within {HELLO_TIMEOUT:?}"))??;
    match &hello_buf[..8] {
        m if m == HELLO_MAGIC => {
            let peer = check_hello(&hello_buf, inner)?;
            drop(slot);
            let result = receive(stream, peer, inner).await;
            (inner.inbound)(Received::PeerDown(peer));
            result
        }
        m if m == HELLO_SNAPSHOT_MAGIC => {
            let peer = check_hello(&hello_buf, inner)?;
            drop(slot);
            receive_snapshot(stream, peer, inner).await
        }
        // Anyone may ask (the asker has no member id yet), so the query keeps its slot and
        // the whole exchange has the hello's deadline.
        m if m == HELLO_JOIN_MAGIC => tokio::time::timeout_at(deadline, answer_join(stream, inner))
            .await
            .map_err(|_| format!("join query not finished within {HELLO_TIMEOUT:?}"))?,
        _ => Err("not a skerry peer".into()),
    }
}

/// The TLS handshake (when the cluster uses TLS) and the hello of an accepted connection.
async fn greet(
    stream: TcpStream,
    remote: SocketAddr,
    inner: &Inner,
) -> Result<(Box<dyn PeerIo>, [u8; HELLO_BYTES]), String> {
    let mut stream: Box<dyn PeerIo> = match &inner.tls {
        None => Box::new(stream),
        // Bounded by the hello's deadline around this call too.
        Some(tls) => match accept::accept_tls(&tls.acceptor, stream, HELLO_TIMEOUT).await {
            Ok(stream) => Box::new(stream),
            Err(e) => {
                warn!(%remote, error = %e, "refused a peer");
                return Err(e.to_string());
            }
        },
    };
    let mut hello_buf = [0u8; HELLO_BYTES];
    stream
        .read_exact(&mut hello_buf)
        .await
        .map_err(|e| format!("reading the hello: {e}"))?;
    Ok((stream, hello_buf))
}

/// Checks a hello's cluster and receiver; returns the sender's id.
fn check_hello(hello_buf: &[u8; HELLO_BYTES], inner: &Inner) -> Result<u64, String> {
    let expect = hello(inner.cluster_id, 0, inner.self_id);
    if hello_buf[8..16] != expect[8..16] || hello_buf[24..] != expect[24..] {
        warn!("refused a peer connection for another cluster or member");
        return Err("hello mismatch".into());
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&hello_buf[16..24]);
    Ok(u64::from_le_bytes(word))
}

/// Reads the message connection of `peer` (its hello checked) until it closes.
async fn receive(stream: Box<dyn PeerIo>, peer: u64, inner: &Inner) -> Result<(), String> {
    let mut stream = tokio::io::BufReader::with_capacity(RECEIVE_BUFFER_BYTES, stream);
    let inbound = &inner.inbound;
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
        if inner.cut.read().contains(&peer) {
            continue;
        }
        let (kind, body) = (frame[0], &frame[1..]);
        let received = match kind {
            FRAME_LEASE_RENEWALS => {
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
                Received::LeaseRenewals(ids)
            }
            FRAME_MEMBERSHIP => {
                let mut fields = Fields(body);
                let proposal = fields.u64()?;
                let change = decode_change(&mut fields)?;
                Received::Membership {
                    from: peer,
                    proposal,
                    change,
                }
            }
            FRAME_MEMBERSHIP_REFUSED => {
                let mut fields = Fields(body);
                let proposal = fields.u64()?;
                let reason = String::from_utf8_lossy(fields.0).into_owned();
                Received::MembershipRefused { proposal, reason }
            }
            FRAME_REMOVED => {
                if !body.is_empty() {
                    return Err("bad removal frame".into());
                }
                Received::Removed { by: peer }
            }
            FRAME_RAFT => {
                let message = Message::parse_from_bytes(body).map_err(|e| e.to_string())?;
                if message.to != inner.self_id || message.from != peer {
                    return Err(
                        "message for another member, or from another than said hello".into(),
                    );
                }
                if message.get_msg_type() == MessageType::MsgSnapshot {
                    // Snapshots come only on their own stream, with their data.
                    return Err("snapshot message on the message connection".into());
                }
                Received::Message(message)
            }
            other => return Err(format!("unknown frame kind {other}")),
        };
        if !inbound(received) {
            return Ok(());
        }
    }
}

/// The receiving side of a snapshot stream (see [`stream_snapshot`]): the data goes to a
/// file, which must be complete and match its digest before the message reaches the node.
async fn receive_snapshot(
    mut stream: Box<dyn PeerIo>,
    peer: u64,
    inner: &Inner,
) -> Result<(), String> {
    if inner.cut.read().contains(&peer) {
        return Err("cut off".into());
    }
    let mut len = [0u8; 4];
    within(stream.read_exact(&mut len)).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err("oversized snapshot message".into());
    }
    let mut head = vec![0u8; len];
    within(stream.read_exact(&mut head)).await?;
    let mut message = Message::parse_from_bytes(&head).map_err(|e| e.to_string())?;
    if message.get_msg_type() != MessageType::MsgSnapshot
        || message.to != inner.self_id
        || message.from != peer
    {
        return Err("not a snapshot message for this member".into());
    }
    let index = message.get_snapshot().get_metadata().index;
    let mut len = [0u8; 4];
    let path = snapshot_file(&inner.snapshots.dir, peer, index);
    let part = path.with_extension("part");
    let received = async {
        let mut file = tokio::fs::File::create(&part)
            .await
            .map_err(|e| format!("{}: {e}", part.display()))?;
        let mut total = 0u64;
        let mut chunk = Vec::new();
        loop {
            within(stream.read_exact(&mut len)).await?;
            let len = u32::from_le_bytes(len) as usize;
            if len == 0 {
                break;
            }
            if len > SNAPSHOT_CHUNK_BYTES {
                return Err("oversized snapshot chunk".to_string());
            }
            total += len as u64;
            if total > SNAPSHOT_BYTES_MAX {
                return Err("snapshot larger than this member accepts".into());
            }
            chunk.resize(len, 0);
            within(stream.read_exact(&mut chunk)).await?;
            file.write_all(&chunk).await.map_err(|e| e.to_string())?;
        }
        file.sync_all().await.map_err(|e| e.to_string())?;
        drop(file);
        let check = part.clone();
        tokio::task::spawn_blocking(move || skerry_store::snapshot::verify(&check))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        tokio::fs::rename(&part, &path)
            .await
            .map_err(|e| e.to_string())?;
        Ok(total)
    }
    .await;
    let answer = match &received {
        Ok(bytes) => {
            info!(
                peer = format_args!("{peer:x}"),
                index, bytes, "received a snapshot"
            );
            message
                .mut_snapshot()
                .set_data(path.to_string_lossy().as_bytes().to_vec().into());
            if (inner.inbound)(Received::Message(message)) {
                0u8
            } else {
                1
            }
        }
        Err(why) => {
            warn!(
                peer = format_args!("{peer:x}"),
                index, why, "refused a snapshot"
            );
            let _ = tokio::fs::remove_file(&part).await;
            1
        }
    };
    within(stream.write_all(&[answer])).await?;
    within(stream.flush()).await?;
    received.map(|_| ())
}

/// Answers a join query from the directory.
async fn answer_join(mut stream: Box<dyn PeerIo>, inner: &Inner) -> Result<(), String> {
    let mut len = [0u8; 2];
    within(stream.read_exact(&mut len)).await?;
    let len = u16::from_le_bytes(len) as usize;
    let mut url = vec![0u8; len];
    within(stream.read_exact(&mut url)).await?;
    let url = String::from_utf8(url).map_err(|_| "peer URL is not UTF-8".to_string())?;
    let answer = (inner.snapshots.directory)(&url)
        .map(|a| a.encode())
        .unwrap_or_default();
    let mut out = BytesMut::with_capacity(4 + answer.len());
    out.put_u32_le(answer.len() as u32);
    out.put_slice(&answer);
    within(stream.write_all(&out)).await?;
    within(stream.flush()).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Instant;

    /// Slack on the far side of a deadline: a loaded 2-core machine runs the timer late.
    const MARGIN: Duration = Duration::from_secs(3);
    /// A connection refused over the cap is closed at accept: far sooner than any deadline.
    const AT_ONCE: Duration = Duration::from_secs(1);

    fn free_addr() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
    }

    /// A transport for member `id` of cluster 1 whose received raft messages go to `tx`.
    async fn start(
        id: u64,
        listen: SocketAddr,
        peers: Vec<(u64, SocketAddr)>,
        tx: Option<mpsc::UnboundedSender<Message>>,
        tls: Option<PeerTls>,
        dir: &Path,
    ) -> Transport {
        let inbound: Inbound = Arc::new(move |received| {
            if let (Received::Message(m), Some(tx)) = (received, &tx) {
                let _ = tx.send(m);
            }
            true
        });
        let snapshots = SnapshotSetup {
            dir: dir.join(format!("snap-{id}")),
            outgoing: Default::default(),
            directory: Arc::new(|_| None),
        };
        Transport::start(1, id, listen, peers, inbound, tls, snapshots)
            .await
            .unwrap()
    }

    /// How long until the other side closes `stream` (EOF, or an error such as a reset),
    /// counted from `opened`; `None` if it is still open after `limit`.
    async fn closed_after(
        stream: &mut (impl AsyncRead + Unpin),
        opened: Instant,
        limit: Duration,
    ) -> Option<Duration> {
        let mut byte = [0u8; 1];
        match tokio::time::timeout_at((opened + limit).into(), stream.read(&mut byte)).await {
            Ok(Ok(0) | Err(_)) => Some(opened.elapsed()),
            Ok(Ok(_)) => panic!("the transport sent bytes to a connection that said nothing"),
            Err(_) => None,
        }
    }

    fn assert_closed_at_the_deadline(closed: Option<Duration>, what: &str) {
        let closed =
            closed.unwrap_or_else(|| panic!("{what}: still open {:?} after the deadline", MARGIN));
        assert!(
            closed >= HELLO_TIMEOUT - Duration::from_millis(100),
            "{what}: closed after {closed:?}, before the hello deadline"
        );
    }

    fn heartbeat(from: u64, to: u64, commit: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgHeartbeat);
        m.from = from;
        m.to = to;
        m.commit = commit;
        m
    }

    /// Connections that never finish their hello are closed at [`HELLO_TIMEOUT`]: one that
    /// sends nothing, one that sends half a hello, and a join query that never sends the URL
    /// it asks about.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_removed_peer_is_told_after_the_messages_queued_before() {
        let dir = tempfile::tempdir().unwrap();
        let (a_addr, b_addr) = (free_addr(), free_addr());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let inbound: Inbound = Arc::new(move |received| {
            let _ = tx.send(match received {
                Received::Message(m) => format!("message {}", m.commit),
                Received::Removed { by } => format!("removed by {by}"),
                _ => "other".to_string(),
            });
            true
        });
        let snapshots = SnapshotSetup {
            dir: dir.path().join("snap-1"),
            outgoing: Default::default(),
            directory: Arc::new(|_| None),
        };
        let a = Transport::start(1, 1, a_addr, vec![], inbound, None, snapshots)
            .await
            .unwrap();
        let b = start(2, b_addr, vec![(1, a_addr)], None, None, dir.path()).await;
        // b applies a's removal right after queueing a heartbeat: a gets the heartbeat, then
        // the notice, and b sends it nothing more.
        assert!(b.send(vec![heartbeat(2, 1, 7)]).is_empty());
        b.remove_peer(1);
        let mut got = Vec::new();
        while got.len() < 2 {
            let r = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("the removal notice did not arrive")
                .unwrap();
            got.push(r);
        }
        assert_eq!(got, ["message 7", "removed by 2"]);
        assert!(b.peer_ids().is_empty());
        assert_eq!(b.send(vec![heartbeat(2, 1, 8)]), vec![1]);
        a.shutdown();
        b.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_without_a_complete_hello_is_closed_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let transport = start(1, addr, vec![], None, None, dir.path()).await;
        let opened = Instant::now();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(&hello(1, 2, 1)[..HELLO_BYTES / 2])
            .await
            .unwrap();
        let mut join = TcpStream::connect(addr).await.unwrap();
        join.write_all(&hello_with(HELLO_JOIN_MAGIC, 0, 0, 0))
            .await
            .unwrap();
        let limit = HELLO_TIMEOUT + MARGIN;
        let (silent, half, join) = tokio::join!(
            closed_after(&mut silent, opened, limit),
            closed_after(&mut half, opened, limit),
            closed_after(&mut join, opened, limit),
        );
        assert_closed_at_the_deadline(silent, "a silent connection");
        assert_closed_at_the_deadline(half, "half a hello");
        assert_closed_at_the_deadline(join, "a join query without its URL");
        transport.shutdown();
    }

    /// With [`UNAUTHENTICATED_PEERS_MAX`] idle connections in their handshake, the next is
    /// closed at once, while a peer that said hello before keeps delivering messages; the
    /// idle ones go at the deadline and new connections are admitted again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_the_cap_connections_are_closed_at_once_while_a_peer_keeps_talking() {
        let dir = tempfile::tempdir().unwrap();
        let (a_addr, b_addr) = (free_addr(), free_addr());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let a = start(1, a_addr, vec![], Some(tx), None, dir.path()).await;
        let b = start(2, b_addr, vec![(1, a_addr)], None, None, dir.path()).await;
        let mut receive = async |commit: u64| {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let m = tokio::time::timeout_at(deadline, rx.recv())
                    .await
                    .expect("the peer's heartbeat did not arrive")
                    .unwrap();
                if m.commit == commit {
                    return;
                }
            }
        };
        assert!(b.send(vec![heartbeat(2, 1, 1)]).is_empty());
        receive(1).await;

        let opened = Instant::now();
        let mut idle = Vec::new();
        for _ in 0..UNAUTHENTICATED_PEERS_MAX {
            idle.push(TcpStream::connect(a_addr).await.unwrap());
        }
        let mut over = TcpStream::connect(a_addr).await.unwrap();
        let refused_after = closed_after(&mut over, opened, AT_ONCE).await;
        assert!(
            refused_after.is_some(),
            "a connection over the cap was not closed at once"
        );
        // The cap is full, yet the peer's established connection still delivers.
        assert!(b.send(vec![heartbeat(2, 1, 2)]).is_empty());
        receive(2).await;
        assert!(opened.elapsed() < HELLO_TIMEOUT, "the test ran too slowly");

        let mut waits = tokio::task::JoinSet::new();
        for mut stream in idle {
            waits.spawn(
                async move { closed_after(&mut stream, opened, HELLO_TIMEOUT + MARGIN).await },
            );
        }
        while let Some(closed) = waits.join_next().await {
            assert_closed_at_the_deadline(closed.unwrap(), "an idle connection under the cap");
        }
        // Slots came back: a new connection is admitted (not closed at once).
        let reopened = Instant::now();
        let mut fresh = TcpStream::connect(a_addr).await.unwrap();
        assert_eq!(closed_after(&mut fresh, reopened, AT_ONCE).await, None);
        a.shutdown();
        b.shutdown();
    }

    /// Writes a CA and a certificate it signs for 127.0.0.1 (server and client use) under
    /// `dir`; returns the member's TLS.
    fn peer_tls(dir: &Path) -> PeerTls {
        use skerry_tls::pki::{Ca, LeafSpec, Names, Usage};
        let ca = Ca::generate("cluster CA").unwrap();
        let member = ca
            .issue(&LeafSpec::new("member", Usage::Both).names(Names::of(["127.0.0.1"])))
            .unwrap();
        let files = crate::tls::PeerTlsFiles {
            cert: dir.join("member.crt"),
            key: dir.join("member.key"),
            trusted_ca: dir.join("ca.crt"),
        };
        member.write(&files.cert, &files.key).unwrap();
        std::fs::write(&files.trusted_ca, ca.cert_pem()).unwrap();
        PeerTls::load(&files).unwrap()
    }

    /// Over mutual TLS, a connection that sends no ClientHello and one that completes the
    /// handshake (with a cluster certificate) but sends no hello are both closed at the
    /// deadline; and our own dial gives up on a peer that accepts TCP but never answers TLS.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_tls_silence_before_or_after_the_handshake_is_closed_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let tls = peer_tls(dir.path());
        let addr = free_addr();
        let transport = start(1, addr, vec![], None, Some(tls.clone()), dir.path()).await;
        let opened = Instant::now();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
        let mut handshaken = tls.connector.connect(name, tcp).await.unwrap();
        // A listener whose backlog completes TCP connects but which never answers TLS.
        let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mute_addr = mute.local_addr().unwrap();
        let limit = HELLO_TIMEOUT + MARGIN;
        let dial_tls = Some(tls.clone());
        let (silent, handshaken, dial) = tokio::join!(
            closed_after(&mut silent, opened, limit),
            closed_after(&mut handshaken, opened, limit),
            tokio::time::timeout(limit, connect(mute_addr, &dial_tls)),
        );
        assert_closed_at_the_deadline(silent, "no ClientHello");
        assert_closed_at_the_deadline(handshaken, "TLS done, no hello");
        match dial {
            Ok(Err(e)) => assert!(e.contains("no answer"), "{e}"),
            Ok(Ok(_)) => panic!("a TLS handshake with a mute listener succeeded"),
            Err(_) => panic!("dialling a mute listener was not bounded"),
        }
        drop(mute);
        transport.shutdown();
    }

    #[test]
    fn membership_frames_and_join_answers_round_trip() {
        for change in [
            MembershipChange::Add {
                peer_urls: vec!["http://10.0.0.4:2380".into(), "http://[::1]:2380".into()],
                learner: true,
            },
            MembershipChange::Add {
                peer_urls: vec!["http://10.0.0.4:2380".into()],
                learner: false,
            },
            MembershipChange::Promote { id: 7 },
            MembershipChange::Remove { id: 9 },
        ] {
            let mut buf = BytesMut::new();
            encode_change(&change, &mut buf);
            assert_eq!(decode_change(&mut Fields(&buf)), Ok(change.clone()));
            // Every truncation is refused, never misread.
            for cut in 0..buf.len() {
                assert!(decode_change(&mut Fields(&buf[..cut])).is_err());
            }
        }
        let answer = JoinAnswer {
            cluster_id: 1,
            member_id: 2,
            members: vec![
                (3, "http://127.0.0.1:1".into()),
                (2, "http://127.0.0.1:2".into()),
            ],
        };
        let bytes = answer.encode();
        assert_eq!(JoinAnswer::decode(&bytes), Ok(answer));
        assert!(JoinAnswer::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
