//! skerry's node network (`skerry-net`), run on every node beside the kubelet: what makes a
//! Service a rule and a name an address (`docs/tricks.md`, part 6).
//!
//! The pieces:
//! - routes between the nodes' pod ranges (host-gw on one segment, VXLAN across segments) and
//!   the masquerade of traffic that leaves the cluster;
//! - the service proxy, nftables backend: one table of its own per family, one
//!   `numgen random mod N vmap` rule per service (#33), topology hints consumed only when
//!   every endpoint has one (#35);
//! - a userspace proxy for NodePorts on localhost, which nftables cannot reach (#33);
//! - the built-in service load balancer (no cloud on an appliance);
//! - cluster DNS served from informer caches.
pub mod dns;
pub mod localhost;
pub mod proxy;
pub mod routes;
pub mod servicelb;
