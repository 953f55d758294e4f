//! `pods/exec`, `pods/attach` and `pods/portforward`: the WebSocket upgrade proxied to the
//! pod's kubelet (upstream `pkg/registry/core/pod/rest/subresources.go`, `ExecREST`,
//! `AttachREST`, `PortForwardREST`, with `ExecLocation` / `AttachLocation` /
//! `PortForwardLocation` of `pkg/registry/core/pod/strategy.go` and the upgrade-aware proxy
//! of `apimachinery/pkg/util/proxy`).
//!
//! The request is authorized twice: as its method's verb by the request path (`get` for a
//! WebSocket's GET), then as `create` on the subresource, since a WebSocket upgrade starts a
//! process just as SPDY's POST does (upstream's `AuthorizePodWebsocketUpgradeCreatePermission`,
//! on by default from Kubernetes 1.35; 1.32 checks only `get` for a WebSocket).
//! The pod must be bound and the container one of its own; then the kubelet's
//! `/exec/{namespace}/{pod}/{container}` (`/attach/...`, `/portForward/{namespace}/{pod}`) is
//! asked for the same upgrade, with kubectl's `stdin`/`stdout`/`stderr`/`tty` as the
//! kubelet's `input`/`output`/`error`/`tty`. Its `101` goes back to the client and the two
//! connections are joined byte for byte; any other answer is a `Status`. The apiserver
//! never reads the streams: the WebSocket protocols are the kubelet's (see
//! `skerry_node::streaming`).
//!
//! SPDY clients (`POST` with `Upgrade: SPDY/3.1`, kubectl's fallback when its WebSocket
//! attempt failed) get the same checks and then a 400: this server streams over WebSocket
//! only, and kubectl then shows the error its WebSocket attempt had.

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
        "portforward" => format!("/portForward/{}/{}", escape(namespace), escape(name)),
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
    if !is_websocket(&parts.headers) {
        return Err(ApiError::bad_request(
            "unable to upgrade connection: this server streams exec, attach and port-forward over WebSocket only",
        ));
    }
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
    let mut request = http::Request::get(path)
        .header(header::HOST, target.as_str())
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket");
    for h in &HANDSHAKE_HEADERS {
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
    copy_handshake(response.headers(), answer.headers_mut());
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

/// Whether the request asks for a WebSocket.
fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The kubelet's `101` headers the client needs.
fn copy_handshake(from: &HeaderMap, to: &mut HeaderMap) {
    to.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    to.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    for h in [
        header::SEC_WEBSOCKET_ACCEPT,
        header::SEC_WEBSOCKET_PROTOCOL,
        header::SEC_WEBSOCKET_EXTENSIONS,
    ] {
        if let Some(v) = from.get(&h) {
            to.insert(h, v.clone());
        }
    }
}
