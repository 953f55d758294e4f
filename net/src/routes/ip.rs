//! The routing table through iproute2's `ip`: reads with `-json` (parsed with serde, never
//! scraped), writes one route per call with our protocol number. The process runs in the
//! caller's network namespace, so whatever thread calls this programs the namespace it is in.

use std::net::IpAddr;
use std::process::Command;

use serde::Deserialize;

use super::plan::{Cidr, Listed, Route};

/// The program run: iproute2's, found on `PATH` (Debian's `iproute2` package).
pub const IP: &str = "ip";

/// The routing protocol number our routes carry (`ip route ... proto 110`), so they are told
/// from every other route, found again after a restart and removed when no Node wants them.
/// Not one of the numbers iproute2's `rt_protos` names (0-4 for the kernel's own, 8-18, 42,
/// 99, 186-192 for routing daemons), and below 256 as `rtm_protocol` is one byte.
pub const RT_PROTO: u8 = 110;

/// The table routes go in (`RT_TABLE_MAIN`), where pod traffic's lookup lands without rules.
pub const TABLE: &str = "main";

/// Why `ip` failed.
#[derive(Debug, thiserror::Error)]
pub enum IpError {
    #[error("run {IP}: {0}")]
    Spawn(std::io::Error),
    #[error("{args}: {stderr}")]
    Failed { args: String, stderr: String },
    #[error("{IP} {args}: unreadable JSON: {why}")]
    Json { args: String, why: String },
}

/// Runs `ip args`, returning stdout.
pub(crate) fn run(args: &[&str]) -> Result<Vec<u8>, IpError> {
    run_program(IP, args)
}

/// Runs `program args` (an iproute2 program), returning stdout.
pub(crate) fn run_program(program: &str, args: &[&str]) -> Result<Vec<u8>, IpError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(IpError::Spawn)?;
    if !out.status.success() {
        return Err(IpError::Failed {
            args: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out.stdout)
}

/// Runs `ip args` and parses its JSON.
pub(crate) fn json<T: for<'de> Deserialize<'de>>(args: &[&str]) -> Result<T, IpError> {
    let out = run(args)?;
    parse_json(args, &out)
}

/// Parses the JSON an iproute2 program printed for `args`.
pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(
    args: &[&str],
    out: &[u8],
) -> Result<T, IpError> {
    // `ip -json` prints nothing at all for an empty list on some versions.
    if out.iter().all(u8::is_ascii_whitespace) {
        return serde_json::from_str("[]").map_err(|e| IpError::Json {
            args: args.join(" "),
            why: e.to_string(),
        });
    }
    serde_json::from_slice(out).map_err(|e| IpError::Json {
        args: args.join(" "),
        why: e.to_string(),
    })
}

#[derive(Deserialize)]
struct JsonRoute {
    dst: String,
    gateway: Option<String>,
    dev: Option<String>,
    protocol: Option<String>,
    #[serde(default)]
    flags: Vec<String>,
}

#[derive(Deserialize)]
struct JsonLink {
    #[serde(default)]
    addr_info: Vec<JsonAddr>,
}

#[derive(Deserialize)]
struct JsonAddr {
    local: String,
    prefixlen: u8,
    #[serde(default)]
    scope: String,
}

/// Whether a listed protocol is ours: `ip` prints a number it has no name for, and a name
/// from `rt_protos` if an administrator gave ours one.
fn is_ours(protocol: Option<&str>) -> bool {
    protocol.is_some_and(|p| p.parse::<u8>() == Ok(RT_PROTO))
}

/// The main table's routes of both families with a destination prefix (not `default`,
/// unreachable or multipath entries' parts), split into ours and the others.
pub fn list_routes() -> Result<(Vec<Listed>, Vec<Listed>), IpError> {
    let mut ours = Vec::new();
    let mut others = Vec::new();
    for family in ["-4", "-6"] {
        let routes: Vec<JsonRoute> = json(&["-json", family, "route", "show", "table", TABLE])?;
        for r in routes {
            let Ok(dst) = Cidr::parse(&r.dst) else {
                continue;
            };
            let listed = Listed {
                dst,
                gateway: r.gateway.as_deref().and_then(|g| g.parse().ok()),
                dev: r.dev,
                protocol: r.protocol,
                onlink: r.flags.iter().any(|f| f == "onlink"),
            };
            if is_ours(listed.protocol.as_deref()) {
                ours.push(listed);
            } else {
                others.push(listed);
            }
        }
    }
    Ok((ours, others))
}

/// The global-scope prefixes on `dev` (the subnets a host-gw peer must be on).
pub fn link_prefixes(dev: &str) -> Result<Vec<Cidr>, IpError> {
    let links: Vec<JsonLink> = json(&["-json", "addr", "show", "dev", dev])?;
    Ok(links
        .iter()
        .flat_map(|l| &l.addr_info)
        .filter(|a| a.scope == "global")
        .filter_map(|a| Cidr::parse(&format!("{}/{}", a.local, a.prefixlen)).ok())
        .collect())
}

/// The link that holds `ip` (the node's address), for a config that names none.
pub fn link_of(ip: IpAddr) -> Result<Option<String>, IpError> {
    #[derive(Deserialize)]
    struct Named {
        ifname: String,
        #[serde(default)]
        addr_info: Vec<JsonAddr>,
    }
    let links: Vec<Named> = json(&["-json", "addr", "show"])?;
    Ok(links
        .into_iter()
        .find(|l| l.addr_info.iter().any(|a| a.local.parse() == Ok(ip)))
        .map(|l| l.ifname))
}

/// Writes `route` (added, or ours replaced in place).
pub fn install(route: &Route) -> Result<(), IpError> {
    let dst = route.dst.to_string();
    let gw = route.gateway.to_string();
    let proto = RT_PROTO.to_string();
    let mut args = vec![
        "route", "replace", &dst, "via", &gw, "dev", &route.dev, "proto", &proto, "table", TABLE,
    ];
    if route.onlink {
        args.push("onlink");
    }
    run(&args).map(drop)
}

/// Removes our route to `dst` (only ours: the protocol is part of the match).
pub fn remove(dst: Cidr) -> Result<(), IpError> {
    let dst = dst.to_string();
    let proto = RT_PROTO.to_string();
    run(&["route", "del", &dst, "proto", &proto, "table", TABLE]).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_protocol_is_recognised_by_number_only() {
        assert!(is_ours(Some("110")));
        assert!(!is_ours(Some("kernel")));
        assert!(!is_ours(Some("static")));
        assert!(!is_ours(None));
    }
}
