//! Accepts the `:authority` that etcdctl 3.4 sends on some connections.
//!
//! etcdctl's per-endpoint commands (`endpoint status`, `endpoint hashkv`, `defrag`, ...) dial
//! `passthrough:///http://127.0.0.1:2379`, and grpc-go then sends the whole endpoint,
//! `http://127.0.0.1:2379`, as the HTTP/2 `:authority`. Go's server ignores it; Rust's `h2`
//! refuses it as malformed and resets the stream. This wrapper sits between the socket and
//! the HTTP/2 server, on the read side only: it decodes the first header block of each
//! connection; if its authority carries a scheme it rewrites that block and every later one
//! (grpc-go uses one authority per connection), re-encoding them as HPACK literals without
//! indexing so the server's HPACK table is never used; otherwise it steps aside and passes
//! the connection through untouched for good. Everything else (DATA, SETTINGS, ...) is copied
//! frame by frame.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface every HTTP/2 connection starts with (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_BYTES: usize = 9;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// The largest frame we emit: HTTP/2's default `SETTINGS_MAX_FRAME_SIZE`, which every server
/// accepts whatever it advertised.
const FRAME_PAYLOAD_MAX: usize = 16_384;
/// The largest frame we accept to buffer (HTTP/2's absolute maximum frame size, 2^24 - 1).
/// tonic/h2 will refuse anything above what it advertised anyway.
const FRAME_PAYLOAD_LIMIT: usize = (1 << 24) - 1;
/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

enum Mode {
    /// Still reading the preface.
    Preface,
    /// Decoding header blocks until the first one decides.
    Inspect,
    /// Rewriting every header block of this connection.
    Rewrite,
    /// Nothing to do on this connection: bytes pass straight through.
    Passthrough,
}

/// A connection whose header blocks are fixed up as described in the module docs.
pub struct AuthorityFix<IO> {
    inner: IO,
    mode: Mode,
    /// Bytes read from the socket, not yet handed on.
    input: BytesMut,
    /// Bytes ready for the HTTP/2 server.
    output: BytesMut,
    decoder: loona_hpack::Decoder<'static>,
    /// The header block being collected across HEADERS + CONTINUATION frames.
    block: Vec<u8>,
    /// Those frames as received, to pass on unchanged if the block needs no fix.
    block_raw: Vec<u8>,
    block_stream_id: u32,
    block_flags: u8,
    block_priority: Option<[u8; 5]>,
    collecting: bool,
    eof: bool,
}

impl<IO> AuthorityFix<IO> {
    pub fn new(inner: IO) -> Self {
        Self {
            inner,
            mode: Mode::Preface,
            input: BytesMut::new(),
            output: BytesMut::new(),
            decoder: loona_hpack::Decoder::new(),
            block: Vec::new(),
            block_raw: Vec::new(),
            block_stream_id: 0,
            block_flags: 0,
            block_priority: None,
            collecting: false,
            eof: false,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.inner
    }

    /// Moves every complete unit of `input` to `output`, transformed as needed.
    fn process(&mut self) -> io::Result<()> {
        loop {
            match self.mode {
                Mode::Passthrough => {
                    let all = self.input.split();
                    self.output.unsplit(all);
                    return Ok(());
                }
                Mode::Preface => {
                    if self.input.len() < PREFACE.len() {
                        // Not HTTP/2 with prior knowledge (or not yet): pass whatever it is.
                        if !PREFACE.starts_with(&self.input) {
                            self.mode = Mode::Passthrough;
                            continue;
                        }
                        return Ok(());
                    }
                    if &self.input[..PREFACE.len()] != PREFACE {
                        self.mode = Mode::Passthrough;
                        continue;
                    }
                    let preface = self.input.split_to(PREFACE.len());
                    self.output.unsplit(preface);
                    self.mode = Mode::Inspect;
                }
                Mode::Inspect | Mode::Rewrite => {
                    if self.input.len() < FRAME_HEADER_BYTES {
                        return Ok(());
                    }
                    let length = (usize::from(self.input[0]) << 16)
                        | (usize::from(self.input[1]) << 8)
                        | usize::from(self.input[2]);
                    if length > FRAME_PAYLOAD_LIMIT {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "oversized HTTP/2 frame",
                        ));
                    }
                    if self.input.len() < FRAME_HEADER_BYTES + length {
                        return Ok(());
                    }
                    let frame = self.input.split_to(FRAME_HEADER_BYTES + length);
                    self.frame(&frame)?;
                }
            }
        }
    }

    fn frame(&mut self, frame: &[u8]) -> io::Result<()> {
        let kind = frame[3];
        let flags = frame[4];
        let stream_id = u32::from_be_bytes([frame[5] & 0x7f, frame[6], frame[7], frame[8]]);
        let payload = &frame[FRAME_HEADER_BYTES..];
        match kind {
            FRAME_HEADERS => {
                let mut body = payload;
                let mut padding = 0usize;
                if flags & FLAG_PADDED != 0 {
                    let (&pad, rest) = body.split_first().ok_or_else(bad_frame)?;
                    padding = usize::from(pad);
                    body = rest;
                }
                self.block_priority = None;
                if flags & FLAG_PRIORITY != 0 {
                    if body.len() < 5 {
                        return Err(bad_frame());
                    }
                    let mut priority = [0u8; 5];
                    priority.copy_from_slice(&body[..5]);
                    self.block_priority = Some(priority);
                    body = &body[5..];
                }
                if padding > body.len() {
                    return Err(bad_frame());
                }
                self.block.clear();
                self.block.extend_from_slice(&body[..body.len() - padding]);
                self.block_raw.clear();
                self.block_raw.extend_from_slice(frame);
                self.block_stream_id = stream_id;
                self.block_flags = flags;
                self.collecting = true;
            }
            FRAME_CONTINUATION if self.collecting => {
                self.block.extend_from_slice(payload);
                self.block_raw.extend_from_slice(frame);
                self.block_flags |= flags & FLAG_END_HEADERS;
            }
            _ => {
                self.output.extend_from_slice(frame);
                return Ok(());
            }
        }
        if self.block_flags & FLAG_END_HEADERS != 0 {
            self.collecting = false;
            self.finish_block()?;
        }
        Ok(())
    }

    fn finish_block(&mut self) -> io::Result<()> {
        let headers = self
            .decoder
            .decode(&self.block)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("HPACK: {e:?}")))?;
        if let Mode::Inspect = self.mode {
            let needs_fix = headers.iter().any(|(name, value)| {
                name.as_slice() == b":authority" && fixed_authority(value).is_some()
            });
            if !needs_fix {
                // This connection's authority is fine: hand over the original bytes and stop
                // looking (the server's HPACK state matches the client's from here on).
                self.output.extend_from_slice(&self.block_raw);
                self.mode = Mode::Passthrough;
                return Ok(());
            }
            self.mode = Mode::Rewrite;
        }
        let mut block = Vec::with_capacity(self.block.len() * 2);
        for (name, value) in &headers {
            let value = match (name.as_slice(), fixed_authority(value)) {
                (b":authority", Some(fixed)) => fixed,
                _ => value.as_slice(),
            };
            encode_literal(&mut block, name, value);
        }
        self.emit_block(&block);
        Ok(())
    }

    fn emit_block(&mut self, block: &[u8]) {
        let priority = self.block_priority;
        let mut chunks = block.chunks(FRAME_PAYLOAD_MAX - 5).peekable();
        let mut first = true;
        if block.is_empty() {
            self.put_frame(
                FRAME_HEADERS,
                self.block_flags & FLAG_END_STREAM | FLAG_END_HEADERS,
                priority,
                &[],
            );
            return;
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let end_headers = if last { FLAG_END_HEADERS } else { 0 };
            if first {
                let flags = (self.block_flags & FLAG_END_STREAM) | end_headers;
                self.put_frame(FRAME_HEADERS, flags, priority, chunk);
                first = false;
            } else {
                self.put_frame(FRAME_CONTINUATION, end_headers, None, chunk);
            }
        }
    }

    fn put_frame(&mut self, kind: u8, flags: u8, priority: Option<[u8; 5]>, payload: &[u8]) {
        let length = payload.len() + priority.map_or(0, |_| 5);
        self.output.put_uint(length as u64, 3);
        self.output.put_u8(kind);
        self.output
            .put_u8(flags | if priority.is_some() { FLAG_PRIORITY } else { 0 });
        self.output.put_u32(self.block_stream_id);
        if let Some(p) = priority {
            self.output.extend_from_slice(&p);
        }
        self.output.extend_from_slice(payload);
    }
}

fn bad_frame() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP/2 HEADERS frame")
}

/// The authority without the scheme (and path) a grpc-go passthrough target put in it, or
/// `None` if it needs no fix.
fn fixed_authority(value: &[u8]) -> Option<&[u8]> {
    let at = value.windows(3).position(|w| w == b"://")?;
    let rest = &value[at + 3..];
    let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    Some(&rest[..end])
}

/// HPACK "literal header field without indexing, new name" with plain (non-Huffman) strings
/// (RFC 7541 §6.2.2): the receiver's dynamic table is never touched.
fn encode_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    encode_string(out, name);
    encode_string(out, value);
}

fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    encode_integer(out, s.len(), 7, 0x00);
    out.extend_from_slice(s);
}

/// RFC 7541 §5.1 integer with an `prefix_bits`-bit prefix.
fn encode_integer(out: &mut Vec<u8>, mut n: usize, prefix_bits: u32, first_byte_flags: u8) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if n < max_prefix {
        out.push(first_byte_flags | n as u8);
        return;
    }
    out.push(first_byte_flags | max_prefix as u8);
    n -= max_prefix;
    while n >= 128 {
        out.push((n % 128 + 128) as u8);
        n /= 128;
    }
    out.push(n as u8);
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityFix<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if let Mode::Passthrough = this.mode
                && this.input.is_empty()
            {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            if this.eof {
                // The peer closed mid-frame: hand over what is left as it is.
                let rest = this.input.split();
                this.output.unsplit(rest);
                if this.output.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut chunk = [0u8; READ_CHUNK_BYTES];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.eof = true;
                continue;
            }
            this.input.extend_from_slice(read.filled());
            this.process()?;
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(block: &[u8], flags: u8) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
        f.push(FRAME_HEADERS);
        f.push(flags);
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(block);
        f
    }

    fn run(input: &[u8]) -> Vec<u8> {
        let mut fix = AuthorityFix::new(());
        fix.input.extend_from_slice(input);
        fix.process().expect("process");
        fix.output.to_vec()
    }

    fn block(authority: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        encode_literal(&mut b, b":method", b"POST");
        encode_literal(&mut b, b":authority", authority);
        encode_literal(&mut b, b":path", b"/etcdserverpb.Maintenance/Status");
        b
    }

    #[test]
    fn a_scheme_in_the_authority_is_removed() {
        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(
            &block(b"http://127.0.0.1:2379"),
            FLAG_END_HEADERS,
        ));
        let out = run(&input);
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let frame = &out[PREFACE.len()..];
        assert_eq!(frame[3], FRAME_HEADERS);
        assert_eq!(frame[4] & FLAG_END_HEADERS, FLAG_END_HEADERS);
        let decoded = loona_hpack::Decoder::new()
            .decode(&frame[FRAME_HEADER_BYTES..])
            .expect("decode");
        assert!(decoded.contains(&(b":authority".to_vec(), b"127.0.0.1:2379".to_vec())));
        assert!(decoded.contains(&(
            b":path".to_vec(),
            b"/etcdserverpb.Maintenance/Status".to_vec()
        )));
    }

    #[test]
    fn a_good_authority_passes_the_connection_through_unchanged() {
        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(
            &block(b"127.0.0.1:2379"),
            FLAG_END_HEADERS | FLAG_END_STREAM,
        ));
        input.extend_from_slice(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00anything after");
        assert_eq!(run(&input), input);
    }

    #[test]
    fn integers_follow_rfc_7541_c_1() {
        let mut out = Vec::new();
        encode_integer(&mut out, 10, 5, 0);
        assert_eq!(out, [10]);
        out.clear();
        encode_integer(&mut out, 1337, 5, 0);
        assert_eq!(out, [31, 154, 10]);
    }
}
