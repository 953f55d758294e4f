//! A real apiserver for other crates' integration tests (cargo feature `testing`).
//!
//! [`TestServer::start`] opens a single-member store in a temp dir, seeds it the way every
//! cluster's apiserver does ([`crate::startup::bootstrap`]: system namespaces, bootstrap RBAC,
//! the `kubernetes` Service), starts [`ApiServer`] on it and serves it with the apiserver's own
//! [`crate::server::serve`] over TLS on `127.0.0.1:0`, HTTP/1.1 and HTTP/2 by ALPN — the same
//! path every request of the real binary takes (authentication, RBAC, admission, the watch
//! cache). The certificates are throwaway, issued by `skerry_tls::pki` as `skerry server`'s
//! are: a fresh CA per server, a serving certificate for
//! `127.0.0.1` and `localhost`, and an admin client certificate (`CN=kubernetes-admin`,
//! `O=system:masters`) as kubeadm's admin kubeconfig carries. [`TestServer::issue_client_cert`]
//! signs more users; [`TestServer::admin_token`] is a bearer token of a `system:masters` user.
//! A fresh P-256 service-account key signs `serviceaccounts/<name>/token` requests and
//! verifies the tokens it issued, as `skerry server`'s does (the node's projected-token tests
//! request them).
//!
//! The ServiceAccount admission plugin is off unless asked for
//! ([`TestServer::start_with_service_account_admission`]): no serviceaccount controller runs
//! here to create the `default` ServiceAccount it would require.
//!
//! There is no compactor: a test that needs a compacted store compacts [`TestServer::store`]
//! itself, at the moment it chooses.
//!
//! Invariant: the server and its store live exactly as long as the [`TestServer`]; dropping it
//! stops the listener (and with it every open connection, gracefully), and the temp dir is
//! removed last, after everything that uses it.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use rand::Rng;
use skerry_store::{Store, StoreConfig};
use skerry_tls::pki::{Ca, Names};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::serviceaccount::{ISSUER_DEFAULT, TokenIssuer};
use crate::auth::token::TokenFile;
use crate::auth::{Authenticator, GROUP_MASTERS, x509};
use crate::handler::Config;
use crate::ipalloc::{SERVICE_CIDR_DEFAULT, ServiceCidr};
use crate::{ApiServer, server};

/// The admin's user name (kubeadm's `kubernetes-admin`).
pub const ADMIN_USER: &str = "kubernetes-admin";

/// The user [`TestServer::admin_token`] authenticates as (in `system:masters`).
pub const TOKEN_USER: &str = "test-token-admin";

/// Bytes of randomness in the admin bearer token: 128 bits, as unguessable as a UUID, and
/// printable as 32 hex digits (a token file is CSV, so it must hold no comma or quote).
const TOKEN_BYTES: usize = 16;

/// A running apiserver over its own store, and the admin's ways in.
pub struct TestServer {
    api: Arc<ApiServer>,
    store: Store,
    addr: SocketAddr,
    ca: Ca,
    admin_cert_pem: String,
    admin_key_pem: String,
    admin_token: String,
    /// Dropping the sender (with the server) makes `serve` return and every connection
    /// shut down gracefully: a `watch` channel because every connection task waits on it.
    _stop: watch::Sender<bool>,
    /// Declared last: fields drop in order, so the store's files go after everything using
    /// them.
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Opens a store in a temp dir, seeds it, starts the apiserver and serves it on
    /// `127.0.0.1` on a free port. Returns once every watch cache has listed, so the first
    /// request of a test is never answered "the cache is not ready".
    pub async fn start() -> Result<TestServer> {
        TestServer::start_with(false).await
    }

    /// [`TestServer::start`] with the ServiceAccount admission plugin on, as `skerry server`
    /// runs it: a pod is then refused in a namespace without its ServiceAccount, so the test
    /// creates the ServiceAccounts itself (no serviceaccount controller runs here).
    pub async fn start_with_service_account_admission() -> Result<TestServer> {
        TestServer::start_with(true).await
    }

    async fn start_with(service_account_admission: bool) -> Result<TestServer> {
        let dir = tempfile::tempdir().context("create the store's temp dir")?;
        let store = Store::open(StoreConfig::new(dir.path())).context("open the store")?;
        let ca = Ca::generate("skerry-test-ca").context("generate the test CA")?;
        let serving = ca
            .serving_cert("kube-apiserver", &Names::of(["localhost", "127.0.0.1"]))
            .context("issue the serving certificate")?;
        let admin = ca
            .client_cert(ADMIN_USER, &[GROUP_MASTERS])
            .context("issue the admin certificate")?;
        let (admin_cert_pem, admin_key_pem) = (admin.cert_pem, admin.key_pem);
        let tls = x509::server_tls_config(
            ca.cert_der().clone(),
            serving.cert_chain()?,
            serving.private_key()?,
        )
        .context("build the server TLS configuration")?;

        let mut token_bytes = [0u8; TOKEN_BYTES];
        rand::rng().fill(&mut token_bytes[..]);
        let admin_token: String = token_bytes.iter().map(|b| format!("{b:02x}")).collect();
        let token_file = TokenFile::parse(&format!(
            "{admin_token},{TOKEN_USER},{TOKEN_USER}-uid,{GROUP_MASTERS}\n"
        ))
        .context("build the token file")?;

        let sa_key = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &ring::rand::SystemRandom::new(),
        )
        .map_err(|_| anyhow!("generate the service-account key"))?;
        let api_audiences = vec![ISSUER_DEFAULT.to_string()];
        let issuer = TokenIssuer::new(sa_key.as_ref(), ISSUER_DEFAULT, api_audiences.clone())
            .context("load the service-account key")?;
        let verifier = issuer.verifier(api_audiences);

        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the API listener")?;
        let addr = listener.local_addr().context("API listener address")?;
        let service_cidr =
            ServiceCidr::parse(SERVICE_CIDR_DEFAULT).map_err(|e| anyhow!("service CIDR: {e}"))?;
        crate::startup::bootstrap(&store, &service_cidr, addr.port())
            .await
            .map_err(|e| anyhow!("bootstrap the store: {}", e.message))?;
        let api = ApiServer::start(
            store.clone(),
            Config {
                server_address: addr.to_string(),
                authenticator: Authenticator {
                    token_file: Some(token_file),
                    service_accounts: Some(verifier),
                },
                token_issuer: Some(issuer),
                // No compactor: tests compact the store themselves when they mean to.
                compaction_interval: None,
                service_cidr,
                node_port_range: Default::default(),
                extra_metrics: None,
                kubelet_client: None,
                service_account_admission,
            },
        );
        for cache in api.caches.values() {
            cache
                .wait_fresh(0)
                .await
                .map_err(|e| anyhow!("wait for a watch cache: {}", e.message))?;
        }
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(server::serve(api.clone(), listener, Arc::new(tls), stopped));
        Ok(TestServer {
            api,
            store,
            addr,
            ca,
            admin_cert_pem,
            admin_key_pem,
            admin_token,
            _stop: stop,
            _dir: dir,
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Where the listener accepts connections.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The cluster CA certificate, PEM (what a kubeconfig's `certificate-authority-data`
    /// holds).
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The admin client certificate (`CN=kubernetes-admin, O=system:masters`), PEM.
    pub fn admin_cert_pem(&self) -> &str {
        &self.admin_cert_pem
    }

    /// The admin client certificate's private key, PEM (PKCS#8).
    pub fn admin_key_pem(&self) -> &str {
        &self.admin_key_pem
    }

    /// A bearer token of [`TOKEN_USER`], a member of `system:masters`.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A client certificate and key (PEM) for `user` in `groups`, signed by this server's
    /// CA: RBAC then decides what it may do.
    /// At most [`skerry_tls::pki::GROUPS_MAX`] groups.
    pub fn issue_client_cert(&self, user: &str, groups: &[&str]) -> Result<(String, String)> {
        let cert = self
            .ca
            .client_cert(user, groups)
            .with_context(|| format!("issue a client certificate for {user}"))?;
        Ok((cert.cert_pem, cert.key_pem))
    }

    /// The store under the server (compact it, or write to it, behind the API's back).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The apiserver itself (its watch caches, metrics, ...).
    pub fn api(&self) -> &Arc<ApiServer> {
        &self.api
    }

    /// A kubeconfig for the admin (client certificate and key inline), as `skerry
    /// kubeconfig` writes one.
    pub fn admin_kubeconfig(&self) -> String {
        use base64::Engine as _;
        let data = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: skerry-test\n  \
               cluster:\n    \
                 certificate-authority-data: {ca}\n    \
                 server: {server}\n\
             users:\n\
             - name: {ADMIN_USER}\n  \
               user:\n    \
                 client-certificate-data: {cert}\n    \
                 client-key-data: {key}\n\
             contexts:\n\
             - name: skerry-test\n  \
               context:\n    \
                 cluster: skerry-test\n    \
                 user: {ADMIN_USER}\n\
             current-context: skerry-test\n",
            ca = data(self.ca.cert_pem()),
            server = self.url(),
            cert = data(&self.admin_cert_pem),
            key = data(&self.admin_key_pem),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[tokio::test]
    async fn starts_and_serves_tls_with_the_admin_certificate() {
        let server = TestServer::start().await.unwrap();
        assert!(server.url().starts_with("https://127.0.0.1:"));
        assert!(server.ca_pem().contains("BEGIN CERTIFICATE"));
        assert!(server.admin_key_pem().contains("PRIVATE KEY"));
        // A bare TLS handshake with the admin certificate succeeds and negotiates h2.
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let roots =
            skerry_tls::config::roots([
                CertificateDer::from_pem_slice(server.ca_pem().as_bytes()).unwrap()
            ])
            .unwrap();
        let chain = CertificateDer::pem_slice_iter(server.admin_cert_pem().as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(server.admin_key_pem().as_bytes()).unwrap();
        let config = skerry_tls::config::client_config(
            Arc::new(roots),
            Some((chain, key)),
            &[b"h2", b"http/1.1"],
        )
        .unwrap();
        let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        // The bootstrap ran: the default namespace is in the store's view of the API.
        assert!(server.api().caches.contains_key("namespaces"));
        let (cert, key) = server.issue_client_cert("alice", &["devs", "qa"]).unwrap();
        assert!(cert.contains("BEGIN CERTIFICATE") && key.contains("PRIVATE KEY"));
        let alice = skerry_tls::pki::inspect_pem(&cert).unwrap();
        assert_eq!(
            alice.organizations,
            ["devs", "qa"],
            "both groups are carried"
        );
    }
}
