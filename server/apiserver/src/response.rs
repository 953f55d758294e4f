//! Content negotiation and response building: which encoding a client accepts (JSON, the
//! `as=Table` form kubectl asks for, aggregated discovery, protobuf), and the one place that
//! turns an [`ApiError`] into a `Status` response.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use serde_json::Value;
use skerry_api::ApiError;

/// The response body type: a whole buffer, or a stream of frames for watches and logs.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

pub const JSON: &str = "application/json";
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
pub const YAML: &str = "application/yaml";
/// A warning per header value, as Kubernetes sends them (code 299, agent "-").
const WARNING_AGENT: &str = "299 -";
/// Warnings sent per response; Kubernetes truncates past a total size, a count bound is
/// simpler and as protective (one line each in kubectl's output).
pub const WARNINGS_MAX: usize = 100;

/// What the client asked to receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    /// `application/yaml` (whole objects and lists only; watches cannot stream YAML).
    Yaml,
    Protobuf,
    /// `application/json;as=Table;v=v1;g=meta.k8s.io` (kubectl get).
    Table(IncludeObject),
    /// `as=PartialObjectMetadata(List)`: metadata only.
    PartialObjectMetadata,
    /// `as=APIGroupDiscoveryList` (discovery only).
    AggregatedDiscovery,
}

/// `includeObject` of a Table request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value.unwrap_or("") {
            "" | "Metadata" => Ok(Self::Metadata),
            "None" => Ok(Self::None),
            "Object" => Ok(Self::Object),
            other => Err(ApiError::bad_request(format!(
                "includeObject must be one of None, Metadata or Object, got {other:?}"
            ))),
        }
    }
}

/// Picks the first acceptable media range of an `Accept` header, in the client's order
/// (kubectl lists what it prefers first and JSON last as the fallback).
pub fn negotiate(accept: Option<&str>, include: IncludeObject) -> Result<Format, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Format::Json);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        let mut params = std::collections::HashMap::new();
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                params.insert(k.trim(), v.trim());
            }
        }
        let r#as = params.get("as").copied();
        let g = params.get("g").copied();
        match (media, r#as) {
            ("application/json", Some("Table")) if g == Some("meta.k8s.io") => {
                return Ok(Format::Table(include));
            }
            ("application/json", Some("APIGroupDiscoveryList"))
                if g == Some("apidiscovery.k8s.io") && params.get("v") == Some(&"v2") =>
            {
                return Ok(Format::AggregatedDiscovery);
            }
            ("application/json", Some("PartialObjectMetadata" | "PartialObjectMetadataList"))
                if g == Some("meta.k8s.io") =>
            {
                return Ok(Format::PartialObjectMetadata);
            }
            ("application/json" | "application/*" | "*/*", None) => return Ok(Format::Json),
            (PROTOBUF, None) => return Ok(Format::Protobuf),
            (YAML, None) => return Ok(Format::Yaml),
            _ => {}
        }
    }
    Err(ApiError::not_acceptable(format!(
        "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;as=Table;v=v1;g=meta.k8s.io (asked for {accept:?})"
    )))
}

/// User agents Kubernetes pretty-prints JSON for unasked (`negotiation.isPrettyPrint`: "basic
/// all browsers and cli http tools"), by prefix.
const PRETTY_USER_AGENT_PREFIXES: [&str; 3] = ["curl", "Wget", "Mozilla/5.0"];

/// Whether a JSON answer is indented, as Kubernetes' `negotiation.isPrettyPrint` decides: a
/// non-empty `pretty` query parameter is read with Go's `strconv.ParseBool` (an unreadable
/// one is `false`, never an error); without one, curl, wget and browsers get it indented.
pub fn wants_pretty(pretty: Option<&str>, user_agent: Option<&str>) -> bool {
    if let Some(value) = pretty.filter(|p| !p.is_empty()) {
        return crate::request::parse_go_bool(value).unwrap_or(false);
    }
    user_agent.is_some_and(|ua| PRETTY_USER_AGENT_PREFIXES.iter().any(|p| ua.starts_with(p)))
}

/// Re-encodes a whole JSON answer indented by two spaces, as Go's `json.MarshalIndent(obj, "",
/// "  ")` writes Kubernetes' pretty serializer output. Other answers pass unchanged; callers
/// never pass a watch stream (its frames are not pretty in Kubernetes either).
pub async fn prettify(response: Response<Body>) -> Response<Body> {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with(JSON));
    if !is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    let pretty = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|value| serde_json::to_vec_pretty(&value).ok());
    Response::from_parts(parts, full(pretty.map(Bytes::from).unwrap_or(bytes)))
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// A JSON response with `code`, carrying `warnings` as `Warning` headers.
pub fn json(code: u16, value: &Value, warnings: &[String]) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    bytes(code, JSON, body, warnings)
}

/// A YAML response.
pub fn yaml(code: u16, value: &Value, warnings: &[String]) -> Response<Body> {
    match serde_yaml_ng::to_string(value) {
        Ok(text) => bytes(code, YAML, text, warnings),
        Err(e) => error(&ApiError::internal(format!("encoding YAML: {e}"))),
    }
}

/// A JSON response under another content type (aggregated discovery).
pub fn json_as(code: u16, value: &Value, content_type: &str) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    bytes(code, content_type, body, &[])
}

/// A response of pre-encoded bytes.
pub fn bytes(
    code: u16,
    content_type: &str,
    body: impl Into<Bytes>,
    warnings: &[String],
) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    add_warnings(&mut response, warnings);
    response
}

/// Adds `Warning: 299 - "text"` headers.
pub fn add_warnings(response: &mut Response<Body>, warnings: &[String]) {
    for w in warnings.iter().take(WARNINGS_MAX) {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("{WARNING_AGENT} \"{escaped}\"")) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
}

/// The `Status` response for an error.
pub fn error(e: &ApiError) -> Response<Body> {
    let mut response = json(e.code, &e.to_status(), &[]);
    if let Some(seconds) = e.retry_after_seconds
        && let Ok(v) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_is_asked_for_or_implied_by_the_client() {
        assert!(wants_pretty(Some("true"), None));
        assert!(wants_pretty(Some("1"), Some("kubectl/v1.32.0")));
        assert!(!wants_pretty(Some("false"), Some("curl/8.5.0")));
        // Unreadable: false, not an error, and the user agent is not consulted.
        assert!(!wants_pretty(Some("yes"), Some("curl/8.5.0")));
        // Empty or absent: the user agent decides.
        assert!(wants_pretty(Some(""), Some("curl/8.5.0")));
        assert!(wants_pretty(None, Some("Wget/1.21")));
        assert!(wants_pretty(None, Some("Mozilla/5.0 (X11)")));
        assert!(!wants_pretty(None, Some("kubectl/v1.32.0 (linux/amd64)")));
        assert!(!wants_pretty(None, None));
    }

    #[tokio::test]
    async fn prettify_indents_json_as_go_marshal_indent_does() {
        let response = json(200, &serde_json::json!({"a": [1, {"b": {}}], "c": []}), &[]);
        let pretty = prettify(response).await;
        let body = pretty.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(
            std::str::from_utf8(&body).expect("utf-8"),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": {}\n    }\n  ],\n  \"c\": []\n}"
        );
        let text = bytes(200, "text/plain; charset=utf-8", "ok", &[]);
        let same = prettify(text)
            .await
            .into_body()
            .collect()
            .await
            .expect("body");
        assert_eq!(same.to_bytes(), "ok");
    }

    #[test]
    fn kubectl_accept_headers_negotiate() {
        let get = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            negotiate(Some(get), IncludeObject::Metadata),
            Ok(Format::Table(IncludeObject::Metadata))
        );
        let disco = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(
            negotiate(Some(disco), IncludeObject::Metadata),
            Ok(Format::AggregatedDiscovery)
        );
        assert_eq!(
            negotiate(
                Some("application/vnd.kubernetes.protobuf, */*"),
                IncludeObject::Metadata
            ),
            Ok(Format::Protobuf)
        );
        assert_eq!(negotiate(None, IncludeObject::Metadata), Ok(Format::Json));
        assert_eq!(
            negotiate(Some("application/yaml"), IncludeObject::Metadata),
            Ok(Format::Yaml)
        );
        assert_eq!(
            negotiate(Some("text/html"), IncludeObject::Metadata).map_err(|e| e.code),
            Err(406)
        );
    }

    #[test]
    fn errors_become_status_responses() {
        let r = error(&ApiError::too_many_requests("slow down", 1));
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
