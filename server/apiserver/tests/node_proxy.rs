//! `nodes/proxy` and `selfsubjectreviews` over real TLS: an apiserver served by
//! `server::serve` with a kubelet client certificate from its CA, and in front of it a
//! kubelet's port played by an HTTP/1.1 server over TLS (its certificate from the same CA, on
//! this host's non-loopback address, since upstream proxies only to global unicast node
//! addresses) that answers what it received. What is checked is the apiserver's side: the
//! routing of `{name}`, `{name}:{port}` and `http:{name}:{port}`, the verb each method is
//! authorized as, the path and query as forwarded, the client's credentials and hop-by-hop
//! headers left behind, bodies both ways and an answer streamed before it ends, an upgrade
//! joined, and the errors (404, 400, 503). The real kubelet behind it is
//! `appliance/tests/node_proxy.rs`'s.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use skerry_apiserver::ApiServer;
use skerry_apiserver::auth::token::TokenFile;
use skerry_apiserver::auth::{Authenticator, GROUP_MASTERS, x509};
use skerry_apiserver::handler::Config;
use skerry_apiserver::ipalloc::{SERVICE_CIDR_DEFAULT, ServiceCidr};
use skerry_apiserver::podlogs::KubeletClient;
use skerry_store::{Store, StoreConfig};
use skerry_tls::pki::{Ca, CertifiedKey, Names};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Every exchange is bounded so that a bug fails instead of hanging.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// The static token of a `system:masters` user, sent to check it is not forwarded.
const TOKEN: &str = "node-proxy-test-token";
const NODE: &str = "n1";

struct Fixture {
    ca: Ca,
    api_addr: SocketAddr,
    /// The kubelet's address: this host's non-loopback address and the TLS port.
    kubelet: SocketAddr,
    /// The same service in plain HTTP on another port (`http:n1:<port>`).
    plain_port: u16,
    /// Lets the kubelet's `/stream` answer send its second line.
    release: Arc<Notify>,
    api: Arc<ApiServer>,
    _stop: watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

/// This host's address on its default route: the source address of a UDP socket connected
/// (nothing is sent) to an address outside the host.
fn host_address() -> IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket
        .connect("198.51.100.1:9")
        .expect("nodes/proxy tests need a default route (upstream refuses loopback nodes)");
    socket.local_addr().unwrap().ip()
}

/// The kubelet's answers: `/stream` one line, then another once released; `/upgrade` a
/// `101` and an echo of the raw bytes; anything else a JSON account of the request.
async fn kubelet_service(
    req: Request<Incoming>,
    release: Arc<Notify>,
) -> Result<Response<http_body_util::combinators::UnsyncBoxBody<Bytes, hyper::Error>>, hyper::Error>
{
    let path = req.uri().path().to_string();
    if path == "/stream" {
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, hyper::Error>>(2);
        tokio::spawn(async move {
            let _ = tx
                .send(Ok(hyper::body::Frame::data(Bytes::from("first\n"))))
                .await;
            release.notified().await;
            let _ = tx
                .send(Ok(hyper::body::Frame::data(Bytes::from("second\n"))))
                .await;
        });
        let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        return Ok(Response::new(body.boxed_unsync()));
    }
    if path == "/upgrade" {
        let on = hyper::upgrade::on(req);
        tokio::spawn(async move {
            if let Ok(upgraded) = on.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 64];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut r = Response::new(
            Full::new(Bytes::new())
                .map_err(|n| match n {})
                .boxed_unsync(),
        );
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        r.headers_mut()
            .insert("connection", "Upgrade".parse().unwrap());
        r.headers_mut()
            .insert("upgrade", "echo-test".parse().unwrap());
        return Ok(r);
    }
    let method = req.method().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers: serde_json::Map<String, Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
        .collect();
    let body = req.into_body().collect().await?.to_bytes();
    let answer = json!({
        "method": method, "path": path, "query": query, "headers": headers,
        "body": String::from_utf8_lossy(&body),
    });
    let mut r = Response::new(
        Full::new(Bytes::from(answer.to_string()))
            .map_err(|n| match n {})
            .boxed_unsync(),
    );
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r.headers_mut().insert("x-kubelet", "yes".parse().unwrap());
    Ok(r)
}

/// Serves the kubelet's answers on `listener`, over TLS when `tls` is given.
fn serve_kubelet(listener: TcpListener, tls: Option<TlsAcceptor>, release: Arc<Notify>) {
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tls = tls.clone();
            let release = release.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req| kubelet_service(req, release.clone()));
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(tcp).await {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .with_upgrades()
                                .await;
                        }
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(tcp), service)
                            .with_upgrades()
                            .await;
                    }
                }
            });
        }
    });
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path())).unwrap();
    let service_cidr = ServiceCidr::parse(SERVICE_CIDR_DEFAULT).unwrap();
    skerry_apiserver::startup::bootstrap(&store, &service_cidr, 6443)
        .await
        .unwrap();
    let ca = Ca::generate("node proxy test CA").unwrap();
    let kubelet_client_cert = ca
        .client_cert("kube-apiserver-kubelet-client", &[GROUP_MASTERS])
        .unwrap();
    let kubelet_client = KubeletClient {
        tls: Arc::new(
            skerry_tls::config::client_config(
                Arc::new(ca.roots().unwrap()),
                Some((
                    kubelet_client_cert.cert_chain().unwrap(),
                    kubelet_client_cert.private_key().unwrap(),
                )),
                &[b"http/1.1"],
            )
            .unwrap(),
        ),
    };
    let api = ApiServer::start(
        store,
        Config {
            server_address: "127.0.0.1:6443".into(),
            authenticator: Authenticator {
                token_file: Some(
                    TokenFile::parse(&format!(
                        "{TOKEN},token-admin,token-admin-uid,{GROUP_MASTERS}\n"
                    ))
                    .unwrap(),
                ),
                service_accounts: None,
            },
            token_issuer: None,
            compaction_interval: None,
            service_cidr,
            node_port_range: Default::default(),
            extra_metrics: None,
            kubelet_client: Some(kubelet_client),
            service_account_admission: false,
        },
    );
    for cache in api.caches.values() {
        cache.wait_fresh(0).await.unwrap();
    }
    let serving = ca
        .serving_cert("kube-apiserver", &Names::of(["127.0.0.1"]))
        .unwrap();
    let tls = x509::server_tls_config(
        ca.cert_der().clone(),
        serving.cert_chain().unwrap(),
        serving.private_key().unwrap(),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = listener.local_addr().unwrap();
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(skerry_apiserver::server::serve(
        api.clone(),
        listener,
        Arc::new(tls),
        stopped,
    ));

    let ip = host_address();
    let kubelet_cert = ca.node_serving_cert(NODE, &[ip]).unwrap();
    let kubelet_tls = skerry_tls::config::server_config(
        kubelet_cert.cert_chain().unwrap(),
        kubelet_cert.private_key().unwrap(),
        skerry_tls::config::ClientAuth::Off,
        &[b"http/1.1"],
    )
    .unwrap();
    let release = Arc::new(Notify::new());
    let tls_listener = TcpListener::bind((ip, 0)).await.unwrap();
    let kubelet = tls_listener.local_addr().unwrap();
    serve_kubelet(
        tls_listener,
        Some(TlsAcceptor::from(Arc::new(kubelet_tls))),
        release.clone(),
    );
    let plain_listener = TcpListener::bind((ip, 0)).await.unwrap();
    let plain_port = plain_listener.local_addr().unwrap().port();
    serve_kubelet(plain_listener, None, release.clone());

    let f = Fixture {
        ca,
        api_addr,
        kubelet,
        plain_port,
        release,
        api,
        _stop: stop,
        _dir: dir,
    };
    let admin = f.admin();
    f.node(&admin, NODE, &ip.to_string(), kubelet.port()).await;
    f
}

/// Who a request is from: a client certificate, and maybe a bearer token.
struct Identity {
    cert: Option<CertifiedKey>,
    token: Option<&'static str>,
}

impl Fixture {
    fn admin(&self) -> Identity {
        Identity {
            cert: Some(
                self.ca
                    .client_cert("kubernetes-admin", &[GROUP_MASTERS])
                    .unwrap(),
            ),
            token: None,
        }
    }

    fn user(&self, name: &str) -> Identity {
        Identity {
            cert: Some(self.ca.client_cert(name, &[]).unwrap()),
            token: None,
        }
    }

    /// Creates a Node whose status gives `address` and `port` as its kubelet's.
    async fn node(&self, admin: &Identity, name: &str, address: &str, port: u16) {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        let (status, body) = self
            .call(
                admin,
                Method::POST,
                "/api/v1/nodes",
                &[("content-type", "application/json")],
                node.to_string(),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let patch = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": address}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}});
        let (status, body) = self
            .call(
                admin,
                Method::PATCH,
                &format!("/api/v1/nodes/{name}/status"),
                &[("content-type", "application/merge-patch+json")],
                patch.to_string(),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    /// Opens an HTTP/1.1 connection to the apiserver as `who`.
    async fn connect(
        &self,
        who: &Identity,
    ) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
        let identity = who
            .cert
            .as_ref()
            .map(|c| (c.cert_chain().unwrap(), c.private_key().unwrap()));
        let config = skerry_tls::config::client_config(
            Arc::new(self.ca.roots().unwrap()),
            identity,
            &[b"http/1.1"],
        )
        .unwrap();
        let tcp = TcpStream::connect(self.api_addr).await.unwrap();
        let tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::IpAddress(self.api_addr.ip().into()), tcp)
            .await
            .unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        sender
    }

    fn request(
        who: &Identity,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Request<Full<Bytes>> {
        let mut r = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1");
        if let Some(t) = who.token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.body(Full::new(Bytes::from(body))).unwrap()
    }

    /// One request as `who`: the status and the whole body.
    async fn call(
        &self,
        who: &Identity,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> (u16, String) {
        let exchange = async {
            let mut sender = self.connect(who).await;
            let response = sender
                .send_request(Self::request(who, method, path, headers, body))
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        };
        tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
            .await
            .unwrap()
    }

    /// A proxied request's account of itself, as the kubelet received it.
    async fn echo(&self, who: &Identity, method: Method, path: &str, body: &str) -> Value {
        let (status, text) = self.call(who, method, path, &[], body.to_string()).await;
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Binds `user` to a ClusterRole allowing `verbs` on `nodes/proxy`.
    async fn grant(&self, user: &str, verbs: &[&str]) {
        let admin = self.admin();
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": user},
            "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": verbs}]});
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
        for (path, object) in [
            ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                binding,
            ),
        ] {
            let (status, body) = self
                .call(
                    &admin,
                    Method::POST,
                    path,
                    &[("content-type", "application/json")],
                    object.to_string(),
                )
                .await;
            assert_eq!(status, 201, "{body}");
        }
        // The RBAC snapshot follows the watch caches.
        let rv = self.api.store.revision();
        for cache in self.api.caches.values() {
            cache.wait_fresh(rv).await.unwrap();
        }
    }
}

#[tokio::test]
async fn requests_reach_the_kubelet_with_their_path_query_and_body_and_without_credentials() {
    let f = fixture().await;
    let admin = f.admin();
    let with_token = Identity {
        cert: None,
        token: Some(TOKEN),
    };
    let path = "/api/v1/nodes/n1/proxy/containerLogs/ns/p/c?follow=true&tailLines=2&x=a%20b";
    let (status, text) = f
        .call(
            &with_token,
            Method::GET,
            path,
            &[
                ("impersonate-user", "token-admin"),
                ("impersonate-group", GROUP_MASTERS),
                ("connection", "keep-alive, x-hop"),
                ("x-hop", "dropped"),
                ("x-end-to-end", "kept"),
            ],
            String::new(),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let seen: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(seen["method"], "GET");
    assert_eq!(seen["path"], "/containerLogs/ns/p/c");
    assert_eq!(seen["query"], "follow=true&tailLines=2&x=a%20b");
    let headers = &seen["headers"];
    assert!(headers.get("authorization").is_none(), "{headers}");
    assert!(headers.get("impersonate-user").is_none(), "{headers}");
    assert!(headers.get("impersonate-group").is_none(), "{headers}");
    assert!(headers.get("x-hop").is_none(), "{headers}");
    assert_eq!(headers["x-end-to-end"], "kept");
    assert_eq!(headers["host"], f.kubelet.to_string());
    assert_eq!(
        headers["x-forwarded-uri"],
        "/api/v1/nodes/n1/proxy/containerLogs/ns/p/c"
    );

    // No path: the kubelet's root; `..` does not climb out; a trailing slash is kept.
    assert_eq!(
        f.echo(&admin, Method::GET, "/api/v1/nodes/n1/proxy", "")
            .await["path"],
        "/"
    );
    assert_eq!(
        f.echo(
            &admin,
            Method::GET,
            "/api/v1/nodes/n1/proxy/a/../../../b/",
            ""
        )
        .await["path"],
        "/b/"
    );
    // The kubelet's port named, with or without a scheme, is the kubelet; another port is
    // reached in plain HTTP without the apiserver's certificate.
    let port = f.kubelet.port();
    for id in [format!("n1:{port}"), format!("https:n1:{port}")] {
        let seen = f
            .echo(
                &admin,
                Method::GET,
                &format!("/api/v1/nodes/{id}/proxy/pods"),
                "",
            )
            .await;
        assert_eq!(seen["path"], "/pods", "{id}");
    }
    let plain = format!("/api/v1/nodes/http:n1:{}/proxy/healthz", f.plain_port);
    let seen = f.echo(&admin, Method::GET, &plain, "").await;
    assert_eq!(
        seen["headers"]["host"],
        format!("{}:{}", f.kubelet.ip(), f.plain_port)
    );

    // A body goes through, and the kubelet's answer keeps its own headers.
    let big = "x".repeat(200_000);
    for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
        let seen = f
            .echo(&admin, method.clone(), "/api/v1/nodes/n1/proxy/run", &big)
            .await;
        assert_eq!(seen["method"], method.as_str());
        assert_eq!(
            seen["body"].as_str().map(str::len),
            Some(big.len()),
            "{method}"
        );
    }
    let mut sender = f.connect(&admin).await;
    let head = sender
        .send_request(Fixture::request(
            &admin,
            Method::HEAD,
            "/api/v1/nodes/n1/proxy/x",
            &[],
            String::new(),
        ))
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()["x-kubelet"], "yes");
}

#[tokio::test]
async fn each_method_is_authorized_as_its_verb_on_nodes_proxy() {
    let f = fixture().await;
    f.grant("reader", &["get"]).await;
    f.grant("writer", &["create", "update", "patch", "delete"])
        .await;
    let reader = f.user("reader");
    let writer = f.user("writer");
    let path = "/api/v1/nodes/n1/proxy/pods";
    assert_eq!(
        f.echo(&reader, Method::GET, path, "").await["method"],
        "GET"
    );
    for (method, verb) in [
        (Method::POST, "create"),
        (Method::PUT, "update"),
        (Method::PATCH, "patch"),
        (Method::DELETE, "delete"),
    ] {
        let (status, body) = f
            .call(&reader, method.clone(), path, &[], String::new())
            .await;
        assert_eq!(status, 403, "{method}: {body}");
        let status: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            status["message"],
            format!(
                "nodes \"n1\" is forbidden: User \"reader\" cannot {verb} resource \"nodes/proxy\" in API group \"\" at the cluster scope"
            )
        );
        assert_eq!(status["details"]["kind"], "nodes");
        assert_eq!(
            f.echo(&writer, method.clone(), path, "").await["method"],
            method.as_str()
        );
    }
    let (status, body) = f.call(&writer, Method::GET, path, &[], String::new()).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("cannot get resource \\\"nodes/proxy\\\""),
        "{body}"
    );
    // HEAD is a get.
    let (status, _) = f
        .call(&reader, Method::HEAD, path, &[], String::new())
        .await;
    assert_eq!(status, 200);
    let (status, _) = f
        .call(&writer, Method::HEAD, path, &[], String::new())
        .await;
    assert_eq!(status, 403);
    // Someone without any right on nodes/proxy.
    let (status, _) = f
        .call(&f.user("jane"), Method::GET, path, &[], String::new())
        .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn an_answer_streams_before_it_ends_and_an_upgrade_is_joined() {
    let f = fixture().await;
    let admin = f.admin();
    let mut sender = f.connect(&admin).await;
    let response = sender
        .send_request(Fixture::request(
            &admin,
            Method::GET,
            "/api/v1/nodes/n1/proxy/stream",
            &[("user-agent", "curl/8")],
            String::new(),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // The first line arrives while the kubelet still holds the second.
    let first = tokio::time::timeout(EXCHANGE_TIMEOUT, body.frame())
        .await
        .expect("the first line arrives before the answer ends")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(first, "first\n");
    f.release.notify_one();
    let rest = tokio::time::timeout(EXCHANGE_TIMEOUT, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest, "second\n");

    let mut sender = f.connect(&admin).await;
    let response = sender
        .send_request(Fixture::request(
            &admin,
            Method::GET,
            "/api/v1/nodes/n1/proxy/upgrade",
            &[("connection", "Upgrade"), ("upgrade", "echo-test")],
            String::new(),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(response.headers()["upgrade"], "echo-test");
    let upgraded = tokio::time::timeout(EXCHANGE_TIMEOUT, hyper::upgrade::on(response))
        .await
        .unwrap()
        .unwrap();
    let mut io = TokioIo::new(upgraded);
    io.write_all(b"ping over the proxy").await.unwrap();
    let mut buf = vec![0u8; 19];
    tokio::time::timeout(EXCHANGE_TIMEOUT, io.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(buf, b"ping over the proxy");
}

#[tokio::test]
async fn unknown_nodes_bad_addresses_and_unreachable_kubelets_are_statuses() {
    let f = fixture().await;
    let admin = f.admin();
    let status_of = |body: &str| -> Value { serde_json::from_str(body).unwrap() };

    let (code, body) = f
        .call(
            &admin,
            Method::GET,
            "/api/v1/nodes/nope/proxy/pods",
            &[],
            String::new(),
        )
        .await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(status_of(&body)["reason"], "NotFound");
    assert_eq!(status_of(&body)["message"], "nodes \"nope\" not found");

    let (code, body) = f
        .call(
            &admin,
            Method::GET,
            "/api/v1/nodes/a:b:c:d/proxy/pods",
            &[],
            String::new(),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        status_of(&body)["message"],
        "invalid node request \"a:b:c:d\""
    );

    // A node on the loopback is not proxied (upstream `IsProxyableHostname`).
    f.node(&admin, "local", "127.0.0.1", f.kubelet.port()).await;
    let (code, body) = f
        .call(
            &admin,
            Method::GET,
            "/api/v1/nodes/local/proxy/pods",
            &[],
            String::new(),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(status_of(&body)["message"], "address not allowed");

    // Nothing listens on the node's kubelet port: 503.
    let closed = TcpListener::bind((f.kubelet.ip(), 0)).await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    f.node(&admin, "down", &f.kubelet.ip().to_string(), closed_port)
        .await;
    let (code, body) = f
        .call(
            &admin,
            Method::GET,
            "/api/v1/nodes/down/proxy/pods",
            &[],
            String::new(),
        )
        .await;
    assert_eq!(code, 503, "{body}");
    let status = status_of(&body);
    assert_eq!(status["reason"], "ServiceUnavailable");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "error trying to reach service: dial tcp {}:{closed_port}",
            f.kubelet.ip()
        )),
        "{message}"
    );
}

#[tokio::test]
async fn a_self_subject_review_answers_who_is_asking() {
    let f = fixture().await;
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
        "metadata": {"name": "ignored"}, "status": {"userInfo": {"username": "forged"}}});
    let path = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let json_ct = [("content-type", "application/json")];
    let (code, body) = f
        .call(&f.admin(), Method::POST, path, &json_ct, review.to_string())
        .await;
    assert_eq!(code, 201, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["kind"], "SelfSubjectReview");
    assert_eq!(answer["apiVersion"], "authentication.k8s.io/v1");
    assert!(
        answer["metadata"]["creationTimestamp"].is_string(),
        "{answer}"
    );
    assert!(answer["metadata"].get("name").is_none(), "{answer}");
    assert_eq!(
        answer["status"]["userInfo"],
        json!({"username": "kubernetes-admin", "groups": [GROUP_MASTERS, "system:authenticated"]})
    );

    let token = Identity {
        cert: None,
        token: Some(TOKEN),
    };
    let (code, body) = f
        .call(&token, Method::POST, path, &json_ct, review.to_string())
        .await;
    assert_eq!(code, 201, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["status"]["userInfo"]["username"], "token-admin");
    assert_eq!(answer["status"]["userInfo"]["uid"], "token-admin-uid");

    // Any authenticated user may ask (system:basic-user), and gets its own name.
    let (code, body) = f
        .call(
            &f.user("jane"),
            Method::POST,
            path,
            &json_ct,
            review.to_string(),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        answer["status"]["userInfo"],
        json!({"username": "jane", "groups": ["system:authenticated"]})
    );
    // Impersonated, the answer is the impersonated user's.
    let (code, body) = f
        .call(
            &f.admin(),
            Method::POST,
            path,
            &[
                ("content-type", "application/json"),
                ("impersonate-user", "bob"),
            ],
            review.to_string(),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"]["userInfo"]["username"],
        "bob"
    );
    // Create only.
    let (code, _) = f
        .call(&f.admin(), Method::GET, path, &[], String::new())
        .await;
    assert_eq!(code, 405);
}
