//! The client's error: an API `Status` from the server, or a failure on the way there.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with a `Status` (404, 409, 410, 422, ...).
    #[error("{} ({}): {}", .0.reason.as_deref().unwrap_or("Unknown"), .0.code.unwrap_or_default(), .0.message.as_deref().unwrap_or_default())]
    Api(Box<Status>),
    /// Connecting, TLS, HTTP or a timeout.
    #[error("transport: {0}")]
    Transport(String),
    /// A body that did not decode as what the server said it was.
    #[error("decode: {0}")]
    Decode(String),
    /// A bad kubeconfig or client configuration.
    #[error("config: {0}")]
    Config(String),
}

impl Error {
    /// The HTTP code of an API error.
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Api(s) => s.code.and_then(|c| u16::try_from(c).ok()),
            _ => None,
        }
    }
    /// 404.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }
    /// 409 with reason `AlreadyExists`.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::Api(s) if s.reason.as_deref() == Some("AlreadyExists"))
    }
    /// 409 with reason `Conflict` (a stale resourceVersion).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api(s) if s.code == Some(409) && s.reason.as_deref() != Some("AlreadyExists"))
    }
    /// 410 Gone / `Expired`: the resource version asked for has been compacted.
    pub fn is_gone(&self) -> bool {
        matches!(self, Error::Api(s) if s.code == Some(410) || matches!(s.reason.as_deref(), Some("Expired" | "Gone")))
    }
    /// 429 or 5xx: worth retrying after a pause.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport(_) => true,
            _ => matches!(self.code(), Some(429 | 500..=599)),
        }
    }
}
