//! Client certificates: the apiserver's rustls configuration and the user a verified client
//! certificate names.
//!
//! The server asks every client for a certificate but does not require one
//! (`skerry_tls::config::ClientAuth::Optional`), so token and anonymous requests still
//! connect; a certificate that is sent must chain to the cluster CA and carry the clientAuth
//! extended key usage, or the handshake fails. After the handshake the leaf names the user as in
//! Kubernetes' x509 authenticator: the subject's CommonName is the user name (the last CN, as Go's
//! `pkix.Name` keeps it), each Organization is a group.
//!
//! Invariant: [`user_from_peer_certs`] trusts its input; it must only see chains rustls has
//! verified with the configuration built here.

use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use skerry_tls::config::{ClientAuth, ConfigError};

use super::UserInfo;

/// ALPN protocols offered, in preference order: HTTP/2 first (kubectl and client-go speak it),
/// then HTTP/1.1 (curl without `--http2`, WebSocket upgrades for `exec`).
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

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

/// The rustls configuration of the apiserver (`skerry_tls`'s server builder): the serving
/// chain and key, ALPN `h2` and `http/1.1`, and client certificates verified against `ca`
/// when a client sends one.
pub fn server_tls_config(
    ca: CertificateDer<'static>,
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::ServerConfig, ConfigError> {
    let roots = skerry_tls::config::roots([ca])?;
    skerry_tls::config::server_config(
        cert_chain,
        key,
        ClientAuth::Optional(Arc::new(roots)),
        &ALPN_PROTOCOLS,
    )
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
    use skerry_tls::pki::{Ca, CertifiedKey, LeafSpec, Names, Usage};

    fn ca(name: &str) -> Ca {
        Ca::generate(name).expect("CA")
    }

    fn leaf(ca: &Ca, cn: Option<&str>, orgs: &[&str], usage: Usage) -> CertifiedKey {
        let spec = LeafSpec::new(cn.unwrap_or(""), usage)
            .organizations(orgs)
            .names(Names::of(["localhost"]));
        ca.issue(&spec).expect("issue")
    }

    fn der(pair: &CertifiedKey) -> CertificateDer<'static> {
        pair.cert_chain().expect("chain").remove(0)
    }

    /// Runs a TLS handshake in memory; returns the server's view of the client chain.
    fn handshake(
        cluster: &Ca,
        client_ca: &Ca,
        client_cert: Option<CertifiedKey>,
    ) -> Result<Vec<CertificateDer<'static>>, rustls::Error> {
        let serving = leaf(cluster, Some("apiserver"), &[], Usage::Server);
        let server_config = server_tls_config(
            cluster.cert_der().clone(),
            serving.cert_chain().expect("chain"),
            serving.private_key().expect("key"),
        )
        .expect("server config");
        let identity = client_cert.map(|pair| {
            (
                vec![der(&pair), client_ca.cert_der().clone()],
                pair.private_key().expect("key"),
            )
        });
        let roots = Arc::new(cluster.roots().expect("roots"));
        let client_config =
            skerry_tls::config::client_config(roots, identity, &[]).expect("client config");
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
            Usage::Client,
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
        let client = leaf(&other, Some("admin"), &["system:masters"], Usage::Client);
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
        let client = leaf(&cluster, Some("jane"), &[], Usage::Server);
        assert!(handshake(&cluster, &cluster, Some(client)).is_err());
    }

    #[test]
    fn cert_without_cn_names_nobody() {
        let cluster = ca("skerry-ca");
        let cert = der(&leaf(&cluster, None, &["dev"], Usage::Client));
        assert_eq!(user_from_peer_certs(&[cert]).expect("parse"), None);
        assert!(user_from_peer_certs(&[CertificateDer::from(vec![1, 2, 3])]).is_err());
    }

    #[test]
    fn alpn_offers_h2_then_http11() {
        let cluster = ca("skerry-ca");
        let serving = leaf(&cluster, Some("apiserver"), &[], Usage::Server);
        let config = server_tls_config(
            cluster.cert_der().clone(),
            serving.cert_chain().expect("chain"),
            serving.private_key().expect("key"),
        )
        .expect("config");
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }
}
