//! `pods/log`: kube-apiserver's `LogREST` (`pkg/registry/core/pod/rest/log.go`,
//! `pod.LogLocation` in `pkg/registry/core/pod/strategy.go`). The `PodLogOptions` of the query
//! are validated, the container chosen (required when the pod has more than one), the node
//! found with its address (`status.addresses` in `--kubelet-preferred-address-types` order,
//! InternalIP first) and its kubelet port (`status.daemonEndpoints.kubeletEndpoint.Port`),
//! and the kubelet's `/containerLogs/{namespace}/{pod}/{container}` answer is streamed
//! through as it comes, so `kubectl logs -f` follows.
//!
//! The apiserver calls the kubelet with its own client certificate
//! (`apiserver-kubelet-client` in `system:masters`, as kubeadm issues it) and checks the
//! kubelet's serving certificate against the cluster CA.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde_json::Value;
use skerry_api::ApiError;
use skerry_api::catalogue::{self, ResourceInfo};
use tokio_rustls::TlsConnector;

use crate::handler::{ApiServer, Request};
use crate::response::Body;
use crate::verbs::{current, name_of};

/// The order in which a node's addresses are tried (kube-apiserver's
/// `--kubelet-preferred-address-types` default, `pkg/controlplane/apiserver/options`).
pub const PREFERRED_ADDRESS_TYPES: [&str; 3] = ["InternalIP", "ExternalIP", "Hostname"];

/// The kubelet's port when the Node does not say (`ports.KubeletPort`).
pub const DEFAULT_KUBELET_PORT: i64 = 10250;

/// Time to connect to a kubelet and finish TLS (kube-apiserver's kubelet client dials with a
/// 30 s timeout, `pkg/kubelet/client` `MakeTransport` over `utilnet.SetTransportDefaults`'s
/// dialer; its TLS handshake timeout is 10 s).
pub const KUBELET_DIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Time for the kubelet's TLS handshake (Go's `http.DefaultTransport` `TLSHandshakeTimeout`).
pub const KUBELET_TLS_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for the kubelet's response head; a follow's body then flows as long as it lasts.
pub const KUBELET_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of a kubelet's error body read into the Status message.
const ERROR_BODY_MAX: usize = 64 * 1024;

/// The kubelet client: how the apiserver reaches kubelets.
#[derive(Clone)]
pub struct KubeletClient {
    /// TLS with the apiserver's kubelet-client certificate, trusting the cluster CA.
    pub tls: Arc<rustls::ClientConfig>,
}

/// `GET .../pods/{name}/log`.
pub async fn get(
    server: &ApiServer,
    resource: &ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let namespace = req.info.namespace.as_deref();
    let query = validate(req)?;
    let pod = current(server, resource, namespace, name).await?;
    let pod = pod.value();
    let container = container_of(pod, name, req.param("container"))?;
    let node_name = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if node_name.is_empty() {
        // A pod not yet scheduled has no log: an empty answer, as upstream's nil location.
        return Ok(text_response(200, Bytes::new()));
    }
    let nodes = catalogue::lookup("", "v1", "nodes").expect("nodes are in the catalogue");
    let node = current(server, nodes, None, node_name).await?;
    let (host, port) = kubelet_address(node.value(), node_name)?;
    let Some(client) = &server.kubelet_client else {
        return Err(ApiError::service_unavailable(
            "this apiserver has no kubelet client configured",
        ));
    };
    let path = format!(
        "/containerLogs/{}/{}/{}?{}",
        escape(namespace.unwrap_or("")),
        escape(name),
        escape(&container),
        query
    );
    proxy(client, &host, port, &path).await
}

/// The query forwarded to the kubelet, after upstream's `ValidatePodLogOptions`.
fn validate(req: &Request) -> Result<String, ApiError> {
    let int = |field: &str| -> Result<Option<i64>, ApiError> {
        req.param(field)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "{field}: Invalid value: \"{v}\": must be an integer"
                    ))
                })
            })
            .transpose()
    };
    let invalid = |field: &str, value: i64, detail: &str| {
        ApiError::invalid(
            "",
            "PodLogOptions",
            "",
            vec![skerry_api::Cause::invalid(
                field,
                &value.to_string(),
                detail,
            )],
        )
    };
    let mut out: Vec<String> = Vec::new();
    if let Some(t) = int("tailLines")? {
        if t < 0 {
            return Err(invalid(
                "tailLines",
                t,
                "must be greater than or equal to 0",
            ));
        }
        out.push(format!("tailLines={t}"));
    }
    if let Some(l) = int("limitBytes")? {
        if l < 1 {
            return Err(invalid("limitBytes", l, "must be greater than 0"));
        }
        out.push(format!("limitBytes={l}"));
    }
    let since_seconds = int("sinceSeconds")?;
    let since_time = req.param("sinceTime");
    if since_seconds.is_some() && since_time.is_some() {
        return Err(ApiError::invalid(
            "",
            "PodLogOptions",
            "",
            vec![skerry_api::Cause::new(
                "FieldValueForbidden",
                "",
                "at most one of `sinceTime` or `sinceSeconds` may be specified",
            )],
        ));
    }
    if let Some(s) = since_seconds {
        if s < 1 {
            return Err(invalid("sinceSeconds", s, "must be greater than 0"));
        }
        out.push(format!("sinceSeconds={s}"));
    }
    if let Some(t) = since_time {
        let parsed: jiff::Timestamp = t.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "sinceTime: Invalid value: \"{t}\": not an RFC 3339 time"
            ))
        })?;
        out.push(format!("sinceTime={}", escape(&parsed.to_string())));
    }
    for flag in ["follow", "previous", "timestamps"] {
        if req.bool_param(flag) == Some(true) {
            out.push(format!("{flag}=true"));
        }
    }
    Ok(out.join("&"))
}

/// The container whose log is asked for (upstream `LogLocation`).
pub(crate) fn container_of(
    pod: &Value,
    name: &str,
    asked: Option<&str>,
) -> Result<String, ApiError> {
    let names = |field: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{field}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    let init = names("initContainers");
    let ephemeral = names("ephemeralContainers");
    match asked.filter(|c| !c.is_empty()) {
        Some(c) => {
            if containers
                .iter()
                .chain(&init)
                .chain(&ephemeral)
                .any(|n| n == c)
            {
                Ok(c.to_string())
            } else {
                Err(ApiError::bad_request(format!(
                    "container {c} is not valid for pod {name}"
                )))
            }
        }
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None if containers.is_empty() => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}"
        ))),
        None => {
            let mut message = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !init.is_empty() {
                message.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init.join(" ")
                ));
            }
            if !ephemeral.is_empty() {
                message.push_str(&format!(
                    " or one of the ephemeral containers: [{}]",
                    ephemeral.join(" ")
                ));
            }
            Err(ApiError::bad_request(message))
        }
    }
}

/// The node's kubelet address and port (upstream `NodeConnectionInfoGetter`).
pub(crate) fn kubelet_address(node: &Value, node_name: &str) -> Result<(String, u16), ApiError> {
    let addresses = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let host = PREFERRED_ADDRESS_TYPES
        .iter()
        .find_map(|kind| {
            addresses.iter().find_map(|a| {
                (a["type"].as_str() == Some(kind))
                    .then(|| a["address"].as_str())
                    .flatten()
                    .filter(|s| !s.is_empty())
            })
        })
        .ok_or_else(|| {
            ApiError::internal(format!(
                "no preferred addresses found; known addresses: {}",
                serde_json::to_string(&addresses).unwrap_or_default()
            ))
        })?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_i64)
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    let port = u16::try_from(port).map_err(|_| {
        ApiError::internal(format!(
            "node {node_name} has an invalid kubelet port {port}"
        ))
    })?;
    Ok((host.to_string(), port))
}

/// Connects to the kubelet at `host:port` and finishes TLS with the apiserver's
/// kubelet-client certificate; the errors are 503s naming the kubelet, as upstream's proxy
/// transport's. Also the address as `host:port` for the `Host` header and messages.
pub(crate) async fn connect_kubelet(
    client: &KubeletClient,
    host: &str,
    port: u16,
) -> Result<
    (
        tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
        String,
    ),
    ApiError,
> {
    let unavailable = |e: String| ApiError::service_unavailable(e);
    let target = format!("{}:{port}", bracket(host));
    let stream = tokio::time::timeout(
        KUBELET_DIAL_TIMEOUT,
        tokio::net::TcpStream::connect(&target),
    )
    .await
    .map_err(|_| unavailable(format!("dial tcp {target}: i/o timeout")))?
    .map_err(|e| unavailable(format!("dial tcp {target}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| unavailable(format!("kubelet address {host}: {e}")))?;
    let connector = TlsConnector::from(client.tls.clone());
    let tls = skerry_tls::accept::connect_tls(&connector, name, stream, KUBELET_TLS_TIMEOUT)
        .await
        .map_err(|e| unavailable(format!("kubelet {target}: {e}")))?;
    Ok((tls, target))
}

/// A kubelet's error answer as a Status with its code and text (upstream
/// `genericrest.NewGenericHttpResponseChecker`).
pub(crate) async fn kubelet_error(response: http::Response<hyper::body::Incoming>) -> ApiError {
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), ERROR_BODY_MAX)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let message = String::from_utf8_lossy(&body).trim().to_string();
    let reason = match status {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        429 => "TooManyRequests",
        _ => "InternalError",
    };
    ApiError::new(status, reason, message)
}

/// Calls the kubelet and streams its answer through; its errors become Statuses with its
/// code and text (upstream `LocationStreamer` with `genericrest.NewGenericHttpResponseChecker`).
async fn proxy(
    client: &KubeletClient,
    host: &str,
    port: u16,
    path: &str,
) -> Result<Response<Body>, ApiError> {
    let unavailable = |e: String| ApiError::service_unavailable(e);
    let (tls, target) = connect_kubelet(client, host, port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| unavailable(format!("kubelet {target}: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = http::Request::get(path)
        .header(http::header::HOST, target.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let response = tokio::time::timeout(KUBELET_RESPONSE_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| ApiError::timeout(format!("kubelet {target} did not answer"), 1))?
        .map_err(|e| unavailable(format!("kubelet {target}: {e}")))?;
    if !response.status().is_success() {
        return Err(kubelet_error(response).await);
    }
    // The body as it arrives; a transport error ends the stream (the client sees a short
    // read, as with upstream's `io.Copy` cut short).
    let body = response.into_body().map_err(|_| ()).into_data_stream();
    let stream = futures::StreamExt::filter_map(body, |r| async move {
        r.ok()
            .map(|b| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b)))
    });
    let mut r = Response::new(http_body_util::StreamBody::new(stream).boxed_unsync());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    Ok(r)
}

fn text_response(code: u16, body: Bytes) -> Response<Body> {
    let mut r = Response::new(crate::response::full(body));
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

/// An IPv6 address in brackets for `host:port`.
fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Percent-encodes what is not unreserved in a path segment or query value.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_container_is_required_when_the_pod_has_more_than_one() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}],
                                   "initContainers": [{"name": "i"}]}});
        let e = container_of(&pod, "x", None).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "a container name must be specified for pod x, choose one of: [a b] or one of the init containers: [i]"
        );
        assert_eq!(container_of(&pod, "x", Some("i")).unwrap(), "i");
        assert_eq!(
            container_of(&pod, "x", Some("z")).unwrap_err().message,
            "container z is not valid for pod x"
        );
        let one = json!({"spec": {"containers": [{"name": "only"}]}});
        assert_eq!(container_of(&one, "x", None).unwrap(), "only");
    }

    #[test]
    fn the_kubelet_is_reached_at_the_preferred_address_and_its_port() {
        let node = json!({"status": {
            "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.5"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 12345}}}});
        assert_eq!(
            kubelet_address(&node, "n1").unwrap(),
            ("10.0.0.5".to_string(), 12345)
        );
        let bare = json!({"status": {"addresses": [{"type": "Hostname", "address": "n1"}]}});
        assert_eq!(
            kubelet_address(&bare, "n1").unwrap(),
            ("n1".to_string(), 10250)
        );
        assert_eq!(kubelet_address(&json!({}), "n1").unwrap_err().code, 500);
    }
}
