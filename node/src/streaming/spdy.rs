//! SPDY/3.1 as Kubernetes' streaming connections use it (moby/spdystream, which client-go,
//! the kubelet's streaming server and containerd's copy of it all speak): frames over one
//! byte stream, streams opened by SYN_STREAM and answered by SYN_REPLY, data frames whose
//! FIN flag half-closes a stream, RST_STREAM, PING, GOAWAY; SETTINGS and WINDOW_UPDATE are
//! read and ignored, as spdystream does (it has no flow control).
//!
//! The trick it carries: header blocks are one zlib stream per direction for the whole
//! session, primed with SPDY/3's published dictionary and sync-flushed per frame, so each
//! side keeps one compressor and one decompressor ([`FrameReader`], [`FrameWriter`]).
//! A [`Session`] is either end: the client opens odd streams, the server even ones.
//!
//! Bounds: a frame's payload ([`MAX_FRAME`]), a decompressed header block
//! ([`MAX_HEADER_BLOCK`]) and its pairs, the streams open at once ([`MAX_STREAMS`]), the
//! wait for a SYN_REPLY ([`REPLY_TIMEOUT`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// The protocol version in every control frame.
pub const VERSION: u16 = 3;

/// The largest frame payload read. The format allows 16 MiB; spdystream writes each
/// `Write` as one frame and its users copy through 32 KiB buffers (Go's `io.Copy`), so a
/// megabyte leaves room and bounds what one frame makes us hold.
pub const MAX_FRAME: usize = 1 << 20;

/// The data written per frame (Go's `io.Copy` buffer, what spdystream's peers send).
pub const DATA_CHUNK: usize = 32 * 1024;

/// The largest header block after decompression. Streaming headers are a handful of short
/// pairs (`streamtype`, `port`, `requestid`); this bounds a zlib bomb.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// Header pairs in one block.
const MAX_HEADER_PAIRS: usize = 256;

/// Streams open at once in one session. An exec uses five, a port-forward two per
/// forwarded connection; one more is refused (RST_STREAM `REFUSED_STREAM`).
pub const MAX_STREAMS: usize = 1024;

/// Time a SYN_STREAM waits for its SYN_REPLY (client-go's `createStreamResponseTimeout`,
/// `tools/remotecommand` and `tools/portforward`, 30 s).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Data frames queued for one stream before the reader waits for its consumer.
const STREAM_QUEUE: usize = 16;

/// Frames queued for the writer.
const WRITE_QUEUE: usize = 64;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

const FLAG_FIN: u8 = 0x01;

/// RST_STREAM status: the stream id is wrong.
pub const RST_PROTOCOL_ERROR: u32 = 1;
/// RST_STREAM status: the stream is refused (too many).
pub const RST_REFUSED_STREAM: u32 = 3;
/// RST_STREAM status: the stream is abandoned.
pub const RST_CANCEL: u32 = 5;

/// The words of SPDY/3's header-compression dictionary, each written with a 4-byte
/// big-endian length (SPDY/3 draft, section 2.6.10.1; moby/spdystream `spdy/dictionary.go`).
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's tail, written as it is after the words.
const DICTIONARY_TAIL: &str = concat!(
    "10010120120220520630030230330430530630740240540640740840941041141241341441541641",
    "7502504505203 Non-Authoritative Information204 No Content301 Moved Permanently40",
    "0 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept O",
    "ct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,imag",
    "e/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/",
    "javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1",
    ",utf-,*,enq=0.",
);

/// The dictionary both sides prime their header zlib streams with.
pub static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut d = Vec::with_capacity(1423);
    for w in DICTIONARY_WORDS {
        d.extend_from_slice(&u32::try_from(w.len()).unwrap_or(0).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    d
});

/// A malformed peer, a closed session or a failed transport.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    /// The transport failed.
    #[error("spdy: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol.
    #[error("spdy: {0}")]
    Protocol(String),
    /// The session is closed.
    #[error("spdy: session closed")]
    Closed,
    /// The peer reset the stream or never answered it.
    #[error("spdy: stream {0} refused")]
    Refused(u32),
}

fn protocol(message: impl Into<String>) -> SpdyError {
    SpdyError::Protocol(message.into())
}

/// Header pairs, names lowercase as SPDY requires (several values of a name are separate
/// pairs here, NUL-joined on the wire).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// Headers from pairs; names are lowercased.
    pub fn of(pairs: &[(&str, &str)]) -> Headers {
        Headers(
            pairs
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), (*v).to_string()))
                .collect(),
        )
    }

    /// The first value of `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Opens a stream.
    SynStream {
        id: u32,
        associated: u32,
        priority: u8,
        fin: bool,
        headers: Headers,
    },
    /// Accepts a stream.
    SynReply {
        id: u32,
        fin: bool,
        headers: Headers,
    },
    /// Ends a stream abnormally.
    RstStream { id: u32, status: u32 },
    /// Session settings (read and ignored).
    Settings,
    /// A ping, answered by its sender's peer with the same id.
    Ping(u32),
    /// The session ends.
    GoAway { last_good: u32, status: u32 },
    /// More headers of a stream.
    Headers {
        id: u32,
        fin: bool,
        headers: Headers,
    },
    /// Flow control (read and ignored).
    WindowUpdate { id: u32, delta: u32 },
    /// A stream's bytes; `fin` half-closes it.
    Data { id: u32, fin: bool, data: Bytes },
}

/// Reads frames, with the session's header decompressor.
pub struct FrameReader<R> {
    io: R,
    inflate: Decompress,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader of `io`.
    pub fn new(io: R) -> Self {
        FrameReader {
            io,
            inflate: Decompress::new(true),
        }
    }

    /// The next frame; `None` at a clean end of stream between frames.
    pub async fn read(&mut self) -> Result<Option<Frame>, SpdyError> {
        let mut head = [0u8; 8];
        match self.io.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let flags = head[4];
        let length = usize::from(head[5]) << 16 | usize::from(head[6]) << 8 | usize::from(head[7]);
        if length > MAX_FRAME {
            return Err(protocol(format!(
                "frame of {length} bytes exceeds {MAX_FRAME}"
            )));
        }
        let mut payload = vec![0u8; length];
        self.io.read_exact(&mut payload).await?;
        let word = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        if word & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                id: word & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                data: Bytes::from(payload),
            }));
        }
        let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
        if version != VERSION {
            return Err(protocol(format!("unsupported version {version}")));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let fin = flags & FLAG_FIN != 0;
        let be32 = |at: usize| -> Result<u32, SpdyError> {
            payload
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| protocol(format!("control frame {kind} too short")))
        };
        let frame = match kind {
            TYPE_SYN_STREAM => {
                let id = be32(0)? & 0x7fff_ffff;
                let associated = be32(4)? & 0x7fff_ffff;
                let priority = payload.get(8).map_or(0, |p| p >> 5);
                let headers = self.headers(payload.get(10..).unwrap_or(&[]))?;
                Frame::SynStream {
                    id,
                    associated,
                    priority,
                    fin,
                    headers,
                }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                let id = be32(0)? & 0x7fff_ffff;
                let headers = self.headers(payload.get(4..).unwrap_or(&[]))?;
                if kind == TYPE_SYN_REPLY {
                    Frame::SynReply { id, fin, headers }
                } else {
                    Frame::Headers { id, fin, headers }
                }
            }
            TYPE_RST_STREAM => Frame::RstStream {
                id: be32(0)? & 0x7fff_ffff,
                status: be32(4)?,
            },
            TYPE_SETTINGS => Frame::Settings,
            TYPE_PING => Frame::Ping(be32(0)?),
            TYPE_GOAWAY => Frame::GoAway {
                last_good: be32(0)? & 0x7fff_ffff,
                status: be32(4).unwrap_or(0),
            },
            TYPE_WINDOW_UPDATE => Frame::WindowUpdate {
                id: be32(0)? & 0x7fff_ffff,
                delta: be32(4)? & 0x7fff_ffff,
            },
            // Unknown control frames are ignored (SPDY/3 section 2.2.1).
            _ => Frame::Settings,
        };
        Ok(Some(frame))
    }

    /// Decompresses and parses one header block.
    fn headers(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let raw = self.inflate(block)?;
        parse_headers(&raw)
    }

    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out: Vec<u8> = Vec::with_capacity(1024);
        let mut at = 0usize;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(protocol(format!(
                        "header block exceeds {MAX_HEADER_BLOCK} bytes"
                    )));
                }
                out.reserve(out.len().min(MAX_HEADER_BLOCK));
            }
            let before_in = self.inflate.total_in();
            let before_out = out.len();
            match self
                .inflate
                .decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => {
                    return Err(protocol("header stream ended"));
                }
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&DICTIONARY)
                        .map_err(|e| protocol(format!("header dictionary: {e}")))?;
                }
                Err(e) => return Err(protocol(format!("header block: {e}"))),
            }
            let consumed = usize::try_from(self.inflate.total_in() - before_in).unwrap_or(0);
            at += consumed;
            let progressed = consumed > 0 || out.len() > before_out;
            if at >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if !progressed && out.len() < out.capacity() {
                return Err(protocol("truncated header block"));
            }
        }
    }
}

/// Parses an uncompressed header block: a pair count, then each name and value with
/// their 4-byte lengths; a value holding NULs is several values.
fn parse_headers(raw: &[u8]) -> Result<Headers, SpdyError> {
    let mut at = 0usize;
    let mut be32 = |raw: &[u8]| -> Result<usize, SpdyError> {
        let b = raw
            .get(at..at + 4)
            .ok_or_else(|| protocol("header block too short"))?;
        at += 4;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = be32(raw)?;
    if count > MAX_HEADER_PAIRS {
        return Err(protocol(format!("{count} header pairs")));
    }
    let mut pairs = Vec::with_capacity(count);
    let mut pos = 4usize;
    for _ in 0..count {
        let mut field = || -> Result<String, SpdyError> {
            let b = raw
                .get(pos..pos + 4)
                .ok_or_else(|| protocol("header block too short"))?;
            let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
            pos += 4;
            let s = raw
                .get(pos..pos.saturating_add(n))
                .ok_or_else(|| protocol("header block too short"))?;
            pos += n;
            String::from_utf8(s.to_vec()).map_err(|_| protocol("header is not UTF-8"))
        };
        let name = field()?;
        let value = field()?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(protocol(format!("header name {name:?} is not lowercase")));
        }
        for v in value.split('\0') {
            pairs.push((name.clone(), v.to_string()));
        }
    }
    Ok(Headers(pairs))
}

/// Writes frames, with the session's header compressor.
pub struct FrameWriter {
    deflate: Compress,
}

impl Default for FrameWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameWriter {
    /// A writer whose compressor is primed with the dictionary.
    pub fn new() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(&DICTIONARY)
            .expect("a fresh compressor takes a dictionary");
        FrameWriter { deflate }
    }

    /// The bytes of `frame`.
    pub fn encode(&mut self, frame: &Frame) -> Vec<u8> {
        let control = |kind: u16, flags: u8, payload: Vec<u8>| -> Vec<u8> {
            let mut out = Vec::with_capacity(8 + payload.len());
            out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
            out.extend_from_slice(&kind.to_be_bytes());
            out.push(flags);
            out.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(0).to_be_bytes()[1..]);
            out.extend_from_slice(&payload);
            out
        };
        let fin_flag = |fin: bool| if fin { FLAG_FIN } else { 0 };
        match frame {
            Frame::SynStream {
                id,
                associated,
                priority,
                fin,
                headers,
            } => {
                let mut p = Vec::new();
                p.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                p.extend_from_slice(&(associated & 0x7fff_ffff).to_be_bytes());
                p.push((priority & 0x07) << 5);
                p.push(0);
                p.extend_from_slice(&self.deflate_headers(headers));
                control(TYPE_SYN_STREAM, fin_flag(*fin), p)
            }
            Frame::SynReply { id, fin, headers } | Frame::Headers { id, fin, headers } => {
                let mut p = Vec::new();
                p.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                p.extend_from_slice(&self.deflate_headers(headers));
                let kind = if matches!(frame, Frame::SynReply { .. }) {
                    TYPE_SYN_REPLY
                } else {
                    TYPE_HEADERS
                };
                control(kind, fin_flag(*fin), p)
            }
            Frame::RstStream { id, status } => {
                let mut p = (id & 0x7fff_ffff).to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                control(TYPE_RST_STREAM, 0, p)
            }
            Frame::Settings => control(TYPE_SETTINGS, 0, 0u32.to_be_bytes().to_vec()),
            Frame::Ping(id) => control(TYPE_PING, 0, id.to_be_bytes().to_vec()),
            Frame::GoAway { last_good, status } => {
                let mut p = (last_good & 0x7fff_ffff).to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                control(TYPE_GOAWAY, 0, p)
            }
            Frame::WindowUpdate { id, delta } => {
                let mut p = (id & 0x7fff_ffff).to_be_bytes().to_vec();
                p.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
                control(TYPE_WINDOW_UPDATE, 0, p)
            }
            Frame::Data { id, fin, data } => {
                let mut out = Vec::with_capacity(8 + data.len());
                out.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                out.push(fin_flag(*fin));
                out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(0).to_be_bytes()[1..]);
                out.extend_from_slice(data);
                out
            }
        }
    }

    fn deflate_headers(&mut self, headers: &Headers) -> Vec<u8> {
        // Values of one name are joined by NUL, names in first-seen order.
        let mut names: Vec<&str> = Vec::new();
        let mut values: HashMap<&str, Vec<&str>> = HashMap::new();
        for (n, v) in &headers.0 {
            if !values.contains_key(n.as_str()) {
                names.push(n);
            }
            values.entry(n).or_default().push(v);
        }
        let mut raw = Vec::new();
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
        raw.extend_from_slice(&len(names.len()));
        for n in names {
            let v = values.get(n).map(|v| v.join("\0")).unwrap_or_default();
            raw.extend_from_slice(&len(n.len()));
            raw.extend_from_slice(n.as_bytes());
            raw.extend_from_slice(&len(v.len()));
            raw.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut at = 0usize;
        loop {
            let before = self.deflate.total_in();
            if self
                .deflate
                .compress_vec(&raw[at..], &mut out, FlushCompress::Sync)
                .is_err()
            {
                // The compressor cannot fail on a buffer it is given; stop rather than loop.
                break;
            }
            at += usize::try_from(self.deflate.total_in() - before).unwrap_or(0);
            if at >= raw.len() && out.len() < out.capacity() {
                break;
            }
            out.reserve(256);
        }
        out
    }
}

/// The state of a stream the session knows.
struct Entry {
    /// Where its data goes; `None` once the peer half-closed it.
    data: Option<mpsc::Sender<Bytes>>,
    /// Who waits for its SYN_REPLY (streams this side opened).
    reply: Option<oneshot::Sender<Headers>>,
}

struct Shared {
    out: mpsc::Sender<Frame>,
    streams: parking_lot::Mutex<HashMap<u32, Entry>>,
    /// The next id this side opens; held while its SYN_STREAM is queued so ids go out in
    /// order.
    next_id: tokio::sync::Mutex<u32>,
    closed: CancellationToken,
}

/// One SPDY session over a byte stream (a TCP connection upgraded from HTTP/1.1, or a
/// WebSocket tunnel's bytes).
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
}

/// A stream: its headers (the SYN_STREAM's for one the peer opened, the SYN_REPLY's for one
/// this side opened), the data the peer sends on it, and a writer.
pub struct Stream {
    /// The stream id.
    pub id: u32,
    /// Its headers.
    pub headers: Headers,
    data: mpsc::Receiver<Bytes>,
    writer: StreamWriter,
}

impl Stream {
    /// The next bytes from the peer; `None` once it half-closed the stream, reset it, or the
    /// session ended.
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.data.recv().await
    }

    /// A handle that writes to the stream.
    pub fn writer(&self) -> StreamWriter {
        self.writer.clone()
    }

    /// Splits into the receiving half and a writer.
    pub fn split(self) -> (mpsc::Receiver<Bytes>, StreamWriter) {
        (self.data, self.writer)
    }
}

/// Writes to one stream.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Frame>,
}

impl StreamWriter {
    /// Sends `data` (in frames of at most [`DATA_CHUNK`]).
    pub async fn send(&self, data: &[u8]) -> Result<(), SpdyError> {
        for chunk in data.chunks(DATA_CHUNK) {
            self.out
                .send(Frame::Data {
                    id: self.id,
                    fin: false,
                    data: Bytes::copy_from_slice(chunk),
                })
                .await
                .map_err(|_| SpdyError::Closed)?;
        }
        Ok(())
    }

    /// Half-closes the stream (an empty data frame with FIN).
    pub async fn close(&self) -> Result<(), SpdyError> {
        self.out
            .send(Frame::Data {
                id: self.id,
                fin: true,
                data: Bytes::new(),
            })
            .await
            .map_err(|_| SpdyError::Closed)
    }

    /// Resets the stream.
    pub async fn reset(&self) -> Result<(), SpdyError> {
        self.out
            .send(Frame::RstStream {
                id: self.id,
                status: RST_CANCEL,
            })
            .await
            .map_err(|_| SpdyError::Closed)
    }
}

impl Session {
    /// Runs a session on `io`: `server` opens even streams, a client odd ones. Streams the
    /// peer opens are accepted (an empty SYN_REPLY) and come out of the returned receiver;
    /// once it is dropped they are refused.
    pub fn new<IO>(io: IO, server: bool) -> (Session, mpsc::Receiver<Stream>)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(io);
        let (out, out_rx) = mpsc::channel(WRITE_QUEUE);
        let shared = Arc::new(Shared {
            out,
            streams: parking_lot::Mutex::new(HashMap::new()),
            next_id: tokio::sync::Mutex::new(if server { 2 } else { 1 }),
            closed: CancellationToken::new(),
        });
        let (incoming_tx, incoming) = mpsc::channel(STREAM_QUEUE);
        tokio::spawn(write_loop(write, out_rx, shared.closed.clone()));
        tokio::spawn(read_loop(
            FrameReader::new(read),
            shared.clone(),
            incoming_tx,
            server,
        ));
        (Session { shared }, incoming)
    }

    /// Opens a stream with `headers` and waits for the peer's SYN_REPLY.
    pub async fn open(&self, headers: Headers) -> Result<Stream, SpdyError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let (data_tx, data_rx) = mpsc::channel(STREAM_QUEUE);
        let id = {
            let mut next = self.shared.next_id.lock().await;
            let id = *next;
            {
                let mut streams = self.shared.streams.lock();
                if streams.len() >= MAX_STREAMS {
                    return Err(protocol(format!("more than {MAX_STREAMS} streams")));
                }
                if id > 0x7fff_ffff {
                    return Err(protocol("stream ids exhausted"));
                }
                streams.insert(
                    id,
                    Entry {
                        data: Some(data_tx),
                        reply: Some(reply_tx),
                    },
                );
            }
            *next = id + 2;
            self.shared
                .out
                .send(Frame::SynStream {
                    id,
                    associated: 0,
                    priority: 0,
                    fin: false,
                    headers,
                })
                .await
                .map_err(|_| SpdyError::Closed)?;
            id
        };
        let reply = tokio::select! {
            r = tokio::time::timeout(REPLY_TIMEOUT, reply_rx) => r,
            () = self.shared.closed.cancelled() => return Err(SpdyError::Closed),
        };
        match reply {
            Ok(Ok(headers)) => Ok(Stream {
                id,
                headers,
                data: data_rx,
                writer: StreamWriter {
                    id,
                    out: self.shared.out.clone(),
                },
            }),
            Ok(Err(_)) => Err(SpdyError::Refused(id)),
            Err(_) => {
                self.shared.streams.lock().remove(&id);
                Err(SpdyError::Refused(id))
            }
        }
    }

    /// Ends the session: a GOAWAY, then the transport is closed once queued frames are out.
    pub async fn close(&self) {
        let _ = self
            .shared
            .out
            .send(Frame::GoAway {
                last_good: 0,
                status: 0,
            })
            .await;
        self.shared.closed.cancel();
    }

    /// Resolves when the session has ended (either side closed it or the transport failed).
    pub async fn closed(&self) {
        self.shared.closed.cancelled().await;
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    write: W,
    mut frames: mpsc::Receiver<Frame>,
    closed: CancellationToken,
) {
    let mut writer = FrameWriter::new();
    let mut io = BufWriter::new(write);
    loop {
        let frame = tokio::select! {
            biased;
            f = frames.recv() => f,
            () = closed.cancelled() => {
                // Drain what is queued (a last FIN, the GOAWAY), then end.
                let mut rest = Vec::new();
                while let Ok(f) = frames.try_recv() {
                    rest.push(f);
                }
                for f in rest {
                    if io.write_all(&writer.encode(&f)).await.is_err() {
                        break;
                    }
                }
                let _ = io.flush().await;
                let _ = io.shutdown().await;
                return;
            }
        };
        let Some(frame) = frame else {
            let _ = io.flush().await;
            let _ = io.shutdown().await;
            return;
        };
        if io.write_all(&writer.encode(&frame)).await.is_err() {
            closed.cancel();
            return;
        }
        if frames.is_empty() && io.flush().await.is_err() {
            closed.cancel();
            return;
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut reader: FrameReader<R>,
    shared: Arc<Shared>,
    incoming: mpsc::Sender<Stream>,
    server: bool,
) {
    let result = read_frames(&mut reader, &shared, &incoming, server).await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "spdy session ended");
    }
    shared.closed.cancel();
    // Every receiver sees its end; every opener waiting for a reply is refused.
    shared.streams.lock().clear();
}

async fn read_frames<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    shared: &Arc<Shared>,
    incoming: &mpsc::Sender<Stream>,
    server: bool,
) -> Result<(), SpdyError> {
    let send = |frame: Frame| {
        let out = shared.out.clone();
        async move { out.send(frame).await.map_err(|_| SpdyError::Closed) }
    };
    loop {
        let frame = tokio::select! {
            f = reader.read() => f?,
            () = shared.closed.cancelled() => return Ok(()),
        };
        let Some(frame) = frame else { return Ok(()) };
        match frame {
            Frame::SynStream {
                id, fin, headers, ..
            } => {
                // The peer's ids are odd if it is the client.
                let from_client = id % 2 == 1;
                if id == 0 || from_client != server {
                    send(Frame::RstStream {
                        id,
                        status: RST_PROTOCOL_ERROR,
                    })
                    .await?;
                    continue;
                }
                let (data_tx, data_rx) = mpsc::channel(STREAM_QUEUE);
                let admitted = {
                    let mut streams = shared.streams.lock();
                    if streams.len() >= MAX_STREAMS || streams.contains_key(&id) {
                        false
                    } else {
                        streams.insert(
                            id,
                            Entry {
                                data: (!fin).then_some(data_tx),
                                reply: None,
                            },
                        );
                        true
                    }
                };
                if !admitted {
                    send(Frame::RstStream {
                        id,
                        status: RST_REFUSED_STREAM,
                    })
                    .await?;
                    continue;
                }
                send(Frame::SynReply {
                    id,
                    fin: false,
                    headers: Headers::default(),
                })
                .await?;
                let stream = Stream {
                    id,
                    headers,
                    data: data_rx,
                    writer: StreamWriter {
                        id,
                        out: shared.out.clone(),
                    },
                };
                if incoming.send(stream).await.is_err() {
                    shared.streams.lock().remove(&id);
                    send(Frame::RstStream {
                        id,
                        status: RST_REFUSED_STREAM,
                    })
                    .await?;
                }
            }
            Frame::SynReply { id, fin, headers } => {
                let mut streams = shared.streams.lock();
                if let Some(entry) = streams.get_mut(&id) {
                    if let Some(reply) = entry.reply.take() {
                        let _ = reply.send(headers);
                    }
                    if fin {
                        entry.data = None;
                    }
                }
            }
            Frame::Data { id, fin, data } => {
                let tx = shared.streams.lock().get(&id).and_then(|e| e.data.clone());
                if let Some(tx) = tx
                    && !data.is_empty()
                {
                    tokio::select! {
                        _ = tx.send(data) => {}
                        () = shared.closed.cancelled() => return Ok(()),
                    }
                }
                if fin {
                    finish(shared, id);
                }
            }
            Frame::Headers { id, fin, .. } => {
                if fin {
                    finish(shared, id);
                }
            }
            Frame::RstStream { id, .. } => {
                shared.streams.lock().remove(&id);
            }
            Frame::Ping(id) => {
                // A ping whose parity is the peer's is answered; ours coming back is dropped
                // (this side sends none).
                let peers = if server { id % 2 == 1 } else { id % 2 == 0 };
                if peers {
                    send(Frame::Ping(id)).await?;
                }
            }
            Frame::GoAway { .. } => return Ok(()),
            Frame::Settings | Frame::WindowUpdate { .. } => {}
        }
    }
}

/// The peer half-closed stream `id`: its receiver ends. The entry goes once it also had its
/// reply (this side's writes need no entry).
fn finish(shared: &Shared, id: u32) {
    let mut streams = shared.streams.lock();
    if let Some(entry) = streams.get_mut(&id) {
        entry.data = None;
        if entry.reply.is_none() {
            streams.remove(&id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        let mut a: u32 = 1;
        let mut b: u32 = 0;
        for &x in DICTIONARY.iter() {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!(
            (b << 16) | a,
            0xe3c6_a7c2,
            "adler32 of the published dictionary"
        );
    }

    #[tokio::test]
    async fn frames_and_compressed_headers_round_trip_across_frames() {
        let mut w = FrameWriter::new();
        let frames = vec![
            Frame::SynStream {
                id: 1,
                associated: 0,
                priority: 0,
                fin: false,
                headers: Headers::of(&[("streamType", "error")]),
            },
            Frame::SynReply {
                id: 1,
                fin: false,
                headers: Headers::default(),
            },
            Frame::SynStream {
                id: 3,
                associated: 0,
                priority: 0,
                fin: false,
                headers: Headers::of(&[("streamtype", "data"), ("port", "80"), ("port", "81")]),
            },
            Frame::Data {
                id: 3,
                fin: true,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Ping(7),
            Frame::RstStream { id: 3, status: 5 },
            Frame::GoAway {
                last_good: 3,
                status: 0,
            },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend_from_slice(&w.encode(f));
        }
        let mut r = FrameReader::new(&wire[..]);
        for f in &frames {
            assert_eq!(r.read().await.unwrap().as_ref(), Some(f));
        }
        assert_eq!(r.read().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_frame_over_the_bound_is_refused() {
        let mut wire = vec![0, 0, 0, 1, 0];
        wire.extend_from_slice(&u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes()[1..]);
        let err = FrameReader::new(&wire[..]).read().await.unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }

    #[tokio::test]
    async fn a_client_and_a_server_exchange_data_and_half_closes() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (client, _) = Session::new(a, false);
        let (_server, mut incoming) = Session::new(b, true);
        let server_side = tokio::spawn(async move {
            let mut s = incoming.recv().await.unwrap();
            assert_eq!(s.headers.get("streamType"), Some("stdin"));
            let mut got = Vec::new();
            while let Some(b) = s.recv().await {
                got.extend_from_slice(&b);
            }
            s.writer().send(&got).await.unwrap();
            s.writer().close().await.unwrap();
        });
        let mut s = client
            .open(Headers::of(&[("streamType", "stdin")]))
            .await
            .unwrap();
        let big = vec![7u8; 100_000];
        s.writer().send(&big).await.unwrap();
        s.writer().close().await.unwrap();
        let mut back = Vec::new();
        while let Some(b) = s.recv().await {
            back.extend_from_slice(&b);
        }
        assert_eq!(back, big);
        server_side.await.unwrap();
    }
}
