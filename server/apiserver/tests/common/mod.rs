//! The in-process harness the registry-level tests share: a single-member store in a temp dir
//! with the bootstrap objects, an [`ApiServer`] over it, and requests handed straight to
//! [`skerry_apiserver::verbs::serve`] as an authenticated admin (no TLS, no HTTP): what these
//! tests check is the API's answers.

#![allow(
    dead_code,
    reason = "each test binary uses a different subset of these helpers"
)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, header};
use http_body_util::BodyExt;
use skerry_api::ApiError;
use skerry_apiserver::ApiServer;
use skerry_apiserver::auth::{Authenticator, GROUP_MASTERS, UserInfo};
use skerry_apiserver::handler::{Config, Request};
use skerry_apiserver::ipalloc::{SERVICE_CIDR_DEFAULT, ServiceCidr};
use skerry_apiserver::request::{RequestInfo, parse_query};
use skerry_store::{Store, StoreConfig};

/// Every exchange is bounded so that a bug fails instead of hanging. Watches in these tests
/// end by their `timeoutSeconds` well inside it, and an eviction that retries a conflict
/// (~10 s by design) would too.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// An apiserver over a fresh store; the store's directory lives as long as the server.
pub struct Server {
    /// The server.
    pub api: Arc<ApiServer>,
    _dir: tempfile::TempDir,
}

/// Opens a store in a temp dir, writes the bootstrap objects and starts the apiserver.
pub async fn start() -> Server {
    start_with(false).await
}

/// [`start`], with the ServiceAccount admission plugin on or off (off in [`start`]: nothing
/// here creates the `default` ServiceAccount it requires).
pub async fn start_with(service_account_admission: bool) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(StoreConfig::new(dir.path())).expect("open store");
    let service_cidr = ServiceCidr::parse(SERVICE_CIDR_DEFAULT).expect("service CIDR");
    skerry_apiserver::startup::bootstrap(&store, &service_cidr, 6443)
        .await
        .expect("bootstrap");
    let api = ApiServer::start(
        store,
        Config {
            server_address: "127.0.0.1:6443".into(),
            authenticator: Authenticator {
                token_file: None,
                service_accounts: None,
            },
            token_issuer: None,
            compaction_interval: None,
            service_cidr,
            node_port_range: Default::default(),
            extra_metrics: None,
            kubelet_client: None,
            service_account_admission,
        },
    );
    Server { api, _dir: dir }
}

/// A request from the admin (`system:masters`) with the given headers and body.
pub fn request(
    method: Method,
    path_and_query: &str,
    accept: Option<&str>,
    content_type: Option<&str>,
    body: Bytes,
) -> Request {
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let query = parse_query(query);
    let info = RequestInfo::parse(&method, path, &query);
    let mut headers = HeaderMap::new();
    if let Some(a) = accept {
        headers.insert(header::ACCEPT, HeaderValue::from_str(a).expect("header"));
    }
    if let Some(c) = content_type {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(c).expect("header"),
        );
    }
    Request {
        info,
        query: query.into_iter().collect::<HashMap<_, _>>(),
        headers,
        body,
        user: UserInfo::authenticated("admin", "", vec![GROUP_MASTERS.to_string()]),
    }
}

/// One request through the registry, bounded by [`EXCHANGE_TIMEOUT`]: the status and the
/// whole body, or the error the registry answered with.
pub async fn exchange(server: &Server, request: Request) -> Result<(u16, Bytes), ApiError> {
    let exchange = async {
        let response = skerry_apiserver::verbs::serve(&server.api, request).await?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .expect("the exchange ended in time")
}
