//! What the routing table should hold, computed from data alone: the peers read off the Node
//! objects, the prefixes of the node's own link, and the routes of our protocol found in the
//! table; out comes the list of changes. No I/O here, so every decision is unit-tested.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

/// The Node address type a peer is reached at (`NodeInternalIP`, `k8s.io/api/core/v1`),
/// as flannel's kube subnet manager reads it.
pub const INTERNAL_IP: &str = "InternalIP";

/// An address prefix: `10.42.0.0/16`, `fd00:42::/56`. Host bits are cleared on parse, as the
/// kernel stores a route's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    /// The network address.
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` or `x::/n`; a bare address is a host prefix (`/32`, `/128`), as
    /// `ip -json route` prints host routes.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|e| format!("invalid prefix {text:?}: {e}"))?;
        let bits = family_bits(addr);
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| u32::from(*p) <= bits)
                .ok_or_else(|| format!("invalid prefix length in {text:?}"))?,
            None => bits as u8,
        };
        Ok(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is inside.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }

    /// Whether this is an IPv4 prefix.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn family_bits(ip: IpAddr) -> u32 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// `ip` with the bits past `prefix` cleared.
fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    let host_bits = family_bits(ip) - u32::from(prefix);
    match ip {
        IpAddr::V4(v4) => {
            let keep = u32::MAX.checked_shl(host_bits).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & keep).into())
        }
        IpAddr::V6(v6) => {
            let keep = u128::MAX.checked_shl(host_bits).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & keep).into())
        }
    }
}

/// What routing needs of one other node: its name, InternalIPs and pod ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub internal_ips: Vec<IpAddr>,
    pub pod_cidrs: Vec<Cidr>,
}

impl Peer {
    /// The peer as a Node describes it; unparsable addresses and ranges are dropped (a peer
    /// writes its own status: nothing it writes may stop the others' routing).
    pub fn from_node(node: &Node) -> Peer {
        let internal_ips = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == INTERNAL_IP)
            .filter_map(|a| a.address.parse().ok())
            .collect();
        let pod_cidrs = skerry_api::node::pod_cidrs(node)
            .iter()
            .filter_map(|c| Cidr::parse(c).ok())
            .collect();
        Peer {
            name: node.metadata.name.clone().unwrap_or_default(),
            internal_ips,
            pod_cidrs,
        }
    }
}

/// One route of ours: a peer's pod range through that peer's address on our link (host-gw),
/// or through the peer's range network address on the overlay device, `onlink` (VXLAN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: Cidr,
    pub gateway: IpAddr,
    pub dev: String,
    /// The gateway is on the device without any prefix of ours covering it.
    pub onlink: bool,
}

/// The overlay this node has: its device, and the underlay address tunnels leave from (whose
/// family a peer's tunnel address must share).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    pub dev: String,
    pub local: IpAddr,
}

/// What the overlay device needs to reach one peer range's gateway: a permanent neighbour
/// entry `gateway -> mac` and a forwarding entry `mac -> remote`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Vtep {
    /// The peer range's network address (the route's gateway).
    pub gateway: IpAddr,
    /// The peer's VTEP MAC, derived from `remote` ([`super::vxlan::vtep_mac`]).
    pub mac: String,
    /// The peer's underlay address (its InternalIP of the tunnel's family).
    pub remote: IpAddr,
}

/// A route in the table as listed: its destination, gateway, device and protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub dst: Cidr,
    pub gateway: Option<IpAddr>,
    pub dev: Option<String>,
    /// The protocol as `ip` prints it (a name from `rt_protos` or a number).
    pub protocol: Option<String>,
    /// Listed with the `onlink` flag.
    pub onlink: bool,
}

/// A peer range that got no route, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unroutable {
    pub node: String,
    pub dst: Cidr,
    pub why: String,
}

/// The changes that bring the table to the wanted state.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Routes to write (added, or ours with another gateway or device: replaced).
    pub install: Vec<Route>,
    /// Our routes no Node wants any more (a node removed, or its range or address changed).
    pub remove: Vec<Cidr>,
    /// Ranges left alone because a route we did not install already covers the same
    /// destination.
    pub foreign: Vec<Cidr>,
    /// Ranges with no path (the peer is not on a subnet of our link and there is no overlay,
    /// or it has no address of the family needed).
    pub unroutable: Vec<Unroutable>,
    /// The overlay entries the routed off-link ranges need: the whole wanted set, which the
    /// overlay's own sync compares with the device (the device is ours alone).
    pub vteps: Vec<Vtep>,
    /// This node's own pod ranges (the overlay device's addresses).
    pub own_ranges: Vec<Cidr>,
}

impl Plan {
    /// Whether nothing is to be changed.
    pub fn is_empty(&self) -> bool {
        self.install.is_empty() && self.remove.is_empty()
    }
}

/// The plan for node `me` whose link `dev` holds `link_prefixes`, given every Node's peer view
/// and the table's routes (`ours` those with our protocol, `others` the rest). A peer on a
/// subnet of the link gets a host-gw route; another one the overlay's, when there is one.
pub fn plan(
    me: &str,
    dev: &str,
    link_prefixes: &[Cidr],
    peers: &[Peer],
    ours: &[Listed],
    others: &[Listed],
    overlay: Option<&Overlay>,
) -> Plan {
    let mut out = Plan::default();
    if let Some(p) = peers.iter().find(|p| p.name == me) {
        out.own_ranges = p.pod_cidrs.clone();
    }
    let foreign_dsts: BTreeSet<Cidr> = others.iter().map(|r| r.dst).collect();
    // The wanted routes by destination; a range claimed by two peers (a stale Node during a
    // re-allocation) goes to the first by name, so every node picks the same.
    let mut wanted: BTreeMap<Cidr, Route> = BTreeMap::new();
    let mut sorted: Vec<&Peer> = peers.iter().filter(|p| p.name != me).collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for peer in sorted {
        for &dst in &peer.pod_cidrs {
            if wanted.contains_key(&dst) {
                continue;
            }
            let same_family: Vec<IpAddr> = peer
                .internal_ips
                .iter()
                .copied()
                .filter(|ip| ip.is_ipv4() == dst.is_ipv4())
                .collect();
            let direct = same_family
                .iter()
                .copied()
                .find(|ip| link_prefixes.iter().any(|p| p.contains(*ip)));
            // Off the link: through the overlay, to the peer's address of the tunnel's family.
            let tunnel = overlay.and_then(|o| {
                peer.internal_ips
                    .iter()
                    .copied()
                    .find(|ip| ip.is_ipv4() == o.local.is_ipv4() && *ip != o.local)
                    .map(|remote| (o, remote))
            });
            let route = match (direct, tunnel) {
                (Some(gateway), _) => Route {
                    dst,
                    gateway,
                    dev: dev.to_string(),
                    onlink: false,
                },
                (None, Some((o, _))) => Route {
                    dst,
                    gateway: dst.addr,
                    dev: o.dev.clone(),
                    onlink: true,
                },
                (None, None) => {
                    let why = if overlay.is_some() {
                        "the node is off this link and has no InternalIP of the overlay's family"
                            .to_string()
                    } else if same_family.is_empty() {
                        "the node has no InternalIP of the range's family".to_string()
                    } else {
                        format!(
                            "no address of the node ({}) is on a subnet of {dev}, and there is no overlay",
                            same_family
                                .iter()
                                .map(IpAddr::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    };
                    out.unroutable.push(Unroutable {
                        node: peer.name.clone(),
                        dst,
                        why,
                    });
                    continue;
                }
            };
            if foreign_dsts.contains(&dst) {
                out.foreign.push(dst);
                continue;
            }
            if let (None, Some((_, remote))) = (direct, tunnel) {
                out.vteps.push(Vtep {
                    gateway: dst.addr,
                    mac: super::vxlan::vtep_mac(remote),
                    remote,
                });
            }
            wanted.insert(dst, route);
        }
    }
    let mut have: BTreeMap<Cidr, &Listed> = BTreeMap::new();
    for r in ours {
        have.insert(r.dst, r);
    }
    for (dst, route) in &wanted {
        let same = have.get(dst).is_some_and(|r| {
            r.gateway == Some(route.gateway)
                && r.dev.as_deref() == Some(route.dev.as_str())
                && r.onlink == route.onlink
        });
        if !same {
            out.install.push(route.clone());
        }
    }
    for dst in have.keys() {
        if !wanted.contains_key(dst) {
            out.remove.push(*dst);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).expect("cidr")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn peer(name: &str, ips: &[&str], cidrs: &[&str]) -> Peer {
        Peer {
            name: name.into(),
            internal_ips: ips.iter().map(|s| ip(s)).collect(),
            pod_cidrs: cidrs.iter().map(|s| cidr(s)).collect(),
        }
    }

    fn ours(dst: &str, gw: &str, dev: &str) -> Listed {
        Listed {
            dst: cidr(dst),
            gateway: Some(ip(gw)),
            dev: Some(dev.into()),
            protocol: Some("110".into()),
            onlink: false,
        }
    }

    #[test]
    fn cidr_parses_masks_and_contains() {
        assert_eq!(cidr("10.42.1.7/24").to_string(), "10.42.1.0/24");
        assert_eq!(cidr("10.42.1.7").to_string(), "10.42.1.7/32");
        assert_eq!(cidr("fd00:42::1/64").to_string(), "fd00:42::/64");
        assert_eq!(cidr("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert!(cidr("10.42.0.0/16").contains(ip("10.42.200.1")));
        assert!(!cidr("10.42.0.0/16").contains(ip("10.43.0.1")));
        assert!(!cidr("10.42.0.0/16").contains(ip("::1")));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("default").is_err());
    }

    #[test]
    fn peers_on_the_link_get_routes_and_self_is_skipped() {
        let link = [cidr("10.77.0.1/24")];
        let peers = [
            peer("a", &["10.77.0.1"], &["10.42.0.0/24"]),
            peer("b", &["10.77.0.2"], &["10.42.1.0/24"]),
            peer("c", &["10.77.0.3"], &["10.42.2.0/24"]),
        ];
        let p = plan("a", "eth0", &link, &peers, &[], &[], None);
        assert_eq!(
            p.install,
            vec![
                Route {
                    dst: cidr("10.42.1.0/24"),
                    gateway: ip("10.77.0.2"),
                    dev: "eth0".into(),
                    onlink: false,
                },
                Route {
                    dst: cidr("10.42.2.0/24"),
                    gateway: ip("10.77.0.3"),
                    dev: "eth0".into(),
                    onlink: false,
                },
            ]
        );
        assert!(p.remove.is_empty() && p.unroutable.is_empty());
    }

    #[test]
    fn a_routed_table_needs_nothing_and_stale_routes_go() {
        let link = [cidr("10.77.0.1/24")];
        let peers = [peer("b", &["10.77.0.2"], &["10.42.1.0/24"])];
        let table = [
            ours("10.42.1.0/24", "10.77.0.2", "eth0"),
            ours("10.42.9.0/24", "10.77.0.9", "eth0"),
        ];
        let p = plan("a", "eth0", &link, &peers, &table, &[], None);
        assert!(p.install.is_empty());
        assert_eq!(p.remove, vec![cidr("10.42.9.0/24")]);
    }

    #[test]
    fn a_changed_address_replaces_the_route() {
        let link = [cidr("10.77.0.1/24")];
        let peers = [peer("b", &["10.77.0.20"], &["10.42.1.0/24"])];
        let table = [ours("10.42.1.0/24", "10.77.0.2", "eth0")];
        let p = plan("a", "eth0", &link, &peers, &table, &[], None);
        assert_eq!(p.install.len(), 1);
        assert_eq!(p.install[0].gateway, ip("10.77.0.20"));
        assert!(p.remove.is_empty());
    }

    #[test]
    fn foreign_routes_win_and_off_link_peers_are_reported() {
        let link = [cidr("10.77.0.1/24")];
        let peers = [
            peer("b", &["10.77.0.2"], &["10.42.1.0/24"]),
            peer("far", &["192.168.5.5"], &["10.42.2.0/24"]),
            peer("v4only", &["10.77.0.4"], &["fd00:42:4::/64"]),
        ];
        let others = [Listed {
            dst: cidr("10.42.1.0/24"),
            gateway: Some(ip("10.77.0.254")),
            dev: Some("eth0".into()),
            protocol: Some("static".into()),
            onlink: false,
        }];
        let p = plan("a", "eth0", &link, &peers, &[], &others, None);
        assert!(p.install.is_empty());
        assert_eq!(p.foreign, vec![cidr("10.42.1.0/24")]);
        assert_eq!(p.unroutable.len(), 2);
        assert!(p.unroutable[0].why.contains("192.168.5.5"));
        assert!(p.unroutable[1].why.contains("family"));
    }

    #[test]
    fn peers_behind_a_router_go_through_the_overlay_and_on_link_ones_stay_direct() {
        let link = [cidr("10.77.0.1/24")];
        let overlay = Overlay {
            dev: "skerry-vxlan".into(),
            local: ip("10.77.0.1"),
        };
        let peers = [
            peer("a", &["10.77.0.1"], &["10.42.0.0/24"]),
            peer("b", &["10.77.0.2"], &["10.42.1.0/24"]),
            peer("c", &["10.78.0.3"], &["10.42.2.0/24", "fd00:42:2::/64"]),
            peer("v6", &["fd00::9"], &["10.42.9.0/24"]),
        ];
        let p = plan("a", "eth0", &link, &peers, &[], &[], Some(&overlay));
        assert_eq!(p.own_ranges, vec![cidr("10.42.0.0/24")]);
        let by_dst = |d: &str| {
            p.install
                .iter()
                .find(|r| r.dst == cidr(d))
                .cloned()
                .expect("route")
        };
        assert_eq!(by_dst("10.42.1.0/24").dev, "eth0", "on the link: host-gw");
        let c = by_dst("10.42.2.0/24");
        assert_eq!(
            (c.gateway, c.dev.as_str(), c.onlink),
            (ip("10.42.2.0"), "skerry-vxlan", true)
        );
        assert_eq!(by_dst("fd00:42:2::/64").gateway, ip("fd00:42:2::"));
        assert_eq!(
            p.vteps,
            vec![
                Vtep {
                    gateway: ip("10.42.2.0"),
                    mac: "0e:6b:0a:4e:00:03".into(),
                    remote: ip("10.78.0.3"),
                },
                Vtep {
                    gateway: ip("fd00:42:2::"),
                    mac: "0e:6b:0a:4e:00:03".into(),
                    remote: ip("10.78.0.3"),
                },
            ]
        );
        // No address of the tunnel's family: nothing to send the tunnel to.
        assert_eq!(p.unroutable.len(), 1);
        assert_eq!(p.unroutable[0].node, "v6");

        // The same table again: nothing to do; a listed route without `onlink` is rewritten.
        let listed: Vec<Listed> = p
            .install
            .iter()
            .map(|r| Listed {
                dst: r.dst,
                gateway: Some(r.gateway),
                dev: Some(r.dev.clone()),
                protocol: Some("110".into()),
                onlink: r.onlink,
            })
            .collect();
        assert!(plan("a", "eth0", &link, &peers, &listed, &[], Some(&overlay)).is_empty());
        let mut flagless = listed.clone();
        for l in &mut flagless {
            l.onlink = false;
        }
        assert_eq!(
            plan("a", "eth0", &link, &peers, &flagless, &[], Some(&overlay))
                .install
                .len(),
            2
        );
    }

    #[test]
    fn node_objects_are_read_for_internal_ips_and_pod_cidrs() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "b"},
            "spec": {"podCIDR": "10.42.1.0/24"},
            "status": {"addresses": [
                {"type": "Hostname", "address": "b"},
                {"type": "InternalIP", "address": "10.77.0.2"},
                {"type": "InternalIP", "address": "not-an-ip"}
            ]}
        }))
        .expect("node");
        assert_eq!(
            Peer::from_node(&node),
            peer("b", &["10.77.0.2"], &["10.42.1.0/24"])
        );
    }
}
