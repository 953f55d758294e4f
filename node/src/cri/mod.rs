//! A typed client of the Container Runtime Interface v1: what the kubelet's
//! `pkg/kubelet/cri/remote` (`remote_runtime.go`, `remote_image.go`) is upstream.
//!
//! [`Cri`] is one handle over one lazily connected unix-socket channel
//! ([`transport::unix_channel`]) that serves both the runtime and the image service, as
//! containerd and CRI-O do. Each call carries the kubelet's deadline (`--runtime-request-timeout`,
//! [`RUNTIME_REQUEST_TIMEOUT`]), except the ones upstream leaves open or stretches: a pull gets
//! its own long bound ([`IMAGE_PULL_TIMEOUT`]) and `ExecSync` gets its command's timeout plus
//! the request timeout. A failed call becomes a [`CriError`] that names the call, what it was
//! about (a container or sandbox id, an image) and the runtime's gRPC code and message.

pub mod transport;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tonic::transport::Channel;

/// The generated CRI v1 messages and clients (`node/proto/cri.proto`).
#[allow(clippy::all, missing_docs)]
pub mod api {
    tonic::include_proto!("runtime.v1");

    impl std::fmt::Debug for AuthConfig {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let redact = |s: &str| if s.is_empty() { "" } else { "<redacted>" };
            f.debug_struct("AuthConfig")
                .field("username", &self.username)
                .field("password", &redact(&self.password))
                .field("auth", &redact(&self.auth))
                .field("server_address", &self.server_address)
                .field("identity_token", &redact(&self.identity_token))
                .field("registry_token", &redact(&self.registry_token))
                .finish()
        }
    }
}

use api::image_service_client::ImageServiceClient;
use api::runtime_service_client::RuntimeServiceClient;

pub use transport::{EndpointError, socket_path};

/// The version the kubelet announces in every `VersionRequest`: its `kubeRuntimeAPIVersion`
/// (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`). The runtime answers with its own.
pub const KUBE_RUNTIME_API_VERSION: &str = "0.1.0";

/// The deadline of every CRI call that has no deadline of its own: the kubelet's
/// `--runtime-request-timeout` default (`pkg/kubelet/apis/config/v1beta1/defaults.go`,
/// `RuntimeRequestTimeout: 2 * time.Minute`). Shorter would fail slow but healthy sandbox
/// setups on a loaded edge box; longer only delays noticing a wedged runtime.
pub const RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The deadline of a `PullImage`. Upstream sets none (`remote_image.go`, `PullImage` uses a
/// plain cancel context) and relies on the runtime's own progress timeout; skerry bounds it
/// anyway, generously, so a registry that trickles bytes cannot hold a pod worker forever. A
/// 1 GiB image at 1 MiB/s fits in it.
pub const IMAGE_PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The largest message the client accepts: upstream's `maxMsgSize` (16 MiB,
/// `pkg/kubelet/cri/remote/utils.go`). `ListContainers` on a node with many exited containers
/// is the call that grows; `ExecSync`'s output is capped by the runtime to the same size.
pub const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// A CRI call that failed: which call, about what, and the runtime's answer.
#[derive(Debug, thiserror::Error)]
pub struct CriError {
    /// The RPC (`CreateContainer`).
    pub call: &'static str,
    /// What it was about (`container 1234abcd`, `image busybox`), or empty.
    pub subject: String,
    /// The gRPC code; `DeadlineExceeded` when the deadline passed on our side.
    pub code: tonic::Code,
    /// The runtime's message.
    pub message: String,
}

impl fmt::Display for CriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CRI {}", self.call)?;
        if !self.subject.is_empty() {
            write!(f, " ({})", self.subject)?;
        }
        let code = match self.code {
            tonic::Code::Unavailable => "runtime unavailable",
            tonic::Code::DeadlineExceeded => "deadline exceeded",
            tonic::Code::NotFound => "not found",
            tonic::Code::Unimplemented => "not implemented by the runtime",
            other => other.description(),
        };
        write!(f, ": {code}: {}", self.message)
    }
}

impl CriError {
    /// Whether the runtime said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code == tonic::Code::NotFound
    }
}

/// A connection to a CRI runtime: its runtime and image services over one channel.
#[derive(Clone)]
pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
    endpoint: String,
}

impl fmt::Debug for Cri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cri")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Cri {
    /// A handle on the runtime at `endpoint` (`unix:///path` or `/path`). It does not dial yet:
    /// the first call does, and calls after a runtime restart dial again.
    pub fn new(endpoint: &str) -> Result<Self, EndpointError> {
        let path = socket_path(endpoint)?;
        let channel = transport::unix_channel(&path);
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            images: ImageServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            timeout: RUNTIME_REQUEST_TIMEOUT,
            endpoint: endpoint.to_string(),
        })
    }

    /// The same handle with another per-call deadline (the kubelet's
    /// `--runtime-request-timeout`).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The endpoint this handle dials.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The runtime's name and version (`containerd`, `1.6.20~ds1`) and its CRI version.
    pub async fn version(&self) -> Result<api::VersionResponse, CriError> {
        let req = api::VersionRequest {
            version: KUBE_RUNTIME_API_VERSION.to_string(),
        };
        let mut c = self.runtime.clone();
        call(
            "Version",
            String::new,
            self.timeout,
            c.version(request(req, self.timeout)),
        )
        .await
    }

    /// The runtime's conditions (RuntimeReady, NetworkReady).
    pub async fn status(&self, verbose: bool) -> Result<api::StatusResponse, CriError> {
        let mut c = self.runtime.clone();
        let req = api::StatusRequest { verbose };
        call(
            "Status",
            String::new,
            self.timeout,
            c.status(request(req, self.timeout)),
        )
        .await
    }

    /// Creates and starts a pod sandbox; returns its id.
    pub async fn run_pod_sandbox(
        &self,
        config: api::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String, CriError> {
        let subject = sandbox_subject(&config);
        let req = api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        };
        let mut c = self.runtime.clone();
        let resp = call(
            "RunPodSandbox",
            || subject,
            self.timeout,
            c.run_pod_sandbox(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.pod_sandbox_id)
    }

    /// Stops a sandbox and everything in it; idempotent.
    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        let mut c = self.runtime.clone();
        call(
            "StopPodSandbox",
            || format!("sandbox {id}"),
            self.timeout,
            c.stop_pod_sandbox(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// Removes a stopped sandbox; idempotent.
    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        let mut c = self.runtime.clone();
        call(
            "RemovePodSandbox",
            || format!("sandbox {id}"),
            self.timeout,
            c.remove_pod_sandbox(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// A sandbox's status; an error when the runtime answers without one.
    pub async fn pod_sandbox_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<api::PodSandboxStatusResponse, CriError> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose,
        };
        let mut c = self.runtime.clone();
        let subject = || format!("sandbox {id}");
        let resp = call(
            "PodSandboxStatus",
            subject,
            self.timeout,
            c.pod_sandbox_status(request(req, self.timeout)),
        )
        .await?;
        if resp.status.is_none() {
            return Err(missing("PodSandboxStatus", subject(), "status"));
        }
        Ok(resp)
    }

    /// The sandboxes matching `filter`.
    pub async fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let req = api::ListPodSandboxRequest { filter };
        let mut c = self.runtime.clone();
        let resp = call(
            "ListPodSandbox",
            String::new,
            self.timeout,
            c.list_pod_sandbox(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.items)
    }

    /// Creates a container in a sandbox; returns its id.
    pub async fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let name = config.metadata.as_ref().map_or("", |m| m.name.as_str());
        let image = config.image.as_ref().map_or("", |i| i.image.as_str());
        let subject = format!("container {name:?} of image {image:?} in sandbox {pod_sandbox_id}");
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let mut c = self.runtime.clone();
        let resp = call(
            "CreateContainer",
            || subject,
            self.timeout,
            c.create_container(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.container_id)
    }

    /// Starts a created container.
    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let req = api::StartContainerRequest {
            container_id: id.to_string(),
        };
        let mut c = self.runtime.clone();
        call(
            "StartContainer",
            || format!("container {id}"),
            self.timeout,
            c.start_container(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// Stops a container: its stop signal, then SIGKILL after `grace` (whole seconds, as CRI
    /// carries it). The call's deadline is the request timeout plus the grace period, as
    /// upstream's `StopContainer` (`remote_runtime.go`).
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let req = api::StopContainerRequest {
            container_id: id.to_string(),
            timeout: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        };
        let deadline = self.timeout.saturating_add(grace);
        let mut c = self.runtime.clone();
        call(
            "StopContainer",
            || format!("container {id}"),
            deadline,
            c.stop_container(request(req, deadline)),
        )
        .await
        .map(drop)
    }

    /// Removes a container; idempotent.
    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let req = api::RemoveContainerRequest {
            container_id: id.to_string(),
        };
        let mut c = self.runtime.clone();
        call(
            "RemoveContainer",
            || format!("container {id}"),
            self.timeout,
            c.remove_container(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// The containers matching `filter`.
    pub async fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> Result<Vec<api::Container>, CriError> {
        let req = api::ListContainersRequest { filter };
        let mut c = self.runtime.clone();
        let resp = call(
            "ListContainers",
            String::new,
            self.timeout,
            c.list_containers(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.containers)
    }

    /// A container's status; an error when the runtime answers without one (upstream's
    /// `ErrContainerStatusNil`).
    pub async fn container_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<api::ContainerStatusResponse, CriError> {
        let req = api::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose,
        };
        let mut c = self.runtime.clone();
        let subject = || format!("container {id}");
        let resp = call(
            "ContainerStatus",
            subject,
            self.timeout,
            c.container_status(request(req, self.timeout)),
        )
        .await?;
        if resp.status.is_none() {
            return Err(missing("ContainerStatus", subject(), "status"));
        }
        Ok(resp)
    }

    /// Changes a running container's resources.
    pub async fn update_container_resources(
        &self,
        id: &str,
        linux: api::LinuxContainerResources,
    ) -> Result<(), CriError> {
        let req = api::UpdateContainerResourcesRequest {
            container_id: id.to_string(),
            linux: Some(linux),
            annotations: Default::default(),
        };
        let mut c = self.runtime.clone();
        call(
            "UpdateContainerResources",
            || format!("container {id}"),
            self.timeout,
            c.update_container_resources(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// Asks the runtime to reopen a container's log file (after the kubelet rotated it).
    pub async fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        let req = api::ReopenContainerLogRequest {
            container_id: id.to_string(),
        };
        let mut c = self.runtime.clone();
        call(
            "ReopenContainerLog",
            || format!("container {id}"),
            self.timeout,
            c.reopen_container_log(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// Runs `cmd` in a container and returns its output and exit code. `timeout` zero means
    /// no limit on the command, as in CRI; the call's deadline is then the request timeout
    /// only if a timeout is given, else none, as upstream's `ExecSync` (`remote_runtime.go`:
    /// `r.timeout + timeout`, or no deadline for 0).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<api::ExecSyncResponse, CriError> {
        let subject = format!("{cmd:?} in container {id}");
        let req = api::ExecSyncRequest {
            container_id: id.to_string(),
            cmd,
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        };
        let mut c = self.runtime.clone();
        if timeout.is_zero() {
            c.exec_sync(tonic::Request::new(req))
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| error("ExecSync", subject, &status))
        } else {
            let deadline = self.timeout.saturating_add(timeout);
            call(
                "ExecSync",
                || subject,
                deadline,
                c.exec_sync(request(req, deadline)),
            )
            .await
        }
    }

    /// The URL of the runtime's streaming server for an exec session.
    pub async fn exec(&self, req: api::ExecRequest) -> Result<String, CriError> {
        let subject = format!("{:?} in container {}", req.cmd, req.container_id);
        let mut c = self.runtime.clone();
        let resp = call(
            "Exec",
            || subject,
            self.timeout,
            c.exec(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.url)
    }

    /// The URL of the runtime's streaming server for an attach session.
    pub async fn attach(&self, req: api::AttachRequest) -> Result<String, CriError> {
        let subject = format!("container {}", req.container_id);
        let mut c = self.runtime.clone();
        let resp = call(
            "Attach",
            || subject,
            self.timeout,
            c.attach(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.url)
    }

    /// The URL of the runtime's streaming server for forwarding ports of a sandbox.
    pub async fn port_forward(
        &self,
        sandbox_id: &str,
        ports: Vec<i32>,
    ) -> Result<String, CriError> {
        let req = api::PortForwardRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            port: ports,
        };
        let mut c = self.runtime.clone();
        let resp = call(
            "PortForward",
            || format!("sandbox {sandbox_id}"),
            self.timeout,
            c.port_forward(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.url)
    }

    /// One container's resource usage.
    pub async fn container_stats(&self, id: &str) -> Result<api::ContainerStats, CriError> {
        let req = api::ContainerStatsRequest {
            container_id: id.to_string(),
        };
        let mut c = self.runtime.clone();
        let subject = || format!("container {id}");
        let resp = call(
            "ContainerStats",
            subject,
            self.timeout,
            c.container_stats(request(req, self.timeout)),
        )
        .await?;
        resp.stats
            .ok_or_else(|| missing("ContainerStats", subject(), "stats"))
    }

    /// The resource usage of the containers matching `filter`.
    pub async fn list_container_stats(
        &self,
        filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>, CriError> {
        let req = api::ListContainerStatsRequest { filter };
        let mut c = self.runtime.clone();
        let resp = call(
            "ListContainerStats",
            String::new,
            self.timeout,
            c.list_container_stats(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.stats)
    }

    /// One sandbox's resource usage.
    pub async fn pod_sandbox_stats(&self, id: &str) -> Result<api::PodSandboxStats, CriError> {
        let req = api::PodSandboxStatsRequest {
            pod_sandbox_id: id.to_string(),
        };
        let mut c = self.runtime.clone();
        let subject = || format!("sandbox {id}");
        let resp = call(
            "PodSandboxStats",
            subject,
            self.timeout,
            c.pod_sandbox_stats(request(req, self.timeout)),
        )
        .await?;
        resp.stats
            .ok_or_else(|| missing("PodSandboxStats", subject(), "stats"))
    }

    /// The resource usage of the sandboxes matching `filter`.
    pub async fn list_pod_sandbox_stats(
        &self,
        filter: Option<api::PodSandboxStatsFilter>,
    ) -> Result<Vec<api::PodSandboxStats>, CriError> {
        let req = api::ListPodSandboxStatsRequest { filter };
        let mut c = self.runtime.clone();
        let resp = call(
            "ListPodSandboxStats",
            String::new,
            self.timeout,
            c.list_pod_sandbox_stats(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.stats)
    }

    /// Tells the runtime the node's pod CIDR.
    pub async fn update_runtime_config(&self, pod_cidr: &str) -> Result<(), CriError> {
        let req = api::UpdateRuntimeConfigRequest {
            runtime_config: Some(api::RuntimeConfig {
                network_config: Some(api::NetworkConfig {
                    pod_cidr: pod_cidr.to_string(),
                }),
            }),
        };
        let mut c = self.runtime.clone();
        call(
            "UpdateRuntimeConfig",
            || format!("pod CIDR {pod_cidr}"),
            self.timeout,
            c.update_runtime_config(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// The images the runtime holds, optionally filtered.
    pub async fn list_images(
        &self,
        filter: Option<api::ImageFilter>,
    ) -> Result<Vec<api::Image>, CriError> {
        let req = api::ListImagesRequest { filter };
        let mut c = self.images.clone();
        let resp = call(
            "ListImages",
            String::new,
            self.timeout,
            c.list_images(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.images)
    }

    /// An image's status, or `None` when the runtime does not have it (CRI answers an empty
    /// status rather than NotFound).
    pub async fn image_status(&self, image: &str) -> Result<Option<api::Image>, CriError> {
        let req = api::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        let mut c = self.images.clone();
        let resp = call(
            "ImageStatus",
            || format!("image {image}"),
            self.timeout,
            c.image_status(request(req, self.timeout)),
        )
        .await?;
        Ok(resp.image)
    }

    /// Pulls an image; returns its reference (the image id). Bounded by
    /// [`IMAGE_PULL_TIMEOUT`], not the request timeout.
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let req = api::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config,
        };
        let mut c = self.images.clone();
        let resp = call(
            "PullImage",
            || format!("image {image}"),
            IMAGE_PULL_TIMEOUT,
            c.pull_image(request(req, IMAGE_PULL_TIMEOUT)),
        )
        .await?;
        Ok(resp.image_ref)
    }

    /// Removes an image; idempotent.
    pub async fn remove_image(&self, image: &str) -> Result<(), CriError> {
        let req = api::RemoveImageRequest {
            image: Some(image_spec(image)),
        };
        let mut c = self.images.clone();
        call(
            "RemoveImage",
            || format!("image {image}"),
            self.timeout,
            c.remove_image(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// The filesystems images and writable layers live on, with their usage.
    pub async fn image_fs_info(&self) -> Result<api::ImageFsInfoResponse, CriError> {
        let mut c = self.images.clone();
        call(
            "ImageFsInfo",
            String::new,
            self.timeout,
            c.image_fs_info(request(api::ImageFsInfoRequest {}, self.timeout)),
        )
        .await
    }
}

/// An image spec naming `image` (a reference or an id).
pub fn image_spec(image: &str) -> api::ImageSpec {
    api::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    }
}

fn sandbox_subject(config: &api::PodSandboxConfig) -> String {
    match &config.metadata {
        Some(m) => format!("pod {}/{} ({})", m.namespace, m.name, m.uid),
        None => "pod without metadata".to_string(),
    }
}

/// A request carrying its deadline in `grpc-timeout`, so the runtime gives up when we do.
fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.set_timeout(timeout);
    req
}

/// Awaits `fut` within `timeout` and turns a failure into a [`CriError`].
async fn call<T, S>(
    name: &'static str,
    subject: S,
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CriError>
where
    S: FnOnce() -> String,
{
    let started = std::time::Instant::now();
    let result = match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) => Err(error(name, subject(), &status)),
        Err(_) => Err(CriError {
            call: name,
            subject: subject(),
            code: tonic::Code::DeadlineExceeded,
            message: format!("no answer within {timeout:?}"),
        }),
    };
    // `instrumented_services.go`: every call counted and timed, failures counted again.
    crate::metrics::metrics().runtime_operation(name, started.elapsed(), result.is_err());
    result
}

fn error(call: &'static str, subject: String, status: &tonic::Status) -> CriError {
    CriError {
        call,
        subject,
        code: status.code(),
        message: status.message().to_string(),
    }
}

fn missing(call: &'static str, subject: String, field: &str) -> CriError {
    CriError {
        call,
        subject,
        code: tonic::Code::Internal,
        message: format!("the runtime answered without a {field}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_and_its_subject() {
        let err = error(
            "CreateContainer",
            "container \"app\" in sandbox abc".to_string(),
            &tonic::Status::not_found("image \"nope\" not found"),
        );
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            "CRI CreateContainer (container \"app\" in sandbox abc): not found: image \"nope\" not \
             found"
        );
    }

    #[test]
    fn auth_config_debug_hides_secrets() {
        let auth = api::AuthConfig {
            username: "me".into(),
            password: "hunter2".into(),
            ..Default::default()
        };
        let shown = format!("{auth:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("me"), "{shown}");
    }

    #[tokio::test]
    async fn a_missing_socket_is_unavailable_and_says_so() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sock = dir.path().join("none.sock");
        let cri = Cri::new(&sock.display().to_string()).expect("endpoint");
        let err = cri.version().await.expect_err("nothing listens");
        assert_eq!(err.code, tonic::Code::Unavailable, "{err}");
        assert!(
            err.to_string()
                .starts_with("CRI Version: runtime unavailable"),
            "{err}"
        );
    }
}
