//! A client of the few containerd services skerry calls itself (content, images, leases,
//! version), beside CRI, over containerd's own socket.
//!
//! containerd scopes every object by namespace, read from the `containerd-namespace` gRPC
//! header; a lease named in `containerd-lease` keeps what a call creates from the garbage
//! collector until the lease ends. [`ContainerdApi::request`] adds both.

use std::path::Path;

use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use crate::cri::transport::unix_channel;

/// The generated containerd messages and clients (`node/proto/containerd/`).
#[allow(clippy::all, missing_docs)]
pub mod proto {
    pub mod containerd {
        pub mod types {
            tonic::include_proto!("containerd.types");
        }
        pub mod services {
            pub mod content {
                pub mod v1 {
                    tonic::include_proto!("containerd.services.content.v1");
                }
            }
            pub mod images {
                pub mod v1 {
                    tonic::include_proto!("containerd.services.images.v1");
                }
            }
            pub mod leases {
                pub mod v1 {
                    tonic::include_proto!("containerd.services.leases.v1");
                }
            }
            pub mod version {
                pub mod v1 {
                    tonic::include_proto!("containerd.services.version.v1");
                }
            }
        }
    }
    pub use containerd::services::content::v1 as content;
    pub use containerd::services::images::v1 as images;
    pub use containerd::services::leases::v1 as leases;
    pub use containerd::services::version::v1 as version;
    pub use containerd::types;
}

use proto::content::content_client::ContentClient;
use proto::images::images_client::ImagesClient;
use proto::leases::leases_client::LeasesClient;
use proto::version::version_client::VersionClient;

/// The namespace containerd's CRI plugin keeps Kubernetes' images and containers in
/// (containerd's `pkg/cri/constants`, `K8sContainerdNamespace`).
pub const K8S_NAMESPACE: &str = "k8s.io";

/// The gRPC header containerd reads the namespace from (`namespaces.GRPCHeader`).
const NAMESPACE_HEADER: &str = "containerd-namespace";

/// The gRPC header containerd reads a lease id from (`leases` package, `GRPCHeader`).
const LEASE_HEADER: &str = "containerd-lease";

/// The largest message containerd's server accepts by default (`defaults.DefaultMaxRecvMsgSize`,
/// 16 MiB); our blob chunks stay far below it.
const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// Clients of containerd's services in one namespace, over one lazily dialled channel.
#[derive(Clone, Debug)]
pub struct ContainerdApi {
    pub content: ContentClient<Channel>,
    pub images: ImagesClient<Channel>,
    pub leases: LeasesClient<Channel>,
    pub version: VersionClient<Channel>,
    namespace: MetadataValue<tonic::metadata::Ascii>,
}

impl ContainerdApi {
    /// Clients of the containerd at `socket`, in `namespace`.
    pub fn new(
        socket: &Path,
        namespace: &str,
    ) -> Result<Self, tonic::metadata::errors::InvalidMetadataValue> {
        let channel = unix_channel(socket);
        Ok(Self {
            content: ContentClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE),
            images: ImagesClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE),
            leases: LeasesClient::new(channel.clone()),
            version: VersionClient::new(channel),
            namespace: namespace.parse()?,
        })
    }

    /// A request in this client's namespace, under `lease` when given.
    pub fn request<T>(&self, message: T, lease: Option<&str>) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        req.metadata_mut()
            .insert(NAMESPACE_HEADER, self.namespace.clone());
        if let Some(lease) = lease.and_then(|l| l.parse().ok()) {
            req.metadata_mut().insert(LEASE_HEADER, lease);
        }
        req
    }
}
