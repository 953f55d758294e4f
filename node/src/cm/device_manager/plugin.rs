//! The registration side of the device plugin API (upstream `devicemanager/plugin/v1beta1`
//! `server.go`, `client.go`, `endpoint.go`): the kubelet's `Registration` server on
//! `<root-dir>/device-plugins/kubelet.sock`, and its client of each plugin that registers,
//! dialled at `<root-dir>/device-plugins/<endpoint>`, following the plugin's `ListAndWatch`.

use std::path::Path;
use std::sync::Arc;

use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{DeviceManager, Endpoint, SUPPORTED_VERSIONS, is_extended_resource_name};
use crate::checkpoint::device_manager::DEVICE_MANAGER_CHECKPOINT_FILE;
use crate::deviceplugin::v1beta1 as api;

/// `errUnsupportedVersion`, with Go's `%q` of the version and of the supported list.
fn unsupported_version(version: &str) -> String {
    let list: Vec<String> = SUPPORTED_VERSIONS
        .iter()
        .map(|v| format!("{v:?}"))
        .collect();
    format!(
        "requested API version {version:?} is not supported by kubelet. Supported versions are [{}]",
        list.join(" ")
    )
}

/// `errInvalidResourceName`.
fn invalid_resource_name(name: &str) -> String {
    format!("the ResourceName {name:?} is invalid")
}

/// Checks a registration (`Server.Register` before it dials the plugin): upstream's message
/// for a refused one.
pub fn validate(req: &api::RegisterRequest) -> Result<(), String> {
    if !SUPPORTED_VERSIONS.contains(&req.version.as_str()) {
        return Err(unsupported_version(&req.version));
    }
    if !is_extended_resource_name(&req.resource_name) {
        return Err(invalid_resource_name(&req.resource_name));
    }
    // The endpoint is a socket in the plugin directory, nothing outside it.
    if req.endpoint.is_empty()
        || Path::new(&req.endpoint)
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(format!(
            "invalid endpoint {:?}: a socket name in the device plugin directory",
            req.endpoint
        ));
    }
    Ok(())
}

struct Registration {
    manager: Arc<DeviceManager>,
}

#[tonic::async_trait]
impl api::registration_server::Registration for Registration {
    async fn register(
        &self,
        request: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        let req = request.into_inner();
        info!(resource = %req.resource_name, endpoint = %req.endpoint, "got registration request from device plugin");
        if let Err(e) = validate(&req) {
            warn!(resource = %req.resource_name, error = %e, "device plugin registration refused");
            // Upstream returns a plain error: gRPC code Unknown.
            return Err(tonic::Status::unknown(e));
        }
        // Dialled after the answer (upstream `go s.connectClient`): a plugin may serve only
        // once it is registered.
        let manager = self.manager.clone();
        tokio::spawn(async move { connect(manager, req).await });
        Ok(tonic::Response::new(api::Empty {}))
    }
}

/// Dials the plugin, reads its options and follows its `ListAndWatch` until it ends.
async fn connect(manager: Arc<DeviceManager>, req: api::RegisterRequest) {
    let path = manager.dir().join(&req.endpoint);
    let channel = crate::cri::transport::unix_channel(&path);
    let mut client = api::device_plugin_client::DevicePluginClient::new(channel);
    let options = match client.get_device_plugin_options(api::Empty {}).await {
        Ok(o) => o.into_inner(),
        Err(e) => {
            warn!(resource = %req.resource_name, error = %e.message(), "failed to get device plugin options");
            return;
        }
    };
    let stream = match client.list_and_watch(api::Empty {}).await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            warn!(resource = %req.resource_name, error = %e.message(), "ListAndWatch failed");
            return;
        }
    };
    let resource = req.resource_name;
    let stop = CancellationToken::new();
    let generation = manager.connected(&resource, Endpoint { client, options }, stop.clone());
    info!(resource = %resource, "device plugin connected");
    run_stream(manager, resource, generation, stream, stop).await;
}

async fn run_stream(
    manager: Arc<DeviceManager>,
    resource: String,
    generation: u64,
    mut stream: tonic::codec::Streaming<api::ListAndWatchResponse>,
    stop: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            next = stream.next() => next,
            // A newer registration of the resource took over.
            () = stop.cancelled() => return,
        };
        match next {
            Some(Ok(r)) => manager.update_devices(&resource, generation, &r.devices),
            Some(Err(e)) => {
                warn!(resource = %resource, error = %e.message(), "ListAndWatch ended with an error");
                break;
            }
            None => break,
        }
    }
    info!(resource = %resource, "device plugin stream ended: its devices are unhealthy");
    manager.stopped(&resource, generation);
}

/// Serves `Registration` on the manager's `kubelet.sock` until `stop` (a stale socket file
/// is removed first, as upstream's `Start` does). Returns when the socket cannot be bound.
pub async fn serve(manager: Arc<DeviceManager>, stop: CancellationToken) -> std::io::Result<()> {
    let listener = bind(&manager)?;
    manager.start_restored_grace();
    info!(socket = %manager.socket_path().display(), "device plugin registration server listening");
    let result = tonic::transport::Server::builder()
        .add_service(api::registration_server::RegistrationServer::new(
            Registration {
                manager: manager.clone(),
            },
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            stop.cancelled_owned(),
        )
        .await;
    let _ = std::fs::remove_file(manager.socket_path());
    result.map_err(std::io::Error::other)
}

/// Binds the registration socket: the directory created, and every file in it but the
/// checkpoint removed first (upstream `Start` -> `removeContents`): the old `kubelet.sock` and
/// the plugins' sockets, whose removal tells a running plugin to register again with this
/// kubelet.
pub fn bind(manager: &DeviceManager) -> std::io::Result<tokio::net::UnixListener> {
    std::fs::create_dir_all(manager.dir())?;
    for entry in std::fs::read_dir(manager.dir())?.flatten() {
        let name = entry.file_name();
        if name == DEVICE_MANAGER_CHECKPOINT_FILE || entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Err(e) = std::fs::remove_file(entry.path()) {
            warn!(file = %entry.path().display(), error = %e, "removing a stale file of the device plugin directory");
        }
    }
    tokio::net::UnixListener::bind(manager.socket_path())
}
