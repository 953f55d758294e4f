//! The ClusterIP allocator: random ClusterIPs with a static lower band (`docs/tricks.md`
//! #36).
//!
//! Sequential ClusterIPs (10.96.0.1, .2, .3, ...) make datapaths that hash the 5-tuple put
//! neighbouring services in neighbouring buckets, so the allocator starts at a random offset
//! and scans from there for a free address. The bottom of the range is kept for addresses
//! users ask for by name (`spec.clusterIP: 10.96.0.10` for DNS): dynamic allocation takes the
//! upper band first and falls back to the lower one only when the upper is full, so a static
//! request rarely finds its address taken.
//!
//! Each allocated address is a key of its own in the store (`/registry/ipaddresses/<ip>`,
//! like Kubernetes' IPAddress objects), created in the same transaction as its Service and
//! deleted in the same transaction as the Service's deletion: two apiservers picking the same
//! address cannot both win, and no address outlives its Service.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use bytes::Bytes;
use rand::Rng;
use serde_json::{Value, json};
use skerry_api::{ApiError, Cause};

/// kubeadm's default Service range (`--service-cluster-ip-range`): 10.96.0.0/12, about a
/// million addresses, far more than an edge cluster uses, out of the way of 10.0.0.0/16
/// networks people already have.
pub const SERVICE_CIDR_DEFAULT: &str = "10.96.0.0/12";

/// The store prefix of address claims (where Kubernetes keeps IPAddress objects).
pub const CLAIM_PREFIX: &str = "/registry/ipaddresses/";

/// The static band's size bounds (Kubernetes' `calculateRangeOffset`): 1/16 of the range,
/// at least 16 addresses (room for DNS and a few well-known services in a /28) and at most
/// 256 (more statically chosen addresses than any cluster writes by hand).
const STATIC_BAND_MIN: u32 = 16;
const STATIC_BAND_MAX: u32 = 256;
const STATIC_BAND_DIVISOR: u32 = 16;

/// Prefix lengths accepted: /30 leaves two usable addresses; below /12 the claim scan's
/// working set (the used addresses) is still small but the range stops meaning anything
/// for a cluster of three boxes (kube-apiserver refuses ranges over 2^20 addresses too).
const PREFIX_LEN_MIN: u8 = 12;
const PREFIX_LEN_MAX: u8 = 30;

/// An IPv4 Service range: usable addresses exclude the network and broadcast addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceCidr {
    network: u32,
    prefix_len: u8,
}

impl ServiceCidr {
    /// Parses `a.b.c.d/n`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (addr, len) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a CIDR (a.b.c.d/n)"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|e| format!("{text:?}: {e}"))?;
        let prefix_len: u8 = len.parse().map_err(|e| format!("{text:?}: {e}"))?;
        if !(PREFIX_LEN_MIN..=PREFIX_LEN_MAX).contains(&prefix_len) {
            return Err(format!(
                "{text:?}: the prefix length must be between {PREFIX_LEN_MIN} and {PREFIX_LEN_MAX}"
            ));
        }
        let mask = u32::MAX << (32 - prefix_len);
        let network = u32::from(addr) & mask;
        if network != u32::from(addr) {
            return Err(format!("{text:?} has host bits set"));
        }
        Ok(Self {
            network,
            prefix_len,
        })
    }

    /// Usable addresses (network and broadcast excluded).
    pub fn size(&self) -> u32 {
        (1u32 << (32 - self.prefix_len)) - 2
    }

    /// Addresses at the bottom kept for static requests.
    pub fn static_band(&self) -> u32 {
        (self.size() / STATIC_BAND_DIVISOR)
            .clamp(STATIC_BAND_MIN, STATIC_BAND_MAX)
            .min(self.size())
    }

    /// The address at `offset` (0 is the first usable one).
    pub fn address(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.network + 1 + offset)
    }

    /// The offset of `ip`, if it is a usable address of the range.
    pub fn offset(&self, ip: Ipv4Addr) -> Option<u32> {
        let ip = u32::from(ip);
        let first = self.network + 1;
        (ip >= first && ip - first < self.size()).then(|| ip - first)
    }

    /// The address of the `kubernetes` Service: the first one, as in every cluster.
    pub fn first(&self) -> Ipv4Addr {
        self.address(0)
    }
}

impl std::fmt::Display for ServiceCidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.network), self.prefix_len)
    }
}

/// Picks a free offset: a random start in the upper band, scanning upwards (wrapping within
/// the band) to the first offset not in `used`; then the same in the static band.
pub fn pick(cidr: &ServiceCidr, used: &BTreeSet<u32>, rng: &mut impl Rng) -> Option<u32> {
    pick_offset(cidr.size(), cidr.static_band(), used, rng)
}

/// The scan [`pick`] runs, over any range of `size` offsets whose first `lower` are the
/// static band: the NodePort allocator ([`crate::portalloc`]) shares it.
pub fn pick_offset(size: u32, lower: u32, used: &BTreeSet<u32>, rng: &mut impl Rng) -> Option<u32> {
    let bands = [(lower, size), (0, lower)];
    for (start, end) in bands {
        if start >= end {
            continue;
        }
        let width = end - start;
        let first = start + rng.random_range(0..width);
        // Free offsets at or after `first`, then from the band's start: Kubernetes' bitmap
        // scan (`randomScanStrategyWithOffset`), over the sorted set of used offsets.
        if let Some(free) = first_free(used, first, end).or_else(|| first_free(used, start, first))
        {
            return Some(free);
        }
    }
    None
}

/// The first offset in `[from, to)` not in `used`.
fn first_free(used: &BTreeSet<u32>, from: u32, to: u32) -> Option<u32> {
    let mut candidate = from;
    for &taken in used.range(from..to) {
        if taken != candidate {
            return Some(candidate);
        }
        candidate += 1;
    }
    (candidate < to).then_some(candidate)
}

/// The claim key of an address.
pub fn claim_key(ip: Ipv4Addr) -> String {
    format!("{CLAIM_PREFIX}{ip}")
}

/// The claim's value: an IPAddress naming its Service, so an operator reading the store can
/// tell who holds an address.
pub fn claim_value(ip: Ipv4Addr, namespace: &str, name: &str) -> Bytes {
    Bytes::from(
        json!({
            "apiVersion": "networking.k8s.io/v1beta1",
            "kind": "IPAddress",
            "metadata": {"name": ip.to_string()},
            "spec": {"parentRef": {"group": "", "resource": "services", "namespace": namespace, "name": name}},
        })
        .to_string(),
    )
}

/// Whether a Service gets a ClusterIP: not ExternalName, not headless (`clusterIP: None`).
pub fn wants_cluster_ip(service: &Value) -> bool {
    let spec = &service["spec"];
    spec["type"].as_str() != Some("ExternalName") && spec["clusterIP"].as_str() != Some("None")
}

/// The address a Service asks for by name, checked against the range.
pub fn requested(
    cidr: &ServiceCidr,
    service: &Value,
    name: &str,
) -> Result<Option<Ipv4Addr>, ApiError> {
    let Some(text) = service["spec"]["clusterIP"]
        .as_str()
        .filter(|s| !s.is_empty())
    else {
        return Ok(None);
    };
    let invalid = |detail: String| {
        ApiError::invalid(
            "",
            "Service",
            name,
            vec![Cause::new(
                "FieldValueInvalid",
                "spec.clusterIPs",
                format!("Invalid value: [{text:?}]: {detail}"),
            )],
        )
    };
    let ip: Ipv4Addr = text
        .parse()
        .map_err(|_| invalid("must be a valid IP address".to_string()))?;
    if cidr.offset(ip).is_none() {
        return Err(invalid(format!(
            "failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range of valid IPs is {cidr}"
        )));
    }
    Ok(Some(ip))
}

/// The error when an asked-for address is taken (Kubernetes' wording).
pub fn already_allocated(ip: Ipv4Addr, name: &str) -> ApiError {
    ApiError::invalid(
        "",
        "Service",
        name,
        vec![Cause::new(
            "FieldValueInvalid",
            "spec.clusterIPs",
            format!(
                "Invalid value: [\"{ip}\"]: failed to allocate IP {ip}: provided IP is already allocated"
            ),
        )],
    )
}

/// The claim keys a stored Service holds (released with it).
pub fn held_claims(service: &Value) -> Vec<String> {
    service["spec"]["clusterIPs"]
        .as_array()
        .map(|ips| {
            ips.iter()
                .filter_map(Value::as_str)
                .filter_map(|ip| ip.parse::<Ipv4Addr>().ok())
                .map(claim_key)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ranges_and_bands_follow_kubernetes() {
        let c = ServiceCidr::parse(SERVICE_CIDR_DEFAULT).expect("valid");
        assert_eq!(c.size(), (1 << 20) - 2);
        assert_eq!(c.static_band(), STATIC_BAND_MAX);
        assert_eq!(c.first(), Ipv4Addr::new(10, 96, 0, 1));
        let small = ServiceCidr::parse("10.0.0.0/24").expect("valid");
        assert_eq!(small.static_band(), STATIC_BAND_MIN);
        let mid = ServiceCidr::parse("10.0.0.0/20").expect("valid");
        assert_eq!(mid.static_band(), 4094 / 16);
        assert_eq!(
            small.offset(Ipv4Addr::new(10, 0, 0, 255)),
            None,
            "broadcast"
        );
        assert_eq!(small.offset(Ipv4Addr::new(10, 0, 0, 0)), None, "network");
        assert!(ServiceCidr::parse("10.0.0.1/24").is_err());
        assert!(ServiceCidr::parse("10.0.0.0/31").is_err());
    }

    #[test]
    fn allocation_is_random_prefers_the_upper_band_and_fills_everything() {
        let c = ServiceCidr::parse("10.0.0.0/24").expect("valid");
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut used = BTreeSet::new();
        let mut order = Vec::new();
        while let Some(offset) = pick(&c, &used, &mut rng) {
            assert!(used.insert(offset), "picked {offset} twice");
            order.push(offset);
        }
        assert_eq!(used.len() as u32, c.size(), "every address handed out once");
        let band = c.static_band();
        let first_static = order
            .iter()
            .position(|o| *o < band)
            .expect("static band used last");
        assert_eq!(
            first_static as u32,
            c.size() - band,
            "the static band only once the upper is full"
        );
        // Not sequential: the first ten picks are not consecutive addresses.
        let consecutive = order[..10].windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(consecutive < 9, "{:?}", &order[..10]);
    }

    #[test]
    fn requested_addresses_are_checked() {
        let c = ServiceCidr::parse("10.96.0.0/12").expect("valid");
        let svc = |ip: &str| json!({"spec": {"clusterIP": ip}});
        assert_eq!(
            requested(&c, &svc("10.96.0.10"), "dns").expect("ok"),
            Some(Ipv4Addr::new(10, 96, 0, 10))
        );
        assert_eq!(
            requested(&c, &svc("192.168.0.1"), "x").map_err(|e| e.code),
            Err(422)
        );
        assert_eq!(
            requested(&c, &svc("nonsense"), "x").map_err(|e| e.code),
            Err(422)
        );
        assert!(!wants_cluster_ip(&svc("None")));
        assert!(!wants_cluster_ip(
            &json!({"spec": {"type": "ExternalName"}})
        ));
    }
}
