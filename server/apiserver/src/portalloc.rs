//! The NodePort allocator: random NodePorts with a static lower band, the ClusterIP
//! allocator's trick (`docs/tricks.md` #36) over `--service-node-port-range` (KEP-3668).
//!
//! A NodePort or LoadBalancer Service gets one node port per service port: the one the user
//! asked for (checked against the range and against every other Service's), or one picked
//! at a random offset in the upper band of the range, scanning upwards to the first free port
//! ([`crate::ipalloc::pick_offset`]); the bottom of the range (1/32 of it, 16 to 128 ports)
//! is left to ports users choose by hand and is only handed out once the upper band is full.
//! Ports with the same number and different protocols (DNS on 53/TCP and 53/UDP) share one
//! node port, as Kubernetes' `initNodePorts` does. A LoadBalancer with
//! `externalTrafficPolicy: Local` also gets a `healthCheckNodePort`; one with
//! `allocateLoadBalancerNodePorts: false` gets only the ports it names.
//!
//! Each port is a claim key of its own (`/registry/servicenodeports/<protocol>/<port>`),
//! created in the transaction that stores the Service (create or update) and deleted in the
//! one that releases it (the delete, or an update that changes the type to ClusterIP or the
//! port): two apiservers picking the same port cannot both win, and no port outlives its
//! Service or stays held by a Service that no longer uses it.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use rand::Rng;
use serde_json::{Value, json};
use skerry_api::{ApiError, Cause};

use crate::ipalloc;

/// kube-apiserver's default `--service-node-port-range`
/// (`pkg/cluster/ports`/`kubeapiserver/options`: `DefaultServiceNodePortRange`).
pub const NODE_PORT_RANGE_DEFAULT: &str = "30000-32767";

/// The store prefix of node port claims (Kubernetes keeps one bitmap at
/// `/registry/ranges/servicenodeports`; here each port is its own key, as ClusterIPs are).
pub const CLAIM_PREFIX: &str = "/registry/servicenodeports/";

/// The static band's bounds, Kubernetes' `calculateRangeOffset` for ports
/// (`pkg/registry/core/service/portallocator/allocator.go`): `min(max(16, size/32), 128)`,
/// and no band at all for a range of 16 ports or fewer.
const STATIC_BAND_MIN: u32 = 16;
const STATIC_BAND_MAX: u32 = 128;
const STATIC_BAND_STEP: u32 = 32;

/// The protocol of a health check node port: kube-proxy serves it over HTTP.
const HEALTH_CHECK_PROTOCOL: &str = "TCP";

/// A range of node ports, both ends included (`k8s.io/apimachinery/pkg/util/net.PortRange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    base: u16,
    size: u32,
}

impl Default for PortRange {
    fn default() -> Self {
        Self {
            base: 30000,
            size: 2768,
        }
    }
}

impl PortRange {
    /// Parses `min-max`, `base+offset` or a single port, as `net.ParsePortRange` does.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("{text:?} is not a port range (min-max): {why}");
        let number = |s: &str| s.trim().parse::<u16>().map_err(|e| bad(&e.to_string()));
        let (low, high) = if let Some((a, b)) = text.split_once('-') {
            (number(a)?, number(b)?)
        } else if let Some((a, b)) = text.split_once('+') {
            let low = number(a)?;
            let high = low
                .checked_add(number(b)?)
                .ok_or_else(|| bad("the end is past 65535"))?;
            (low, high)
        } else {
            let port = number(text)?;
            (port, port)
        };
        if low == 0 || high < low {
            return Err(bad("the range must be non-empty and start above 0"));
        }
        Ok(Self {
            base: low,
            size: u32::from(high - low) + 1,
        })
    }

    /// How many ports the range holds.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Ports at the bottom kept for ports users choose.
    pub fn static_band(&self) -> u32 {
        if self.size <= STATIC_BAND_MIN {
            return 0;
        }
        (self.size / STATIC_BAND_STEP).clamp(STATIC_BAND_MIN, STATIC_BAND_MAX)
    }

    /// The offset of `port`, if the range holds it.
    pub fn offset(&self, port: u16) -> Option<u32> {
        let offset = u32::from(port).checked_sub(u32::from(self.base))?;
        (offset < self.size).then_some(offset)
    }

    /// The port at `offset`.
    fn port(&self, offset: u32) -> u16 {
        // The offset comes from `pick_offset` over `size`, so the sum is at most 65535.
        u16::try_from(u32::from(self.base) + offset).unwrap_or(u16::MAX)
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.base, self.port(self.size - 1))
    }
}

/// One claimed node port: the protocol and the port.
pub type NodePort = (String, u16);

/// The claim key of a node port.
pub fn claim_key((protocol, port): &NodePort) -> String {
    format!("{CLAIM_PREFIX}{protocol}/{port}")
}

/// The node port a claim key names.
pub fn parse_claim_key(key: &str) -> Option<NodePort> {
    let (protocol, port) = key.strip_prefix(CLAIM_PREFIX)?.split_once('/')?;
    Some((protocol.to_string(), port.parse().ok()?))
}

/// The claim's value: the Service holding the port, for an operator reading the store.
pub fn claim_value((protocol, port): &NodePort, namespace: &str, name: &str) -> Bytes {
    Bytes::from(
        json!({
            "protocol": protocol,
            "port": port,
            "parentRef": {"group": "", "resource": "services", "namespace": namespace, "name": name},
        })
        .to_string(),
    )
}

/// `spec.type`, ClusterIP when unset (before defaulting, an update may not carry it).
fn service_type(service: &Value) -> &str {
    service["spec"]["type"].as_str().unwrap_or("ClusterIP")
}

/// Whether a Service has node ports: NodePort and LoadBalancer (`needsNodePort`).
pub fn wants_node_ports(service: &Value) -> bool {
    matches!(service_type(service), "NodePort" | "LoadBalancer")
}

/// Whether ports left 0 get one picked: always for NodePort, for LoadBalancer unless
/// `allocateLoadBalancerNodePorts: false` (`shouldAllocateNodePorts`).
fn allocates_node_ports(service: &Value) -> bool {
    match service_type(service) {
        "NodePort" => true,
        "LoadBalancer" => service["spec"]["allocateLoadBalancerNodePorts"].as_bool() != Some(false),
        _ => false,
    }
}

/// Whether a Service needs a health check node port: a LoadBalancer that keeps the
/// client's address (`NeedsHealthCheck`).
pub fn needs_health_check(service: &Value) -> bool {
    service_type(service) == "LoadBalancer"
        && service["spec"]["externalTrafficPolicy"].as_str() == Some("Local")
}

/// `spec.ports[i].nodePort`, 0 when unset or out of u16.
fn node_port_of(port: &Value) -> u16 {
    port["nodePort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(0)
}

/// `spec.ports[i].protocol`, TCP when unset (the default).
fn protocol_of(port: &Value) -> String {
    port["protocol"].as_str().unwrap_or("TCP").to_string()
}

/// The node ports a stored Service holds (released with it).
pub fn held(service: &Value) -> BTreeSet<NodePort> {
    let mut held = BTreeSet::new();
    if wants_node_ports(service) {
        for port in service["spec"]["ports"].as_array().into_iter().flatten() {
            let number = node_port_of(port);
            if number != 0 {
                held.insert((protocol_of(port), number));
            }
        }
    }
    if needs_health_check(service) {
        let number = health_check_node_port(service);
        if number != 0 {
            held.insert((HEALTH_CHECK_PROTOCOL.to_string(), number));
        }
    }
    held
}

fn health_check_node_port(service: &Value) -> u16 {
    service["spec"]["healthCheckNodePort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(0)
}

/// What [`assign`] decided: the ports to claim and the ones to release.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    pub claims: BTreeSet<NodePort>,
    pub releases: BTreeSet<NodePort>,
}

/// Fills the node ports of `service` (being created when `old` is `None`, else replacing
/// `old`), given every port claimed in the cluster (`used`, `old`'s among them): requested
/// ports are checked, zero ones picked. Returns what to claim and release.
pub fn assign(
    range: &PortRange,
    old: Option<&Value>,
    service: &mut Value,
    used: &BTreeSet<NodePort>,
    name: &str,
    rng: &mut impl Rng,
) -> Result<Assignment, ApiError> {
    let kept = old.map(held).unwrap_or_default();
    // Offsets no pick may take: every port held under any protocol (one bitmap upstream).
    let mut taken: BTreeSet<u32> = used.iter().filter_map(|(_, p)| range.offset(*p)).collect();
    let mut wanted: BTreeSet<NodePort> = BTreeSet::new();
    let claim = |path: String,
                 node_port: NodePort,
                 wanted: &mut BTreeSet<NodePort>,
                 taken: &mut BTreeSet<u32>|
     -> Result<(), ApiError> {
        let value = node_port.1;
        let Some(offset) = range.offset(value) else {
            return Err(invalid(
                name,
                &path,
                value,
                &format!(
                    "provided port is not in the valid range. The range of valid ports is {range}"
                ),
            ));
        };
        let elsewhere = used.contains(&node_port) && !kept.contains(&node_port);
        if elsewhere || !wanted.insert(node_port) {
            return Err(invalid(
                name,
                &path,
                value,
                "provided port is already allocated",
            ));
        }
        taken.insert(offset);
        Ok(())
    };
    let mut pick = |taken: &mut BTreeSet<u32>| -> Result<u16, ApiError> {
        let offset = ipalloc::pick_offset(range.size(), range.static_band(), taken, rng)
            .ok_or_else(|| {
                ApiError::internal(format!(
                    "failed to allocate a nodePort: range is full ({range})"
                ))
            })?;
        taken.insert(offset);
        Ok(range.port(offset))
    };

    if wants_node_ports(service) {
        let allocates = allocates_node_ports(service);
        let ports = service["spec"]["ports"]
            .as_array_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        // The node port chosen for each service port number, so that 53/TCP and 53/UDP
        // share one; a number the user gave on any of them is the one they share.
        let mut by_number: BTreeMap<i64, u16> = BTreeMap::new();
        for port in &ports {
            let number = port["port"].as_i64().unwrap_or(0);
            let node_port = node_port_of(port);
            if node_port != 0 {
                by_number.entry(number).or_insert(node_port);
            }
        }
        let mut filled = Vec::with_capacity(ports.len());
        for (i, mut port) in ports.into_iter().enumerate() {
            let number = port["port"].as_i64().unwrap_or(0);
            let mut node_port = node_port_of(&port);
            if node_port == 0 && allocates {
                node_port = match by_number.get(&number) {
                    Some(shared) => *shared,
                    None => {
                        let picked = pick(&mut taken)?;
                        by_number.insert(number, picked);
                        picked
                    }
                };
            }
            if node_port != 0 {
                let path = format!("spec.ports[{i}].nodePort");
                claim(
                    path,
                    (protocol_of(&port), node_port),
                    &mut wanted,
                    &mut taken,
                )?;
                port["nodePort"] = json!(node_port);
            }
            filled.push(port);
        }
        service["spec"]["ports"] = Value::Array(filled);
    }
    if needs_health_check(service) {
        let mut node_port = health_check_node_port(service);
        if node_port == 0 {
            node_port = pick(&mut taken)?;
        }
        claim(
            "spec.healthCheckNodePort".to_string(),
            (HEALTH_CHECK_PROTOCOL.to_string(), node_port),
            &mut wanted,
            &mut taken,
        )?;
        service["spec"]["healthCheckNodePort"] = json!(node_port);
    }
    Ok(Assignment {
        claims: wanted.difference(&kept).cloned().collect(),
        releases: kept.difference(&wanted).cloned().collect(),
    })
}

/// A 422 naming the port's field, in Kubernetes' words (`field.Invalid` over the
/// allocator's error).
fn invalid(name: &str, path: &str, value: u16, detail: &str) -> ApiError {
    ApiError::invalid(
        "",
        "Service",
        name,
        vec![Cause::new(
            "FieldValueInvalid",
            path,
            format!("Invalid value: {value}: {detail}"),
        )],
    )
}

/// Kubernetes' `PatchAllocatedValues` and `dropTypeDependentFields` for node ports, run on
/// an update before defaults: a replacement that leaves a port's node port out (kubectl
/// apply never sends it) keeps the one it had, matched by port name; a type change away from
/// NodePort/LoadBalancer that did not touch the node ports clears them, and the health check
/// port goes when it is no longer needed.
pub fn prepare_update(old: &Value, new: &mut Value) {
    if wants_node_ports(old) && wants_node_ports(new) {
        let in_new: BTreeSet<u16> = new["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(node_port_of)
            .filter(|p| *p != 0)
            .collect();
        let by_name: BTreeMap<String, u16> = old["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["name"].as_str().unwrap_or("").to_string(),
                    node_port_of(p),
                )
            })
            .collect();
        if let Some(ports) = new["spec"]["ports"].as_array_mut() {
            for port in ports {
                if node_port_of(port) != 0 {
                    continue;
                }
                let name = port["name"].as_str().unwrap_or("");
                if let Some(&previous) = by_name.get(name)
                    && previous != 0
                    && !in_new.contains(&previous)
                {
                    port["nodePort"] = json!(previous);
                }
            }
        }
    }
    if needs_health_check(old) && needs_health_check(new) && health_check_node_port(new) == 0 {
        let previous = health_check_node_port(old);
        if previous != 0 {
            new["spec"]["healthCheckNodePort"] = json!(previous);
        }
    }
    let node_ports = |s: &Value| -> Vec<u16> {
        s["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(node_port_of)
            .collect()
    };
    if wants_node_ports(old)
        && !wants_node_ports(new)
        && node_ports(old) == node_ports(new)
        && let Some(ports) = new["spec"]["ports"].as_array_mut()
    {
        for port in ports {
            if let Some(map) = port.as_object_mut() {
                map.remove("nodePort");
            }
        }
    }
    if !needs_health_check(new)
        && health_check_node_port(old) == health_check_node_port(new)
        && let Some(spec) = new["spec"].as_object_mut()
    {
        spec.remove("healthCheckNodePort");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(20)
    }

    fn tcp(port: u16) -> NodePort {
        ("TCP".to_string(), port)
    }

    #[test]
    fn ranges_and_bands_follow_kubernetes() {
        let r = PortRange::parse(NODE_PORT_RANGE_DEFAULT).expect("valid");
        assert_eq!(r, PortRange::default());
        assert_eq!(r.size(), 2768);
        // calculateRangeOffset: 2768 / 32 = 86, inside [16, 128].
        assert_eq!(r.static_band(), 86);
        assert_eq!(r.to_string(), "30000-32767");
        let cases = [
            ("30000-30015", 0),
            ("30000-30016", 16),
            ("30000-30099", 16),
            ("1-65535", 128),
            ("30000+99", 16),
        ];
        for (text, band) in cases {
            assert_eq!(
                PortRange::parse(text).expect(text).static_band(),
                band,
                "{text}"
            );
        }
        assert_eq!(PortRange::parse("30000+99").expect("ok").size(), 100);
        assert_eq!(PortRange::parse("8080").expect("ok").size(), 1);
        for bad in ["", "0-10", "200-100", "30000-70000", "a-b", "65535+1"] {
            assert!(PortRange::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(r.offset(29999), None);
        assert_eq!(r.offset(32768), None);
        assert_eq!(r.offset(32767), Some(2767));
        assert_eq!(parse_claim_key(&claim_key(&tcp(30080))), Some(tcp(30080)));
    }

    #[test]
    fn picks_are_random_in_the_upper_band_and_fill_the_range() {
        let r = PortRange::parse("30000-30099").expect("valid");
        let mut used = BTreeSet::new();
        let mut order = Vec::new();
        let mut rng = rng();
        for i in 0..r.size() {
            let mut svc =
                json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "protocol": "TCP"}]}});
            let a = assign(&r, None, &mut svc, &used, "s", &mut rng).expect("room left");
            let port = svc["spec"]["ports"][0]["nodePort"]
                .as_u64()
                .expect("filled") as u16;
            assert_eq!(a.claims, BTreeSet::from([tcp(port)]), "pick {i}");
            assert!(used.insert(tcp(port)), "{port} twice");
            order.push(port);
        }
        let band = r.static_band() as usize;
        let first_static = order
            .iter()
            .position(|p| *p < 30000 + band as u16)
            .expect("the band is used last");
        assert_eq!(first_static, order.len() - band);
        let consecutive = order[..10].windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(consecutive < 9, "{:?}", &order[..10]);
        let mut full = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        let e = assign(&r, None, &mut full, &used, "s", &mut rng).expect_err("full");
        assert_eq!(e.code, 500);
        assert!(e.message.contains("range is full"), "{}", e.message);
    }

    #[test]
    fn requested_ports_are_checked_with_kubernetes_messages() {
        let r = PortRange::default();
        let used = BTreeSet::from([tcp(30080)]);
        let svc = |np: u16| json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "protocol": "TCP", "nodePort": np}]}});
        let cases: [(u16, Option<&str>); 4] = [
            (30081, None),
            (
                30080,
                Some(
                    "spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated",
                ),
            ),
            (
                8080,
                Some(
                    "spec.ports[0].nodePort: Invalid value: 8080: provided port is not in the valid range. The range of valid ports is 30000-32767",
                ),
            ),
            (
                32768,
                Some(
                    "spec.ports[0].nodePort: Invalid value: 32768: provided port is not in the valid range. The range of valid ports is 30000-32767",
                ),
            ),
        ];
        for (np, error) in cases {
            let mut s = svc(np);
            match (assign(&r, None, &mut s, &used, "web", &mut rng()), error) {
                (Ok(a), None) => assert_eq!(a.claims, BTreeSet::from([tcp(np)])),
                (Err(e), Some(message)) => {
                    assert_eq!(e.code, 422);
                    assert_eq!(e.message, format!("Service \"web\" is invalid: {message}"));
                }
                (other, _) => panic!("{np}: {other:?}"),
            }
        }
        // The same port under another protocol is another claim.
        let mut udp = json!({"spec": {"type": "NodePort", "ports": [{"port": 53, "protocol": "UDP", "nodePort": 30080}]}});
        assert!(assign(&r, None, &mut udp, &used, "dns", &mut rng()).is_ok());
        // Two ports of one Service cannot ask for one node port.
        let mut twice = json!({"spec": {"type": "NodePort", "ports": [
            {"name": "a", "port": 80, "protocol": "TCP", "nodePort": 30100},
            {"name": "b", "port": 81, "protocol": "TCP", "nodePort": 30100}]}});
        let e = assign(&r, None, &mut twice, &used, "x", &mut rng()).expect_err("dup");
        assert!(
            e.message.contains("spec.ports[1].nodePort"),
            "{}",
            e.message
        );
    }

    #[test]
    fn which_services_get_which_ports() {
        let r = PortRange::default();
        let none = BTreeSet::new();
        let count = |svc: Value| {
            let mut svc = svc;
            let a = assign(&r, None, &mut svc, &none, "s", &mut rng()).expect("ok");
            (a.claims.len(), svc)
        };
        // ClusterIP: nothing.
        let (n, _) = count(json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}));
        assert_eq!(n, 0);
        // DNS: one node port shared by 53/TCP and 53/UDP, claimed under both.
        let (n, svc) = count(json!({"spec": {"type": "NodePort", "ports": [
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            {"name": "dns", "port": 53, "protocol": "UDP"}]}}));
        assert_eq!(n, 2);
        assert_eq!(
            svc["spec"]["ports"][0]["nodePort"],
            svc["spec"]["ports"][1]["nodePort"]
        );
        // LoadBalancer with Local: a port and the health check port.
        let (n, svc) = count(
            json!({"spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "ports": [{"port": 80, "protocol": "TCP"}]}}),
        );
        assert_eq!(n, 2);
        assert!(svc["spec"]["healthCheckNodePort"].as_u64().is_some());
        // allocateLoadBalancerNodePorts: false: only what is asked for.
        let (n, svc) = count(
            json!({"spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
            "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81, "nodePort": 30200}]}}),
        );
        assert_eq!(n, 1);
        assert!(svc["spec"]["ports"][0].get("nodePort").is_none());
        assert_eq!(svc["spec"]["ports"][1]["nodePort"], 30200);
    }

    #[test]
    fn updates_keep_release_and_claim() {
        let r = PortRange::default();
        let old = json!({"spec": {"type": "NodePort", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]}});
        let used = BTreeSet::from([tcp(30080)]);
        // Unchanged: nothing to claim or release.
        let mut same = old.clone();
        let a = assign(&r, Some(&old), &mut same, &used, "s", &mut rng()).expect("ok");
        assert_eq!(a, Assignment::default());
        // A replacement without the node port keeps it.
        let mut omitted = json!({"spec": {"type": "NodePort", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}});
        prepare_update(&old, &mut omitted);
        assert_eq!(omitted["spec"]["ports"][0]["nodePort"], 30080);
        // To ClusterIP: the node port is dropped and released.
        let mut cluster_ip = old.clone();
        cluster_ip["spec"]["type"] = json!("ClusterIP");
        prepare_update(&old, &mut cluster_ip);
        assert!(cluster_ip["spec"]["ports"][0].get("nodePort").is_none());
        let a = assign(&r, Some(&old), &mut cluster_ip, &used, "s", &mut rng()).expect("ok");
        assert_eq!(a.releases, BTreeSet::from([tcp(30080)]));
        assert!(a.claims.is_empty());
        // A changed port: the new one claimed, the old one released.
        let mut moved = old.clone();
        moved["spec"]["ports"][0]["nodePort"] = json!(30090);
        let a = assign(&r, Some(&old), &mut moved, &used, "s", &mut rng()).expect("ok");
        assert_eq!(a.claims, BTreeSet::from([tcp(30090)]));
        assert_eq!(a.releases, BTreeSet::from([tcp(30080)]));
        // The health check port goes with externalTrafficPolicy: Local.
        let lb = json!({"spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]}});
        let mut cluster = lb.clone();
        cluster["spec"]["externalTrafficPolicy"] = json!("Cluster");
        prepare_update(&lb, &mut cluster);
        assert!(cluster["spec"].get("healthCheckNodePort").is_none());
        let used = BTreeSet::from([tcp(30080), tcp(31000)]);
        let a = assign(&r, Some(&lb), &mut cluster, &used, "s", &mut rng()).expect("ok");
        assert_eq!(a.releases, BTreeSet::from([tcp(31000)]));
    }
}
