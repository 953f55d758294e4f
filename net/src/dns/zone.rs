//! The cluster zone: the authoritative answers for `<domain>` (`cluster.local` unless
//! configured) and for the reverse names of cluster addresses, computed on every query from the
//! informer caches of Services and EndpointSlices — no zone file, no copy to keep in step.
//!
//! The records are the Kubernetes DNS specification's (`kubernetes/dns`
//! `docs/specification.md`, schema 1.1.0), with CoreDNS's `kubernetes` plugin's choices where the
//! spec leaves room:
//! - `<svc>.<ns>.svc.<domain>`: A/AAAA of a ClusterIP Service's cluster IPs; of a headless
//!   Service's ready endpoints; a CNAME to an ExternalName Service's name, for any type;
//! - `<host>.<svc>.<ns>.svc.<domain>`: A/AAAA of one ready endpoint of a headless Service, where
//!   `<host>` is the endpoint's `hostname` or its address with dashes (CoreDNS's default
//!   `endpoint_pod_names` off);
//! - `_<port>._<proto>.<svc>.<ns>.svc.<domain>`: SRV for each named port, targeting the
//!   Service's name (ClusterIP) or each ready endpoint's name (headless), with the targets'
//!   addresses in the additional section;
//! - `<a-b-c-d>.<ns>.pod.<domain>`: A (or AAAA for a dashed IPv6) of the address itself, the
//!   `pods insecure` mode kubeadm's Corefile configures;
//! - PTR in `in-addr.arpa` / `ip6.arpa` for cluster IPs and headless endpoints;
//! - `dns-version.<domain>` TXT `1.1.0`; SOA and NS at the apex.
//!
//! A name that exists without the asked type is NODATA (NOERROR, SOA in the authority
//! section); a name that does not exist is NXDOMAIN. A reverse name matching no cluster address
//! is not ours ([`Zone::answer`] returns `None`) and goes to the upstream resolvers, as
//! CoreDNS's `fallthrough in-addr.arpa ip6.arpa` does.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use skerry_client::cache::Indexer;

/// The TTL of every record of the cluster zone, and the SOA minimum (the negative TTL): the
/// `ttl 30` of the `kubernetes` block in kubeadm's Corefile
/// (`cmd/kubeadm/app/phases/addons/dns/manifests.go`), what every kubeadm cluster's CoreDNS
/// answers with.
pub const TTL: u32 = 30;

/// The schema version answered at `dns-version.<domain>` (the spec's section 2.2).
pub const SCHEMA_VERSION: &str = "1.1.0";

/// The label naming a slice's Service (`discovery.LabelServiceName`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The slice index by owning Service (`<ns>/<service>`).
pub const SLICES_BY_SERVICE: &str = "dns-by-service";
/// The slice index by endpoint address (for PTR).
pub const SLICES_BY_ADDRESS: &str = "dns-by-address";
/// The Service index by cluster IP (for PTR).
pub const SERVICES_BY_IP: &str = "dns-by-cluster-ip";

/// SOA timers, CoreDNS's (`plugin/kubernetes/kubernetes.go` and `plugin/etcd/msg` SOA):
/// refresh 2 h, retry 30 min, expire 24 h; the minimum (negative TTL) is the zone's TTL.
const SOA_REFRESH: i32 = 7200;
/// See [`SOA_REFRESH`].
const SOA_RETRY: i32 = 1800;
/// See [`SOA_REFRESH`].
const SOA_EXPIRE: i32 = 86400;

/// SRV priority of every target (the spec gives all targets one priority).
const SRV_PRIORITY: u16 = 0;
/// The weight shared by the targets of one SRV answer: CoreDNS gives each of `n` targets
/// `100 / n` (`plugin/backend_lookup.go` `SRV`).
const SRV_WEIGHT_TOTAL: u16 = 100;

/// The service type of an ExternalName Service.
const EXTERNAL_NAME: &str = "ExternalName";
/// The cluster IP of a headless Service.
const CLUSTER_IP_NONE: &str = "None";

/// What the zone answers to one question.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// NOERROR (with answers, or NODATA without) or NXDOMAIN.
    pub rcode: ResponseCode,
    /// The answer section.
    pub answers: Vec<Record>,
    /// The authority section: the SOA on NODATA and NXDOMAIN.
    pub authorities: Vec<Record>,
    /// The additional section: the addresses of SRV targets.
    pub additionals: Vec<Record>,
}

/// The cluster zone over the informers' stores. Cheap to clone.
#[derive(Clone)]
pub struct Zone {
    domain: Name,
    /// `<domain>` lowercased, without the trailing dot.
    domain_str: Arc<str>,
    /// The cluster DNS address, the A/AAAA of the apex's NS `ns.dns.<domain>`.
    dns_ip: Option<IpAddr>,
    services: Indexer<Service>,
    slices: Indexer<EndpointSlice>,
    /// The SOA serial: seconds since the epoch when the zone was built.
    serial: u32,
}

/// The indexes [`Zone`] needs on the Service store; add them before the informer runs.
pub fn service_indexes() -> Vec<(&'static str, skerry_client::cache::IndexFunc<Service>)> {
    vec![(
        SERVICES_BY_IP,
        Arc::new(|s: &Service| {
            cluster_ips(s)
                .into_iter()
                .map(|ip| ip.to_string())
                .collect()
        }),
    )]
}

/// The indexes [`Zone`] needs on the EndpointSlice store.
pub fn slice_indexes() -> Vec<(&'static str, skerry_client::cache::IndexFunc<EndpointSlice>)> {
    vec![
        (
            SLICES_BY_SERVICE,
            Arc::new(|s: &EndpointSlice| {
                let ns = s.metadata.namespace.clone().unwrap_or_default();
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .map(|svc| vec![format!("{ns}/{svc}")])
                    .unwrap_or_default()
            }),
        ),
        (
            SLICES_BY_ADDRESS,
            Arc::new(|s: &EndpointSlice| {
                s.endpoints
                    .iter()
                    .flat_map(|e| e.addresses.iter())
                    .filter_map(|a| a.parse::<IpAddr>().ok())
                    .map(|ip| ip.to_string())
                    .collect()
            }),
        ),
    ]
}

/// A Service's cluster IPs (none for headless and ExternalName).
fn cluster_ips(s: &Service) -> Vec<IpAddr> {
    let Some(spec) = &s.spec else {
        return Vec::new();
    };
    if spec.type_.as_deref() == Some(EXTERNAL_NAME) {
        return Vec::new();
    }
    let mut ips: Vec<String> = spec.cluster_ips.clone().unwrap_or_default();
    if ips.is_empty()
        && let Some(ip) = &spec.cluster_ip
    {
        ips.push(ip.clone());
    }
    ips.iter().filter_map(|ip| ip.parse().ok()).collect()
}

fn is_headless(s: &Service) -> bool {
    let Some(spec) = &s.spec else {
        return false;
    };
    spec.type_.as_deref() != Some(EXTERNAL_NAME)
        && spec.cluster_ip.as_deref() == Some(CLUSTER_IP_NONE)
}

/// An IP with dashes for dots (IPv4) or colons (IPv6): CoreDNS's endpoint and pod labels.
pub fn dashed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// The address of a dashed label (`10-0-0-1`, `fd00--1`), if it is one.
fn undashed(label: &str) -> Option<IpAddr> {
    if let Ok(v4) = label.replace('-', ".").parse::<Ipv4Addr>()
        && label.bytes().filter(|b| *b == b'-').count() == 3
    {
        return Some(IpAddr::V4(v4));
    }
    label
        .replace('-', ":")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// One ready endpoint of a headless Service: its address and its DNS label.
struct Endpoint {
    ip: IpAddr,
    host: String,
}

/// The parsed question, below the domain.
enum Query<'a> {
    Apex,
    /// `ns.dns.<domain>`, the apex's NS target.
    NsHost,
    /// `dns-version.<domain>`.
    Version,
    /// `svc.<domain>` or `pod.<domain>`: empty non-terminals.
    Intermediate,
    /// `<ns>.svc.<domain>` or `<ns>.pod.<domain>`.
    Namespace,
    Service {
        ns: &'a str,
        svc: &'a str,
    },
    Endpoint {
        ns: &'a str,
        svc: &'a str,
        host: &'a str,
    },
    Srv {
        ns: &'a str,
        svc: &'a str,
        port: &'a str,
        proto: &'a str,
    },
    /// `_<port>.<svc>.<ns>.svc` without the protocol label: exists as an empty non-terminal.
    SrvPartial,
    Pod(IpAddr),
    None,
}

impl Zone {
    /// The zone `domain` over the stores (which carry [`service_indexes`] and
    /// [`slice_indexes`]); `dns_ip` is the kube-dns cluster address.
    pub fn new(
        domain: &str,
        dns_ip: Option<IpAddr>,
        services: Indexer<Service>,
        slices: Indexer<EndpointSlice>,
    ) -> Result<Zone, String> {
        let trimmed = domain.trim_end_matches('.').to_ascii_lowercase();
        if trimmed.is_empty() {
            return Err("the cluster domain is empty".to_string());
        }
        let mut name = Name::from_ascii(&trimmed).map_err(|e| format!("cluster domain: {e}"))?;
        name.set_fqdn(true);
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
            .unwrap_or(1);
        Ok(Zone {
            domain: name,
            domain_str: trimmed.into(),
            dns_ip,
            services,
            slices,
            serial,
        })
    }

    /// The zone's name.
    pub fn domain(&self) -> &Name {
        &self.domain
    }

    /// The answer to `name`/`rtype` if the name is the zone's (under the domain, or a reverse
    /// name of a cluster address); `None` if it is to be forwarded.
    pub fn answer(&self, name: &Name, rtype: RecordType) -> Option<Answer> {
        let lower = name.to_lowercase().to_ascii();
        let lower = lower.trim_end_matches('.');
        if lower.ends_with(".in-addr.arpa") || lower.ends_with(".ip6.arpa") {
            return self.reverse(name, rtype);
        }
        let rest = if lower == &*self.domain_str {
            ""
        } else {
            lower.strip_suffix(&*self.domain_str)?.strip_suffix('.')?
        };
        let labels: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('.').collect()
        };
        Some(self.forward_answer(name, rtype, self.parse(&labels)))
    }

    fn parse<'a>(&self, labels: &[&'a str]) -> Query<'a> {
        match labels {
            [] => Query::Apex,
            ["dns-version"] => Query::Version,
            ["ns", "dns"] => Query::NsHost,
            ["svc"] | ["pod"] => Query::Intermediate,
            [ns, "svc"] => {
                if self.services.list_namespace(ns).is_empty() {
                    Query::None
                } else {
                    Query::Namespace
                }
            }
            [svc, ns, "svc"] => Query::Service { ns, svc },
            [port, svc, ns, "svc"] if port.starts_with('_') => {
                if self.services.get_by(ns, svc).is_some() {
                    Query::SrvPartial
                } else {
                    Query::None
                }
            }
            [host, svc, ns, "svc"] => Query::Endpoint { ns, svc, host },
            [port, proto, svc, ns, "svc"] => {
                match (port.strip_prefix('_'), proto.strip_prefix('_')) {
                    (Some(port), Some(proto)) => Query::Srv {
                        ns,
                        svc,
                        port,
                        proto,
                    },
                    _ => Query::None,
                }
            }
            [ip, _ns, "pod"] => undashed(ip).map_or(Query::None, Query::Pod),
            _ => Query::None,
        }
    }

    fn record(&self, name: &Name, rdata: RData) -> Record {
        Record::from_rdata(name.clone(), TTL, rdata)
    }

    fn soa(&self) -> Record {
        let mname = self.ns_name();
        let rname = Name::from_ascii("hostmaster")
            .and_then(|n| n.append_domain(&self.domain))
            .unwrap_or_else(|_| self.domain.clone());
        Record::from_rdata(
            self.domain.clone(),
            TTL,
            RData::SOA(SOA::new(
                mname,
                rname,
                self.serial,
                SOA_REFRESH,
                SOA_RETRY,
                SOA_EXPIRE,
                TTL,
            )),
        )
    }

    fn ns_name(&self) -> Name {
        Name::from_ascii("ns.dns")
            .and_then(|n| n.append_domain(&self.domain))
            .unwrap_or_else(|_| self.domain.clone())
    }

    fn nodata(&self) -> Answer {
        Answer {
            rcode: ResponseCode::NoError,
            answers: Vec::new(),
            authorities: vec![self.soa()],
            additionals: Vec::new(),
        }
    }

    fn nxdomain(&self) -> Answer {
        Answer {
            rcode: ResponseCode::NXDomain,
            answers: Vec::new(),
            authorities: vec![self.soa()],
            additionals: Vec::new(),
        }
    }

    /// `answers` if any, NODATA otherwise (the name exists).
    fn found(&self, answers: Vec<Record>, additionals: Vec<Record>) -> Answer {
        if answers.is_empty() {
            return self.nodata();
        }
        Answer {
            rcode: ResponseCode::NoError,
            answers,
            authorities: Vec::new(),
            additionals,
        }
    }

    /// Address records of `ips` matching `rtype` (A for IPv4, AAAA for IPv6).
    fn addresses(&self, name: &Name, rtype: RecordType, ips: &[IpAddr]) -> Vec<Record> {
        ips.iter()
            .filter_map(|ip| match (ip, rtype) {
                (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => {
                    Some(self.record(name, RData::A(A(*v4))))
                }
                (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => {
                    Some(self.record(name, RData::AAAA(AAAA(*v6))))
                }
                _ => None,
            })
            .collect()
    }

    /// The ready endpoints of the Service `ns/svc`, each address once, in address order.
    fn ready_endpoints(&self, ns: &str, svc: &str) -> Vec<Endpoint> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for slice in self
            .slices
            .by_index(SLICES_BY_SERVICE, &format!("{ns}/{svc}"))
        {
            for ep in &slice.endpoints {
                // The API: "nil should be interpreted as true" for `ready`.
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if !ready {
                    continue;
                }
                for addr in &ep.addresses {
                    let Ok(ip) = addr.parse::<IpAddr>() else {
                        continue;
                    };
                    if !seen.insert(ip) {
                        continue;
                    }
                    let host = ep
                        .hostname
                        .clone()
                        .filter(|h| !h.is_empty())
                        .unwrap_or_else(|| dashed(ip));
                    out.push(Endpoint { ip, host });
                }
            }
        }
        out.sort_by_key(|e| e.ip);
        out
    }

    /// A name under the service's: `<label>.<svc>.<ns>.svc.<domain>`.
    fn child(&self, label: &str, svc: &str, ns: &str) -> Option<Name> {
        Name::from_ascii(format!("{label}.{svc}.{ns}.svc"))
            .ok()?
            .append_domain(&self.domain)
            .ok()
    }

    fn service_name(&self, svc: &str, ns: &str) -> Option<Name> {
        Name::from_ascii(format!("{svc}.{ns}.svc"))
            .ok()?
            .append_domain(&self.domain)
            .ok()
    }

    fn forward_answer(&self, name: &Name, rtype: RecordType, query: Query<'_>) -> Answer {
        match query {
            Query::Apex => match rtype {
                RecordType::SOA => self.found(vec![self.soa()], Vec::new()),
                RecordType::NS => {
                    let ns = self.ns_name();
                    let glue = self
                        .dns_ip
                        .map(|ip| self.addresses(&ns, RecordType::ANY, &[ip]))
                        .unwrap_or_default();
                    self.found(
                        vec![self.record(&self.domain, RData::NS(NS(ns.clone())))],
                        glue,
                    )
                }
                _ => self.nodata(),
            },
            Query::NsHost => {
                let ips: Vec<IpAddr> = self.dns_ip.into_iter().collect();
                let answers = self.addresses(name, rtype, &ips);
                self.found(answers, Vec::new())
            }
            Query::Version => match rtype {
                RecordType::TXT | RecordType::ANY => self.found(
                    vec![self.record(name, RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_string()])))],
                    Vec::new(),
                ),
                _ => self.nodata(),
            },
            Query::Intermediate | Query::Namespace | Query::SrvPartial => self.nodata(),
            Query::None => self.nxdomain(),
            Query::Pod(ip) => {
                let answers = self.addresses(name, rtype, &[ip]);
                self.found(answers, Vec::new())
            }
            Query::Service { ns, svc } => {
                let Some(service) = self.services.get_by(ns, svc) else {
                    return self.nxdomain();
                };
                self.service_answer(name, rtype, ns, svc, &service)
            }
            Query::Endpoint { ns, svc, host } => {
                let Some(service) = self.services.get_by(ns, svc) else {
                    return self.nxdomain();
                };
                if !is_headless(&service) {
                    return self.nxdomain();
                }
                let ips: Vec<IpAddr> = self
                    .ready_endpoints(ns, svc)
                    .into_iter()
                    .filter(|e| e.host == host)
                    .map(|e| e.ip)
                    .collect();
                if ips.is_empty() {
                    return self.nxdomain();
                }
                let answers = self.addresses(name, rtype, &ips);
                self.found(answers, Vec::new())
            }
            Query::Srv {
                ns,
                svc,
                port,
                proto,
            } => {
                let Some(service) = self.services.get_by(ns, svc) else {
                    return self.nxdomain();
                };
                self.srv_answer(name, rtype, ns, svc, port, proto, &service)
            }
        }
    }

    fn service_answer(
        &self,
        name: &Name,
        rtype: RecordType,
        ns: &str,
        svc: &str,
        service: &Service,
    ) -> Answer {
        let spec = service.spec.clone().unwrap_or_default();
        if spec.type_.as_deref() == Some(EXTERNAL_NAME) {
            // The spec: a CNAME for any question; the resolver (or the client) chases it.
            let Some(target) = spec
                .external_name
                .as_deref()
                .and_then(|t| Name::from_ascii(t.trim_end_matches('.')).ok())
                .map(|mut t| {
                    t.set_fqdn(true);
                    t
                })
            else {
                return self.nxdomain();
            };
            return self.found(
                vec![self.record(name, RData::CNAME(CNAME(target)))],
                Vec::new(),
            );
        }
        if rtype == RecordType::SRV {
            // SRV at the service name: every named port, as CoreDNS answers it.
            return self.srv_answer(name, rtype, ns, svc, "", "", service);
        }
        if is_headless(service) {
            let endpoints = self.ready_endpoints(ns, svc);
            if endpoints.is_empty() {
                // CoreDNS: a headless Service without a ready endpoint has no records.
                return self.nxdomain();
            }
            let ips: Vec<IpAddr> = endpoints.iter().map(|e| e.ip).collect();
            let answers = self.addresses(name, rtype, &ips);
            return self.found(answers, Vec::new());
        }
        let answers = self.addresses(name, rtype, &cluster_ips(service));
        self.found(answers, Vec::new())
    }

    /// SRV for the named ports matching `port`/`proto` (empty: any).
    #[allow(clippy::too_many_arguments, reason = "the parsed parts of one name")]
    fn srv_answer(
        &self,
        name: &Name,
        rtype: RecordType,
        ns: &str,
        svc: &str,
        port: &str,
        proto: &str,
        service: &Service,
    ) -> Answer {
        let spec = service.spec.clone().unwrap_or_default();
        let ports: Vec<(String, u16)> = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                let pname = p.name.clone().filter(|n| !n.is_empty())?;
                let pproto = p
                    .protocol
                    .clone()
                    .unwrap_or_else(|| "TCP".to_string())
                    .to_ascii_lowercase();
                let number = u16::try_from(p.port).ok()?;
                ((port.is_empty() || pname.eq_ignore_ascii_case(port))
                    && (proto.is_empty() || pproto == proto))
                    .then_some((pname, number))
            })
            .collect();
        if ports.is_empty() {
            return self.nxdomain();
        }
        if rtype != RecordType::SRV && rtype != RecordType::ANY {
            return self.nodata();
        }
        // Targets: the Service's own name (ClusterIP) or each ready endpoint's.
        let mut targets: Vec<(Name, Vec<IpAddr>)> = Vec::new();
        if is_headless(service) {
            for e in self.ready_endpoints(ns, svc) {
                if let Some(t) = self.child(&e.host, svc, ns) {
                    targets.push((t, vec![e.ip]));
                }
            }
        } else if let Some(t) = self.service_name(svc, ns) {
            targets.push((t, cluster_ips(service)));
        }
        if targets.is_empty() {
            return self.nxdomain();
        }
        let count = u16::try_from(targets.len() * ports.len()).unwrap_or(u16::MAX);
        let weight = (SRV_WEIGHT_TOTAL / count.max(1)).max(1);
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        for (_, number) in &ports {
            for (target, _) in &targets {
                answers.push(self.record(
                    name,
                    RData::SRV(SRV::new(SRV_PRIORITY, weight, *number, target.clone())),
                ));
            }
        }
        for (target, ips) in &targets {
            additionals.extend(self.addresses(target, RecordType::ANY, ips));
        }
        self.found(answers, additionals)
    }

    /// PTR for a reverse name of a cluster IP or a headless endpoint; `None` for any other
    /// address (forwarded).
    fn reverse(&self, name: &Name, rtype: RecordType) -> Option<Answer> {
        let net = name.parse_arpa_name().ok()?;
        // Only a full address: a shorter arpa name (a reverse zone cut) is not ours.
        if net.prefix_len() != net.max_prefix_len() {
            return None;
        }
        let ip = net.addr();
        let key = ip.to_string();
        let mut targets: Vec<Name> = Vec::new();
        for service in self.services.by_index(SERVICES_BY_IP, &key) {
            let (Some(ns), Some(svc)) = (&service.metadata.namespace, &service.metadata.name)
            else {
                continue;
            };
            targets.extend(self.service_name(svc, ns));
        }
        for slice in self.slices.by_index(SLICES_BY_ADDRESS, &key) {
            let Some(ns) = &slice.metadata.namespace else {
                continue;
            };
            let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
            else {
                continue;
            };
            if !self
                .services
                .get_by(ns, svc)
                .is_some_and(|s| is_headless(&s))
            {
                continue;
            }
            for e in self.ready_endpoints(ns, svc) {
                if e.ip == ip {
                    targets.extend(self.child(&e.host, svc, ns));
                }
            }
        }
        if targets.is_empty() {
            return None;
        }
        targets.sort();
        targets.dedup();
        if rtype != RecordType::PTR && rtype != RecordType::ANY {
            return Some(self.nodata());
        }
        let answers = targets
            .into_iter()
            .map(|t| self.record(name, RData::PTR(PTR(t))))
            .collect();
        Some(self.found(answers, Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint as SliceEndpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).expect("a valid name")
    }

    fn indexed_stores() -> (Indexer<Service>, Indexer<EndpointSlice>) {
        let services = Indexer::new();
        for (n, f) in service_indexes() {
            services.add_index(n, f).expect("index");
        }
        let slices = Indexer::new();
        for (n, f) in slice_indexes() {
            slices.add_index(n, f).expect("index");
        }
        (services, slices)
    }

    fn service(ns: &str, n: &str, spec: ServiceSpec) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(n.to_string()),
                namespace: Some(ns.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            ..Service::default()
        }
    }

    fn port(n: &str, number: i32, proto: &str) -> ServicePort {
        ServicePort {
            name: Some(n.to_string()),
            port: number,
            protocol: Some(proto.to_string()),
            ..ServicePort::default()
        }
    }

    fn slice(ns: &str, svc: &str, eps: &[(&str, Option<&str>, bool)]) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{svc}-abc")),
                namespace: Some(ns.to_string()),
                labels: Some(BTreeMap::from([(
                    SERVICE_NAME_LABEL.to_string(),
                    svc.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".to_string(),
            endpoints: eps
                .iter()
                .map(|(ip, host, ready)| SliceEndpoint {
                    addresses: vec![ip.to_string()],
                    hostname: host.map(str::to_string),
                    conditions: Some(EndpointConditions {
                        ready: Some(*ready),
                        ..EndpointConditions::default()
                    }),
                    ..SliceEndpoint::default()
                })
                .collect(),
            ports: None,
        }
    }

    /// web (ClusterIP, dual-stack, named port http), db (headless, two ready endpoints, one
    /// with a hostname, one not ready), ext (ExternalName), all in `shop`.
    fn zone() -> Zone {
        let (services, slices) = indexed_stores();
        let web = service(
            "shop",
            "web",
            ServiceSpec {
                cluster_ip: Some("10.96.0.20".to_string()),
                cluster_ips: Some(vec!["10.96.0.20".to_string(), "fd00::20".to_string()]),
                ports: Some(vec![port("http", 80, "TCP")]),
                ..ServiceSpec::default()
            },
        );
        let db = service(
            "shop",
            "db",
            ServiceSpec {
                cluster_ip: Some("None".to_string()),
                ports: Some(vec![port("pg", 5432, "TCP")]),
                ..ServiceSpec::default()
            },
        );
        let ext = service(
            "shop",
            "ext",
            ServiceSpec {
                type_: Some("ExternalName".to_string()),
                external_name: Some("example.org".to_string()),
                ..ServiceSpec::default()
            },
        );
        for s in [web, db, ext] {
            let key = format!("shop/{}", s.metadata.name.clone().unwrap_or_default());
            services.upsert(&key, Arc::new(s));
        }
        slices.upsert(
            "shop/db-abc",
            Arc::new(slice(
                "shop",
                "db",
                &[
                    ("10.244.1.5", Some("db-0"), true),
                    ("10.244.2.7", None, true),
                    ("10.244.3.9", Some("db-2"), false),
                ],
            )),
        );
        Zone::new(
            "cluster.local",
            Some("10.96.0.10".parse().expect("ip")),
            services,
            slices,
        )
        .expect("a zone")
    }

    fn ask(z: &Zone, n: &str, t: RecordType) -> Answer {
        z.answer(&name(n), t).expect("the zone's name")
    }

    fn rdatas(a: &Answer) -> Vec<String> {
        let mut v: Vec<String> = a.answers.iter().map(|r| r.data.to_string()).collect();
        v.sort();
        v
    }

    fn assert_nodata(a: &Answer) {
        assert_eq!(a.rcode, ResponseCode::NoError);
        assert!(a.answers.is_empty(), "{a:?}");
        assert!(matches!(
            a.authorities.first().map(|r| &r.data),
            Some(RData::SOA(_))
        ));
    }

    fn assert_nxdomain(a: &Answer) {
        assert_eq!(a.rcode, ResponseCode::NXDomain, "{a:?}");
        assert!(a.answers.is_empty());
        assert!(matches!(
            a.authorities.first().map(|r| &r.data),
            Some(RData::SOA(_))
        ));
    }

    #[test]
    fn cluster_ip_service_a_and_aaaa() {
        let z = zone();
        let a = ask(&z, "web.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(rdatas(&a), ["10.96.0.20"]);
        assert_eq!(a.answers[0].ttl, TTL);
        let aaaa = ask(&z, "WEB.Shop.svc.Cluster.Local.", RecordType::AAAA);
        assert_eq!(rdatas(&aaaa), ["fd00::20"]);
        // The name exists; MX does not: NODATA.
        assert_nodata(&ask(&z, "web.shop.svc.cluster.local.", RecordType::MX));
    }

    #[test]
    fn headless_service_returns_ready_endpoints_and_their_names() {
        let z = zone();
        let a = ask(&z, "db.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(rdatas(&a), ["10.244.1.5", "10.244.2.7"]);
        let host = ask(&z, "db-0.db.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(rdatas(&host), ["10.244.1.5"]);
        // Without a hostname the endpoint is named by its dashed address.
        let dashed = ask(&z, "10-244-2-7.db.shop.svc.cluster.local.", RecordType::A);
        assert_eq!(rdatas(&dashed), ["10.244.2.7"]);
        // Not ready: no record.
        assert_nxdomain(&ask(&z, "db-2.db.shop.svc.cluster.local.", RecordType::A));
        // A headless endpoint name under a ClusterIP Service does not exist.
        assert_nxdomain(&ask(&z, "db-0.web.shop.svc.cluster.local.", RecordType::A));
    }

    #[test]
    fn external_name_is_a_cname_for_any_type() {
        let z = zone();
        for t in [RecordType::A, RecordType::AAAA, RecordType::CNAME] {
            let a = ask(&z, "ext.shop.svc.cluster.local.", t);
            assert_eq!(rdatas(&a), ["example.org."], "{t}");
            assert!(matches!(a.answers[0].data, RData::CNAME(_)));
        }
    }

    #[test]
    fn srv_for_named_ports() {
        let z = zone();
        let a = ask(
            &z,
            "_http._tcp.web.shop.svc.cluster.local.",
            RecordType::SRV,
        );
        assert_eq!(rdatas(&a), ["0 100 80 web.shop.svc.cluster.local."]);
        let addl: Vec<String> = a.additionals.iter().map(|r| r.data.to_string()).collect();
        assert!(addl.contains(&"10.96.0.20".to_string()), "{addl:?}");
        let h = ask(&z, "_pg._tcp.db.shop.svc.cluster.local.", RecordType::SRV);
        assert_eq!(
            rdatas(&h),
            [
                "0 50 5432 10-244-2-7.db.shop.svc.cluster.local.",
                "0 50 5432 db-0.db.shop.svc.cluster.local.",
            ]
        );
        // Wrong protocol or unknown port: no such name.
        assert_nxdomain(&ask(
            &z,
            "_http._udp.web.shop.svc.cluster.local.",
            RecordType::SRV,
        ));
        assert_nxdomain(&ask(
            &z,
            "_ssh._tcp.web.shop.svc.cluster.local.",
            RecordType::SRV,
        ));
        // The SRV name exists; an A question there is NODATA.
        assert_nodata(&ask(
            &z,
            "_http._tcp.web.shop.svc.cluster.local.",
            RecordType::A,
        ));
    }

    #[test]
    fn ptr_for_cluster_ips_and_headless_endpoints() {
        let z = zone();
        let a = ask(&z, "20.0.96.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(rdatas(&a), ["web.shop.svc.cluster.local."]);
        let v6: Name = "fd00::20".parse::<IpAddr>().map(Name::from).expect("ip");
        let a6 = z.answer(&v6, RecordType::PTR).expect("ours");
        assert_eq!(rdatas(&a6), ["web.shop.svc.cluster.local."]);
        let ep = ask(&z, "5.1.244.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(rdatas(&ep), ["db-0.db.shop.svc.cluster.local."]);
        // Not a cluster address, or a not-ready endpoint: not ours, forwarded.
        assert!(
            z.answer(&name("8.8.8.8.in-addr.arpa."), RecordType::PTR)
                .is_none()
        );
        assert!(
            z.answer(&name("9.3.244.10.in-addr.arpa."), RecordType::PTR)
                .is_none()
        );
    }

    #[test]
    fn pod_records() {
        let z = zone();
        let a = ask(&z, "10-244-1-5.shop.pod.cluster.local.", RecordType::A);
        assert_eq!(rdatas(&a), ["10.244.1.5"]);
        let v6 = ask(&z, "fd00--5.shop.pod.cluster.local.", RecordType::AAAA);
        assert_eq!(rdatas(&v6), ["fd00::5"]);
        assert_nodata(&ask(
            &z,
            "10-244-1-5.shop.pod.cluster.local.",
            RecordType::AAAA,
        ));
        assert_nxdomain(&ask(&z, "10-244-1.shop.pod.cluster.local.", RecordType::A));
        assert_nxdomain(&ask(&z, "not-an-ip.shop.pod.cluster.local.", RecordType::A));
    }

    #[test]
    fn nxdomain_and_nodata_for_the_rest_of_the_zone() {
        let z = zone();
        assert_nxdomain(&ask(&z, "nope.shop.svc.cluster.local.", RecordType::A));
        assert_nxdomain(&ask(&z, "web.other.svc.cluster.local.", RecordType::A));
        assert_nxdomain(&ask(&z, "a.b.c.d.e.f.cluster.local.", RecordType::A));
        // Existing non-terminals: NODATA.
        assert_nodata(&ask(&z, "shop.svc.cluster.local.", RecordType::A));
        assert_nodata(&ask(&z, "svc.cluster.local.", RecordType::A));
        assert_nxdomain(&ask(&z, "empty.svc.cluster.local.", RecordType::A));
        let soa = ask(&z, "cluster.local.", RecordType::SOA);
        assert!(matches!(soa.answers[0].data, RData::SOA(_)));
        let ns = ask(&z, "cluster.local.", RecordType::NS);
        assert_eq!(rdatas(&ns), ["ns.dns.cluster.local."]);
        let glue = ask(&z, "ns.dns.cluster.local.", RecordType::A);
        assert_eq!(rdatas(&glue), ["10.96.0.10"]);
        let version = ask(&z, "dns-version.cluster.local.", RecordType::TXT);
        assert_eq!(rdatas(&version), [SCHEMA_VERSION]);
        // Outside the zone: not ours.
        assert!(z.answer(&name("example.org."), RecordType::A).is_none());
        assert!(
            z.answer(&name("notcluster.local."), RecordType::A)
                .is_none()
        );
    }

    #[test]
    fn odd_names_never_panic() {
        let z = zone();
        let long = "a".repeat(63);
        for n in [
            format!("{long}.{long}.shop.svc.cluster.local."),
            "_._.web.shop.svc.cluster.local.".to_string(),
            "-.shop.pod.cluster.local.".to_string(),
            "---.shop.pod.cluster.local.".to_string(),
            "1.2.3.4.5.6.in-addr.arpa.".to_string(),
            "in-addr.arpa.".to_string(),
            "x.ip6.arpa.".to_string(),
            "\\000.svc.cluster.local.".to_string(),
        ] {
            let Ok(parsed) = Name::from_ascii(&n) else {
                continue;
            };
            for t in [
                RecordType::A,
                RecordType::SRV,
                RecordType::PTR,
                RecordType::ANY,
            ] {
                if let Some(a) = z.answer(&parsed, t) {
                    assert!(
                        a.rcode == ResponseCode::NXDomain || a.rcode == ResponseCode::NoError,
                        "{n} {t}: {a:?}"
                    );
                }
            }
        }
    }
}
