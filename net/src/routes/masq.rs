//! Egress masquerade and forwarding: traffic from the cluster's pod ranges to anywhere outside
//! them leaves with the node's address; traffic between pod ranges (across boxes too) keeps
//! its pod addresses. flannel's `--ip-masq` rules (`pkg/trafficmngr/iptables`) in nftables:
//! pod to pod returns, pod to multicast returns, pod to anything else is masqueraded with
//! `fully-random` ports (flannel's `--random-fully`).
//!
//! One table of our own per family (`ip skerry-nat`, `ip6 skerry-nat`), written in one
//! `nft -f` transaction that declares the table, deletes it and declares it again with its
//! chain: the kernel swaps the whole table atomically, no packet sees half of it, and no
//! other table is named, so other programs' rules stay as they were.
//!
//! The masquerade itself matches routed packets only (pod to pod on one node stays on the
//! bridge, never leaves the range, and needs no NAT). The bridge needs the kernel to forward
//! between it and the node's link: `net.ipv4.ip_forward` (and IPv6's `conf.all.forwarding`
//! when a range is IPv6). The service proxy needs one more thing of the bridge: a pod reaching
//! a ClusterIP whose endpoint sits on the same bridge gets its answer bridged straight back,
//! which must pass netfilter to be un-DNATed (else the client sees the endpoint's address and
//! resets): `net.bridge.bridge-nf-call-iptables` (and `-ip6tables`) on, as kube-proxy and
//! the kubelet require, where the kernel has `br_netfilter`.
//!
//! The same table clamps the MSS of TCP connections forwarded out of the VXLAN overlay
//! ([`super::vxlan`]) to the route's MTU (`tcp option maxseg size set rt mtu`): pods keep their
//! bridge's 1500 bytes, the tunnel carries 50 fewer, and a pod must not depend on an ICMP
//! "fragmentation needed" finding its way back to learn that.

use std::io::Write;
use std::process::{Command, Stdio};

use super::plan::Cidr;

/// nftables' command line (Debian's `nftables` package).
pub const NFT: &str = "nft";
/// Our table's name in both families.
pub const TABLE: &str = "skerry-nat";
/// The chain, hooked at `postrouting` with the `srcnat` priority (100), where masquerading
/// belongs (nftables' standard priority names, `nft(8)` "CHAINS").
pub const CHAIN: &str = "postrouting";
/// The chain clamping the MSS of TCP connections that leave through the overlay, hooked at
/// `forward` with the `mangle` priority (-150), where packet fields are rewritten.
pub const CLAMP_CHAIN: &str = "overlay-mss";
/// IPv4 multicast (RFC 5771): not masqueraded, as flannel leaves `224.0.0.0/4` alone.
const MULTICAST_V4: &str = "224.0.0.0/4";
/// IPv6 multicast (RFC 4291), the same for IPv6 (flannel's `ff00::/8`).
const MULTICAST_V6: &str = "ff00::/8";
/// `/proc/sys` file of `net.ipv4.ip_forward`.
const IPV4_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// `/proc/sys` file of `net.ipv6.conf.all.forwarding`.
const IPV6_FORWARD: &str = "/proc/sys/net/ipv6/conf/all/forwarding";

/// Why the masquerade or forwarding could not be set.
#[derive(Debug, thiserror::Error)]
pub enum MasqError {
    #[error("run {NFT}: {0}")]
    Spawn(std::io::Error),
    #[error("{NFT} -f: {0}")]
    Rejected(String),
    #[error("write {path}: {source}")]
    Sysctl {
        path: &'static str,
        source: std::io::Error,
    },
}

/// The ruleset for `cluster_cidrs`: both families' tables, each created (if absent), deleted
/// and, for a family with ranges, declared again with its rules. A family without ranges ends
/// up with no table.
pub fn ruleset(cluster_cidrs: &[Cidr]) -> String {
    let mut out = String::new();
    for (family, v4, multicast, addr) in [
        ("ip", true, MULTICAST_V4, "ip"),
        ("ip6", false, MULTICAST_V6, "ip6"),
    ] {
        let ranges: Vec<String> = cluster_cidrs
            .iter()
            .filter(|c| c.is_ipv4() == v4)
            .map(Cidr::to_string)
            .collect();
        out.push_str(&format!(
            "table {family} {TABLE}\ndelete table {family} {TABLE}\n"
        ));
        if ranges.is_empty() {
            continue;
        }
        let set = format!("{{ {} }}", ranges.join(", "));
        out.push_str(&format!(
            "table {family} {TABLE} {{\n\
             \tchain {CHAIN} {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\t{addr} saddr {set} {addr} daddr {set} return\n\
             \t\t{addr} saddr {set} {addr} daddr {multicast} return\n\
             \t\t{addr} saddr {set} masquerade fully-random\n\
             \t}}\n\
             \tchain {CLAMP_CHAIN} {{\n\
             \t\ttype filter hook forward priority mangle; policy accept;\n\
             \t\toifname \"{overlay}\" tcp flags syn / syn,rst tcp option maxseg size set rt mtu\n\
             \t}}\n\
             }}\n",
            overlay = super::vxlan::DEVICE
        ));
    }
    out
}

/// Applies [`ruleset`] in one `nft -f -` transaction.
pub fn apply(cluster_cidrs: &[Cidr]) -> Result<(), MasqError> {
    let text = ruleset(cluster_cidrs);
    let mut child = Command::new(NFT)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(MasqError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).map_err(MasqError::Spawn)?;
    }
    let out = child.wait_with_output().map_err(MasqError::Spawn)?;
    if !out.status.success() {
        return Err(MasqError::Rejected(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// Whether our IPv4 table is in place (a drift check: someone ran `nft flush ruleset`).
pub fn present(cluster_cidrs: &[Cidr]) -> bool {
    [("ip", true), ("ip6", false)]
        .iter()
        .filter(|(_, v4)| cluster_cidrs.iter().any(|c| c.is_ipv4() == *v4))
        .all(|(family, _)| {
            Command::new(NFT)
                .args(["list", "chain", family, TABLE, CHAIN])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// Turns forwarding on for the families of `cluster_cidrs` (the calling thread's network
/// namespace: `/proc/sys/net` is per namespace).
pub fn enable_forwarding(cluster_cidrs: &[Cidr]) -> Result<(), MasqError> {
    let mut files = vec![IPV4_FORWARD];
    let ipv6 = cluster_cidrs.iter().any(|c| !c.is_ipv4());
    if ipv6 {
        files.push(IPV6_FORWARD);
    }
    for path in files {
        std::fs::write(path, "1").map_err(|source| MasqError::Sysctl { path, source })?;
    }
    // Bridged packets through netfilter, where `br_netfilter` is there (its sysctls exist
    // only then; without it, the service proxy's same-node answers cannot be un-DNATed).
    let mut bridge = vec![BRIDGE_NF_CALL_IPTABLES];
    if ipv6 {
        bridge.push(BRIDGE_NF_CALL_IP6TABLES);
    }
    for path in bridge {
        if std::path::Path::new(path).exists() {
            std::fs::write(path, "1").map_err(|source| MasqError::Sysctl { path, source })?;
        } else {
            tracing::warn!(
                path,
                "no br_netfilter: a pod reaching a Service whose endpoint is on its own node gets no answer"
            );
        }
    }
    Ok(())
}

/// Bridged IPv4 through netfilter (`br_netfilter`), per network namespace.
const BRIDGE_NF_CALL_IPTABLES: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";
/// Bridged IPv6 through netfilter.
const BRIDGE_NF_CALL_IP6TABLES: &str = "/proc/sys/net/bridge/bridge-nf-call-ip6tables";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_names_only_our_tables_and_skips_absent_families() {
        let text = ruleset(&[Cidr::parse("10.42.0.0/16").expect("cidr")]);
        assert!(text.contains("ip saddr { 10.42.0.0/16 } ip daddr { 10.42.0.0/16 } return"));
        assert!(text.contains("ip saddr { 10.42.0.0/16 } masquerade fully-random"));
        assert!(text.contains(
            "oifname \"skerry-vxlan\" tcp flags syn / syn,rst tcp option maxseg size set rt mtu"
        ));
        assert!(text.contains("delete table ip6 skerry-nat"));
        assert!(!text.contains("table ip6 skerry-nat {"));
        for line in text
            .lines()
            .filter(|l| l.starts_with("table") || l.starts_with("delete"))
        {
            assert!(line.contains(TABLE), "{line}");
        }
    }

    #[test]
    fn dual_stack_gets_both_tables() {
        let text = ruleset(&[
            Cidr::parse("10.42.0.0/16").expect("cidr"),
            Cidr::parse("fd00:42::/56").expect("cidr"),
        ]);
        assert!(text.contains("ip6 saddr { fd00:42::/56 } ip6 daddr ff00::/8 return"));
    }
}
