//! gRPC channels over a unix socket, for CRI and for containerd's own API.
//!
//! The channel is lazy: it dials on the first call and again after the runtime restarts, so a
//! handle made once survives a supervised containerd being restarted under it.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// The longest socket path `sockaddr_un` holds: 108 bytes with the terminating NUL on Linux
/// (`man 7 unix`, `sun_path[108]`).
pub const UNIX_PATH_MAX: usize = 107;

/// Parses a runtime endpoint as the kubelet's `--container-runtime-endpoint` takes it:
/// `unix:///path/to.sock`, or a bare absolute path (which upstream still accepts with a
/// deprecation warning: `pkg/kubelet/util/util_unix.go`, `parseEndpointWithFallbackProtocol`).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, EndpointError> {
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if let Some((scheme, _)) = endpoint.split_once("://") {
        return Err(EndpointError::Scheme(
            endpoint.to_string(),
            scheme.to_string(),
        ));
    } else {
        endpoint
    };
    if path.is_empty() || !path.starts_with('/') {
        return Err(EndpointError::NotAbsolute(endpoint.to_string()));
    }
    if path.len() > UNIX_PATH_MAX {
        return Err(EndpointError::TooLong(path.to_string(), path.len()));
    }
    Ok(PathBuf::from(path))
}

/// Why an endpoint cannot be dialled.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "container runtime endpoint {0:?}: protocol {1:?} not supported, only unix:// sockets are"
    )]
    Scheme(String, String),
    #[error(
        "container runtime endpoint {0:?}: want unix:///absolute/path.sock or an absolute path"
    )]
    NotAbsolute(String),
    #[error(
        "unix socket path {0:?} is {1} bytes long; Linux allows at most {UNIX_PATH_MAX}: choose a \
         shorter data dir"
    )]
    TooLong(String, usize),
}

/// A lazily connecting channel to the gRPC server on the unix socket at `path`.
pub fn unix_channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    // The URI is required by tonic and ignored by the connector; `:authority` stays "localhost",
    // which is what the Go clients send over unix sockets too.
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(
        move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_as_the_kubelet_takes_them() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").expect("valid"),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/run/crio/crio.sock").expect("valid"),
            PathBuf::from("/run/crio/crio.sock")
        );
        let err = socket_path("tcp://127.0.0.1:1234").expect_err("tcp is refused");
        assert!(err.to_string().contains("only unix://"), "{err}");
        assert!(socket_path("unix://relative.sock").is_err());
        let long = format!("/{}", "x".repeat(200));
        let err = socket_path(&long).expect_err("too long");
        assert!(err.to_string().contains("shorter data dir"), "{err}");
    }
}
