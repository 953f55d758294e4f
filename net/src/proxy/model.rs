//! The proxy's model of Services and EndpointSlices: what of the API objects the rules depend
//! on, read defensively (the objects come from the API, written by users: a malformed field
//! skips that port or endpoint with a warning, never the whole sync), and the choice of
//! endpoints per traffic policy (upstream `pkg/proxy/topology.go`, `CategorizeEndpoints`),
//! which carries the proxy half of `docs/tricks.md` #35: topology hints are used only when
//! every ready endpoint of the Service has one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tracing::warn;

/// The label an EndpointSlice names its Service with (`discovery.LabelServiceName`).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The annotation that turns topology-aware routing on (`v1.AnnotationTopologyMode`).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// Its deprecated predecessor, still honoured upstream (`v1.DeprecatedAnnotationTopologyAwareHints`).
pub const ANNOTATION_TOPOLOGY_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// `spec.trafficDistribution` value that also turns hints on (`v1.ServiceTrafficDistributionPreferClose`).
pub const TRAFFIC_DISTRIBUTION_PREFER_CLOSE: &str = "PreferClose";
/// The default ClientIP affinity timeout, 3 hours (`v1.DefaultClientIPServiceAffinitySeconds`).
pub const DEFAULT_AFFINITY_SECONDS: u32 = 10_800;
/// The longest ClientIP affinity timeout validation admits, one day
/// (`core.MaxClientIPServiceAffinitySeconds`).
pub const MAX_AFFINITY_SECONDS: u32 = 86_400;

/// An IP family: one nftables table each (`ip` and `ip6`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4, table family `ip`.
    V4,
    /// IPv6, table family `ip6`.
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
    /// The nftables table family and the address match keyword (`ip daddr`, `ip6 daddr`).
    pub fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
    /// The nftables address type (`ipv4_addr`, `ipv6_addr`).
    pub fn addr_type(self) -> &'static str {
        match self {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }
    /// The loopback range NodePort rules leave out (nftables cannot DNAT from loopback: #33).
    pub fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.0/8",
            Family::V6 => "::1",
        }
    }
    /// The EndpointSlice `addressType` of this family.
    fn address_type(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// The transport protocols a Service port can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// From the API's spelling; `None` when the protocol is absent (TCP) is handled by callers.
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s {
            None | Some("TCP") => Some(Protocol::Tcp),
            Some("UDP") => Some(Protocol::Udp),
            Some("SCTP") => Some(Protocol::Sctp),
            Some(_) => None,
        }
    }
    /// nftables' (and upstream's chain names') lower-case name.
    pub fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// A Service's name (`namespace/name`): the unit of a partial sync.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceName {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One port of a Service as the proxy programs it (upstream `BaseServicePortInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// The port's name (may be empty for a single-port Service).
    pub port_name: String,
    /// Its protocol.
    pub protocol: Protocol,
    /// The ClusterIP of this family.
    pub cluster_ip: IpAddr,
    /// The Service port.
    pub port: u16,
    /// The NodePort, 0 when none.
    pub node_port: u16,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of this family.
    pub load_balancer_ips: Vec<IpAddr>,
    /// ClientIP affinity timeout in seconds, `None` without affinity.
    pub affinity_seconds: Option<u32>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local` (only meaningful when externally accessible).
    pub external_local: bool,
    /// Topology-aware routing asked for (annotation or `trafficDistribution`).
    pub topology: bool,
}

impl ServicePort {
    /// Reachable from outside: a NodePort, external IPs or load-balancer IPs
    /// (upstream `ExternallyAccessible`).
    pub fn externally_accessible(&self) -> bool {
        self.node_port != 0 || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }
    /// Upstream `ExternalPolicyLocal`: Local only counts when something is external.
    pub fn external_policy_local(&self) -> bool {
        self.externally_accessible() && self.external_local
    }
    /// Upstream `UsesClusterEndpoints`.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_local || (self.externally_accessible() && !self.external_local)
    }
    /// Upstream `UsesLocalEndpoints`.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_local || self.external_policy_local()
    }
}

/// One endpoint of one Service port (upstream `BaseEndpointInfo`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// Its address.
    pub ip: IpAddr,
    /// Its port.
    pub port: u16,
    /// `conditions.ready` (absent means ready).
    pub ready: bool,
    /// `conditions.serving` (absent means as ready).
    pub serving: bool,
    /// `conditions.terminating` (absent means not).
    pub terminating: bool,
    /// On this node (`nodeName` equals the proxy's node).
    pub local: bool,
    /// `hints.forZones[].name`.
    pub zone_hints: BTreeSet<String>,
}

impl Endpoint {
    /// `ip:port` as nftables' `dnat to` writes it (brackets for IPv6).
    pub fn addr(&self) -> String {
        match self.ip {
            IpAddr::V4(ip) => format!("{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("[{ip}]:{}", self.port),
        }
    }
}

/// A Service's ports of one family, keyed by (port name, protocol).
pub type ServicePorts = BTreeMap<(String, Protocol), ServicePort>;

/// Reads the ports of `svc` the proxy programs for `family`. `None` when the Service is not
/// proxied at all (headless, ExternalName, no ClusterIP of this family) or is malformed.
pub fn service_ports(svc: &Service, family: Family) -> Option<(ServiceName, ServicePorts)> {
    let meta = &svc.metadata;
    let name = ServiceName {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone()?,
    };
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    let mut cluster_ips: Vec<&String> = spec.cluster_ips.iter().flatten().collect();
    if cluster_ips.is_empty() {
        cluster_ips.extend(spec.cluster_ip.as_ref());
    }
    let cluster_ip = cluster_ips
        .iter()
        .filter(|s| s.as_str() != "None" && !s.is_empty())
        .filter_map(|s| match s.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                warn!(service = %name, ip = %s, "skipping a malformed ClusterIP");
                None
            }
        })
        .find(|ip| Family::of(ip) == family)?;
    let ips_of = |list: &mut dyn Iterator<Item = &String>, what: &str| -> Vec<IpAddr> {
        let mut out = Vec::new();
        for s in list {
            match s.parse::<IpAddr>() {
                Ok(ip) if Family::of(&ip) == family => out.push(ip),
                Ok(_) => {}
                Err(_) => warn!(service = %name, ip = %s, "skipping a malformed {what}"),
            }
        }
        out.sort();
        out.dedup();
        out
    };
    let external_ips = ips_of(&mut spec.external_ips.iter().flatten(), "externalIP");
    let lb_ips = ips_of(
        &mut svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_ref()),
        "load-balancer ingress IP",
    );
    let affinity_seconds = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| (1..=MAX_AFFINITY_SECONDS).contains(t))
            .unwrap_or(DEFAULT_AFFINITY_SECONDS)
    });
    let annotations = meta.annotations.as_ref();
    let annotation = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    let topology = match spec.traffic_distribution.as_deref() {
        Some(TRAFFIC_DISTRIBUTION_PREFER_CLOSE) => true,
        _ => matches!(
            annotation(ANNOTATION_TOPOLOGY_MODE).or(annotation(ANNOTATION_TOPOLOGY_HINTS)),
            Some("Auto" | "auto")
        ),
    };
    let node_ports_allowed = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
    let mut ports = ServicePorts::new();
    for p in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else {
            warn!(service = %name, protocol = ?p.protocol, "skipping a port with an unknown protocol");
            continue;
        };
        let Ok(port) = u16::try_from(p.port) else {
            warn!(service = %name, port = p.port, "skipping a port out of range");
            continue;
        };
        if port == 0 {
            warn!(service = %name, "skipping port 0");
            continue;
        }
        let node_port = match p.node_port.filter(|_| node_ports_allowed) {
            Some(np) => match u16::try_from(np) {
                Ok(np) => np,
                Err(_) => {
                    warn!(service = %name, node_port = np, "ignoring a NodePort out of range");
                    0
                }
            },
            None => 0,
        };
        let port_name = p.name.clone().unwrap_or_default();
        ports.insert(
            (port_name.clone(), protocol),
            ServicePort {
                port_name,
                protocol,
                cluster_ip,
                port,
                node_port,
                external_ips: external_ips.clone(),
                load_balancer_ips: lb_ips.clone(),
                affinity_seconds,
                internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
                external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
                topology,
            },
        );
    }
    Some((name, ports))
}

/// What the proxy keeps of one EndpointSlice: its Service and, per (port name, protocol),
/// its endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceInfo {
    /// The Service the slice belongs to.
    pub service: ServiceName,
    /// Endpoints per port.
    pub ports: BTreeMap<(String, Protocol), Vec<Endpoint>>,
}

/// Reads `slice` for `family`; `None` when it is of another family, names no Service, or is
/// unusable.
pub fn slice_info(slice: &EndpointSlice, family: Family, node_name: &str) -> Option<SliceInfo> {
    if slice.address_type != family.address_type() {
        return None;
    }
    let namespace = slice.metadata.namespace.clone().unwrap_or_default();
    let svc = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME))?;
    let service = ServiceName {
        namespace,
        name: svc.clone(),
    };
    let mut endpoints = Vec::new();
    for ep in &slice.endpoints {
        let conditions = ep.conditions.as_ref();
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
        let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
        let local = ep.node_name.as_deref() == Some(node_name);
        let zone_hints: BTreeSet<String> = ep
            .hints
            .as_ref()
            .and_then(|h| h.for_zones.as_ref())
            .into_iter()
            .flatten()
            .map(|z| z.name.clone())
            .collect();
        // Upstream uses the first address only: the others are for the same Pod.
        let Some(addr) = ep.addresses.first() else {
            continue;
        };
        match addr.parse::<IpAddr>() {
            Ok(ip) if Family::of(&ip) == family => {
                endpoints.push((ip, ready, serving, terminating, local, zone_hints))
            }
            _ => {
                warn!(service = %service, address = %addr, "skipping a malformed endpoint address")
            }
        }
    }
    let mut ports = BTreeMap::new();
    for p in slice.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else {
            warn!(service = %service, "skipping a slice port with an unknown protocol");
            continue;
        };
        let Some(port) = p
            .port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
        else {
            warn!(service = %service, port = ?p.port, "skipping a slice port without a valid number");
            continue;
        };
        let eps = endpoints
            .iter()
            .map(|(ip, ready, serving, terminating, local, hints)| Endpoint {
                ip: *ip,
                port,
                ready: *ready,
                serving: *serving,
                terminating: *terminating,
                local: *local,
                zone_hints: hints.clone(),
            })
            .collect();
        ports.insert((p.name.clone().unwrap_or_default(), protocol), eps);
    }
    Some(SliceInfo { service, ports })
}

/// The endpoints of one Service port as the rules use them (upstream `CategorizeEndpoints`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized {
    /// For `Cluster` policy traffic.
    pub cluster: Vec<Endpoint>,
    /// For `Local` policy traffic.
    pub local: Vec<Endpoint>,
    /// Every endpoint a chain is needed for (the union of the two).
    pub reachable: Vec<Endpoint>,
    /// Whether the Service has any usable endpoint anywhere (else its traffic is rejected).
    pub has_any: bool,
}

/// Upstream `canUseTopology`: hints are used only when asked for, the node has a zone, every
/// ready endpoint carries hints (#35: a half-hinted Service is routed as if unhinted), and
/// at least one is hinted to this zone.
pub fn can_use_topology(endpoints: &[Endpoint], svc: &ServicePort, zone: Option<&str>) -> bool {
    if !svc.topology {
        return false;
    }
    let Some(zone) = zone.filter(|z| !z.is_empty()) else {
        return false;
    };
    let mut has_for_zone = false;
    for ep in endpoints.iter().filter(|e| e.ready) {
        if ep.zone_hints.is_empty() {
            return false;
        }
        has_for_zone |= ep.zone_hints.contains(zone);
    }
    has_for_zone
}

/// Upstream `CategorizeEndpoints`: ready endpoints (filtered by topology when usable); the
/// serving-and-terminating ones only when no ready one is left.
pub fn categorize(endpoints: &[Endpoint], svc: &ServicePort, zone: Option<&str>) -> Categorized {
    let mut out = Categorized::default();
    if svc.uses_cluster_endpoints() {
        let topo = can_use_topology(endpoints, svc, zone);
        out.cluster = endpoints
            .iter()
            .filter(|e| e.ready && (!topo || zone.is_some_and(|z| e.zone_hints.contains(z))))
            .cloned()
            .collect();
        if out.cluster.is_empty() {
            out.cluster = endpoints
                .iter()
                .filter(|e| e.serving && e.terminating)
                .cloned()
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !svc.uses_local_endpoints() {
        out.reachable = out.cluster.clone();
        return out;
    }
    let (mut local_ready, mut local_terminating) = (false, false);
    for e in endpoints {
        if e.ready {
            out.has_any = true;
            local_ready |= e.local;
        } else if e.serving && e.terminating {
            out.has_any = true;
            local_terminating |= e.local;
        }
    }
    if local_ready {
        out.local = endpoints
            .iter()
            .filter(|e| e.local && e.ready)
            .cloned()
            .collect();
    } else if local_terminating {
        out.local = endpoints
            .iter()
            .filter(|e| e.local && e.serving && e.terminating)
            .cloned()
            .collect();
    }
    if !svc.uses_cluster_endpoints() {
        out.reachable = out.local.clone();
        return out;
    }
    let mut all: Vec<Endpoint> = out.cluster.iter().chain(&out.local).cloned().collect();
    all.sort();
    all.dedup();
    out.reachable = all;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(topology: bool) -> ServicePort {
        ServicePort {
            port_name: "http".into(),
            protocol: Protocol::Tcp,
            cluster_ip: "10.96.0.20".parse().expect("ip"),
            port: 80,
            node_port: 0,
            external_ips: vec![],
            load_balancer_ips: vec![],
            affinity_seconds: None,
            internal_local: false,
            external_local: false,
            topology,
        }
    }

    fn ep(last: u8, ready: bool, terminating: bool, zones: &[&str]) -> Endpoint {
        Endpoint {
            ip: IpAddr::from([10, 244, 0, last]),
            port: 8080,
            ready,
            serving: ready || terminating,
            terminating,
            local: false,
            zone_hints: zones.iter().map(|z| z.to_string()).collect(),
        }
    }

    #[test]
    fn hints_are_used_only_when_every_ready_endpoint_has_one() {
        let svc = port(true);
        let all = [ep(1, true, false, &["a"]), ep(2, true, false, &["b"])];
        let c = categorize(&all, &svc, Some("a"));
        assert_eq!(
            c.cluster,
            vec![all[0].clone()],
            "hinted: only zone a's endpoint"
        );
        let half = [ep(1, true, false, &["a"]), ep(2, true, false, &[])];
        let c = categorize(&half, &svc, Some("a"));
        assert_eq!(
            c.cluster.len(),
            2,
            "one endpoint without hint: hints ignored"
        );
        // A not-ready endpoint without hints does not turn hints off (it is not used anyway).
        let unready = [ep(1, true, false, &["a"]), ep(2, false, false, &[])];
        assert_eq!(categorize(&unready, &svc, Some("a")).cluster.len(), 1);
        // No endpoint for this zone, no zone, or hints not asked for: everything.
        assert_eq!(categorize(&all, &svc, Some("c")).cluster.len(), 2);
        assert_eq!(categorize(&all, &svc, None).cluster.len(), 2);
        assert_eq!(categorize(&all, &port(false), Some("a")).cluster.len(), 2);
    }

    #[test]
    fn terminating_endpoints_only_when_no_ready_one_is_left() {
        let svc = port(false);
        let eps = [ep(1, true, false, &[]), ep(2, false, true, &[])];
        let c = categorize(&eps, &svc, None);
        assert_eq!(c.cluster, vec![eps[0].clone()]);
        let only_terminating = [ep(2, false, true, &[]), ep(3, false, false, &[])];
        let c = categorize(&only_terminating, &svc, None);
        assert_eq!(c.cluster, vec![only_terminating[0].clone()]);
        assert!(c.has_any);
        let none = [ep(3, false, false, &[])];
        assert!(!categorize(&none, &svc, None).has_any);
    }

    #[test]
    fn local_policy_uses_this_nodes_endpoints() {
        let mut svc = port(false);
        svc.internal_local = true;
        let mut mine = ep(1, true, false, &[]);
        mine.local = true;
        let eps = [mine.clone(), ep(2, true, false, &[])];
        let c = categorize(&eps, &svc, None);
        assert!(c.cluster.is_empty());
        assert_eq!(c.local, vec![mine]);
        assert_eq!(c.reachable.len(), 1);
        let remote_only = [ep(2, true, false, &[])];
        let c = categorize(&remote_only, &svc, None);
        assert!(c.local.is_empty() && c.has_any, "drop, not reject");
    }
}
