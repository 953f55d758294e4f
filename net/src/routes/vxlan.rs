//! The VXLAN overlay for peers on another segment: flannel's `vxlan` backend with its
//! `DirectRouting` option, where a peer on a subnet of our link still gets a plain host-gw
//! route ([`super::plan`]) and only a peer behind a router is reached through the tunnel.
//!
//! One device per node, [`DEVICE`], VNI [`VNI`] on UDP port [`PORT`], with address learning
//! off: every entry it needs is written by us, level-triggered like the routes. For a peer's
//! pod range `R` at underlay address `U`:
//!
//! - a route `R via R.0 dev skerry-vxlan onlink` (our protocol number, like every route of
//!   ours): the gateway is the peer's range network address, which lives on the peer's own
//!   device, so no address of ours has to be routable for it;
//! - a permanent neighbour entry `R.0 lladdr MAC(U)`: the kernel never has to ARP across the
//!   tunnel;
//! - a forwarding entry `MAC(U) dst U`: frames for that MAC go in UDP to the peer.
//!
//! The trick that keeps this stateless: the VTEP's MAC is derived from the node's underlay
//! address ([`vtep_mac`]), so every node computes every peer's MAC from its Node object alone.
//! flannel publishes each node's MAC in a Node annotation instead; deriving it needs no write
//! to the API, no ordering between a node creating its device and its peers reading the
//! annotation, and it is the same after a restart or a recreated device.
//!
//! The device also holds this node's range network address (`R.0/32`), as flannel's does, so
//! the host's own connections to a remote pod leave with an address inside the cluster's
//! ranges and their answers come back through the tunnel, not around it.
//!
//! Packets grow by the tunnel's headers ([`OVERHEAD_V4`]) while pods keep the 1500-byte MTU
//! of their bridge; the masquerade table clamps the MSS of TCP connections leaving through
//! the device to its route's MTU ([`super::masq`]), so no connection depends on ICMP
//! "fragmentation needed" reaching the pod.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde::Deserialize;

use super::ip::{IpError, json, run};
use super::plan::{Cidr, Vtep};

/// The device's name (flannel's is `flannel.1`; ours is named for the project, within the
/// kernel's 15-byte `IFNAMSIZ`).
pub const DEVICE: &str = "skerry-vxlan";
/// The VXLAN network identifier: one overlay per cluster, flannel's default VNI 1.
pub const VNI: u32 = 1;
/// The UDP port: 8472, the Linux kernel's historical VXLAN port that flannel, Cilium and
/// k3s use, rather than IANA's 4789 (RFC 7348), so a box's firewall rules written for those
/// clusters apply unchanged.
pub const PORT: u16 = 8472;
/// What the tunnel adds to a packet over IPv4: outer IPv4 (20) + UDP (8) + VXLAN (8) + the
/// inner Ethernet header (14) = 50 bytes (RFC 7348 section 5). The kernel sizes the device's
/// MTU as the link's minus this when the device is created over a link.
pub const OVERHEAD_V4: u32 = 50;
/// The first two bytes of a VTEP MAC: `0x0e` has the locally administered bit set and the
/// multicast bit clear (IEEE 802 "U/L" and "I/G" bits), so it can collide with no vendor's
/// address; `0x6b` is 'k'. The last four bytes are the underlay address's last four.
pub const VTEP_MAC_PREFIX: [u8; 2] = [0x0e, 0x6b];

/// The VTEP MAC of the node at underlay address `ip`: [`VTEP_MAC_PREFIX`] and the address's
/// last four bytes (the whole IPv4 address; an IPv6 address's interface identifier tail).
pub fn vtep_mac(ip: IpAddr) -> String {
    let tail: [u8; 4] = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    let [p0, p1] = VTEP_MAC_PREFIX;
    format!(
        "{p0:02x}:{p1:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        tail[0], tail[1], tail[2], tail[3]
    )
}

#[derive(Deserialize)]
struct JsonLink {
    #[serde(default)]
    address: String,
    #[serde(default)]
    linkinfo: Option<JsonLinkInfo>,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    addr_info: Vec<JsonAddr>,
}

#[derive(Deserialize)]
struct JsonLinkInfo {
    #[serde(default)]
    info_kind: String,
    #[serde(default)]
    info_data: Option<JsonVxlan>,
}

#[derive(Deserialize)]
struct JsonVxlan {
    #[serde(default)]
    id: u32,
    #[serde(default)]
    local: Option<String>,
    #[serde(default)]
    local6: Option<String>,
    #[serde(default)]
    link: Option<String>,
    #[serde(default)]
    port: u16,
    #[serde(default)]
    learning: bool,
}

#[derive(Deserialize)]
struct JsonAddr {
    local: String,
    prefixlen: u8,
}

#[derive(Deserialize)]
struct JsonNeigh {
    dst: String,
    #[serde(default)]
    lladdr: Option<String>,
}

#[derive(Deserialize)]
struct JsonFdb {
    mac: String,
    #[serde(default)]
    dst: Option<String>,
}

/// What the device must be: over `link`, sourcing tunnels from `local`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The underlay address (the node's InternalIP).
    pub local: IpAddr,
    /// The link the tunnel's packets leave on.
    pub link: String,
}

impl Device {
    /// Creates the device, or recreates it when it exists with other parameters (the node's
    /// address or link changed, or someone else's device took the name), and sets it up.
    pub fn ensure(&self) -> Result<(), IpError> {
        let mac = vtep_mac(self.local);
        let found: Option<Vec<JsonLink>> =
            json(&["-details", "-json", "link", "show", "dev", DEVICE]).ok();
        let current = found.as_ref().and_then(|l| l.first());
        let fits = current.is_some_and(|l| {
            let data = l
                .linkinfo
                .as_ref()
                .filter(|i| i.info_kind == "vxlan")
                .and_then(|i| i.info_data.as_ref());
            data.is_some_and(|d| {
                let local = d.local.as_deref().or(d.local6.as_deref());
                d.id == VNI
                    && d.port == PORT
                    && !d.learning
                    && local.and_then(|a| a.parse().ok()) == Some(self.local)
                    && d.link.as_deref() == Some(self.link.as_str())
            }) && l.address == mac
        });
        if current.is_some() && !fits {
            run(&["link", "del", "dev", DEVICE])?;
        }
        if !fits {
            let vni = VNI.to_string();
            let port = PORT.to_string();
            let local = self.local.to_string();
            run(&[
                "link",
                "add",
                DEVICE,
                "address",
                &mac,
                "type",
                "vxlan",
                "id",
                &vni,
                "local",
                &local,
                "dev",
                &self.link,
                "dstport",
                &port,
                "nolearning",
            ])?;
        }
        let up = current.is_some_and(|l| fits && l.flags.iter().any(|f| f == "UP"));
        if !up {
            run(&["link", "set", "dev", DEVICE, "up"])?;
        }
        Ok(())
    }
}

/// Gives the device exactly the network addresses of `own` (this node's pod ranges) as host
/// prefixes, removing any other address.
pub fn sync_addresses(own: &[Cidr]) -> Result<(), IpError> {
    let links: Vec<JsonLink> = json(&["-json", "addr", "show", "dev", DEVICE])?;
    let want: BTreeSet<Cidr> = own
        .iter()
        .map(|c| Cidr {
            addr: c.addr,
            prefix: if c.is_ipv4() { 32 } else { 128 },
        })
        .collect();
    let have: BTreeSet<Cidr> = links
        .iter()
        .flat_map(|l| &l.addr_info)
        // IPv6 link-local addresses the kernel gives every device stay.
        .filter(|a| !a.local.starts_with("fe80:"))
        .filter_map(|a| Cidr::parse(&format!("{}/{}", a.local, a.prefixlen)).ok())
        .collect();
    for extra in have.difference(&want) {
        run(&["addr", "del", &extra.to_string(), "dev", DEVICE])?;
    }
    for missing in want.difference(&have) {
        run(&["addr", "add", &missing.to_string(), "dev", DEVICE])?;
    }
    Ok(())
}

/// What changed in one [`sync_entries`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EntriesReport {
    /// Neighbour and forwarding entries written.
    pub written: usize,
    /// Entries removed (their peer gone or moved).
    pub removed: usize,
}

/// Brings the device's neighbour and forwarding entries to exactly `vteps`: the device is
/// ours alone, so an entry no peer wants is removed whoever wrote it.
pub fn sync_entries(vteps: &[Vtep]) -> Result<EntriesReport, IpError> {
    let mut report = EntriesReport::default();
    let mut neighs: Vec<JsonNeigh> = json(&["-json", "-4", "neigh", "show", "dev", DEVICE])?;
    neighs.extend(json::<Vec<JsonNeigh>>(&[
        "-json", "-6", "neigh", "show", "dev", DEVICE,
    ])?);
    let fdb: Vec<JsonFdb> = bridge_json(&["-json", "fdb", "show", "dev", DEVICE])?;

    let want_neigh: BTreeSet<(IpAddr, String)> =
        vteps.iter().map(|v| (v.gateway, v.mac.clone())).collect();
    let want_fdb: BTreeSet<(String, IpAddr)> =
        vteps.iter().map(|v| (v.mac.clone(), v.remote)).collect();
    let have_neigh: BTreeSet<(IpAddr, String)> = neighs
        .iter()
        .filter_map(|n| Some((n.dst.parse().ok()?, n.lladdr.clone()?)))
        .collect();
    let have_fdb: BTreeSet<(String, IpAddr)> = fdb
        .iter()
        .filter_map(|f| Some((f.mac.clone(), f.dst.as_deref()?.parse().ok()?)))
        .collect();

    for (ip, _) in have_neigh.difference(&want_neigh) {
        if !want_neigh.iter().any(|(w, _)| w == ip) {
            run(&["neigh", "del", &ip.to_string(), "dev", DEVICE])?;
            report.removed += 1;
        }
    }
    for (ip, mac) in want_neigh.difference(&have_neigh) {
        run(&[
            "neigh",
            "replace",
            &ip.to_string(),
            "lladdr",
            mac,
            "dev",
            DEVICE,
            "nud",
            "permanent",
        ])?;
        report.written += 1;
    }
    for (mac, dst) in have_fdb.difference(&want_fdb) {
        bridge(&["fdb", "del", mac, "dev", DEVICE, "dst", &dst.to_string()])?;
        report.removed += 1;
    }
    for (mac, dst) in want_fdb.difference(&have_fdb) {
        bridge(&[
            "fdb",
            "replace",
            mac,
            "dev",
            DEVICE,
            "dst",
            &dst.to_string(),
            "self",
            "permanent",
        ])?;
        report.written += 1;
    }
    Ok(report)
}

/// iproute2's `bridge` program, which owns the forwarding database (`ip` has no `fdb`).
pub const BRIDGE: &str = "bridge";

fn bridge(args: &[&str]) -> Result<Vec<u8>, IpError> {
    super::ip::run_program(BRIDGE, args)
}

fn bridge_json<T: for<'de> Deserialize<'de>>(args: &[&str]) -> Result<T, IpError> {
    let out = bridge(args)?;
    super::ip::parse_json(args, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vtep_macs_are_local_unicast_and_follow_the_address() {
        assert_eq!(
            vtep_mac("10.77.0.3".parse().expect("ip")),
            "0e:6b:0a:4d:00:03"
        );
        assert_eq!(
            vtep_mac("fd00::1:2:a0b:c0d".parse().expect("ip")),
            "0e:6b:0a:0b:0c:0d"
        );
        let first = VTEP_MAC_PREFIX[0];
        assert_eq!(first & 0x02, 0x02, "locally administered");
        assert_eq!(first & 0x01, 0, "unicast");
        assert_ne!(
            vtep_mac("10.77.0.3".parse().expect("ip")),
            vtep_mac("10.78.0.3".parse().expect("ip"))
        );
    }
}
