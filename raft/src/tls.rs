//! Mutual TLS between members: `--peer-cert-file`, `--peer-key-file`,
//! `--peer-trusted-ca-file`, as etcd names them, loaded into `skerry_tls`'s configurations.
//!
//! Both directions authenticate: a member accepts a peer connection only if the peer's client
//! certificate is signed by the cluster CA, and dials a peer only if the peer's server
//! certificate is signed by it and valid for the IP in its peer URL. A peer with a certificate
//! from another CA gets no connection, so it can neither send nor receive Raft messages.

use std::path::PathBuf;
use std::sync::Arc;

use skerry_tls::config::{self, ClientAuth, ConfigError};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::RaftError;

/// The three files of a member's peer TLS.
#[derive(Debug, Clone)]
pub struct PeerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub trusted_ca: PathBuf,
}

/// Ready-to-use TLS for the peer transport.
#[derive(Clone)]
pub struct PeerTls {
    pub acceptor: TlsAcceptor,
    pub connector: TlsConnector,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls { .. }")
    }
}

/// A refused configuration, in the words of the flags involved.
fn refused(e: ConfigError) -> RaftError {
    RaftError::Config(match e {
        ConfigError::Verifier(e) => format!("--peer-trusted-ca-file: {e}"),
        ConfigError::CertificateAndKey(e) => {
            format!("--peer-cert-file / --peer-key-file do not make a usable pair: {e}")
        }
        e => format!("peer TLS: {e}"),
    })
}

impl PeerTls {
    /// Loads and checks the files; every problem names its flag.
    pub fn load(files: &PeerTlsFiles) -> Result<PeerTls, RaftError> {
        let flag_error = |e: skerry_tls::Error| RaftError::Config(e.to_string());
        let certs = config::read_certs(&files.cert, "--peer-cert-file").map_err(flag_error)?;
        let key = config::read_key(&files.key, "--peer-key-file").map_err(flag_error)?;
        let roots = Arc::new(
            config::read_roots(&files.trusted_ca, "--peer-trusted-ca-file").map_err(flag_error)?,
        );
        let server = config::server_config(
            certs.clone(),
            key.clone_key(),
            ClientAuth::Required(roots.clone()),
            &[],
        )
        .map_err(refused)?;
        let client = config::client_config(roots, Some((certs, key)), &[]).map_err(refused)?;
        Ok(PeerTls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }
}
