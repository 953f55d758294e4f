//! Throwaway certificates for one benchmark run: a cluster CA, a serving certificate for the
//! loopback, and an admin client certificate in `system:masters`, so every benchmark request
//! is authenticated by x509 and passes RBAC the way kubectl's admin does.
//!
//! The shapes (ECDSA P-256, CA key usages, clientAuth/serverAuth extended key usages, CN as
//! user and O as group) follow `appliance/src/pki.rs`, which is a binary crate and cannot be
//! imported; nothing here touches the disk.
//!
//! Invariant: the server and client configurations built here trust only this run's CA, so a
//! benchmark can never reach anything but the apiserver it started.

use std::sync::Arc;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use skerry_apiserver::auth::{GROUP_MASTERS, x509};

/// The admin's user name (kubeadm's `kubernetes-admin`).
pub const ADMIN_USER: &str = "kubernetes-admin";

/// The name clients verify the serving certificate against: the loopback address the
/// benchmark binds.
pub const SERVER_NAME: &str = "127.0.0.1";

/// One certificate with its key, DER.
struct Leaf {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

/// The certificates of one run.
pub struct BenchPki {
    ca: CertificateDer<'static>,
    serving: Leaf,
    admin: Leaf,
}

impl BenchPki {
    /// A fresh CA with a serving certificate for [`SERVER_NAME`] and `localhost`, and an admin
    /// client certificate (`CN=kubernetes-admin, O=system:masters`).
    pub fn generate() -> Result<BenchPki> {
        let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generate CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "skerry-apibench-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = params.self_signed(&ca_key).context("self-sign the CA")?;
        let ca_der = ca_cert.der().clone();
        let ca = Issuer::new(params, ca_key);

        let mut serving = CertificateParams::new(vec!["localhost".to_string()])
            .context("serving certificate names")?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.subject_alt_names.push(SanType::IpAddress(
            SERVER_NAME.parse().context("loopback address")?,
        ));
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving = sign(serving, &ca).context("issue the serving certificate")?;

        let mut admin = CertificateParams::default();
        admin.distinguished_name = DistinguishedName::new();
        admin
            .distinguished_name
            .push(DnType::CommonName, ADMIN_USER);
        admin
            .distinguished_name
            .push(DnType::OrganizationName, GROUP_MASTERS);
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin = sign(admin, &ca).context("issue the admin certificate")?;
        Ok(BenchPki {
            ca: ca_der,
            serving,
            admin,
        })
    }

    /// The apiserver's rustls configuration, built by the apiserver's own
    /// [`x509::server_tls_config`] (ALPN `h2` and `http/1.1`, client certificates verified).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        let config = x509::server_tls_config(
            self.ca.clone(),
            vec![self.serving.cert.clone()],
            self.serving.key.clone_key(),
        )
        .context("build the server TLS configuration")?;
        Ok(Arc::new(config))
    }

    /// The admin client's rustls configuration: trusts only this run's CA, presents the admin
    /// certificate, and offers only `h2`, so every connection multiplexes.
    pub fn admin_client_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).context("trust the CA")?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![self.admin.cert.clone()], self.admin.key.clone_key())
            .context("use the admin client certificate")?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Signs `params` with a fresh P-256 key (valid from now for rcgen's default span, which
/// outlives any benchmark).
fn sign(params: CertificateParams, ca: &Issuer<'_, KeyPair>) -> Result<Leaf> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generate a leaf key")?;
    let cert = params.signed_by(&key, ca).context("sign a leaf")?;
    Ok(Leaf {
        cert: cert.der().clone(),
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    })
}
