//! A device plugin served in a test's process (the `DevicePlugin` side of
//! [`crate::deviceplugin::v1beta1`] on a Unix socket), for tests of the kubelet's device
//! manager: its devices are set by the test, its `Allocate` answers
//! `<ENV>=<ids>` (comma-separated), one `/dev/null` device node per id at
//! `/dev/<resource's name>-<id>` and an annotation, and it records every call.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::deviceplugin::v1beta1 as api;

/// What the plugin was asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    /// The device ids of each `Allocate` container request.
    pub allocate: Vec<Vec<String>>,
    /// The available ids of each `GetPreferredAllocation` container request.
    pub preferred: Vec<Vec<String>>,
    /// The ids of each `PreStartContainer`.
    pub pre_start: Vec<Vec<String>>,
}

/// The plugin's settings and state, shared with its server.
pub struct FakeDevicePlugin {
    /// The resource (`skerry.test/widget`).
    pub resource: String,
    /// The environment variable `Allocate` sets to the ids.
    pub env: String,
    /// Its socket.
    pub socket: PathBuf,
    /// The options it reports.
    pub options: api::DevicePluginOptions,
    devices: tokio::sync::watch::Sender<Vec<api::Device>>,
    calls: parking_lot::Mutex<Calls>,
    stop: CancellationToken,
}

/// A device of `id`, healthy or not, on the NUMA nodes `numa`.
pub fn device(id: &str, healthy: bool, numa: &[i64]) -> api::Device {
    api::Device {
        id: id.to_string(),
        health: if healthy { "Healthy" } else { "Unhealthy" }.to_string(),
        topology: (!numa.is_empty()).then(|| api::TopologyInfo {
            nodes: numa.iter().map(|&id| api::NumaNode { id }).collect(),
        }),
    }
}

impl FakeDevicePlugin {
    /// Serves the plugin on `<dir>/<socket_name>` with `devices`.
    pub fn start(
        dir: &Path,
        socket_name: &str,
        resource: &str,
        env: &str,
        options: api::DevicePluginOptions,
        devices: Vec<api::Device>,
    ) -> std::io::Result<Arc<FakeDevicePlugin>> {
        let socket = dir.join(socket_name);
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let (tx, _) = tokio::sync::watch::channel(devices);
        let plugin = Arc::new(FakeDevicePlugin {
            resource: resource.to_string(),
            env: env.to_string(),
            socket,
            options,
            devices: tx,
            calls: parking_lot::Mutex::new(Calls::default()),
            stop: CancellationToken::new(),
        });
        let server = tonic::transport::Server::builder()
            .add_service(api::device_plugin_server::DevicePluginServer::new(Service(
                plugin.clone(),
            )))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                plugin.stop.clone().cancelled_owned(),
            );
        tokio::spawn(server);
        Ok(plugin)
    }

    /// Registers with the kubelet's registration socket.
    pub async fn register(&self, kubelet_socket: &Path) -> Result<(), tonic::Status> {
        let endpoint = self
            .socket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        register(
            kubelet_socket,
            "v1beta1",
            &endpoint,
            &self.resource,
            self.options,
        )
        .await
    }

    /// Sends a new device list on every `ListAndWatch` stream.
    pub fn set_devices(&self, devices: Vec<api::Device>) {
        self.devices.send_replace(devices);
    }

    /// The calls so far.
    pub fn calls(&self) -> Calls {
        self.calls.lock().clone()
    }

    /// Stops serving: the streams end, as when a plugin exits.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for FakeDevicePlugin {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One `Register` call to the kubelet's socket.
pub async fn register(
    kubelet_socket: &Path,
    version: &str,
    endpoint: &str,
    resource: &str,
    options: api::DevicePluginOptions,
) -> Result<(), tonic::Status> {
    let channel = crate::cri::transport::unix_channel(kubelet_socket);
    api::registration_client::RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: version.to_string(),
            endpoint: endpoint.to_string(),
            resource_name: resource.to_string(),
            options: Some(options),
        })
        .await
        .map(|_| ())
}

struct Service(Arc<FakeDevicePlugin>);

type DeviceStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<api::ListAndWatchResponse, tonic::Status>> + Send>,
>;

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<api::DevicePluginOptions>, tonic::Status> {
        Ok(tonic::Response::new(self.0.options))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<DeviceStream>, tonic::Status> {
        // The current list, then each new one.
        let rx = self.0.devices.subscribe();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let devices = rx.borrow_and_update().clone();
            Some((Ok(api::ListAndWatchResponse { devices }), (rx, false)))
        })
        .take_until(self.0.stop.clone().cancelled_owned());
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: tonic::Request<api::PreferredAllocationRequest>,
    ) -> Result<tonic::Response<api::PreferredAllocationResponse>, tonic::Status> {
        let mut out = Vec::new();
        for r in request.into_inner().container_requests {
            self.0
                .calls
                .lock()
                .preferred
                .push(r.available_device_i_ds.clone());
            // The last ones: a choice the kubelet would not make by itself.
            let n = usize::try_from(r.allocation_size).unwrap_or(0);
            let ids = r
                .available_device_i_ds
                .iter()
                .rev()
                .take(n)
                .cloned()
                .collect();
            out.push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(tonic::Response::new(api::PreferredAllocationResponse {
            container_responses: out,
        }))
    }

    async fn allocate(
        &self,
        request: tonic::Request<api::AllocateRequest>,
    ) -> Result<tonic::Response<api::AllocateResponse>, tonic::Status> {
        let name = self
            .0
            .resource
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let mut out = Vec::new();
        for r in request.into_inner().container_requests {
            self.0.calls.lock().allocate.push(r.devices_i_ds.clone());
            out.push(api::ContainerAllocateResponse {
                envs: [(self.0.env.clone(), r.devices_i_ds.join(","))].into(),
                mounts: Vec::new(),
                devices: r
                    .devices_i_ds
                    .iter()
                    .map(|id| api::DeviceSpec {
                        container_path: format!("/dev/{name}-{id}"),
                        host_path: "/dev/null".to_string(),
                        permissions: "rw".to_string(),
                    })
                    .collect(),
                annotations: [(format!("{name}.skerry.test/ids"), r.devices_i_ds.join(","))].into(),
                cdi_devices: Vec::new(),
            });
        }
        Ok(tonic::Response::new(api::AllocateResponse {
            container_responses: out,
        }))
    }

    async fn pre_start_container(
        &self,
        request: tonic::Request<api::PreStartContainerRequest>,
    ) -> Result<tonic::Response<api::PreStartContainerResponse>, tonic::Status> {
        self.0
            .calls
            .lock()
            .pre_start
            .push(request.into_inner().devices_i_ds);
        Ok(tonic::Response::new(api::PreStartContainerResponse {}))
    }
}
