//! The node's addresses (`nodestatus/setters.go`, `NodeAddress`, without a cloud provider):
//! InternalIP from `--node-ip`, else from `--hostname-override` when that is an IP, else the
//! address of the default route's interface (apimachinery's `ChooseHostInterface`); and
//! Hostname from `--hostname-override` or the host name.
//!
//! The trick carried here: the default route's address is found without listing interfaces
//! (which needs `getifaddrs` and so `unsafe`): `/proc/net/route` (or `ipv6_route`) gives the
//! default gateway, and a UDP socket *connected* to it, which sends nothing, is given by the
//! kernel the source address it would use on that route. A `--node-ip` is checked the same
//! way: binding a socket to it fails unless an interface of this host has it.
//!
//! Upstream's third step, a DNS lookup of the node name, is left out: on Debian the host
//! name resolves to `127.0.1.1` through `/etc/hosts`, which the kubelet then rejects as
//! loopback, so on the boxes skerry targets it only costs a resolver timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;

use k8s_openapi::api::core::v1::NodeAddress;

/// `InternalIP`.
pub const INTERNAL_IP: &str = "InternalIP";
/// `Hostname`.
pub const HOSTNAME: &str = "Hostname";

/// The `RTF_UP` and `RTF_GATEWAY` route flags (`linux/route.h`).
const RTF_UP: u32 = 0x1;
const RTF_GATEWAY: u32 = 0x2;
/// The discard port: the connected probe socket needs a port, and sends nothing to it.
const PROBE_PORT: u16 = 9;

/// The host's name as the kubelet takes it (`nodeutil.GetHostname`): the override if given,
/// else the kernel's node name; trimmed and lower-cased; empty is an error.
pub fn hostname(override_: Option<&str>) -> Result<String, String> {
    let raw = match override_ {
        Some(o) if !o.trim().is_empty() => o.to_string(),
        _ => rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
    };
    let name = raw.trim().to_lowercase();
    if name.is_empty() {
        return Err("empty hostname is invalid".to_string());
    }
    Ok(name)
}

/// Checks a `--node-ip` as the kubelet's `validateNodeIP` does: not loopback, link-local,
/// multicast or unspecified, and held by an interface of this host.
pub fn validate_node_ip(ip: IpAddr) -> Result<(), String> {
    let bad = |what: &str| Err(format!("nodeIP can't be {what} address"));
    if ip.is_loopback() {
        return bad("loopback");
    }
    if ip.is_multicast() {
        return bad("a multicast");
    }
    if ip.is_unspecified() {
        return bad("an all zeros");
    }
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    if link_local {
        return bad("a link-local unicast");
    }
    UdpSocket::bind(SocketAddr::new(ip, 0))
        .map(drop)
        .map_err(|_| format!("node IP: {ip:?} not found in the host's network interfaces"))
}

/// The default IPv4 gateway of a `/proc/net/route` table: the lowest-metric route to
/// 0.0.0.0/0 that is up and goes through a gateway.
pub fn default_gateway_v4(route_table: &str) -> Option<Ipv4Addr> {
    route_table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            if f.len() < 8 || f[1] != "00000000" || f[7] != "00000000" {
                return None;
            }
            let flags = u32::from_str_radix(f[3], 16).ok()?;
            if flags & (RTF_UP | RTF_GATEWAY) != RTF_UP | RTF_GATEWAY {
                return None;
            }
            // The table prints addresses as little-endian hex of the network-order word.
            let gw = u32::from_str_radix(f[2], 16).ok()?;
            let metric: u32 = f[6].parse().ok()?;
            Some((metric, Ipv4Addr::from(gw.swap_bytes())))
        })
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, gw)| gw)
}

/// The default IPv6 gateway of a `/proc/net/ipv6_route` table: the lowest-metric route to
/// ::/0 that is up and goes through a gateway.
pub fn default_gateway_v6(route_table: &str) -> Option<Ipv6Addr> {
    route_table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // dest dest_len src src_len next_hop metric refcnt use flags iface
            if f.len() < 10 || f[0] != "0".repeat(32) || f[1] != "00" {
                return None;
            }
            let flags = u32::from_str_radix(f[8], 16).ok()?;
            if flags & (RTF_UP | RTF_GATEWAY) != RTF_UP | RTF_GATEWAY {
                return None;
            }
            let hop = u128::from_str_radix(f[4], 16).ok()?;
            let metric = u32::from_str_radix(f[5], 16).ok()?;
            Some((metric, Ipv6Addr::from(hop)))
        })
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, gw)| gw)
}

/// The source address this host would use towards `gateway`.
fn source_towards(gateway: IpAddr) -> Option<IpAddr> {
    let any: IpAddr = match gateway {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind(SocketAddr::new(any, 0)).ok()?;
    socket.connect(SocketAddr::new(gateway, PROBE_PORT)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    validate_node_ip(ip).ok().map(|()| ip)
}

/// The address of the default route's interface, IPv4 first (`ChooseHostInterface`).
pub fn default_route_address(proc_dir: &Path) -> Result<IpAddr, String> {
    let v4 = std::fs::read_to_string(proc_dir.join("net/route"))
        .ok()
        .and_then(|t| default_gateway_v4(&t))
        .and_then(|gw| source_towards(gw.into()));
    if let Some(ip) = v4 {
        return Ok(ip);
    }
    std::fs::read_to_string(proc_dir.join("net/ipv6_route"))
        .ok()
        .and_then(|t| default_gateway_v6(&t))
        .and_then(|gw| source_towards(gw.into()))
        .ok_or_else(|| {
            "no default route with a gateway: pass --node-ip to choose the node's address"
                .to_string()
        })
}

/// The node's InternalIP: `--node-ip` (validated), an IP given as the host name, else the
/// default route's address (the kubelet's `NodeAddress` setter without its DNS lookup).
pub fn internal_ip(
    node_name: &str,
    node_ip: Option<IpAddr>,
    hostname: &str,
    proc_dir: &Path,
) -> Result<IpAddr, String> {
    match node_ip {
        Some(ip) => {
            validate_node_ip(ip).map_err(|e| format!("failed to validate nodeIP: {e}"))?;
            Ok(ip)
        }
        None => match hostname.parse::<IpAddr>() {
            Ok(ip) => Ok(ip),
            Err(_) => default_route_address(proc_dir)
                .map_err(|e| format!("can't get ip address of node {node_name}. error: {e}")),
        },
    }
}

/// The node's addresses: InternalIP then Hostname.
pub fn node_addresses(
    node_name: &str,
    node_ip: Option<IpAddr>,
    hostname: &str,
    proc_dir: &Path,
) -> Result<Vec<NodeAddress>, String> {
    let ip = internal_ip(node_name, node_ip, hostname, proc_dir)?;
    Ok(vec![
        NodeAddress {
            type_: INTERNAL_IP.to_string(),
            address: ip.to_string(),
        },
        NodeAddress {
            type_: HOSTNAME.to_string(),
            address: hostname.to_string(),
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_gateway_is_read_from_the_route_tables() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth1\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
                  eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(default_gateway_v4(v4), Some(Ipv4Addr::new(192, 0, 2, 1)));
        let no_default = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
                          eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n";
        assert_eq!(default_gateway_v4(no_default), None);
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                  fd000000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n";
        assert_eq!(default_gateway_v6(v6), Some("fd00::1".parse().expect("ip")));
    }

    #[test]
    fn node_ips_are_validated() {
        assert_eq!(
            validate_node_ip("127.0.0.1".parse().expect("ip")).unwrap_err(),
            "nodeIP can't be loopback address"
        );
        assert_eq!(
            validate_node_ip("0.0.0.0".parse().expect("ip")).unwrap_err(),
            "nodeIP can't be an all zeros address"
        );
        assert_eq!(
            validate_node_ip("169.254.1.1".parse().expect("ip")).unwrap_err(),
            "nodeIP can't be a link-local unicast address"
        );
        // TEST-NET-3: documentation space, on no interface of a test machine.
        assert!(
            validate_node_ip("203.0.113.77".parse().expect("ip"))
                .unwrap_err()
                .contains("not found in the host's network interfaces")
        );
    }

    #[test]
    fn the_hostname_is_trimmed_and_lower_cased() {
        assert_eq!(hostname(Some(" Edge-1 ")).expect("valid"), "edge-1");
        assert!(!hostname(None).expect("the kernel has a name").is_empty());
        let addrs = node_addresses("n", None, "192.0.2.200", Path::new("/nonexistent"))
            .expect("an IP host name is the InternalIP");
        assert_eq!(addrs[0].address, "192.0.2.200");
        assert_eq!(addrs[1].type_, "Hostname");
    }
}
