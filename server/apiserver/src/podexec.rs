//! `pods/exec`, `pods/attach` and `pods/portforward`: the streaming upgrade proxied to the
//! pod's kubelet (upstream `pkg/registry/core/pod/rest/subresources.go`, `ExecREST`,
//! `AttachREST`, `PortForwardREST`, with `ExecLocation` / `AttachLocation` /
//! `PortForwardLocation` of `pkg/registry/core/pod/strategy.go` and the upgrade-aware proxy
//! of `apimachinery/pkg/util/proxy`).
//!
//! The request is authorized twice: as its method's verb by the request path (`get` for a
//! WebSocket's GET, `create` for SPDY's POST), then as `create` on the subresource, since a
//! WebSocket upgrade starts a process just as SPDY's POST does (upstream's
//! `AuthorizePodWebsocketUpgradeCreatePermission`, on by default from Kubernetes 1.35; 1.32
//! checks only `get` for a WebSocket).
//! The pod must be bound and the container one of its own; then the kubelet's
//! `/exec/{namespace}/{pod}/{container}` (`/attach/...`, `/portForward/{namespace}/{pod}`) is
//! asked for the same upgrade, with kubectl's `stdin`/`stdout`/`stderr`/`tty` as the
//! kubelet's `input`/`output`/`error`/`tty` and port-forward's `ports` as `port`. Both kinds
//! of upgrade go through unchanged: a WebSocket (its key, version and sub-protocols) and a
//! SPDY/3.1 one (`POST`, its `X-Stream-Protocol-Version` offers; kubectl with
//! `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` or `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`,
//! older kubectl, client-go programs). The kubelet's `101` goes back to the client with its
//! handshake headers and the two connections are joined byte for byte; any other answer is
//! a `Status`. The apiserver never reads the streams: the protocols are the kubelet's and
//! the runtime's (see `skerry_node::streaming`).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use skerry_api::ApiError;
use skerry_api::catalogue;

use crate::auth::UserInfo;
use crate::handler::ApiServer;
use crate::podlogs::{
    KUBELET_RESPONSE_TIMEOUT, connect_kubelet, container_of, escape, kubelet_address, kubelet_error,
};
use crate::request::RequestInfo;
use crate::response::Body;
use crate::verbs::current;

/// Proxied streaming sessions open at once in this process; one more is a 429. An upgraded
/// connection leaves the server's connection cap once hyper hands it over, and each holds
/// two sockets and a copy task for as long as the exec lasts; kube-apiserver has no such cap
/// (its bound is the process's file limit). The kubelet caps its own sessions too.
pub const STREAMING_SESSIONS_MAX: usize = 2048;

pub(crate) static SESSIONS: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| Arc::new(tokio::sync::Semaphore::new(STREAMING_SESSIONS_MAX)));

/// The headers of a WebSocket handshake passed to the kubelet and back.
const HANDSHAKE_HEADERS: [header::HeaderName; 4] = [
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_PROTOCOL,
    header::SEC_WEBSOCKET_EXTENSIONS,
];

/// The header of a SPDY upgrade naming the stream protocols offered, and in the answer the
/// one chosen (`apimachinery/pkg/util/httpstream` `HeaderProtocolVersion`).
const STREAM_PROTOCOL_VERSION: header::HeaderName =
    header::HeaderName::from_static("x-stream-protocol-version");

/// A SPDY upgrade's token (`httpstream/spdy` `HeaderSpdy31`).
const SPDY_31: &str = "SPDY/3.1";

/// Which upgrade a streaming request asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Upgrade {
    WebSocket,
    Spdy,
}

/// Whether the request is one of the streaming subresources this module serves.
pub fn handles(info: &RequestInfo) -> bool {
    info.resource_request
        && info.group.is_empty()
        && info.resource == "pods"
        && matches!(
            info.subresource.as_deref(),
            Some("exec" | "attach" | "portforward")
        )
}

/// Serves one streaming request (already authorized for its own verb).
pub async fn serve(
    server: &Arc<ApiServer>,
    mut parts: http::request::Parts,
    info: &RequestInfo,
    user: &UserInfo,
) -> Result<Response<Body>, ApiError> {
    if info.verb != "create" {
        let create = RequestInfo {
            verb: "create".to_string(),
            ..info.clone()
        };
        server.authorize(&create, user)?;
    }
    let subresource = info.subresource.as_deref().unwrap_or("");
    let name = info
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("a name is required"))?;
    let namespace = info.namespace.as_deref().unwrap_or("");
    let query: Vec<(String, String)> =
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let param = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let pods = catalogue::lookup("", "v1", "pods").expect("pods are in the catalogue");
    let pod = current(server, pods, Some(namespace), name).await?;
    let pod = pod.value();
    let path = match subresource {
        "portforward" => {
            // `ports` (a list, each value possibly comma-separated, as the apiserver's
            // query conversion reads []int32) becomes the kubelet's `port`.
            let mut ports = Vec::new();
            for v in query.iter().filter(|(k, _)| k == "ports").map(|(_, v)| v) {
                for p in v.split(',') {
                    let port: i32 = p.trim().parse().map_err(|_| {
                        ApiError::bad_request(format!("invalid port {p:?}: ports must be numbers"))
                    })?;
                    ports.push(format!("port={port}"));
                }
            }
            let query = if ports.is_empty() {
                String::new()
            } else {
                format!("?{}", ports.join("&"))
            };
            format!("/portForward/{}/{}{query}", escape(namespace), escape(name))
        }
        _ => {
            let container = container_of(pod, name, param("container"))?;
            let flag = |k: &str| param(k).is_some_and(crate::request::parse_query_bool);
            let mut kubelet_query: Vec<String> = Vec::new();
            if subresource == "exec" {
                let command: Vec<&str> = query
                    .iter()
                    .filter(|(k, _)| k == "command")
                    .map(|(_, v)| v.as_str())
                    .collect();
                if command.is_empty() {
                    return Err(ApiError::bad_request("you must specify at least 1 command"));
                }
                kubelet_query.extend(command.iter().map(|c| format!("command={}", escape(c))));
            }
            for (ours, theirs) in [
                ("stdin", "input"),
                ("stdout", "output"),
                ("stderr", "error"),
                ("tty", "tty"),
            ] {
                if flag(ours) {
                    kubelet_query.push(format!("{theirs}=1"));
                }
            }
            if !["stdin", "stdout", "stderr"].iter().any(|k| flag(k)) {
                return Err(ApiError::bad_request(
                    "you must specify at least 1 of stdin, stdout, stderr",
                ));
            }
            let verb = if subresource == "exec" {
                "exec"
            } else {
                "attach"
            };
            format!(
                "/{verb}/{}/{}/{}?{}",
                escape(namespace),
                escape(name),
                escape(&container),
                kubelet_query.join("&")
            )
        }
    };
    let node_name = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let upgrade = if is_upgrade(&parts.headers, "websocket") {
        Upgrade::WebSocket
    } else if is_upgrade(&parts.headers, SPDY_31) {
        Upgrade::Spdy
    } else {
        return Err(ApiError::bad_request(
            "Upgrade request required: exec, attach and port-forward need a WebSocket or SPDY/3.1 upgrade",
        ));
    };
    let nodes = catalogue::lookup("", "v1", "nodes").expect("nodes are in the catalogue");
    let node = current(server, nodes, None, node_name).await?;
    let (host, port) = kubelet_address(node.value(), node_name)?;
    let Some(client) = &server.kubelet_client else {
        return Err(ApiError::service_unavailable(
            "this apiserver has no kubelet client configured",
        ));
    };
    let Some(client_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
        return Err(ApiError::bad_request("the connection cannot be upgraded"));
    };
    let Ok(permit) = SESSIONS.clone().try_acquire_owned() else {
        return Err(ApiError::too_many_requests(
            "too many streaming sessions, please try again later",
            1,
        ));
    };
    let (tls, target) = connect_kubelet(client, &host, port).await?;
    let unavailable = |e: String| ApiError::service_unavailable(e);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| unavailable(format!("kubelet {target}: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut request = match upgrade {
        Upgrade::WebSocket => http::Request::get(path).header(header::UPGRADE, "websocket"),
        Upgrade::Spdy => http::Request::post(path).header(header::UPGRADE, SPDY_31),
    }
    .header(header::HOST, target.as_str())
    .header(header::CONNECTION, "Upgrade");
    let passed: &[header::HeaderName] = match upgrade {
        Upgrade::WebSocket => &HANDSHAKE_HEADERS,
        Upgrade::Spdy => &[STREAM_PROTOCOL_VERSION],
    };
    for h in passed {
        for v in parts.headers.get_all(h) {
            request = request.header(h, v);
        }
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let response = tokio::time::timeout(KUBELET_RESPONSE_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| ApiError::timeout(format!("kubelet {target} did not answer"), 1))?
        .map_err(|e| unavailable(format!("kubelet {target}: {e}")))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(kubelet_error(response).await);
    }
    let mut answer = Response::new(crate::response::full(Bytes::new()));
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    copy_handshake(upgrade, response.headers(), answer.headers_mut());
    let kubelet_upgrade = hyper::upgrade::on(response);
    tokio::spawn(async move {
        let _permit = permit;
        let (client, kubelet) = match tokio::join!(client_upgrade, kubelet_upgrade) {
            (Ok(c), Ok(k)) => (c, k),
            (c, k) => {
                tracing::debug!(client = ?c.err(), kubelet = ?k.err(), "streaming upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut kubelet = TokioIo::new(kubelet);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await;
    });
    Ok(answer)
}

/// Whether the request asks to upgrade to `protocol` (`websocket`, `SPDY/3.1`).
fn is_upgrade(headers: &HeaderMap, protocol: &str) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case(protocol))
}

/// The kubelet's `101` headers the client needs.
fn copy_handshake(upgrade: Upgrade, from: &HeaderMap, to: &mut HeaderMap) {
    to.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    let names: &[header::HeaderName] = match upgrade {
        Upgrade::WebSocket => {
            to.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            &[
                header::SEC_WEBSOCKET_ACCEPT,
                header::SEC_WEBSOCKET_PROTOCOL,
                header::SEC_WEBSOCKET_EXTENSIONS,
            ]
        }
        Upgrade::Spdy => {
            to.insert(header::UPGRADE, HeaderValue::from_static(SPDY_31));
            &[STREAM_PROTOCOL_VERSION]
        }
    };
    for h in names {
        if let Some(v) = from.get(h) {
            to.insert(h, v.clone());
        }
    }
}
