//! Mutual TLS between members (rustls, ring provider): `--peer-cert-file`,
//! `--peer-key-file`, `--peer-trusted-ca-file`, as etcd names them.
//!
//! Both directions authenticate: a member accepts a peer connection only if the peer's client
//! certificate is signed by the cluster CA, and dials a peer only if the peer's server
//! certificate is signed by it and valid for the IP in its peer URL. A peer with a certificate
//! from another CA gets no connection, so it can neither send nor receive Raft messages.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
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

/// The PEM certificates in `path`; an error names `flag` and the file. Shared with the
/// client-side TLS of the `skerry` binary.
pub fn read_certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, RaftError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| RaftError::Config(format!("{flag} {}: {e}", path.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| RaftError::Config(format!("{flag} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(RaftError::Config(format!(
            "{flag} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// The CA certificates in `path` as a root store; an error names `flag` and the file.
pub fn read_roots(path: &Path, flag: &str) -> Result<RootCertStore, RaftError> {
    let mut roots = RootCertStore::empty();
    for ca in read_certs(path, flag)? {
        roots
            .add(ca)
            .map_err(|e| RaftError::Config(format!("{flag} {}: {e}", path.display())))?;
    }
    Ok(roots)
}

impl PeerTls {
    /// Loads and checks the files; every problem names its flag.
    pub fn load(files: &PeerTlsFiles) -> Result<PeerTls, RaftError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = read_certs(&files.cert, "--peer-cert-file")?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
            RaftError::Config(format!("--peer-key-file {}: {e}", files.key.display()))
        })?;
        let roots = Arc::new(read_roots(&files.trusted_ca, "--peer-trusted-ca-file")?);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| RaftError::Config(format!("--peer-trusted-ca-file: {e}")))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| RaftError::Config(format!("peer TLS: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| {
                RaftError::Config(format!(
                    "--peer-cert-file / --peer-key-file do not make a usable pair: {e}"
                ))
            })?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| RaftError::Config(format!("peer TLS: {e}")))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| {
                RaftError::Config(format!(
                    "--peer-cert-file / --peer-key-file do not make a usable pair: {e}"
                ))
            })?;
        Ok(PeerTls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }
}
