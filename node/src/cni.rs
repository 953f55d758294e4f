//! The pod network on one node: the CNI configuration skerry writes from the node's
//! podCIDRs, for the runtime (containerd's CRI plugin) to run when it creates a pod sandbox.
//! What k3s does with its built-in flannel, minus the overlay: one Linux bridge per node
//! (`cni0`, the gateway of the node's pod range), addresses from `host-local` over the
//! podCIDR, `portmap` for `hostPort`s. Routes between nodes come with the next issue.
//!
//! The configuration (a `.conflist`, CNI spec 1.0.0):
//! - `bridge` with `isGateway` (the bridge holds the range's first address and pods route
//!   through it) and `hairpinMode` (a pod reaching a Service that lands on itself gets its
//!   own packet back); `ipMasq` is off: masquerading everything that leaves the range would
//!   also hide pod addresses from other nodes' pods once routes exist, so egress NAT belongs
//!   with the routes between nodes;
//! - `host-local` IPAM over each podCIDR (IPv4 and IPv6 for a dual-stack node), the gateway
//!   its first address, the reservations in a data dir of skerry's own so they live and
//!   die with the node's root dir;
//! - `portmap` with the `portMappings` capability, which the runtime fills from `hostPort`s.
//!
//! `loopback` is not chained: it acts on the interface it is given, and the runtime runs it
//! itself for `lo` from the same plugin dir (containerd's `WithLoNetwork`). It is required in
//! the plugin dir all the same, with the others: a node whose plugins are missing stays
//! NotReady with a message naming them, rather than failing every pod sandbox.
//!
//! The trick carried here: the file is written to a temporary name the runtime ignores
//! (libcni loads only `.conf`, `.conflist` and `.json`), synced and renamed over the old one,
//! and the directory synced, so the runtime, which re-reads the directory when a sandbox is
//! created, sees the old configuration or the new one and never half of one.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::nodestatus::readiness::NETWORK_PLUGIN_NOT_READY;
use crate::nodestatus::{PodCidrHandler, Readiness};

/// The CNI spec version written: 1.0.0 is the newest Debian's plugins (1.1) and
/// containerd 1.6's libcni both speak.
pub const CNI_VERSION: &str = "1.0.0";
/// The network's name (the runtime's `CNI_ARGS`/results carry it; host-local keys its
/// reservations by it).
pub const NETWORK_NAME: &str = "skerry";
/// The file written: `10-` sorts it before configurations other packages drop into the same
/// dir, and libcni uses the first file in order.
pub const CONFLIST_FILE: &str = "10-skerry.conflist";
/// The bridge: k3s's and containerd's default name.
pub const BRIDGE_DEFAULT: &str = "cni0";
/// Where Debian's `containernetworking-plugins` installs the plugins.
pub const PLUGIN_DIR_DEFAULT: &str = "/usr/lib/cni";
/// The plugins the node needs.
pub const REQUIRED_PLUGINS: &[&str] = &["bridge", "host-local", "portmap", "loopback"];
/// The Debian package that has them.
pub const PLUGINS_PACKAGE: &str = "containernetworking-plugins";
/// The longest IPv4 prefix a pod range may have: a /30 leaves the gateway and one pod.
const IPV4_PREFIX_MAX: u8 = 30;
/// The longest IPv6 prefix a pod range may have (the same two addresses).
const IPV6_PREFIX_MAX: u8 = 126;

/// Where the configuration goes and what it names.
#[derive(Debug, Clone)]
pub struct CniConfig {
    /// The directory the runtime reads configurations from (containerd's
    /// `plugins."io.containerd.grpc.v1.cri".cni.conf_dir`).
    pub conf_dir: PathBuf,
    /// The plugin binaries (containerd's `bin_dir`).
    pub plugin_dir: PathBuf,
    /// host-local's reservations (`dataDir`).
    pub ipam_data_dir: PathBuf,
    /// The bridge's name.
    pub bridge: String,
}

impl CniConfig {
    /// The configuration under `root_dir` (the kubelet's `--root-dir`): `cni/net.d` for the
    /// conflist, `cni/networks` for host-local's reservations, Debian's plugin dir.
    pub fn under(root_dir: &Path) -> CniConfig {
        CniConfig {
            conf_dir: root_dir.join("cni/net.d"),
            plugin_dir: PathBuf::from(PLUGIN_DIR_DEFAULT),
            ipam_data_dir: root_dir.join("cni/networks"),
            bridge: BRIDGE_DEFAULT.to_string(),
        }
    }

    /// The conflist's path.
    pub fn conflist_path(&self) -> PathBuf {
        self.conf_dir.join(CONFLIST_FILE)
    }
}

/// Why the pod network could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// A podCIDR that is not one.
    #[error("invalid pod CIDR {cidr:?}: {why}")]
    BadCidr { cidr: String, why: String },
    /// No podCIDR at all.
    #[error("the node has no pod CIDR yet")]
    NoCidr,
    /// Plugins missing from the plugin dir.
    #[error("CNI plugins missing from {dir}: {missing}; install the {PLUGINS_PACKAGE} package")]
    MissingPlugins { dir: String, missing: String },
    /// Writing the file failed.
    #[error("write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A pod range: its network address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodRange {
    /// The network address (host bits zero).
    pub network: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl PodRange {
    /// Parses `10.42.0.0/24` or `fd00:42::/64`; host bits must be zero and the range must
    /// hold at least the gateway and one pod.
    pub fn parse(cidr: &str) -> Result<PodRange, CniError> {
        let bad = |why: String| CniError::BadCidr {
            cidr: cidr.to_string(),
            why,
        };
        let (addr, prefix) = cidr
            .split_once('/')
            .ok_or_else(|| bad("not in address/prefix form".into()))?;
        let network: IpAddr = addr.parse().map_err(|e| bad(format!("{e}")))?;
        let prefix: u8 = prefix.parse().map_err(|e| bad(format!("prefix: {e}")))?;
        let (bits, max) = match network {
            IpAddr::V4(_) => (32u32, IPV4_PREFIX_MAX),
            IpAddr::V6(_) => (128u32, IPV6_PREFIX_MAX),
        };
        if prefix > max {
            return Err(bad(format!(
                "a /{prefix} has no room for the gateway and a pod (at most /{max})"
            )));
        }
        let value = ip_to_u128(network);
        let host_bits = bits - u32::from(prefix);
        let host_mask = if host_bits == 0 {
            0
        } else {
            u128::MAX >> (128 - host_bits)
        };
        if value & host_mask != 0 {
            return Err(bad("host bits are set".into()));
        }
        Ok(PodRange { network, prefix })
    }

    /// The range's first address: the bridge's, the pods' gateway.
    pub fn gateway(&self) -> IpAddr {
        u128_to_ip(ip_to_u128(self.network) + 1, self.network)
    }

    /// Whether `ip` is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.network.is_ipv4() {
            return false;
        }
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        let shift = bits - u32::from(self.prefix);
        let (a, b) = (ip_to_u128(ip), ip_to_u128(self.network));
        shift >= 128 || (a >> shift) == (b >> shift)
    }
}

impl std::fmt::Display for PodRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn u128_to_ip(value: u128, family: IpAddr) -> IpAddr {
    match family {
        IpAddr::V4(_) => IpAddr::V4((value as u32).into()),
        IpAddr::V6(_) => IpAddr::V6(value.into()),
    }
}

/// The conflist for `pod_cidrs` (one or, dual-stack, two ranges).
pub fn conflist(config: &CniConfig, pod_cidrs: &[String]) -> Result<Value, CniError> {
    if pod_cidrs.is_empty() {
        return Err(CniError::NoCidr);
    }
    let ranges = pod_cidrs
        .iter()
        .map(|c| PodRange::parse(c))
        .collect::<Result<Vec<_>, _>>()?;
    let ipam_ranges: Vec<Value> = ranges
        .iter()
        .map(|r| json!([{"subnet": r.to_string(), "gateway": r.gateway().to_string()}]))
        .collect();
    let mut routes = Vec::new();
    if ranges.iter().any(|r| r.network.is_ipv4()) {
        routes.push(json!({"dst": "0.0.0.0/0"}));
    }
    if ranges.iter().any(|r| r.network.is_ipv6()) {
        routes.push(json!({"dst": "::/0"}));
    }
    Ok(json!({
        "cniVersion": CNI_VERSION,
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": config.bridge,
                "isGateway": true,
                "hairpinMode": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": ipam_ranges,
                    "routes": routes,
                    "dataDir": config.ipam_data_dir.to_string_lossy(),
                },
            },
            {
                "type": "portmap",
                "capabilities": {"portMappings": true},
            },
        ],
    }))
}

/// The plugins of [`REQUIRED_PLUGINS`] not in `plugin_dir`.
pub fn missing_plugins(plugin_dir: &Path) -> Vec<&'static str> {
    REQUIRED_PLUGINS
        .iter()
        .copied()
        .filter(|p| !plugin_dir.join(p).is_file())
        .collect()
}

/// Checks the plugins and writes the conflist for `pod_cidrs` atomically; returns its path.
pub fn write(config: &CniConfig, pod_cidrs: &[String]) -> Result<PathBuf, CniError> {
    let missing = missing_plugins(&config.plugin_dir);
    if !missing.is_empty() {
        return Err(CniError::MissingPlugins {
            dir: config.plugin_dir.display().to_string(),
            missing: missing.join(", "),
        });
    }
    let body = conflist(config, pod_cidrs)?;
    let path = config.conflist_path();
    let io = |source| CniError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(&config.conf_dir).map_err(io)?;
    std::fs::create_dir_all(&config.ipam_data_dir).map_err(io)?;
    let text = serde_json::to_vec_pretty(&body).expect("a JSON value serializes");
    let tmp = config.conf_dir.join(format!(".{CONFLIST_FILE}.tmp"));
    {
        let mut file = std::fs::File::create(&tmp).map_err(io)?;
        file.write_all(&text).map_err(io)?;
        file.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, &path).map_err(io)?;
    std::fs::File::open(&config.conf_dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(path)
}

/// The handler the node status loop calls with the Node's podCIDRs: writes the conflist
/// and marks the network ready, or reports why it is not (the Ready condition's message).
pub fn pod_cidr_handler(config: CniConfig, readiness: Readiness) -> PodCidrHandler {
    Arc::new(move |cidrs: &[String]| match write(&config, cidrs) {
        Ok(path) => {
            tracing::info!(path = %path.display(), ?cidrs, "pod network configured");
            readiness.set_network_ready();
            Ok(())
        }
        Err(e) => {
            readiness.set_network_not_ready(
                NETWORK_PLUGIN_NOT_READY,
                &format!("network plugin is not ready: {e}"),
            );
            Err(e.into())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> CniConfig {
        CniConfig {
            conf_dir: dir.join("net.d"),
            plugin_dir: dir.join("bin"),
            ipam_data_dir: dir.join("networks"),
            bridge: "cni0".into(),
        }
    }

    #[test]
    fn pod_ranges_parse_and_give_their_gateway() {
        let r = PodRange::parse("10.42.3.0/24").expect("valid");
        assert_eq!(r.gateway().to_string(), "10.42.3.1");
        assert!(r.contains("10.42.3.200".parse().expect("ip")));
        assert!(!r.contains("10.42.4.1".parse().expect("ip")));
        let r6 = PodRange::parse("fd00:42:0:3::/64").expect("valid");
        assert_eq!(r6.gateway().to_string(), "fd00:42:0:3::1");
        assert!(matches!(
            PodRange::parse("10.42.3.1/24"),
            Err(CniError::BadCidr { why, .. }) if why == "host bits are set"
        ));
        assert!(PodRange::parse("10.42.3.0/31").is_err());
        assert!(PodRange::parse("10.42.3.0").is_err());
        assert!(PodRange::parse("nonsense/24").is_err());
    }

    #[test]
    fn the_conflist_names_every_plugin() {
        let dir = tempfile::tempdir().expect("temp dir");
        let c = config(dir.path());
        let v = conflist(&c, &["10.42.0.0/24".into(), "fd00:42::/64".into()]).expect("valid");
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["plugins"][0]["type"], "bridge");
        assert_eq!(v["plugins"][0]["isGateway"], true);
        assert_eq!(v["plugins"][0]["hairpinMode"], true);
        let ipam = &v["plugins"][0]["ipam"];
        assert_eq!(ipam["type"], "host-local");
        assert_eq!(ipam["ranges"][0][0]["subnet"], "10.42.0.0/24");
        assert_eq!(ipam["ranges"][0][0]["gateway"], "10.42.0.1");
        assert_eq!(ipam["ranges"][1][0]["gateway"], "fd00:42::1");
        assert_eq!(
            ipam["routes"],
            json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
        );
        assert_eq!(v["plugins"][1]["type"], "portmap");
        assert_eq!(v["plugins"][1]["capabilities"]["portMappings"], true);
        assert!(matches!(conflist(&c, &[]), Err(CniError::NoCidr)));
    }

    #[test]
    fn missing_plugins_keep_the_network_not_ready() {
        let dir = tempfile::tempdir().expect("temp dir");
        let c = config(dir.path());
        std::fs::create_dir_all(&c.plugin_dir).expect("mkdir");
        std::fs::write(c.plugin_dir.join("bridge"), b"").expect("write");
        let readiness = Readiness::new();
        let handler = pod_cidr_handler(c.clone(), readiness.clone());
        let e = handler(&["10.42.0.0/24".into()]).expect_err("plugins are missing");
        assert!(
            e.to_string().contains(
                "host-local, portmap, loopback; install the containernetworking-plugins package"
            ),
            "{e}"
        );
        assert!(!readiness.network_ready());
        assert!(
            readiness
                .errors()
                .iter()
                .any(|m| m.contains("reason:NetworkPluginNotReady")
                    && m.contains("CNI plugins missing")),
            "{:?}",
            readiness.errors()
        );
        assert!(!c.conflist_path().exists(), "nothing written");
        for p in REQUIRED_PLUGINS {
            std::fs::write(c.plugin_dir.join(p), b"").expect("write");
        }
        handler(&["10.42.0.0/24".into()]).expect("written");
        assert!(readiness.network_ready());
        let written: Value =
            serde_json::from_slice(&std::fs::read(c.conflist_path()).expect("read"))
                .expect("the file is JSON");
        assert_eq!(
            written["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.42.0.0/24"
        );
        let leftovers: Vec<_> = std::fs::read_dir(&c.conf_dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(leftovers, [CONFLIST_FILE], "no temporary file left behind");
    }
}
