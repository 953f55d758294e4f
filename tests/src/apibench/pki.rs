//! Throwaway certificates for one benchmark run: a cluster CA, a serving certificate for the
//! loopback, and an admin client certificate in `system:masters`, so every benchmark request
//! is authenticated by x509 and passes RBAC the way kubectl's admin does.
//!
//! Issued by `skerry_tls::pki`, as `skerry server`'s own are; nothing here touches the disk.
//!
//! Invariant: the server and client configurations built here trust only this run's CA, so a
//! benchmark can never reach anything but the apiserver it started.

use std::sync::Arc;

use anyhow::{Context, Result};
use skerry_apiserver::auth::{GROUP_MASTERS, x509};
use skerry_tls::pki::{Ca, CertifiedKey, Names};

/// The admin's user name (kubeadm's `kubernetes-admin`).
pub const ADMIN_USER: &str = "kubernetes-admin";

/// The name clients verify the serving certificate against: the loopback address the
/// benchmark binds.
pub const SERVER_NAME: &str = "127.0.0.1";

/// The certificates of one run.
pub struct BenchPki {
    ca: Ca,
    serving: CertifiedKey,
    admin: CertifiedKey,
}

impl BenchPki {
    /// A fresh CA with a serving certificate for [`SERVER_NAME`] and `localhost`, and an admin
    /// client certificate (`CN=kubernetes-admin, O=system:masters`).
    pub fn generate() -> Result<BenchPki> {
        let ca = Ca::generate("skerry-apibench-ca").context("generate the CA")?;
        let serving = ca
            .serving_cert("kube-apiserver", &Names::of(["localhost", SERVER_NAME]))
            .context("issue the serving certificate")?;
        let admin = ca
            .client_cert(ADMIN_USER, &[GROUP_MASTERS])
            .context("issue the admin certificate")?;
        Ok(BenchPki { ca, serving, admin })
    }

    /// The apiserver's rustls configuration, built by the apiserver's own
    /// [`x509::server_tls_config`] (ALPN `h2` and `http/1.1`, client certificates verified).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        let config = x509::server_tls_config(
            self.ca.cert_der().clone(),
            self.serving.cert_chain()?,
            self.serving.private_key()?,
        )
        .context("build the server TLS configuration")?;
        Ok(Arc::new(config))
    }

    /// The admin client's rustls configuration: trusts only this run's CA, presents the admin
    /// certificate, and offers only `h2`, so every connection multiplexes.
    pub fn admin_client_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let identity = (self.admin.cert_chain()?, self.admin.private_key()?);
        let config =
            skerry_tls::config::client_config(Arc::new(self.ca.roots()?), Some(identity), &[b"h2"])
                .context("build the admin client TLS configuration")?;
        Ok(Arc::new(config))
    }
}
