//! Client certificates: the apiserver's rustls configuration and the user a verified client
//! certificate names.
//!
//! The server asks every client for a certificate but does not require one (rustls
//! `WebPkiClientVerifier` with `allow_unauthenticated`), so token and anonymous requests still
//! connect; a certificate that is sent must chain to the cluster CA and carry the clientAuth
//! extended key usage, or the handshake fails. After the handshake the leaf names the user as in
//! Kubernetes' x509 authenticator: the subject's CommonName is the user name (the last CN, as Go's
//! `pkix.Name` keeps it), each Organization is a group.
//!
//! Invariant: [`user_from_peer_certs`] trusts its input; it must only see chains rustls has
//! verified with the configuration built here.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::UserInfo;

/// ALPN protocols offered, in preference order: HTTP/2 first (kubectl and client-go speak it),
/// then HTTP/1.1 (curl without `--http2`, WebSocket upgrades for `exec`).
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why a TLS server configuration cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    /// The CA certificate is not usable as a trust anchor.
    #[error("cluster CA certificate: {0}")]
    CaCertificate(#[source] rustls::Error),
    /// The client verifier could not be built from the CA.
    #[error("client certificate verifier: {0}")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    /// rustls refused the protocol versions or the certificate and key pair.
    #[error("serving certificate and key: {0}")]
    ServingCertificate(#[source] rustls::Error),
}

/// Why a verified client certificate yields no user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertificateUserError {
    /// The leaf is not DER X.509 that x509-parser reads (rustls accepted it, so this is a
    /// certificate feature we do not parse).
    #[error("cannot parse the client certificate: {0}")]
    Parse(String),
    /// A CN or O value is not a string.
    #[error("client certificate subject {attribute} is not a string")]
    NotAString {
        /// `CN` or `O`.
        attribute: &'static str,
    },
}

/// The rustls configuration of the apiserver: the serving chain and key, ALPN `h2` and
/// `http/1.1`, and client certificates verified against `ca` when a client sends one.
pub fn server_tls_config(
    ca: CertificateDer<'static>,
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::ServerConfig, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(ca).map_err(TlsConfigError::CaCertificate)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(TlsConfigError::Verifier)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::ServingCertificate)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(cert_chain, key)
        .map_err(TlsConfigError::ServingCertificate)?;
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The user named by a verified client chain (leaf first): `None` when the client sent no
/// certificate or the leaf has no CommonName (Kubernetes then tries the other authenticators).
pub fn user_from_peer_certs(
    chain: &[CertificateDer<'_>],
) -> Result<Option<UserInfo>, CertificateUserError> {
    let Some(leaf) = chain.first() else {
        return Ok(None);
    };
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| CertificateUserError::Parse(e.to_string()))?;
    let subject = cert.subject();
    let mut name = None;
    for cn in subject.iter_common_name() {
        let value = cn
            .as_str()
            .map_err(|_| CertificateUserError::NotAString { attribute: "CN" })?;
        name = Some(value);
    }
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let groups = subject
        .iter_organization()
        .map(|o| {
            o.as_str()
                .map(str::to_string)
                .map_err(|_| CertificateUserError::NotAString { attribute: "O" })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(UserInfo::authenticated(name, "", groups)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::GROUP_AUTHENTICATED;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    use rustls_pki_types::PrivatePkcs8KeyDer;

    struct Ca {
        issuer: Issuer<'static, KeyPair>,
        cert: CertificateDer<'static>,
    }

    fn ca(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("ca cert").der().clone();
        Ca {
            issuer: Issuer::new(params, key),
            cert,
        }
    }

    fn leaf(
        ca: &Ca,
        cn: Option<&str>,
        orgs: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        // rcgen keeps one value per attribute type; a second O goes in under its OID
        // (2.5.4.10) spelled as a custom type, so the parser sees two O attributes.
        for (index, org) in orgs.iter().enumerate() {
            let kind = match index {
                0 => DnType::OrganizationName,
                1 => DnType::CustomDnType(vec![2, 5, 4, 10]),
                _ => panic!("the test helper makes at most two O attributes"),
            };
            params.distinguished_name.push(kind, *org);
        }
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &ca.issuer)
            .expect("sign")
            .der()
            .clone();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert, key)
    }

    /// Runs a TLS handshake in memory; returns the server's view of the client chain.
    fn handshake(
        cluster: &Ca,
        client_ca: &Ca,
        client_cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
    ) -> Result<Vec<CertificateDer<'static>>, rustls::Error> {
        let (serving_cert, serving_key) = leaf(
            cluster,
            Some("apiserver"),
            &[],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let server_config =
            server_tls_config(cluster.cert.clone(), vec![serving_cert], serving_key)
                .expect("server config");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots.add(cluster.cert.clone()).expect("root");
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
        let client_config = match client_cert {
            Some((cert, key)) => builder
                .with_client_auth_cert(vec![cert, client_ca.cert.clone()], key)
                .expect("client cert"),
            None => builder.with_no_client_auth(),
        };
        let mut server = rustls::ServerConnection::new(Arc::new(server_config)).expect("server");
        let mut client = rustls::ClientConnection::new(
            Arc::new(client_config),
            "localhost".try_into().expect("name"),
        )
        .expect("client");
        for _ in 0..10 {
            let mut buf = Vec::new();
            client.write_tls(&mut buf).expect("client write");
            server.read_tls(&mut buf.as_slice()).expect("server read");
            server.process_new_packets()?;
            let mut buf = Vec::new();
            server.write_tls(&mut buf).expect("server write");
            client.read_tls(&mut buf.as_slice()).expect("client read");
            client.process_new_packets()?;
            if !client.is_handshaking() && !server.is_handshaking() {
                // TLS 1.3: the client's certificate travels after the server's Finished.
                let mut buf = Vec::new();
                client.write_tls(&mut buf).expect("client write");
                server.read_tls(&mut buf.as_slice()).expect("server read");
                server.process_new_packets()?;
                assert_eq!(server.alpn_protocol(), None, "the client offered no ALPN");
                return Ok(server
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default());
            }
        }
        panic!("handshake did not finish");
    }

    #[test]
    fn cert_from_cluster_ca_names_the_user() {
        let cluster = ca("skerry-ca");
        let client = leaf(
            &cluster,
            Some("jane"),
            &["dev", "system:masters"],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let chain = handshake(&cluster, &cluster, Some(client)).expect("handshake");
        let user = user_from_peer_certs(&chain)
            .expect("parse")
            .expect("a user");
        assert_eq!(user.name, "jane");
        assert_eq!(user.uid, "");
        assert_eq!(user.groups, ["dev", "system:masters", GROUP_AUTHENTICATED]);
    }

    #[test]
    fn no_cert_still_connects_anonymously() {
        let cluster = ca("skerry-ca");
        let chain = handshake(&cluster, &cluster, None).expect("handshake");
        assert!(chain.is_empty());
        assert_eq!(user_from_peer_certs(&chain).expect("parse"), None);
    }

    #[test]
    fn cert_from_another_ca_is_refused() {
        let cluster = ca("skerry-ca");
        let other = ca("evil-ca");
        let client = leaf(
            &other,
            Some("admin"),
            &["system:masters"],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let err = handshake(&cluster, &other, Some(client)).expect_err("must fail");
        assert!(
            matches!(err, rustls::Error::InvalidCertificate(_)),
            "unexpected error {err:?}"
        );
    }

    #[test]
    fn server_cert_used_as_client_cert_is_refused() {
        // Kubernetes requires the clientAuth usage; webpki enforces it.
        let cluster = ca("skerry-ca");
        let client = leaf(
            &cluster,
            Some("jane"),
            &[],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        assert!(handshake(&cluster, &cluster, Some(client)).is_err());
    }

    #[test]
    fn cert_without_cn_names_nobody() {
        let cluster = ca("skerry-ca");
        let (cert, _) = leaf(
            &cluster,
            None,
            &["dev"],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        assert_eq!(user_from_peer_certs(&[cert]).expect("parse"), None);
        assert!(user_from_peer_certs(&[CertificateDer::from(vec![1, 2, 3])]).is_err());
    }

    #[test]
    fn alpn_offers_h2_then_http11() {
        let cluster = ca("skerry-ca");
        let (cert, key) = leaf(
            &cluster,
            Some("apiserver"),
            &[],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let config = server_tls_config(cluster.cert.clone(), vec![cert], key).expect("config");
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }
}
