//! The kubelet's streaming paths (upstream `pkg/kubelet/server/server.go`, `getExec`,
//! `getAttach`, `getPortForward`): `/exec/{namespace}/{pod}/{container}?command=..`,
//! `/attach/{namespace}/{pod}/{container}` with `input`, `output`, `error`, `tty` (`1` for
//! on), and `/portForward/{namespace}/{pod}` (with `port=` for WebSocket clients). Each asks
//! CRI for the runtime's streaming URL, then serves the client by its kind:
//!
//! - a WebSocket (`v5.channel.k8s.io` / `v4.channel.k8s.io` remote commands, the
//!   `SPDY/3.1+portforward.k8s.io` tunnel, `v4.channel.k8s.io` port-forward channels) is
//!   bridged to a SPDY session with the runtime, connected before answering
//!   ([`crate::streaming::bridge`]);
//! - a SPDY upgrade is passed through to the runtime's URL as upstream's `proxyStream`
//!   does ([`crate::streaming::proxy`]): the runtime speaks it itself.
//!
//! Every session is closed after `--streaming-connection-idle-timeout` without traffic
//! ([`crate::streaming::idle`]).

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use k8s_openapi::api::core::v1::Pod;

use crate::cri::Cri;
use crate::cri::api;
use crate::kubelet::runtime;
use crate::streaming::bridge::{self, Forwarder, Streams};
use crate::streaming::idle::Idle;
use crate::streaming::proxy::{self, Answer};
use crate::streaming::{channel, runtime as runtime_stream};

use super::{Body, KubeletServer, decode, full, text};

/// Whether exec attaches to a new process or the container's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/exec`: a new process.
    Exec,
    /// `/attach`: the container's main process.
    Attach,
}

/// The streams and command of a query (upstream `remotecommand.NewOptions`: a flag is on
/// when it is `1`).
fn options(query: Option<&str>) -> (Vec<String>, Streams) {
    let mut command = Vec::new();
    let mut streams = Streams::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let on = decode(v) == "1";
        match decode(k).as_str() {
            "command" => command.push(decode(v)),
            "input" => streams.stdin = on,
            "output" => streams.stdout = on,
            "error" => streams.stderr = on,
            "tty" => streams.tty = on,
            _ => {}
        }
    }
    // A terminal has no separate stderr (upstream bypasses it with a tty).
    if streams.tty {
        streams.stderr = false;
    }
    (command, streams)
}

impl KubeletServer {
    fn find_pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.kubelet.pods().into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
    }

    /// `/exec/...` and `/attach/...`.
    pub(super) async fn remote_command(
        &self,
        req: Request<Incoming>,
        kind: Kind,
        namespace: &str,
        name: &str,
        container: &str,
    ) -> Response<Body> {
        let (command, streams) = options(req.uri().query());
        if !streams.stdin && !streams.stdout && !streams.stderr {
            return text(
                StatusCode::BAD_REQUEST,
                "you must specify at least 1 of stdin, stdout, stderr",
            );
        }
        if kind == Kind::Exec && command.is_empty() {
            return text(StatusCode::BAD_REQUEST, "you must specify a command");
        }
        let spdy = proxy::is_spdy(req.headers());
        let protocol = self.websocket_protocol(&req, &[channel::V5, channel::V4]);
        if !spdy && protocol.is_none() {
            return text(
                StatusCode::BAD_REQUEST,
                "unable to upgrade: a SPDY/3.1 upgrade or a WebSocket with sub-protocol v5.channel.k8s.io or v4.channel.k8s.io is required",
            );
        }
        let Some(pod) = self.find_pod(namespace, name) else {
            return text(StatusCode::NOT_FOUND, "pod does not exist");
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let cri = self.kubelet.cri();
        let running = match runtime::pod_status(cri, &uid).await {
            Ok(p) => p
                .latest(container)
                .filter(|c| c.running())
                .map(|c| c.id.clone()),
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        let Some(id) = running else {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("container not found ({container:?})"),
            );
        };
        let url = match kind {
            Kind::Exec => {
                cri.exec(api::ExecRequest {
                    container_id: id,
                    cmd: command,
                    tty: streams.tty,
                    stdin: streams.stdin,
                    stdout: streams.stdout,
                    stderr: streams.stderr,
                })
                .await
            }
            Kind::Attach => {
                cri.attach(api::AttachRequest {
                    container_id: id,
                    stdin: streams.stdin,
                    tty: streams.tty,
                    stdout: streams.stdout,
                    stderr: streams.stderr,
                })
                .await
            }
        };
        let url = match url {
            Ok(u) => u,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        let Some(protocol) = protocol.filter(|_| !spdy) else {
            return self.pass_through(req, &url).await;
        };
        let session = match runtime_stream::connect(&url, runtime_stream::REMOTECOMMAND_V4).await {
            Ok(s) => s,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        let runtime_streams = match bridge::open_streams(session, streams).await {
            Ok(s) => s,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        let Ok(permit) = self.sessions.clone().try_acquire_owned() else {
            return text(StatusCode::TOO_MANY_REQUESTS, "too many streaming sessions");
        };
        let response = match channel::accept(req.headers(), protocol) {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_REQUEST, &e),
        };
        let on = hyper::upgrade::on(req);
        let idle = self.idle();
        tokio::spawn(async move {
            let _permit = permit;
            match channel::upgraded(on, idle.clone()).await {
                Ok(ws) => bridge::remote_command(ws, protocol, runtime_streams, idle).await,
                Err(e) => tracing::debug!(error = %e, "kubelet: streaming upgrade failed"),
            }
        });
        response.map(|()| full(bytes::Bytes::new()))
    }

    /// `/portForward/{namespace}/{pod}`.
    pub(super) async fn port_forward(
        &self,
        req: Request<Incoming>,
        namespace: &str,
        name: &str,
    ) -> Response<Body> {
        let spdy = proxy::is_spdy(req.headers());
        let protocol = if channel::is_websocket(req.headers())
            && req
                .headers()
                .get(http::header::SEC_WEBSOCKET_PROTOCOL)
                .is_none()
        {
            // No sub-protocol: upstream's `""` entry, the channel protocol.
            Some("")
        } else {
            self.websocket_protocol(
                &req,
                &[channel::PORTFORWARD_TUNNEL, channel::PORTFORWARD_V4],
            )
        };
        if !spdy && protocol.is_none() {
            return text(
                StatusCode::BAD_REQUEST,
                "unable to upgrade: a SPDY/3.1 upgrade or a WebSocket with sub-protocol SPDY/3.1+portforward.k8s.io or v4.channel.k8s.io is required",
            );
        }
        // The WebSocket channel protocol names its ports up front (upstream `NewV4Options`).
        let channel_ports = match protocol {
            Some(p) if !spdy && p != channel::PORTFORWARD_TUNNEL => {
                match ports(req.uri().query()) {
                    Ok(p) => Some(p),
                    Err(e) => return text(StatusCode::BAD_REQUEST, &e),
                }
            }
            _ => None,
        };
        let Some(pod) = self.find_pod(namespace, name) else {
            return text(StatusCode::NOT_FOUND, "pod does not exist");
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let cri = self.kubelet.cri().clone();
        let sandbox = match runtime::pod_status(&cri, &uid).await {
            Ok(p) => p.sandboxes.iter().find(|s| s.ready).map(|s| s.id.clone()),
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        let Some(sandbox) = sandbox else {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("pod {name:?} has no running sandbox"),
            );
        };
        let Some(protocol) = protocol.filter(|_| !spdy) else {
            // The runtime reads the ports from the client's streams' headers.
            let url = match cri.port_forward(&sandbox, Vec::new()).await {
                Ok(u) => u,
                Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            };
            return self.pass_through(req, &url).await;
        };
        let Ok(permit) = self.sessions.clone().try_acquire_owned() else {
            return text(StatusCode::TOO_MANY_REQUESTS, "too many streaming sessions");
        };
        let response = match channel::accept(req.headers(), protocol) {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_REQUEST, &e),
        };
        let on = hyper::upgrade::on(req);
        let forwarder = Arc::new(SandboxPorts { cri, sandbox });
        let idle = self.idle();
        tokio::spawn(async move {
            let _permit = permit;
            match (channel::upgraded(on, idle.clone()).await, channel_ports) {
                (Ok(ws), None) => bridge::port_forward(ws, forwarder, idle).await,
                (Ok(ws), Some(ports)) => {
                    bridge::port_forward_channels(ws, forwarder, ports, idle).await;
                }
                (Err(e), _) => tracing::debug!(error = %e, "kubelet: streaming upgrade failed"),
            }
        });
        response.map(|()| full(bytes::Bytes::new()))
    }

    /// A new session's idle clock (`--streaming-connection-idle-timeout`).
    fn idle(&self) -> Arc<Idle> {
        Idle::new(self.kubelet.config().streaming_connection_idle_timeout)
    }

    /// A SPDY client's upgrade forwarded to the runtime's `url`; the runtime's answer goes
    /// back, and on a `101` the connections are joined.
    async fn pass_through(&self, req: Request<Incoming>, url: &str) -> Response<Body> {
        let Ok(permit) = self.sessions.clone().try_acquire_owned() else {
            return text(StatusCode::TOO_MANY_REQUESTS, "too many streaming sessions");
        };
        let (headers, runtime) = match proxy::forward(url, req.headers()).await {
            Ok(Answer::Switched(h, io)) => (h, io),
            Ok(Answer::Refused(status, content_type, body)) => {
                let mut r = Response::new(full(body));
                *r.status_mut() = status;
                if let Some(t) = content_type {
                    r.headers_mut().insert(http::header::CONTENT_TYPE, t);
                }
                return r;
            }
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        let on = hyper::upgrade::on(req);
        let idle = self.idle();
        tokio::spawn(async move {
            let _permit = permit;
            proxy::join(on, runtime, idle).await;
        });
        proxy::switching::<()>(headers).map(|()| full(bytes::Bytes::new()))
    }

    fn websocket_protocol(
        &self,
        req: &Request<Incoming>,
        supported: &[&'static str],
    ) -> Option<&'static str> {
        if !channel::is_websocket(req.headers()) {
            return None;
        }
        channel::negotiate(req.headers(), supported)
    }
}

/// The `port` parameters of a WebSocket port-forward, each a port or a comma-separated
/// list (upstream `portforward.NewV4Options`, with its messages).
fn ports(query: Option<&str>) -> Result<Vec<u16>, String> {
    let values: Vec<String> = query
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('=').or(Some((p, ""))))
        .filter(|(k, _)| decode(k) == "port")
        .map(|(_, v)| decode(v))
        .collect();
    if values.is_empty() {
        return Err("query parameter \"port\" is required".to_string());
    }
    let mut out = Vec::new();
    for value in &values {
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".to_string());
        }
        for p in value.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|e| format!("unable to parse {value:?} as a port: {e}"))?;
            if port < 1 {
                return Err(format!("port {value:?} must be > 0"));
            }
            out.push(port);
        }
    }
    Ok(out)
}

/// A sandbox's ports through CRI: a fresh URL per forwarded connection.
struct SandboxPorts {
    cri: Cri,
    sandbox: String,
}

impl Forwarder for SandboxPorts {
    async fn url(&self, port: u16) -> Result<String, String> {
        self.cri
            .port_forward(&self.sandbox, vec![i32::from(port)])
            .await
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_the_command_and_the_streams() {
        let (command, streams) = options(Some(
            "command=sh&command=-c&command=echo%20hi&input=1&output=1&error=1",
        ));
        assert_eq!(command, ["sh", "-c", "echo hi"]);
        assert_eq!(
            streams,
            Streams {
                stdin: true,
                stdout: true,
                stderr: true,
                tty: false
            }
        );
        let (_, tty) = options(Some("output=1&error=1&tty=1&input=0"));
        assert!(tty.tty && tty.stdout && !tty.stderr && !tty.stdin);
    }

    #[test]
    fn websocket_port_forward_ports_are_upstreams_v4_options() {
        assert_eq!(
            ports(Some("port=80&port=8080,9090")).unwrap(),
            [80, 8080, 9090]
        );
        assert_eq!(
            ports(Some("x=1")).unwrap_err(),
            "query parameter \"port\" is required"
        );
        assert_eq!(
            ports(Some("port=")).unwrap_err(),
            "query parameter \"port\" cannot be empty"
        );
        assert_eq!(ports(Some("port=0")).unwrap_err(), "port \"0\" must be > 0");
        assert!(
            ports(Some("port=70000"))
                .unwrap_err()
                .starts_with("unable to parse \"70000\" as a port")
        );
    }
}
