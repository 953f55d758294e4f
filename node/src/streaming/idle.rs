//! `--streaming-connection-idle-timeout`: a streaming session with no traffic either way for
//! that long is closed (upstream `KubeletConfiguration.streamingConnectionIdleTimeout`,
//! default 4 h; `0` never closes one).
//!
//! The trick: the clock is kept by the client's connection itself. [`IdleIo`] wraps the
//! upgraded socket and touches the session's [`Idle`] on every read or write that moved
//! bytes, so the WebSocket bridge, the port-forward tunnel and the SPDY pass-through share
//! one rule, counted on the wire: any frame either way (data, a resize, a ping) is traffic,
//! as spdystream's idle timer resets on every frame read or written
//! (`moby/spdystream` `connection.go`, `idleAwareFramer`). Each session's task waits on
//! [`Idle::expired`] beside its work and drops the connection when it fires.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The kubelet's default (`streamingConnectionIdleTimeout`, 4 h in
/// `pkg/kubelet/apis/config/v1beta1/defaults.go`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);

/// One session's idle clock.
#[derive(Debug)]
pub struct Idle {
    timeout: Duration,
    start: Instant,
    /// Milliseconds from `start` to the last traffic.
    last_ms: AtomicU64,
}

impl Idle {
    /// A clock that fires after `timeout` without traffic (never when it is zero), started
    /// now.
    pub fn new(timeout: Duration) -> Arc<Idle> {
        Arc::new(Idle {
            timeout,
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    /// Records traffic now.
    pub fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Completes once the session has been idle for the timeout; never with a zero timeout.
    pub async fn expired(&self) {
        if self.timeout.is_zero() {
            return std::future::pending().await;
        }
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last + self.timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A connection whose reads and writes touch an [`Idle`] clock.
pub struct IdleIo<S> {
    inner: S,
    idle: Arc<Idle>,
}

impl<S> IdleIo<S> {
    /// Wraps `inner`, counting its traffic on `idle`.
    pub fn new(inner: S, idle: Arc<Idle>) -> Self {
        IdleIo { inner, idle }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.idle.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.idle.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.idle.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test(start_paused = true)]
    async fn traffic_either_way_postpones_the_expiry_and_silence_reaches_it() {
        let idle = Idle::new(Duration::from_secs(10));
        let (a, mut b) = tokio::io::duplex(64);
        let mut a = IdleIo::new(a, idle.clone());
        let started = Instant::now();
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            a.write_all(b"x").await.unwrap();
            b.read_exact(&mut [0u8; 1]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(6)).await;
            b.write_all(b"y").await.unwrap();
            a.read_exact(&mut [0u8; 1]).await.unwrap();
        }
        // 36 s of a session never silent for 10 s, then 10 s of silence.
        idle.expired().await;
        assert_eq!(started.elapsed(), Duration::from_secs(46));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_never_expires() {
        let idle = Idle::new(Duration::ZERO);
        let r = tokio::time::timeout(Duration::from_secs(24 * 3600), idle.expired()).await;
        assert!(r.is_err());
    }
}
