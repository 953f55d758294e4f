//! What the controllers' integration tests share: clients of a `TestServer` as the admin and as
//! a controller's service account (the identity `skerry server` gives each controller, so its
//! bootstrap RBAC role is exercised).

#![allow(dead_code, reason = "each test file uses its own subset")]

use skerry_apiserver::testing::TestServer;
use skerry_client::Client;
use skerry_client::config::{Config, Credentials};

/// The group every service account is in.
pub const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// A client of `server` authenticating with a client certificate, unthrottled: these tests
/// check behaviour, not the rate limiter.
pub fn client_with_cert(server: &TestServer, cert_pem: &str, key_pem: &str) -> Client {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: cert_pem.to_string(),
        key_pem: key_pem.to_string(),
    };
    config.qps = 0.0;
    Client::new(config).expect("a client of the test server")
}

/// The admin's client: what a test itself reads and writes with.
pub fn admin_client(server: &TestServer) -> Client {
    client_with_cert(server, server.admin_cert_pem(), server.admin_key_pem())
}

/// The client of the controller whose service account in `kube-system` is `name`.
pub fn controller_client(server: &TestServer, name: &str) -> Client {
    let user = format!("system:serviceaccount:kube-system:{name}");
    let (cert, key) = server
        .issue_client_cert(&user, &[SERVICE_ACCOUNTS_GROUP])
        .expect("a certificate for the controller's service account");
    client_with_cert(server, &cert, &key)
}

/// How often [`eventually`] polls: quick next to a controller's convergence, slow enough to
/// leave the two cores to the controllers being waited for.
const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// Polls `check` until it returns `Some`; panics naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: std::time::Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
