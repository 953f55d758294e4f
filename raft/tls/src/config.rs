//! rustls configurations (ring provider, rustls' safe default protocol versions): PEM inputs
//! read with errors that name the flag they came from, one server builder and one client
//! builder.
//!
//! The server builder takes the listener's stance on client certificates ([`ClientAuth`]):
//! none asked (the etcd client port without `--client-cert-auth`), asked and verified when
//! sent (the Kubernetes API port, where tokens and anonymous requests still connect), or
//! required (the peer port's mutual TLS, `--client-cert-auth`). A certificate that is sent is
//! always verified against the CA, with the clientAuth extended key usage (webpki checks it),
//! so a leaf from another CA, or a serving certificate passed off as a client's, fails the
//! handshake. ALPN is the listener's own list, in its order of preference: rustls picks the
//! first of the server's protocols that the client offers.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// Why rustls refused a configuration; the caller names the flags or files involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A CA certificate is not usable as a trust anchor.
    #[error("CA certificate: {0}")]
    TrustAnchor(rustls::Error),
    /// The client-certificate verifier could not be built from the CA (no usable root).
    #[error("client certificate verifier: {0}")]
    Verifier(rustls::server::VerifierBuilderError),
    /// The provider offers none of the safe default protocol versions.
    #[error("TLS protocol versions: {0}")]
    Versions(rustls::Error),
    /// The certificate chain and the private key do not make a usable pair.
    #[error("certificate and key: {0}")]
    CertificateAndKey(rustls::Error),
}

/// The crypto provider of every configuration: ring, as the workspace's rustls is built.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether and how a server asks its clients for a certificate.
#[derive(Clone, Debug)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    Off,
    /// A certificate is asked for; one that is sent must chain to these roots, but a client
    /// without one still connects.
    Optional(Arc<RootCertStore>),
    /// A certificate chaining to these roots is required.
    Required(Arc<RootCertStore>),
}

/// A server configuration: the serving chain (leaf first) and its key, `client_auth`, and
/// `alpn` in the server's order of preference.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_auth: ClientAuth,
    alpn: &[&[u8]],
) -> Result<rustls::ServerConfig, ConfigError> {
    let provider = provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::Versions)?;
    let builder = match client_auth {
        ClientAuth::Off => builder.with_no_client_auth(),
        ClientAuth::Optional(roots) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(roots, provider)
                .allow_unauthenticated()
                .build()
                .map_err(ConfigError::Verifier)?,
        ),
        ClientAuth::Required(roots) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(ConfigError::Verifier)?,
        ),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(ConfigError::CertificateAndKey)?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client configuration: servers are trusted when their chain ends at one of `roots` (and
/// their certificate carries the name dialled), `identity` (chain, key) is presented when the
/// server asks, and `alpn` is offered in this order.
pub fn client_config(
    roots: Arc<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, ConfigError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::Versions)?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(ConfigError::CertificateAndKey)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client configuration that accepts any server certificate, for a kubeconfig's
/// `insecure-skip-tls-verify`: the handshake's signatures are still checked, so the server
/// holds the key of the certificate it showed, but nothing says that certificate is the
/// server's. `identity` and `alpn` as in [`client_config`].
pub fn insecure_client_config(
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, ConfigError> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::Versions)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(insecure::AcceptAnyServerCert { provider }));
    let mut config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(ConfigError::CertificateAndKey)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The verifier of [`insecure_client_config`].
mod insecure {
    use std::sync::Arc;

    use rustls::DigitallySignedStruct;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

    #[derive(Debug)]
    pub(super) struct AcceptAnyServerCert {
        pub(super) provider: Arc<CryptoProvider>,
    }

    impl ServerCertVerifier for AcceptAnyServerCert {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
}

/// A root store of `certs`.
pub fn roots(
    certs: impl IntoIterator<Item = CertificateDer<'static>>,
) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(ConfigError::TrustAnchor)?;
    }
    Ok(roots)
}

/// The PEM certificates in `pem`, in order (none if it holds none: the caller says what
/// that means for it).
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// The first PEM private key in `pem` (PKCS#8, PKCS#1 or SEC1).
pub fn key_from_pem(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| e.to_string())
}

/// The PEM certificates in `path`; an error names `flag` and the file
/// (`--peer-cert-file /etc/skerry/peer.crt: no PEM certificate in it`).
pub fn read_certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| Error::Invalid(format!("{flag} {}: {e}", path.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Invalid(format!("{flag} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Invalid(format!(
            "{flag} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// The CA certificates in `path` as a root store; an error names `flag` and the file.
pub fn read_roots(path: &Path, flag: &str) -> Result<RootCertStore, Error> {
    roots(read_certs(path, flag)?)
        .map_err(|e| Error::Invalid(format!("{flag} {}: {e}", path.display())))
}

/// The PEM private key in `path`; an error names `flag` and the file.
pub fn read_key(path: &Path, flag: &str) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| Error::Invalid(format!("{flag} {}: {e}", path.display())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use crate::pki::{Ca, CertifiedKey, LeafSpec, Names, Usage};

    fn serving(ca: &Ca) -> CertifiedKey {
        ca.serving_cert("server", &Names::of(["localhost", "127.0.0.1"]))
            .unwrap()
    }

    /// Runs a TLS handshake in memory between `server` and `client` (for `localhost`);
    /// returns the server's connection once both sides are done, or the first error.
    fn handshake(
        server: rustls::ServerConfig,
        client: rustls::ClientConfig,
    ) -> Result<rustls::ServerConnection, rustls::Error> {
        let mut server = rustls::ServerConnection::new(Arc::new(server))?;
        let mut client =
            rustls::ClientConnection::new(Arc::new(client), "localhost".try_into().unwrap())?;
        for _ in 0..10 {
            let mut buf = Vec::new();
            client.write_tls(&mut buf).unwrap();
            server.read_tls(&mut buf.as_slice()).unwrap();
            server.process_new_packets()?;
            let mut buf = Vec::new();
            server.write_tls(&mut buf).unwrap();
            client.read_tls(&mut buf.as_slice()).unwrap();
            client.process_new_packets()?;
            if !client.is_handshaking() && !server.is_handshaking() {
                // TLS 1.3: the client's certificate travels after the server's Finished.
                let mut buf = Vec::new();
                client.write_tls(&mut buf).unwrap();
                server.read_tls(&mut buf.as_slice()).unwrap();
                server.process_new_packets()?;
                return Ok(server);
            }
        }
        panic!("the handshake did not finish");
    }

    fn server(ca: &Ca, auth: ClientAuth, alpn: &[&[u8]]) -> rustls::ServerConfig {
        let leaf = serving(ca);
        server_config(
            leaf.cert_chain().unwrap(),
            leaf.private_key().unwrap(),
            auth,
            alpn,
        )
        .unwrap()
    }

    fn client(ca: &Ca, identity: Option<&CertifiedKey>, alpn: &[&[u8]]) -> rustls::ClientConfig {
        let identity = identity.map(|i| (i.cert_chain().unwrap(), i.private_key().unwrap()));
        client_config(Arc::new(ca.roots().unwrap()), identity, alpn).unwrap()
    }

    #[test]
    fn required_client_auth_takes_the_cas_client_and_refuses_others() {
        let ca = Ca::generate("cluster").unwrap();
        let rogue = Ca::generate("rogue").unwrap();
        let roots = Arc::new(ca.roots().unwrap());
        let required = || server(&ca, ClientAuth::Required(roots.clone()), &[]);
        let member = ca
            .issue(&LeafSpec::new("m1", Usage::Both).names(Names::of(["localhost"])))
            .unwrap();
        let done = handshake(required(), client(&ca, Some(&member), &[])).unwrap();
        assert_eq!(done.peer_certificates().map(<[_]>::len), Some(1));
        // Signed by another CA: refused.
        let foreign = rogue.client_cert("m3", &[]).unwrap();
        let err = handshake(required(), client(&ca, Some(&foreign), &[])).unwrap_err();
        assert!(
            matches!(err, rustls::Error::InvalidCertificate(_)),
            "{err:?}"
        );
        // No certificate: refused.
        assert!(handshake(required(), client(&ca, None, &[])).is_err());
        // A serving certificate used as a client's lacks clientAuth: refused.
        let serving_only = serving(&ca);
        assert!(handshake(required(), client(&ca, Some(&serving_only), &[])).is_err());
        // The client refuses a server whose certificate another CA signed.
        let rogue_server = server(&rogue, ClientAuth::Off, &[]);
        assert!(handshake(rogue_server, client(&ca, None, &[])).is_err());
    }

    #[test]
    fn optional_client_auth_admits_anonymous_clients_and_verifies_sent_certificates() {
        let ca = Ca::generate("cluster").unwrap();
        let roots = Arc::new(ca.roots().unwrap());
        let optional = || server(&ca, ClientAuth::Optional(roots.clone()), &[]);
        let anonymous = handshake(optional(), client(&ca, None, &[])).unwrap();
        assert!(anonymous.peer_certificates().is_none());
        let jane = ca.client_cert("jane", &["dev"]).unwrap();
        let named = handshake(optional(), client(&ca, Some(&jane), &[])).unwrap();
        assert_eq!(named.peer_certificates().map(<[_]>::len), Some(1));
        let foreign = Ca::generate("rogue")
            .unwrap()
            .client_cert("admin", &["system:masters"])
            .unwrap();
        assert!(handshake(optional(), client(&ca, Some(&foreign), &[])).is_err());
    }

    #[test]
    fn an_insecure_client_takes_any_server_and_still_presents_its_certificate() {
        let ca = Ca::generate("cluster").unwrap();
        let rogue = Ca::generate("rogue").unwrap();
        let roots = Arc::new(ca.roots().unwrap());
        // A server with another CA's certificate: refused by a verifying client...
        let rogue_server = || server(&rogue, ClientAuth::Optional(roots.clone()), &[]);
        assert!(handshake(rogue_server(), client(&ca, None, &[])).is_err());
        // ...taken by an insecure one, which still sends its client certificate.
        let jane = ca.client_cert("jane", &[]).unwrap();
        let identity = Some((jane.cert_chain().unwrap(), jane.private_key().unwrap()));
        let insecure = insecure_client_config(identity, &[b"h2"]).unwrap();
        assert_eq!(insecure.alpn_protocols, [b"h2".to_vec()]);
        let done = handshake(rogue_server(), insecure).unwrap();
        assert_eq!(done.peer_certificates().map(<[_]>::len), Some(1));
    }

    #[test]
    fn the_servers_alpn_order_decides() {
        let ca = Ca::generate("cluster").unwrap();
        let both: &[&[u8]] = &[b"http/1.1", b"h2"];
        let done = handshake(
            server(&ca, ClientAuth::Off, both),
            client(&ca, None, &[b"h2", b"http/1.1"]),
        )
        .unwrap();
        assert_eq!(done.alpn_protocol(), Some(&b"http/1.1"[..]));
        let done = handshake(
            server(&ca, ClientAuth::Off, both),
            client(&ca, None, &[b"h2"]),
        )
        .unwrap();
        assert_eq!(done.alpn_protocol(), Some(&b"h2"[..]));
    }

    #[test]
    fn files_are_read_with_errors_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("cluster").unwrap();
        let cert = dir.path().join("ca.crt");
        std::fs::write(&cert, ca.cert_pem()).unwrap();
        assert_eq!(read_certs(&cert, "--x").unwrap().len(), 1);
        assert_eq!(read_roots(&cert, "--x").unwrap().len(), 1);
        let empty = dir.path().join("empty.crt");
        std::fs::write(&empty, "not pem\n").unwrap();
        let err = read_certs(&empty, "--peer-cert-file")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "--peer-cert-file {}: no PEM certificate in it",
                empty.display()
            )
        );
        let missing = dir.path().join("missing.key");
        let err = read_key(&missing, "--key-file").unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("--key-file {}: ", missing.display())),
            "{err}"
        );
        // A certificate and a key that are not a pair are refused by the builder.
        let a = serving(&ca);
        let b = serving(&ca);
        let err = server_config(
            a.cert_chain().unwrap(),
            b.private_key().unwrap(),
            ClientAuth::Off,
            &[],
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::CertificateAndKey(_)), "{err:?}");
    }
}
