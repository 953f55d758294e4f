//! What the network's integration tests share: an admin client of an in-process apiserver
//! (`skerry_apiserver::testing::TestServer`) and a bounded poll.

#![allow(dead_code, reason = "each test file uses its own subset")]

use std::time::Duration;

use skerry_apiserver::testing::TestServer;
use skerry_client::Client;
use skerry_client::config::{Config, Credentials};

/// The admin's client (`system:masters`), unthrottled: these tests check behaviour, not the
/// rate limiter.
pub fn admin_client(server: &TestServer) -> Client {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    Client::new(config).expect("a client of the test server")
}

/// How often [`eventually`] polls.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Polls `check` until it returns `Some`; panics naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
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
