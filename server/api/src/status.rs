//! API errors as Kubernetes `Status` objects, with Kubernetes' reasons and HTTP codes.
//!
//! Every error a client sees crosses the wire through [`ApiError::to_status`], so reasons
//! and codes are decided here once (kubectl prints `Error from server (<reason>): <message>`
//! and client libraries branch on the reason).

use serde_json::{Value, json};

/// Causes past this many are dropped from one error (Kubernetes caps field errors at 100
/// so that a hostile body cannot make the error larger than the request).
pub const CAUSES_MAX: usize = 100;

/// One field-level cause of an Invalid or BadRequest error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueDuplicate`, ...
    pub reason: String,
    pub message: String,
    /// The JSON path of the field (`spec.containers[0].name`).
    pub field: String,
}

impl Cause {
    pub fn new(reason: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.to_string(),
            message: message.into(),
            field: field.into(),
        }
    }

    pub fn required(field: impl Into<String>) -> Self {
        Self::new("FieldValueRequired", field, "Required value")
    }

    pub fn invalid(field: impl Into<String>, value: &str, detail: &str) -> Self {
        Self::new(
            "FieldValueInvalid",
            field,
            format!(
                "Invalid value: {}: {detail}",
                Value::String(value.to_string())
            ),
        )
    }
}

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ... (metav1.StatusReason).
    pub reason: &'static str,
    pub message: String,
    /// `details.group`/`kind`/`name` when the error concerns one object.
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: Option<String>,
    pub causes: Vec<Cause>,
    /// For 429 and 504: `details.retryAfterSeconds` and the `Retry-After` header.
    pub retry_after_seconds: Option<u32>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            group: None,
            kind: None,
            name: None,
            causes: Vec::new(),
            retry_after_seconds: None,
        }
    }

    fn about(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.group = Some(group.to_string());
        self.kind = Some(kind.to_string());
        self.name = Some(name.to_string());
        self
    }

    /// Sets `details.kind` (what a Forbidden or NotFound concerned).
    pub fn with_detail_kind(mut self, kind: &str) -> Self {
        self.kind = Some(kind.to_string());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// `pods "web" not found`. `resource` is the plural (`pods`), `group` may be empty.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .about(group, resource, name)
    }

    /// A path or resource that does not exist at all.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .about(group, resource, name)
    }

    /// Optimistic concurrency lost: the object changed since the client read it.
    pub fn conflict(group: &str, resource: &str, name: &str, detail: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {detail}"),
        )
        .about(group, resource, name)
    }

    /// Validation failed: 422 with one cause per field, capped at [`CAUSES_MAX`].
    pub fn invalid(group: &str, kind: &str, name: &str, mut causes: Vec<Cause>) -> Self {
        causes.truncate(CAUSES_MAX);
        let list = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect::<Vec<_>>();
        let summary = match list.len() {
            0 => String::new(),
            1 => format!(": {}", list[0]),
            _ => format!(": [{}]", list.join(", ")),
        };
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid{summary}"),
        )
        .about(group, kind, name);
        e.causes = causes;
        e
    }

    /// 410: the requested resource version is older than the history kept.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Gone", message)
    }

    /// 410 Expired: the resource version of a watch or continue token was compacted.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type:?})"
            ),
        )
    }

    pub fn request_entity_too_large(limit_bytes: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit_bytes}"),
        )
    }

    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: u32) -> Self {
        let mut e = Self::new(429, "TooManyRequests", message);
        e.retry_after_seconds = Some(retry_after_seconds);
        e
    }

    pub fn timeout(message: impl Into<String>, retry_after_seconds: u32) -> Self {
        let mut e = Self::new(504, "Timeout", message);
        e.retry_after_seconds = Some(retry_after_seconds);
        e
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// A failure of the server itself (the store broke). Never for bad input.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object sent to the client.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some(name) = &self.name {
            details.insert("name".into(), json!(name));
        }
        if let Some(group) = &self.group {
            details.insert("group".into(), json!(group));
        }
        if let Some(kind) = &self.kind {
            details.insert("kind".into(), json!(kind));
        }
        if !self.causes.is_empty() {
            let causes = self
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect::<Vec<_>>();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(seconds) = self.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(seconds));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

/// `deployments.apps`, `pods`: the resource as Kubernetes names it in messages.
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// A success `Status` (DELETE of a collection, of an object with no body to return).
pub fn success(details: Option<Value>) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_reads_like_kubernetes() {
        let s = ApiError::not_found("apps", "deployments", "web").to_status();
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["code"], 404);
        assert_eq!(s["details"]["name"], "web");
    }

    #[test]
    fn invalid_caps_causes() {
        let causes = (0..150).map(|i| Cause::required(format!("f{i}"))).collect();
        let e = ApiError::invalid("", "Pod", "p", causes);
        assert_eq!(e.causes.len(), CAUSES_MAX);
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .starts_with("Pod \"p\" is invalid: [f0: Required value")
        );
    }
}
