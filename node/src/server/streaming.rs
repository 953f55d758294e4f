//! The kubelet's streaming paths (upstream `pkg/kubelet/server/server.go`, `getExec`,
//! `getAttach`, `getPortForward`): `/exec/{namespace}/{pod}/{container}?command=..`,
//! `/attach/{namespace}/{pod}/{container}` with `input`, `output`, `error`, `tty` (`1` for
//! on), and `/portForward/{namespace}/{pod}`. Each asks CRI for the runtime's streaming URL,
//! connects to it over SPDY before answering, and then serves the client's WebSocket
//! ([`crate::streaming`]).

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use k8s_openapi::api::core::v1::Pod;

use crate::cri::Cri;
use crate::cri::api;
use crate::kubelet::runtime;
use crate::streaming::bridge::{self, Forwarder, Streams};
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
        let Some(protocol) = self.websocket_protocol(&req, &[channel::V5, channel::V4]) else {
            return text(
                StatusCode::BAD_REQUEST,
                "unable to upgrade: a WebSocket with sub-protocol v5.channel.k8s.io or v4.channel.k8s.io is required",
            );
        };
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
        tokio::spawn(async move {
            let _permit = permit;
            match channel::upgraded(on).await {
                Ok(ws) => bridge::remote_command(ws, protocol, runtime_streams).await,
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
        let Some(protocol) = self.websocket_protocol(&req, &[channel::PORTFORWARD_TUNNEL]) else {
            return text(
                StatusCode::BAD_REQUEST,
                "unable to upgrade: a WebSocket with sub-protocol SPDY/3.1+portforward.k8s.io is required",
            );
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
        let Ok(permit) = self.sessions.clone().try_acquire_owned() else {
            return text(StatusCode::TOO_MANY_REQUESTS, "too many streaming sessions");
        };
        let response = match channel::accept(req.headers(), protocol) {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_REQUEST, &e),
        };
        let on = hyper::upgrade::on(req);
        let forwarder = Arc::new(SandboxPorts { cri, sandbox });
        tokio::spawn(async move {
            let _permit = permit;
            match channel::upgraded(on).await {
                Ok(ws) => bridge::port_forward(ws, forwarder).await,
                Err(e) => tracing::debug!(error = %e, "kubelet: streaming upgrade failed"),
            }
        });
        response.map(|()| full(bytes::Bytes::new()))
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
}
