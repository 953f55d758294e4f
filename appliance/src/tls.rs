//! Client TLS for the etcd API (`https://` client URLs): `--cert-file`, `--key-file`, and with
//! `--client-cert-auth` client certificates checked against `--trusted-ca-file`, as etcd
//! names them.
//!
//! Handshakes run in their own tasks (`client_port`), so a slow or silent client never holds
//! up the accept loop; the negotiated protocol sends a connection to gRPC or to HTTP/1.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::{Result, bail};
use skerry_tls::config::{self, ClientAuth, ConfigError};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client gets to finish its TLS handshake before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The client port's ALPN, in the server's order of preference.
///
/// rustls picks the first of the server's protocols the client offers. gRPC clients offer
/// `h2` alone (grpc-go, which etcdctl and the Kubernetes apiserver use, appends only `h2` to
/// its TLS config), so they get HTTP/2 and the gRPC server; a general HTTP client such as
/// curl offers both and gets HTTP/1.1 and the HTTP face. etcd 3.4 serves both faces over
/// either protocol behind TLS (`grpcHandlerFunc` in `embed/serve.go`); preferring
/// `http/1.1` gives the same answers without a router in front of the gRPC path.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"http/1.1", b"h2"];

/// The acceptor for client connections (`skerry_tls`'s server builder): ALPN
/// [`ALPN_PROTOCOLS`], and with `client_cert_auth` a client certificate signed by
/// `trusted_ca` required.
pub fn acceptor(
    cert: &Path,
    key: &Path,
    trusted_ca: Option<&Path>,
    client_cert_auth: bool,
) -> Result<TlsAcceptor> {
    let chain = config::read_certs(cert, "--cert-file")?;
    let key = config::read_key(key, "--key-file")?;
    let client_auth = if client_cert_auth {
        let Some(ca) = trusted_ca else {
            bail!("--client-cert-auth needs --trusted-ca-file");
        };
        ClientAuth::Required(Arc::new(config::read_roots(ca, "--trusted-ca-file")?))
    } else {
        ClientAuth::Off
    };
    let config =
        config::server_config(chain, key, client_auth, &ALPN_PROTOCOLS).map_err(|e| match e {
            ConfigError::Verifier(e) => anyhow::anyhow!("--trusted-ca-file: {e}"),
            ConfigError::CertificateAndKey(e) => {
                anyhow::anyhow!("--cert-file and --key-file do not make a usable pair: {e}")
            }
            e => anyhow::anyhow!("client TLS: {e}"),
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A client connection after its TLS handshake, as the gRPC server takes it.
///
/// Until its first bytes arrive it carries a deadline: the HTTP/2 server would wait for the
/// client's preface forever, so a client that negotiates `h2` and then says nothing gets a
/// read error (and its connection closed) when the deadline passes. After the first bytes
/// the deadline is gone and reads pass straight through.
pub struct TlsConn {
    stream: TlsStream<TcpStream>,
    silent_until: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl TlsConn {
    /// `stream`, closed by a read error if it sends nothing within `deadline`.
    pub fn new(stream: TlsStream<TcpStream>, deadline: std::time::Duration) -> Self {
        Self {
            stream,
            silent_until: Some(Box::pin(tokio::time::sleep(deadline))),
        }
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Some(deadline) = &mut this.silent_until {
            match &polled {
                Poll::Ready(_) if buf.filled().len() > before => this.silent_until = None,
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client sent nothing after its TLS handshake",
                    )));
                }
                _ => {}
            }
        }
        polled
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.get_ref().0.connect_info()
    }
}
