//! Running one probe (upstream `pkg/kubelet/prober/prober.go` `runProbe` and `pkg/probe/`
//! `exec`, `http`, `tcp`, `grpc`): an exec in the container over CRI `ExecSync`, an HTTP GET,
//! a TCP connect, or a gRPC health `Check`, each bounded by the probe's `timeoutSeconds`.
//!
//! Each gives an [`Outcome`]: success, success with a warning (an HTTP redirect to another
//! host, not followed, as upstream), or failure, with the output upstream's messages carry.

use std::time::Duration;

use http_body_util::{BodyExt as _, Empty};
use k8s_openapi::api::core::v1::{
    Container, ExecAction, GRPCAction, HTTPGetAction, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::net::TcpStream;

use crate::cri::Cri;

/// The most of a response body an HTTP probe reads (`pkg/probe/http/http.go`:
/// `maxRespBodyLength = 10 * 1 << 10`); the rest is not read.
pub const MAX_BODY: usize = 10 * 1024;
/// The most redirects an HTTP probe follows (Go's `http.Client` default policy, which
/// upstream's `RedirectChecker` keeps for same-host redirects).
pub const MAX_REDIRECTS: usize = 10;
/// The most of an exec probe's output kept for the event (`pkg/probe/exec/exec.go`:
/// `maxReadLength = 10 * 1 << 10`).
pub const MAX_EXEC_OUTPUT: usize = 10 * 1024;
/// The User-Agent of HTTP probes (`http.go`: `kube-probe/<major>.<minor>`).
pub const USER_AGENT: &str = "kube-probe/1.32";
/// The User-Agent of HTTP lifecycle hooks (`NewRequestForHTTPGetAction` with the
/// `lifecycle` fragment: `kube-lifecycle/<major>.<minor>`).
pub const LIFECYCLE_USER_AGENT: &str = "kube-lifecycle/1.32";

/// A probe's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It passed.
    Success,
    /// It passed with a warning (`ProbeWarning` event).
    Warning(String),
    /// It failed, with the output.
    Failure(String),
}

/// What a probe needs of the pod.
pub struct ProbeTarget<'a> {
    /// The container's runtime id (exec probes).
    pub container_id: &'a str,
    /// The container's spec (named ports).
    pub container: &'a Container,
    /// The pod's IP (the default host).
    pub pod_ip: &'a str,
}

/// The probe's `timeoutSeconds` (default 1, `SetDefaults_Probe`).
pub fn timeout(p: &Probe) -> Duration {
    Duration::from_secs(u64::try_from(p.timeout_seconds.unwrap_or(1).max(1)).unwrap_or(1))
}

/// Runs `probe` once.
pub async fn run(cri: &Cri, probe: &Probe, target: &ProbeTarget<'_>) -> Outcome {
    let timeout = timeout(probe);
    if let Some(exec) = &probe.exec {
        let command = exec_command(exec, target.container);
        return run_exec(cri, command, target.container_id, timeout).await;
    }
    if let Some(h) = &probe.http_get {
        return match port(&h.port, target.container) {
            Ok(port) => run_http(h, port, target.pod_ip, timeout).await,
            Err(e) => Outcome::Failure(e),
        };
    }
    if let Some(t) = &probe.tcp_socket {
        return match port(&t.port, target.container) {
            Ok(port) => run_tcp(t, port, target.pod_ip, timeout).await,
            Err(e) => Outcome::Failure(e),
        };
    }
    if let Some(g) = &probe.grpc {
        return run_grpc(g, target.pod_ip, timeout).await;
    }
    // `prober.go`: "missing probe handler for <container>".
    Outcome::Failure(format!(
        "missing probe handler for {}",
        target.container.name
    ))
}

/// A port by number or by the container's port name (`prober.go` `resolveContainerPort`).
pub fn port(p: &IntOrString, c: &Container) -> Result<u16, String> {
    let n = match p {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => c
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name.as_str()))
                .map(|cp| cp.container_port)
                .ok_or_else(|| format!("couldn't find port: {name} in {}", c.name))?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// An exec probe's command with `$(VAR)` expanded against the container's literal `env`
/// values only (`ExpandContainerCommandOnlyStatic`: no `valueFrom`, no service variables).
pub fn exec_command(exec: &ExecAction, c: &Container) -> Vec<String> {
    let env: std::collections::BTreeMap<String, String> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect();
    let contexts = [&env];
    let mapping = crate::env::expansion::mapping_for(&contexts);
    exec.command
        .iter()
        .flatten()
        .map(|s| crate::env::expansion::expand(s, &mapping))
        .collect()
}

async fn run_exec(cri: &Cri, cmd: Vec<String>, id: &str, timeout: Duration) -> Outcome {
    let line = cmd.join(" ");
    match tokio::time::timeout(timeout, cri.exec_sync(id, cmd, timeout)).await {
        Ok(Ok(r)) => {
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            out.truncate(MAX_EXEC_OUTPUT);
            let text = String::from_utf8_lossy(&out).into_owned();
            // `exec.go`: a non-zero exit fails with the output, empty or not.
            if r.exit_code == 0 {
                Outcome::Success
            } else {
                Outcome::Failure(text)
            }
        }
        Ok(Err(e)) => Outcome::Failure(e.to_string()),
        // `pkg/probe/exec/exec.go`: a timed-out exec probe fails with this text.
        Err(_) => Outcome::Failure(format!("command {line:?} timed out")),
    }
}

async fn run_tcp(t: &TCPSocketAction, port: u16, pod_ip: &str, timeout: Duration) -> Outcome {
    let host = t
        .host
        .as_deref()
        .filter(|h| !h.is_empty())
        .unwrap_or(pod_ip);
    let addr = host_port(host, port);
    match tokio::time::timeout(timeout, TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => Outcome::Success,
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// One GET's answer.
struct Answer {
    status: u16,
    location: Option<String>,
    body: String,
}

/// The parts of an `httpGet` request: HTTPS or not, `host:port` (the host defaulting to the
/// pod's IP), the path with its leading `/`, the headers.
fn http_request_parts(
    h: &HTTPGetAction,
    port: u16,
    pod_ip: &str,
) -> (bool, String, String, Vec<(String, String)>) {
    let host = h
        .host
        .as_deref()
        .filter(|h| !h.is_empty())
        .unwrap_or(pod_ip);
    let https = h
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
    let mut path = h.path.clone().unwrap_or_default();
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    let headers: Vec<(String, String)> = h
        .http_headers
        .iter()
        .flatten()
        .map(|hd| (hd.name.clone(), hd.value.clone()))
        .collect();
    (https, host_port(host, port), path, headers)
}

/// What rustls says when an HTTPS request gets a plain HTTP answer (the record type of
/// `HTTP/1.1 ...` is no TLS content type): Go's `server gave HTTP response to HTTPS client`.
const PLAIN_HTTP_ANSWER: &str = "InvalidContentType";

/// An HTTP lifecycle hook (`lifecycle/handlers.go` `runHTTPHandler`): one GET built as a
/// probe's, bounded by `timeout`; only a request that gets no answer fails (the status code
/// does not matter, as upstream, which discards the response). An HTTPS hook answered in
/// plain HTTP is sent again over HTTP without its `Authorization` header; `Ok(Some(addr))`
/// says that fallback succeeded (upstream's `LifecycleHTTPFallback` event).
pub async fn lifecycle_http_get(
    h: &HTTPGetAction,
    port: u16,
    pod_ip: &str,
    timeout: Duration,
) -> Result<Option<String>, String> {
    let (https, addr, path, mut headers) = http_request_parts(h, port, pod_ip);
    let deadline = tokio::time::Instant::now() + timeout;
    let timed_out = |https: bool| {
        format!(
            "Get \"{}://{addr}{path}\": context deadline exceeded",
            if https { "https" } else { "http" }
        )
    };
    let get_once = get(https, &addr, &path, &headers, LIFECYCLE_USER_AGENT);
    match tokio::time::timeout_at(deadline, get_once).await {
        Ok(Ok(_)) => Ok(None),
        Ok(Err(e)) if https && e.contains(PLAIN_HTTP_ANSWER) => {
            headers.retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
            let retry = get(false, &addr, &path, &headers, LIFECYCLE_USER_AGENT);
            match tokio::time::timeout_at(deadline, retry).await {
                Ok(Ok(_)) => Ok(Some(addr.clone())),
                // The HTTPS error is the hook's, as upstream's.
                Ok(Err(_)) | Err(_) => Err(e),
            }
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(timed_out(https)),
    }
}

async fn run_http(h: &HTTPGetAction, port: u16, pod_ip: &str, timeout: Duration) -> Outcome {
    let (https, addr, path, headers) = http_request_parts(h, port, pod_ip);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut url_path = path;
    for _ in 0..=MAX_REDIRECTS {
        let get = get(https, &addr, &url_path, &headers, USER_AGENT);
        let answer = match tokio::time::timeout_at(deadline, get).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Outcome::Failure(e),
            Err(_) => {
                return Outcome::Failure(format!(
                    "Get \"{}://{addr}{url_path}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
                    if https { "https" } else { "http" }
                ));
            }
        };
        if (300..400).contains(&answer.status) {
            // Followed only to the same host (`http.go` `RedirectChecker`): elsewhere the
            // redirect itself is the answer, a success with a warning.
            match answer.location.as_deref().and_then(|l| same_host(l, &addr)) {
                Some(next) => {
                    url_path = next;
                    continue;
                }
                None => {
                    return Outcome::Warning(format!(
                        "Probe terminated redirects, Response body: {}",
                        answer.body
                    ));
                }
            }
        }
        if (200..400).contains(&answer.status) {
            return Outcome::Success;
        }
        return Outcome::Failure(format!(
            "HTTP probe failed with statuscode: {}",
            answer.status
        ));
    }
    Outcome::Failure("stopped after 10 redirects".to_string())
}

/// The path of a redirect that stays on `addr` (a relative location, or an absolute one
/// naming the same host and port).
fn same_host(location: &str, addr: &str) -> Option<String> {
    if location.starts_with('/') {
        return Some(location.to_string());
    }
    let rest = location
        .strip_prefix("http://")
        .or_else(|| location.strip_prefix("https://"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    (authority == addr).then(|| {
        if path.is_empty() {
            "/".to_string()
        } else {
            path.to_string()
        }
    })
}

async fn get(
    https: bool,
    addr: &str,
    path: &str,
    headers: &[(String, String)],
    user_agent: &str,
) -> Result<Answer, String> {
    let scheme = if https { "https" } else { "http" };
    let url = format!("{scheme}://{addr}{path}");
    let err = |e: &dyn std::fmt::Display| format!("Get \"{url}\": {e}");
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| err(&format!("dial tcp {addr}: {e}")))?;
    let mut req = http::Request::get(path);
    let mut host_set = false;
    let mut ua_set = false;
    let mut accept_set = false;
    for (name, value) in headers {
        // A `Host` header names the virtual host (`http.go`: it replaces the request's).
        host_set |= name.eq_ignore_ascii_case("host");
        ua_set |= name.eq_ignore_ascii_case("user-agent");
        accept_set |= name.eq_ignore_ascii_case("accept");
        req = req.header(name.as_str(), value.as_str());
    }
    if !host_set {
        req = req.header("Host", addr);
    }
    if !ua_set {
        req = req.header("User-Agent", user_agent);
    }
    if !accept_set {
        req = req.header("Accept", "*/*");
    }
    req = req.header("Connection", "close");
    let req = req
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| err(&e))?;
    let response = if https {
        let config = skerry_tls::config::insecure_client_config(None, &[b"http/1.1"])
            .map_err(|e| err(&e))?;
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let name = rustls_pki_types::ServerName::try_from(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        )
        .map_err(|e| err(&e))?;
        let tls = connector.connect(name, tcp).await.map_err(|e| err(&e))?;
        send(hyper_util::rt::TokioIo::new(tls), req).await
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), req).await
    }
    .map_err(|e| err(&e))?;
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get(http::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = Vec::new();
    let mut stream = response.into_body();
    while body.len() < MAX_BODY {
        match stream.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    body.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    body.truncate(MAX_BODY);
    Ok(Answer {
        status,
        location,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

async fn send<IO>(
    io: IO,
    req: http::Request<Empty<bytes::Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, hyper::Error>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await
}

/// The gRPC health protocol's messages and client.
pub mod health {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("grpc.health.v1");
}

async fn run_grpc(g: &GRPCAction, pod_ip: &str, timeout: Duration) -> Outcome {
    use health::health_check_response::ServingStatus;
    let Ok(port) = u16::try_from(g.port) else {
        return Outcome::Failure(format!("invalid port number: {}", g.port));
    };
    let addr = host_port(pod_ip, port);
    let service = g.service.clone().unwrap_or_default();
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return Outcome::Failure(e.to_string()),
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        // `pkg/probe/grpc/grpc.go`'s texts.
        Ok(Err(e)) => {
            return Outcome::Failure(format!(
                "timeout: failed to connect service \"{addr}\" within {}s: {e}",
                timeout.as_secs()
            ));
        }
        Err(_) => {
            return Outcome::Failure(format!(
                "timeout: failed to connect service \"{addr}\" within {}s: context deadline exceeded",
                timeout.as_secs()
            ));
        }
    };
    let mut client = health::health_client::HealthClient::new(channel);
    let call = client.check(health::HealthCheckRequest { service });
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(r)) => {
            let status = r.into_inner().status();
            if status == ServingStatus::Serving {
                Outcome::Success
            } else {
                Outcome::Failure(format!(
                    "service unhealthy (responded with \"{}\")",
                    status.as_str_name()
                ))
            }
        }
        Ok(Err(s)) if s.code() == tonic::Code::DeadlineExceeded => Outcome::Failure(format!(
            "timeout: health rpc did not complete within {}s",
            timeout.as_secs()
        )),
        Ok(Err(s)) => Outcome::Failure(format!("error: health rpc probe failed: {s}")),
        Err(_) => Outcome::Failure(format!(
            "timeout: health rpc did not complete within {}s",
            timeout.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn container(json: serde_json::Value) -> Container {
        serde_json::from_value(json).expect("container")
    }

    #[test]
    fn ports_by_number_or_name() {
        let c = container(
            serde_json::json!({"name": "c", "ports": [{"name": "web", "containerPort": 8080}]}),
        );
        assert_eq!(port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(port(&IntOrString::String("web".into()), &c), Ok(8080));
        assert_eq!(port(&IntOrString::String("81".into()), &c), Ok(81));
        assert_eq!(
            port(&IntOrString::String("db".into()), &c),
            Err("couldn't find port: db in c".to_string())
        );
        assert!(port(&IntOrString::Int(70000), &c).is_err());
    }

    #[test]
    fn exec_commands_expand_literal_env_only() {
        let c = container(serde_json::json!({"name": "c", "env": [
            {"name": "FILE", "value": "/tmp/ok"},
            {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
        ]}));
        let exec = ExecAction {
            command: Some(vec!["cat".into(), "$(FILE)".into(), "$(SECRET)".into()]),
        };
        assert_eq!(exec_command(&exec, &c), ["cat", "/tmp/ok", "$(SECRET)"]);
    }

    #[test]
    fn redirects_stay_on_the_host() {
        assert_eq!(same_host("/b", "1.2.3.4:80"), Some("/b".into()));
        assert_eq!(
            same_host("http://1.2.3.4:80/x", "1.2.3.4:80"),
            Some("/x".into())
        );
        assert_eq!(same_host("http://other:80/x", "1.2.3.4:80"), None);
    }

    /// A one-shot HTTP server answering each connection with the next canned response.
    async fn server(responses: Vec<&'static str>) -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        tokio::spawn(async move {
            for r in responses {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(r.as_bytes()).await;
                let _ = s.shutdown().await;
            }
        });
        port
    }

    fn get_action(port: u16, path: &str) -> HTTPGetAction {
        HTTPGetAction {
            port: IntOrString::Int(i32::from(port)),
            path: Some(path.into()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn http_status_codes_and_redirects() {
        let t = Duration::from_secs(2);
        let ok = server(vec!["HTTP/1.1 204 No Content\r\n\r\n"]).await;
        assert_eq!(
            run_http(&get_action(ok, "/"), ok, "127.0.0.1", t).await,
            Outcome::Success
        );
        let bad = server(vec![
            "HTTP/1.1 503 Unavailable\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        assert_eq!(
            run_http(&get_action(bad, "/"), bad, "127.0.0.1", t).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        // A same-host redirect is followed (here to a failure).
        let same = server(vec![
            "HTTP/1.1 302 Found\r\nLocation: /other\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        assert_eq!(
            run_http(&get_action(same, "/"), same, "127.0.0.1", t).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".into())
        );
        // Another host's is not: a success with a warning.
        let away = server(vec![
            "HTTP/1.1 301 Moved\r\nLocation: http://example.invalid/\r\nContent-Length: 2\r\n\r\nhi",
        ])
        .await;
        assert_eq!(
            run_http(&get_action(away, "/"), away, "127.0.0.1", t).await,
            Outcome::Warning("Probe terminated redirects, Response body: hi".into())
        );
    }

    #[tokio::test]
    async fn lifecycle_hooks_ignore_the_status_and_fall_back_to_http() {
        let t = Duration::from_secs(2);
        let failing = server(vec!["HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"]).await;
        assert_eq!(
            lifecycle_http_get(&get_action(failing, "/"), failing, "127.0.0.1", t).await,
            Ok(None),
            "an answer is a success, whatever its status"
        );
        // HTTPS answered in plain HTTP: the same request again over HTTP.
        let plain = server(vec![
            "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let mut https = get_action(plain, "/hook");
        https.scheme = Some("HTTPS".into());
        assert_eq!(
            lifecycle_http_get(&https, plain, "127.0.0.1", t).await,
            Ok(Some(format!("127.0.0.1:{plain}")))
        );
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let e = lifecycle_http_get(&get_action(closed, "/x"), closed, "127.0.0.1", t)
            .await
            .expect_err("nothing listens");
        assert!(
            e.starts_with(&format!("Get \"http://127.0.0.1:{closed}/x\": dial tcp")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn tcp_connects_or_fails() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = TCPSocketAction {
            port: IntOrString::Int(i32::from(port)),
            ..Default::default()
        };
        assert_eq!(
            run_tcp(&t, port, "127.0.0.1", Duration::from_secs(1)).await,
            Outcome::Success
        );
        drop(l);
        assert!(matches!(
            run_tcp(&t, port, "127.0.0.1", Duration::from_secs(1)).await,
            Outcome::Failure(m) if m.starts_with(&format!("dial tcp 127.0.0.1:{port}: "))
        ));
    }

    struct Health;

    #[tonic::async_trait]
    impl health::health_server::Health for Health {
        async fn check(
            &self,
            req: tonic::Request<health::HealthCheckRequest>,
        ) -> Result<tonic::Response<health::HealthCheckResponse>, tonic::Status> {
            use health::health_check_response::ServingStatus;
            let status = match req.into_inner().service.as_str() {
                "" => ServingStatus::Serving,
                "sick" => ServingStatus::NotServing,
                _ => return Err(tonic::Status::not_found("unknown service")),
            };
            Ok(tonic::Response::new(health::HealthCheckResponse {
                status: status.into(),
            }))
        }
    }

    #[tokio::test]
    async fn grpc_health_check_serving_or_not() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health::health_server::HealthServer::new(Health))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
        );
        let t = Duration::from_secs(2);
        let action = |service: Option<&str>| GRPCAction {
            port: i32::from(port),
            service: service.map(str::to_string),
        };
        assert_eq!(
            run_grpc(&action(None), "127.0.0.1", t).await,
            Outcome::Success
        );
        assert_eq!(
            run_grpc(&action(Some("sick")), "127.0.0.1", t).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        assert!(matches!(
            run_grpc(&action(Some("other")), "127.0.0.1", t).await,
            Outcome::Failure(m) if m.starts_with("error: health rpc probe failed: ")
        ));
        let closed = GRPCAction {
            port: i32::from(free_port().await),
            service: None,
        };
        assert!(matches!(
            run_grpc(&closed, "127.0.0.1", t).await,
            Outcome::Failure(m) if m.starts_with("timeout: failed to connect service \"127.0.0.1:")
        ));
    }

    async fn free_port() -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        l.local_addr().expect("addr").port()
    }
}
