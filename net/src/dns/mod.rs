//! Cluster DNS, served by skerry itself on every node (`docs/tricks.md`, part 6): the
//! Kubernetes DNS specification's records for Services, endpoints and pods answered straight
//! from this node's informer caches, every other name forwarded to the node's upstream
//! resolvers through a cache — what CoreDNS with kubeadm's Corefile does, without a Deployment
//! to schedule, an image to pull or a second copy of the Services to watch.
//!
//! The pieces:
//! - [`zone`]: the authoritative answers for the cluster domain and the reverse names of
//!   cluster addresses, computed per question from the Service and EndpointSlice stores;
//! - [`forward`]: the upstreams read from a resolv.conf (loopback stubs skipped), UDP with a
//!   TCP retry on truncation, and the positive/negative answer cache;
//! - [`server`]: hickory-server's UDP and TCP listeners and the request handler that picks the
//!   zone or the forwarder, with truncation (TC) over UDP;
//! - [`metrics`]: CoreDNS's metric names;
//! - [`testing`]: an upstream resolver of fixed answers on loopback, for tests and the
//!   benchmark;
//! - [`service`]: the control-plane controller that keeps the `kube-system/kube-dns` Service
//!   and its EndpointSlice (every Ready node's InternalIP) in step with the Nodes.
//!
//! Entries: [`run_server`] on every node, [`run_service_controller`] in the control plane.

pub mod forward;
pub mod metrics;
pub mod server;
pub mod service;
pub mod testing;
pub mod zone;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

pub use server::run_server;
pub use service::run_service_controller;

/// The cluster domain unless configured (the kubelet's `--cluster-domain` default in kubeadm).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// The node's resolver configuration, where the upstreams are read (the kubelet's
/// `--resolv-conf` default).
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";

/// The cluster DNS address unless configured: the tenth address of kubeadm's default Service
/// range `10.96.0.0/12` (kubeadm's `DefaultClusterDNSIP`), the kubelet's `--cluster-dns`.
pub const DEFAULT_CLUSTER_DNS_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 96, 0, 10));

/// The DNS port.
pub const DNS_PORT: u16 = 53;

/// How cluster DNS is served, on a node and by the control plane's controller.
#[derive(Clone, Debug)]
pub struct DnsConfig {
    /// The cluster domain (`cluster.local`).
    pub cluster_domain: String,
    /// The kube-dns Service's cluster IP (the kubelet's `--cluster-dns`).
    pub cluster_dns_ip: IpAddr,
    /// Where the node's DNS server listens: the node's InternalIP on port 53 (what the
    /// kube-dns EndpointSlice points at), and whatever else the integrator adds.
    pub listen: Vec<SocketAddr>,
    /// The node's resolv.conf, for the upstreams.
    pub resolv_conf: PathBuf,
    /// Upstreams to use instead of the resolv.conf's when not empty (CoreDNS's
    /// `forward . <addr:port>...`): a fixed resolver, or one on another port.
    pub upstreams: Vec<SocketAddr>,
    /// Entries of the forwarder's cache.
    pub cache_capacity: usize,
    /// This member's identity in the kube-dns controller's leader election (the node name).
    pub identity: String,
}

impl DnsConfig {
    /// The defaults, listening on `listen`, as `identity`.
    pub fn new(listen: Vec<SocketAddr>, identity: &str) -> DnsConfig {
        DnsConfig {
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_string(),
            cluster_dns_ip: DEFAULT_CLUSTER_DNS_IP,
            listen,
            resolv_conf: PathBuf::from(DEFAULT_RESOLV_CONF),
            upstreams: Vec::new(),
            cache_capacity: forward::CACHE_CAPACITY,
            identity: identity.to_string(),
        }
    }
}
