//! skerry's node agent: what the upstream kubelet does on each box, over the Container Runtime
//! Interface to containerd. Every member of a skerry cluster is also a node, and `skerry agent`
//! runs this crate alone against a cluster.
//!
//! The crate reaches the apiserver only through `skerry-client`, as the upstream kubelet reaches
//! it through client-go, and the runtime only through CRI, so any CRI runtime can serve it.

pub mod cgroups;
pub mod checkpoint;
pub mod cm;
pub mod cni;
pub mod containerd;
pub mod cri;
pub mod deviceplugin;
pub mod env;
pub mod eviction;
pub mod images;
pub mod kubelet;
pub mod machine;
pub mod metrics;
pub mod nodestatus;
pub mod packages;
pub mod registries;
pub mod server;
pub mod stats;
pub mod streaming;
#[cfg(feature = "testing")]
pub mod testing;
pub mod volume;
