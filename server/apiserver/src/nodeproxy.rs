//! `nodes/proxy`: any request to `/api/v1/nodes/{name}/proxy[/{path...}]` passed to the
//! node's kubelet and its answer passed back (upstream `pkg/registry/core/node/rest/proxy.go`,
//! `ProxyREST`, with `node.ResourceLocation` of `pkg/registry/core/node/strategy.go` and the
//! upgrade-aware proxy of `k8s.io/apimachinery/pkg/util/proxy`, `upgradeaware.go` and
//! `transport.go`).
//!
//! The name may be `{node}`, `{node}:{port}` or `{scheme}:{node}:{port}`
//! (`utilnet.SplitSchemeNamePort`). Without a port, or with the kubelet's own, the kubelet is
//! reached as `pods/log` reaches it ([`crate::podlogs`]: the node's preferred address and
//! `daemonEndpoints` port, TLS with the apiserver's kubelet-client certificate, the
//! kubelet's certificate checked against the cluster CA); another port is reached as
//! upstream's proxy transport reaches it, plain HTTP, or HTTPS without a client certificate
//! and without checking the server's (`CreateProxyTransport`'s `InsecureSkipVerify`). As
//! upstream, the node's address must be a global unicast one (`IsProxyableHostname`: a
//! loopback or link-local node address is refused 400 `address not allowed`).
//!
//! The trick carried here is that nothing is buffered: the client's body is the kubelet
//! request's body and the kubelet's body the client's, frame by frame, so a
//! `containerLogs/...?follow=true` streams; and a request asking for an upgrade (WebSocket,
//! SPDY) gets the kubelet's `101` and then the two connections joined byte for byte, as
//! [`crate::podexec`] joins them. The path after `proxy` is decoded and cleaned
//! (`path.Join`: no `..` escapes it) and the query kept as sent. Hop-by-hop headers
//! (RFC 9110 §7.6.1, Go's `httputil.ReverseProxy` list, and those `Connection` names) are
//! dropped both ways, except `Connection`/`Upgrade` on an upgrade; the client's credentials
//! (`Authorization`, the `Impersonate-*` headers, which kube-apiserver's filters delete once
//! read) never reach the kubelet, which sees only the apiserver's certificate.
//!
//! Errors: an unknown node is 404 NotFound; a kubelet that cannot be reached 503
//! `error trying to reach service: ...` (upstream `proxy.Transport.RoundTrip`); the kubelet's
//! own answers, errors included, pass through unchanged. Upstream's rewriting of links in
//! HTML answers (`proxy.Transport` for `text/html`) is not done: the kubelet serves none.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use skerry_api::ApiError;
use skerry_api::catalogue;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsConnector;

use crate::handler::ApiServer;
use crate::podlogs::{
    KUBELET_DIAL_TIMEOUT, KUBELET_RESPONSE_TIMEOUT, KUBELET_TLS_TIMEOUT, KubeletClient,
    connect_kubelet, kubelet_address,
};
use crate::request::RequestInfo;
use crate::response::Body;
use crate::verbs::current;

/// The prefix of a proxy's transport error (upstream `proxy.Transport.RoundTrip` wraps every
/// round-trip failure as a 503 with it).
const UNREACHABLE_PREFIX: &str = "error trying to reach service: ";

/// Hop-by-hop headers, never forwarded (Go's `httputil.ReverseProxy` `hopHeaders`).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The request headers that carry the client's identity, read by the apiserver and removed
/// before proxying (kube-apiserver's `WithAuthentication` deletes `Authorization`,
/// `WithImpersonation` the `Impersonate-*` headers).
fn is_credential(name: &HeaderName) -> bool {
    name == header::AUTHORIZATION || name.as_str().starts_with("impersonate-")
}

/// Whether the request is one this module serves.
pub fn handles(info: &RequestInfo) -> bool {
    info.resource_request
        && info.group.is_empty()
        && info.resource == "nodes"
        && info.namespace.is_none()
        && info.subresource.as_deref() == Some("proxy")
}

/// `utilnet.SplitSchemeNamePort`: `name`, `name:port` or `scheme:name:port`, the scheme
/// `http`, `https` or empty; `None` when the id is none of these.
pub fn split_scheme_name_port(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    (!name.is_empty() && matches!(scheme, "" | "http" | "https")).then_some((scheme, name, port))
}

/// Go's `net.IP.IsGlobalUnicast`, upstream's test of a proxyable address (`isProxyableIP`).
pub fn is_proxyable(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_broadcast())
        }
        std::net::IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_proxyable(std::net::IpAddr::V4(v4));
            }
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// `proxyutil.IsProxyableHostname`: every address the host resolves to must be proxyable.
async fn check_proxyable(host: &str) -> Result<(), ApiError> {
    let not_allowed = || ApiError::bad_request("address not allowed");
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return if is_proxyable(ip) {
            Ok(())
        } else {
            Err(not_allowed())
        };
    }
    let resolved: Vec<std::net::SocketAddr> =
        tokio::time::timeout(KUBELET_DIAL_TIMEOUT, tokio::net::lookup_host((host, 0)))
            .await
            .map_err(|_| ApiError::bad_request(format!("lookup {host}: i/o timeout")))?
            .map_err(|e| ApiError::bad_request(format!("lookup {host}: {e}")))?
            .collect();
    if resolved.is_empty() {
        return Err(ApiError::bad_request("no addresses for hostname"));
    }
    if resolved.iter().all(|a| is_proxyable(a.ip())) {
        Ok(())
    } else {
        Err(not_allowed())
    }
}

/// The path the kubelet is asked for: what follows `proxy` in the request's path, decoded and
/// cleaned as Go's `path.Join` cleans it, a trailing slash kept
/// (`JoinPreservingTrailingSlash`), each segment escaped again. `/` when nothing follows.
pub fn kubelet_path(request_path: &str) -> String {
    let segments: Vec<&str> = request_path.trim_start_matches('/').split('/').collect();
    // api/v1/nodes/{name}/proxy/...
    let rest = segments.get(5..).unwrap_or(&[]);
    let decoded: Vec<String> = rest
        .iter()
        .map(|s| percent_decode(s))
        .collect::<Vec<_>>()
        .join("/")
        .split('/')
        .map(str::to_string)
        .collect();
    let mut clean: Vec<&str> = Vec::new();
    for segment in &decoded {
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                clean.pop();
            }
            s => clean.push(s),
        }
    }
    let mut out = String::from("/");
    out.push_str(
        &clean
            .iter()
            .map(|s| escape_segment(s))
            .collect::<Vec<_>>()
            .join("/"),
    );
    if !clean.is_empty() && request_path.ends_with('/') {
        out.push('/');
    }
    out
}

/// Decodes `%XX` escapes (invalid ones are kept as written).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Escapes a path segment as Go's `url.PathEscape` does for a path (RFC 3986 `pchar` kept).
fn escape_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
            )
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The headers `from` minus hop-by-hop ones (and those its `Connection` names) and, for a
/// request, the client's credentials.
fn forwarded_headers(from: &HeaderMap, request: bool) -> HeaderMap {
    let named: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let mut out = HeaderMap::new();
    for (name, value) in from {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n)
            || named.iter().any(|t| t == n)
            || name == header::HOST
            || (request && is_credential(name))
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// Whether the request asks for a protocol upgrade (`httpstream.IsUpgradeRequest`: a
/// `Connection` header naming `upgrade`).
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        && headers.contains_key(header::UPGRADE)
}

/// A connection to the kubelet (or to another port of the node), TLS or plain.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Opens the connection upstream's `ResourceLocation` chooses: the kubelet's port with the
/// kubelet client, another port with the proxy transport. Returns it with `host:port`.
async fn connect(
    client: &KubeletClient,
    host: &str,
    kubelet_port: u16,
    scheme: &str,
    port: &str,
) -> Result<(Box<dyn Io>, String), ApiError> {
    let unreachable = |e: String| ApiError::service_unavailable(format!("{UNREACHABLE_PREFIX}{e}"));
    if port.is_empty() || port == kubelet_port.to_string() {
        let (tls, target) = connect_kubelet(client, host, kubelet_port)
            .await
            .map_err(|e| unreachable(e.message))?;
        return Ok((Box::new(tls), target));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid port {port:?}")))?;
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let stream = tokio::time::timeout(
        KUBELET_DIAL_TIMEOUT,
        tokio::net::TcpStream::connect(&target),
    )
    .await
    .map_err(|_| unreachable(format!("dial tcp {target}: i/o timeout")))?
    .map_err(|e| unreachable(format!("dial tcp {target}: {e}")))?;
    let _ = stream.set_nodelay(true);
    if scheme != "https" {
        return Ok((Box::new(stream), target));
    }
    let config = skerry_tls::config::insecure_client_config(None, &[b"http/1.1"])
        .map_err(|e| ApiError::internal(format!("proxy TLS configuration: {e}")))?;
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| unreachable(format!("address {host}: {e}")))?;
    let tls = skerry_tls::accept::connect_tls(
        &TlsConnector::from(Arc::new(config)),
        name,
        stream,
        KUBELET_TLS_TIMEOUT,
    )
    .await
    .map_err(|e| unreachable(format!("{target}: {e}")))?;
    Ok((Box::new(tls), target))
}

/// Serves one `nodes/proxy` request (already authorized as `nodes/proxy` with its verb).
pub async fn serve(
    server: &Arc<ApiServer>,
    mut parts: http::request::Parts,
    body: Incoming,
    info: &RequestInfo,
) -> Result<Response<Body>, ApiError> {
    let id = info
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("a name is required"))?;
    let (scheme, node_name, port) = split_scheme_name_port(id)
        .ok_or_else(|| ApiError::bad_request(format!("invalid node request {id:?}")))?;
    let nodes = catalogue::lookup("", "v1", "nodes").expect("nodes are in the catalogue");
    let node = current(server, nodes, None, node_name).await?;
    let (host, kubelet_port) = kubelet_address(node.value(), node_name)?;
    check_proxyable(&host).await?;
    let Some(client) = &server.kubelet_client else {
        return Err(ApiError::service_unavailable(
            "this apiserver has no kubelet client configured",
        ));
    };
    let mut target_uri = kubelet_path(parts.uri.path());
    if let Some(q) = parts.uri.query() {
        target_uri.push('?');
        target_uri.push_str(q);
    }
    let upgrade = is_upgrade(&parts.headers);
    let client_upgrade = if upgrade {
        let Some(on) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return Err(ApiError::bad_request("the connection cannot be upgraded"));
        };
        let Ok(permit) = crate::podexec::SESSIONS.clone().try_acquire_owned() else {
            return Err(ApiError::too_many_requests(
                "too many streaming sessions, please try again later",
                1,
            ));
        };
        Some((on, permit))
    } else {
        None
    };

    let (io, target) = connect(client, &host, kubelet_port, scheme, port).await?;
    let unreachable = |e: String| ApiError::service_unavailable(format!("{UNREACHABLE_PREFIX}{e}"));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| unreachable(format!("{target}: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });

    let mut headers = forwarded_headers(&parts.headers, true);
    if let Ok(v) = HeaderValue::from_str(&target) {
        headers.insert(header::HOST, v);
    }
    // Upstream's proxy transport tells the backend where the client's request was sent.
    if let Ok(v) = HeaderValue::from_str(parts.uri.path()) {
        headers.insert("x-forwarded-uri", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("https"));
    if let Some(host) = parts
        .headers
        .get(header::HOST)
        .cloned()
        .or_else(|| parts.uri.authority().and_then(|a| a.as_str().parse().ok()))
    {
        headers.insert("x-forwarded-host", host);
    }

    let response = if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        if let Some(v) = parts.headers.get(header::UPGRADE) {
            headers.insert(header::UPGRADE, v.clone());
        }
        let mut request = http::Request::new(
            Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = target_uri
            .parse()
            .map_err(|e| ApiError::bad_request(format!("proxy path: {e}")))?;
        *request.headers_mut() = headers;
        send(&mut sender, request, &target).await?
    } else {
        let mut request = http::Request::new(body.boxed_unsync());
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = target_uri
            .parse()
            .map_err(|e| ApiError::bad_request(format!("proxy path: {e}")))?;
        *request.headers_mut() = headers;
        send(&mut sender, request, &target).await?
    };

    let status = response.status();
    if status == StatusCode::SWITCHING_PROTOCOLS
        && let Some((client_upgrade, permit)) = client_upgrade
    {
        let mut answer = Response::new(crate::response::full(Bytes::new()));
        *answer.status_mut() = status;
        *answer.headers_mut() = forwarded_headers(response.headers(), false);
        answer
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        if let Some(v) = response.headers().get(header::UPGRADE) {
            answer.headers_mut().insert(header::UPGRADE, v.clone());
        }
        let kubelet_upgrade = hyper::upgrade::on(response);
        tokio::spawn(async move {
            let _permit = permit;
            let (client, kubelet) = match tokio::join!(client_upgrade, kubelet_upgrade) {
                (Ok(c), Ok(k)) => (c, k),
                (c, k) => {
                    tracing::debug!(client = ?c.err(), kubelet = ?k.err(), "node proxy upgrade failed");
                    return;
                }
            };
            let mut client = TokioIo::new(client);
            let mut kubelet = TokioIo::new(kubelet);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await;
        });
        return Ok(answer);
    }

    let head_only = parts.method == Method::HEAD;
    let response_headers = forwarded_headers(response.headers(), false);
    // The body as it arrives; a transport error ends the stream (the client sees a short
    // read, as with upstream's copy cut short).
    let body = response.into_body().map_err(|_| ()).into_data_stream();
    let stream = futures::StreamExt::filter_map(body, |r| async move {
        r.ok()
            .map(|b| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b)))
    });
    let mut answer = if head_only {
        Response::new(crate::response::full(Bytes::new()))
    } else {
        Response::new(http_body_util::StreamBody::new(stream).boxed_unsync())
    };
    *answer.status_mut() = status;
    *answer.headers_mut() = response_headers;
    Ok(answer)
}

/// A request body on its way to the kubelet: the client's, or none on an upgrade.
type ProxiedBody = http_body_util::combinators::UnsyncBoxBody<Bytes, hyper::Error>;

/// Sends the request, waiting [`KUBELET_RESPONSE_TIMEOUT`] at most for the response head.
async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<ProxiedBody>,
    request: http::Request<ProxiedBody>,
    target: &str,
) -> Result<http::Response<Incoming>, ApiError> {
    let wait: Duration = KUBELET_RESPONSE_TIMEOUT;
    tokio::time::timeout(wait, sender.send_request(request))
        .await
        .map_err(|_| ApiError::timeout(format!("{UNREACHABLE_PREFIX}{target} did not answer"), 1))?
        .map_err(|e| ApiError::service_unavailable(format!("{UNREACHABLE_PREFIX}{target}: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn ids_split_as_upstream_splits_them() {
        assert_eq!(split_scheme_name_port("n1"), Some(("", "n1", "")));
        assert_eq!(
            split_scheme_name_port("n1:10255"),
            Some(("", "n1", "10255"))
        );
        assert_eq!(
            split_scheme_name_port("https:n1:10250"),
            Some(("https", "n1", "10250"))
        );
        assert_eq!(split_scheme_name_port("ftp:n1:21"), None);
        assert_eq!(split_scheme_name_port(":80"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
    }

    #[test]
    fn the_path_after_proxy_is_decoded_cleaned_and_escaped() {
        assert_eq!(kubelet_path("/api/v1/nodes/n1/proxy"), "/");
        assert_eq!(kubelet_path("/api/v1/nodes/n1/proxy/"), "/");
        assert_eq!(kubelet_path("/api/v1/nodes/n1/proxy/pods"), "/pods");
        assert_eq!(
            kubelet_path("/api/v1/nodes/n1/proxy/containerLogs/ns/p/c"),
            "/containerLogs/ns/p/c"
        );
        assert_eq!(kubelet_path("/api/v1/nodes/n1/proxy/logs/"), "/logs/");
        assert_eq!(
            kubelet_path("/api/v1/nodes/n1/proxy/a/../../../etc"),
            "/etc"
        );
        assert_eq!(kubelet_path("/api/v1/nodes/n1/proxy/a%2Fb%20c"), "/a/b%20c");
    }

    #[test]
    fn only_global_unicast_addresses_are_proxied() {
        for ok in ["10.0.0.5", "192.0.2.2", "2001:db8::1"] {
            assert!(is_proxyable(ok.parse().unwrap()), "{ok}");
        }
        for refused in [
            "127.0.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!is_proxyable(refused.parse().unwrap()), "{refused}");
        }
    }

    #[test]
    fn hop_by_hop_headers_and_credentials_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer secret".parse().unwrap());
        h.insert("impersonate-user", "jane".parse().unwrap());
        h.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(header::ACCEPT, "application/json".parse().unwrap());
        let out = forwarded_headers(&h, true);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[header::ACCEPT], "application/json");
        // A response keeps an `Authorization`-like header of its own (none is hop-by-hop).
        let mut r = HeaderMap::new();
        r.insert(header::WWW_AUTHENTICATE, "Bearer".parse().unwrap());
        assert_eq!(forwarded_headers(&r, false).len(), 1);
    }
}
