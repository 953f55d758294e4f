//! The rule generator: from the model of Services and their endpoints to an `nft -f` script,
//! pure (no I/O), as upstream's `pkg/proxy/nftables/proxier.go` `syncProxyRules` writes its
//! transaction. It carries `docs/tricks.md` #33: a Service port's endpoint choice is one
//! `numgen random mod N vmap { 0 : goto endpoint-…, … }` rule, and dispatch to the Service is
//! one lookup in the `service-ips` / `service-nodeports` verdict maps.
//!
//! Everything lives in one table per family, `skerry-proxy` (`ip` / `ip6`); no other table is
//! named by any command this module writes. Per Service port (names as upstream's, a base
//! `HASH-namespace/name/protocol/port` where HASH is the first 8 base32 characters of the
//! SHA-256 of the rest, truncated to the chain-name limit):
//! - `service-…` (Cluster policy) and `local-…` (Local policy): the numgen rule over the
//!   endpoint chains, preceded by the ClientIP-affinity lookups;
//! - `external-…`: NodePort, externalIP and load-balancer traffic, masqueraded for Cluster
//!   policy, short-circuited to `service-…` for pod and host sources under Local policy;
//! - `endpoint-…__IP/PORT`: hairpin masquerade, the affinity `update`, the `dnat`;
//! - `affinity-…__IP/PORT`: the per-endpoint set of client addresses with the timeout.
//!
//! A partial sync rewrites the chains and map elements of the changed Services only
//! ([`ServiceRules`] remembers what each Service was given); a full sync rewrites the table.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::model::{Categorized, Endpoint, Family, ServiceName, ServicePort, categorize};

/// The table, one per family.
pub const TABLE: &str = "skerry-proxy";
/// Dispatch by destination address, protocol and port (upstream `serviceIPsMap`).
pub const SERVICE_IPS: &str = "service-ips";
/// Dispatch of NodePorts by protocol and port (upstream `serviceNodePortsMap`).
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// The node addresses that accept NodePorts (upstream `nodePortIPsSet`).
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// The dispatching chain (upstream `servicesChain`).
pub const SERVICES_CHAIN: &str = "services";
/// Drop/reject of traffic to Services without endpoints (upstream `endpointsCheckChain`).
pub const ENDPOINTS_CHECK: &str = "endpoints-check";
/// Verdicts for service addresses without endpoints (upstream `noEndpointServicesMap`).
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// Verdicts for NodePorts without endpoints (upstream `noEndpointNodePortsMap`).
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// The one `reject` rule the maps above jump to (upstream `rejectChain`).
pub const REJECT_CHAIN: &str = "reject-chain";
/// Sets the masquerade mark (upstream `markMasqChain`).
pub const MARK_MASQ: &str = "mark-for-masquerade";
/// Masquerades marked packets in postrouting (upstream `masqueradingChain`).
pub const MASQUERADING: &str = "masquerading";
/// The base chain of DNAT for arriving traffic (upstream's `nat-prerouting`).
pub const NAT_PREROUTING: &str = "nat-prerouting";
/// One element, the number of the last sync: the cheap drift check (see `sync.rs`). skerry's
/// own; upstream does not check for drift.
pub const SYNC_GENERATION: &str = "sync-generation";

/// The masquerade mark: bit 14 (`--masquerade-bit` default 14 in upstream's kube-proxy
/// config, `0x4000`), the same bit the kubelet and iptables mode use.
pub const MASQUERADE_MARK: u32 = 1 << 14;

/// `dstnat` hook priority (nftables' named priority, -100).
const PRIORITY_DSTNAT: i32 = -100;
/// `srcnat` hook priority (nftables' named priority, 100).
const PRIORITY_SRCNAT: i32 = 100;
/// Upstream runs its filter chains at `dstnat - 10`, so they see pre-DNAT addresses.
const FILTER_BEFORE_DNAT: i32 = 10;

/// Longest chain-name prefix, trailing hyphen included (upstream `chainNamePrefixLengthMax`).
const CHAIN_PREFIX_MAX: usize = 16;
/// nftables' name limit (knftables `NameLengthMax`, the kernel's `NFT_NAME_MAXLEN` 256).
const NAME_LENGTH_MAX: usize = 256;
/// Longest base name (upstream `chainNameBaseLengthMax`).
const CHAIN_BASE_MAX: usize = NAME_LENGTH_MAX - CHAIN_PREFIX_MAX;
/// Characters of the base32 hash in front of a base name (upstream `hashAndTruncate`).
const HASH_CHARS: usize = 8;

/// Chain prefixes (upstream `servicePortPolicyClusterChainNamePrefix` and the rest).
const PREFIX_CLUSTER: &str = "service-";
/// See [`PREFIX_CLUSTER`].
const PREFIX_LOCAL: &str = "local-";
/// See [`PREFIX_CLUSTER`].
const PREFIX_EXTERNAL: &str = "external-";
/// See [`PREFIX_CLUSTER`].
const PREFIX_ENDPOINT: &str = "endpoint-";
/// See [`PREFIX_CLUSTER`].
pub const PREFIX_AFFINITY: &str = "affinity-";

/// RFC 4648 base32 alphabet (Go's `base32.StdEncoding`).
const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// The node-level facts the rules depend on.
#[derive(Clone, Debug, Default)]
pub struct RuleConfig {
    /// This node's addresses of the family (NodePorts answer on them; loopback is left out).
    pub node_ips: Vec<std::net::IpAddr>,
    /// The cluster (pod) CIDR of the family: non-pod traffic to a ClusterIP is masqueraded,
    /// pod traffic to a Local-policy external address short-circuits (upstream's local
    /// traffic detector by cluster CIDR). `None`: neither rule.
    pub cluster_cidr: Option<String>,
    /// This node's zone (topology hints, #35).
    pub zone: Option<String>,
}

/// The first 8 base32 characters of SHA-256(name), a hyphen, the name; truncated with `...`
/// (upstream `hashAndTruncate`).
pub fn hash_and_truncate(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut out = String::with_capacity(HASH_CHARS + 1 + name.len());
    // 8 base32 characters are the first 40 bits: 5 bytes.
    let mut bits: u64 = 0;
    for b in &digest[..5] {
        bits = (bits << 8) | u64::from(*b);
    }
    for i in (0..HASH_CHARS).rev() {
        let idx = ((bits >> (i * 5)) & 0x1f) as usize;
        out.push(char::from(BASE32[idx]));
    }
    out.push('-');
    out.push_str(name);
    if out.len() > CHAIN_BASE_MAX {
        let mut cut = CHAIN_BASE_MAX - 3;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// `HASH-namespace/name/protocol/port` (upstream `servicePortChainNameBase`).
pub fn port_chain_base(svc: &ServiceName, port: &ServicePort) -> String {
    hash_and_truncate(&format!(
        "{}/{}/{}/{}",
        svc.namespace,
        svc.name,
        port.protocol.nft(),
        port.port_name
    ))
}

/// `HASH-namespace/name/protocol/port__IP/PORT`, colons of IPv6 as dots (upstream
/// `servicePortEndpointChainNameBase`).
pub fn endpoint_chain_base(svc: &ServiceName, port: &ServicePort, ep: &Endpoint) -> String {
    hash_and_truncate(&format!(
        "{}/{}/{}/{}__{}/{}",
        svc.namespace,
        svc.name,
        port.protocol.nft(),
        port.port_name,
        ep.ip.to_string().replace(':', "."),
        ep.port
    ))
}

/// One element of one of the verdict maps.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Element {
    /// The map.
    pub map: &'static str,
    /// The key as nft writes it (`10.96.0.1 . tcp . 80`).
    pub key: String,
    /// The verdict (`goto service-…`, `drop`).
    pub value: String,
}

/// Everything one Service owns in the table: what a partial sync rewrites or removes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// Chains and their rules, in order.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Affinity sets and their timeouts in seconds.
    pub sets: BTreeMap<String, u32>,
    /// Map elements.
    pub elements: BTreeSet<Element>,
}

impl ServiceRules {
    /// Rules written.
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(Vec::len).sum()
    }
}

/// The rules of one Service (all its ports of the family), given its endpoints per port.
pub fn service_rules<'a>(
    family: Family,
    cfg: &RuleConfig,
    svc: &ServiceName,
    ports: impl IntoIterator<Item = (&'a ServicePort, &'a [Endpoint])>,
) -> ServiceRules {
    let mut out = ServiceRules::default();
    for (port, endpoints) in ports {
        let cat = categorize(endpoints, port, cfg.zone.as_deref());
        port_rules(family, cfg, svc, port, &cat, &mut out);
    }
    out
}

fn port_rules(
    family: Family,
    cfg: &RuleConfig,
    svc: &ServiceName,
    port: &ServicePort,
    cat: &Categorized,
    out: &mut ServiceRules,
) {
    let ip = family.nft();
    let proto = port.protocol.nft();
    let base = port_chain_base(svc, port);
    let cluster_chain = format!("{PREFIX_CLUSTER}{base}");
    let local_chain = format!("{PREFIX_LOCAL}{base}");
    let external_chain = format!("{PREFIX_EXTERNAL}{base}");

    let uses_cluster_chain = !cat.cluster.is_empty() && port.uses_cluster_endpoints();
    let uses_local_chain = !cat.local.is_empty() && port.uses_local_endpoints();
    let has_endpoints = cat.has_any;
    let (internal_chain, has_internal) = if port.internal_local {
        (&local_chain, has_endpoints && !cat.local.is_empty())
    } else {
        (&cluster_chain, has_endpoints)
    };
    let (external_policy_chain, has_external) = if port.external_policy_local() {
        (&local_chain, has_endpoints && !cat.local.is_empty())
    } else {
        (&cluster_chain, has_endpoints)
    };
    let uses_external_chain = has_endpoints && port.externally_accessible();

    // Upstream: no endpoints at all rejects (the client sees a refusal at once); a Local
    // policy without a local endpoint drops.
    let reject = format!("goto {REJECT_CHAIN}");
    let internal_verdict = if has_endpoints {
        "drop"
    } else {
        reject.as_str()
    };
    let external_verdict = internal_verdict;

    let mut element = |map: &'static str, key: String, value: String| {
        out.elements.insert(Element { map, key, value });
    };
    let key = |addr: &std::net::IpAddr| format!("{addr} . {proto} . {}", port.port);
    if has_internal {
        element(
            SERVICE_IPS,
            key(&port.cluster_ip),
            format!("goto {internal_chain}"),
        );
    } else {
        element(
            NO_ENDPOINT_SERVICES,
            key(&port.cluster_ip),
            internal_verdict.to_string(),
        );
    }
    for addr in port.external_ips.iter().chain(&port.load_balancer_ips) {
        if has_endpoints {
            element(SERVICE_IPS, key(addr), format!("goto {external_chain}"));
        }
        if !has_external {
            element(
                NO_ENDPOINT_SERVICES,
                key(addr),
                external_verdict.to_string(),
            );
        }
    }
    if port.node_port != 0 {
        let np_key = format!("{proto} . {}", port.node_port);
        if has_endpoints {
            element(
                SERVICE_NODEPORTS,
                np_key.clone(),
                format!("goto {external_chain}"),
            );
        }
        if !has_external {
            element(NO_ENDPOINT_NODEPORTS, np_key, external_verdict.to_string());
        }
    }

    fn chain<'c>(out: &'c mut ServiceRules, name: &str) -> &'c mut Vec<String> {
        out.chains.entry(name.to_string()).or_default()
    }
    if uses_cluster_chain {
        chain(out, &cluster_chain);
    }
    if uses_local_chain {
        chain(out, &local_chain);
    }
    // Non-pod traffic to a ClusterIP may come from outside the node (a route to the service
    // range): masquerade it so the answer comes back through this node.
    if has_internal && let Some(cidr) = &cfg.cluster_cidr {
        chain(out, internal_chain).push(format!(
            "{ip} daddr {} {proto} dport {} {ip} saddr != {cidr} jump {MARK_MASQ}",
            port.cluster_ip, port.port
        ));
    }
    if uses_external_chain {
        let ext = chain(out, &external_chain);
        if !port.external_policy_local() {
            ext.push(format!("jump {MARK_MASQ}"));
        } else if uses_cluster_chain {
            if let Some(cidr) = &cfg.cluster_cidr {
                ext.push(format!("{ip} saddr {cidr} goto {cluster_chain}"));
            }
            ext.push(format!("fib saddr type local jump {MARK_MASQ}"));
            ext.push(format!("fib saddr type local goto {cluster_chain}"));
        }
        if has_external {
            ext.push(format!("goto {external_policy_chain}"));
        }
    }

    let affinity = port.affinity_seconds;
    let ep_names = |ep: &Endpoint| {
        let b = endpoint_chain_base(svc, port, ep);
        (
            format!("{PREFIX_ENDPOINT}{b}"),
            format!("{PREFIX_AFFINITY}{b}"),
        )
    };
    if let Some(timeout) = affinity {
        for ep in &cat.reachable {
            out.sets.insert(ep_names(ep).1, timeout);
        }
    }
    for (used, chain_name, eps) in [
        (uses_cluster_chain, &cluster_chain, &cat.cluster),
        (uses_local_chain, &local_chain, &cat.local),
    ] {
        if !used {
            continue;
        }
        let rules = out.chains.entry(chain_name.clone()).or_default();
        if affinity.is_some() {
            for ep in eps.iter() {
                let (c, s) = ep_names(ep);
                rules.push(format!("{ip} saddr @{s} goto {c}"));
            }
        }
        // One endpoint: straight to it. Every `numgen` rule carries an anonymous verdict map,
        // and the kernel's cost of adding a rule grows with the maps already in the
        // transaction (a full sync is super-linear in them), so a Service with one endpoint,
        // the common case, gets none (upstream kubernetes/kubernetes#140723).
        if let [only] = eps.as_slice() {
            rules.push(format!("goto {}", ep_names(only).0));
            continue;
        }
        let mut vmap = String::new();
        for (i, ep) in eps.iter().enumerate() {
            if i > 0 {
                vmap.push_str(", ");
            }
            let _ = write!(vmap, "{i} : goto {}", ep_names(ep).0);
        }
        rules.push(format!("numgen random mod {} vmap {{ {vmap} }}", eps.len()));
    }
    for ep in &cat.reachable {
        let (c, s) = ep_names(ep);
        let rules = out.chains.entry(c).or_default();
        rules.push(format!("{ip} saddr {} jump {MARK_MASQ}", ep.ip));
        if affinity.is_some() {
            rules.push(format!("update @{s} {{ {ip} saddr }}"));
        }
        rules.push(format!("meta l4proto {proto} dnat to {}", ep.addr()));
    }
}

/// A transaction being written: one `nft -f` script.
pub struct Script {
    family: Family,
    text: String,
    /// Rules added.
    pub rules: usize,
    /// Map and set elements added.
    pub elements: usize,
}

impl Script {
    /// An empty script for `family`'s table.
    pub fn new(family: Family) -> Script {
        Script {
            family,
            text: String::new(),
            rules: 0,
            elements: 0,
        }
    }
    /// The text for `nft -f -`.
    pub fn text(&self) -> &str {
        &self.text
    }
    fn t(&self) -> String {
        format!("{} {TABLE}", self.family.nft())
    }
    fn line(&mut self, s: std::fmt::Arguments<'_>) {
        let _ = self.text.write_fmt(s);
        self.text.push('\n');
    }
    /// `add chain` + `flush chain`: the chain exists and is empty.
    pub fn ensure_chain(&mut self, name: &str) {
        let t = self.t();
        self.line(format_args!("add chain {t} {name}"));
        self.line(format_args!("flush chain {t} {name}"));
    }
    /// `flush chain`.
    pub fn flush_chain(&mut self, name: &str) {
        let t = self.t();
        self.line(format_args!("flush chain {t} {name}"));
    }
    /// `delete chain`.
    pub fn delete_chain(&mut self, name: &str) {
        let t = self.t();
        self.line(format_args!("delete chain {t} {name}"));
    }
    /// `add rule`.
    pub fn rule(&mut self, chain: &str, rule: &str) {
        let t = self.t();
        self.line(format_args!("add rule {t} {chain} {rule}"));
        self.rules += 1;
    }
    /// `add set` for an affinity set.
    pub fn affinity_set(&mut self, name: &str, timeout: u32) {
        let t = self.t();
        let ty = self.family.addr_type();
        self.line(format_args!(
            "add set {t} {name} {{ type {ty}; flags dynamic,timeout; timeout {timeout}s; }}"
        ));
    }
    /// `delete set`.
    pub fn delete_set(&mut self, name: &str) {
        let t = self.t();
        self.line(format_args!("delete set {t} {name}"));
    }
    /// `add element`.
    pub fn add_element(&mut self, e: &Element) {
        let t = self.t();
        self.line(format_args!(
            "add element {t} {} {{ {} : {} }}",
            e.map, e.key, e.value
        ));
        self.elements += 1;
    }
    /// `delete element`.
    pub fn delete_element(&mut self, e: &Element) {
        let t = self.t();
        self.line(format_args!("delete element {t} {} {{ {} }}", e.map, e.key));
    }
    /// The drift canary: the generation moves from `old` to `new`. Deleting the old element
    /// fails the whole transaction if the table or the element is gone.
    pub fn generation(&mut self, old: Option<u32>, new: u32) {
        let t = self.t();
        if let Some(old) = old {
            self.line(format_args!(
                "delete element {t} {SYNC_GENERATION} {{ {old} }}"
            ));
        }
        self.line(format_args!(
            "add element {t} {SYNC_GENERATION} {{ {new} }}"
        ));
    }

    /// The table's fixed part, every base chain and map emptied and refilled (upstream
    /// `setupNFTables` plus the map flushes of a full sync).
    pub fn setup(&mut self, cfg: &RuleConfig) {
        let t = self.t();
        let fam = self.family;
        let ip = fam.nft();
        let addr = fam.addr_type();
        self.line(format_args!(
            "add table {t} {{ comment \"skerry service proxy\"; }}"
        ));
        let filter = PRIORITY_DSTNAT - FILTER_BEFORE_DNAT;
        for (name, ty, hook, prio) in [
            ("filter-prerouting", "filter", "prerouting", filter),
            ("filter-input", "filter", "input", filter),
            ("filter-forward", "filter", "forward", filter),
            ("filter-output", "filter", "output", filter),
            ("nat-prerouting", "nat", "prerouting", PRIORITY_DSTNAT),
            ("nat-output", "nat", "output", PRIORITY_DSTNAT),
            ("nat-postrouting", "nat", "postrouting", PRIORITY_SRCNAT),
        ] {
            self.line(format_args!(
                "add chain {t} {name} {{ type {ty} hook {hook} priority {prio}; }}"
            ));
            self.flush_chain(name);
        }
        for c in [
            ENDPOINTS_CHECK,
            SERVICES_CHAIN,
            MASQUERADING,
            MARK_MASQ,
            REJECT_CHAIN,
        ] {
            self.ensure_chain(c);
        }
        for src in ["filter-input", "filter-forward", "filter-output"] {
            self.rule(src, &format!("ct state new jump {ENDPOINTS_CHECK}"));
        }
        self.rule("nat-output", &format!("jump {SERVICES_CHAIN}"));
        self.rule("nat-prerouting", &format!("jump {SERVICES_CHAIN}"));
        self.rule("nat-postrouting", &format!("jump {MASQUERADING}"));
        let mark = format!("{MASQUERADE_MARK:#x}");
        self.rule(MARK_MASQ, &format!("meta mark set meta mark or {mark}"));
        self.rule(MASQUERADING, &format!("meta mark & {mark} == 0 return"));
        self.rule(MASQUERADING, &format!("meta mark set meta mark xor {mark}"));
        self.rule(MASQUERADING, "masquerade fully-random");
        self.rule(REJECT_CHAIN, "reject");

        self.line(format_args!(
            "add set {t} {NODEPORT_IPS} {{ type {addr}; }}"
        ));
        self.line(format_args!("flush set {t} {NODEPORT_IPS}"));
        let node_ips: Vec<String> = cfg
            .node_ips
            .iter()
            .filter(|i| Family::of(i) == fam && !i.is_loopback())
            .map(|i| i.to_string())
            .collect();
        if !node_ips.is_empty() {
            self.line(format_args!(
                "add element {t} {NODEPORT_IPS} {{ {} }}",
                node_ips.join(", ")
            ));
            self.elements += node_ips.len();
        }
        self.line(format_args!(
            "add set {t} {SYNC_GENERATION} {{ type mark; }}"
        ));
        self.line(format_args!("flush set {t} {SYNC_GENERATION}"));
        for (map, ty) in [
            (SERVICE_IPS, format!("{addr} . inet_proto . inet_service")),
            (SERVICE_NODEPORTS, "inet_proto . inet_service".to_string()),
            (
                NO_ENDPOINT_SERVICES,
                format!("{addr} . inet_proto . inet_service"),
            ),
            (
                NO_ENDPOINT_NODEPORTS,
                "inet_proto . inet_service".to_string(),
            ),
        ] {
            self.line(format_args!("add map {t} {map} {{ type {ty} : verdict; }}"));
            self.line(format_args!("flush map {t} {map}"));
        }
        self.rule(
            ENDPOINTS_CHECK,
            &format!("{ip} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"),
        );
        self.rule(
            ENDPOINTS_CHECK,
            &format!(
                "{ip} daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
            ),
        );
        self.rule(
            SERVICES_CHAIN,
            &format!("{ip} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"),
        );
        self.rule(
            SERVICES_CHAIN,
            &format!(
                "{ip} daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"
            ),
        );
    }

    /// Writes the transition of one Service from `old` (what the table holds, when known) to
    /// `new`. Chains `new` no longer has are flushed and returned: they are deleted by a
    /// later sync, as upstream does (before Linux 6.2 a chain just unreferenced by a deleted
    /// map element cannot be deleted at once).
    pub fn service(&mut self, old: Option<&ServiceRules>, new: &ServiceRules) -> Vec<String> {
        let empty = ServiceRules::default();
        let old = old.unwrap_or(&empty);
        let mut stale = Vec::new();
        for c in new.chains.keys() {
            self.ensure_chain(c);
        }
        for c in old.chains.keys().filter(|c| !new.chains.contains_key(*c)) {
            self.flush_chain(c);
            stale.push(c.clone());
        }
        for e in old.elements.difference(&new.elements) {
            // An element whose key stays gets a new value: delete then add.
            self.delete_element(e);
        }
        for (s, timeout) in &old.sets {
            if new.sets.get(s) != Some(timeout) {
                self.delete_set(s);
            }
        }
        for (s, timeout) in &new.sets {
            if old.sets.get(s) != Some(timeout) {
                self.affinity_set(s, *timeout);
            }
        }
        for (c, rules) in &new.chains {
            for r in rules {
                self.rule(c, r);
            }
        }
        for e in new.elements.difference(&old.elements) {
            self.add_element(e);
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::model::Protocol;
    use std::net::IpAddr;

    fn name() -> ServiceName {
        ServiceName {
            namespace: "ns1".into(),
            name: "svc1".into(),
        }
    }

    fn port() -> ServicePort {
        ServicePort {
            port_name: "p80".into(),
            protocol: Protocol::Tcp,
            cluster_ip: "172.30.0.41".parse().expect("ip"),
            port: 80,
            node_port: 0,
            external_ips: vec![],
            load_balancer_ips: vec![],
            affinity_seconds: None,
            internal_local: false,
            external_local: false,
            topology: false,
        }
    }

    fn ep(last: u8, local: bool) -> Endpoint {
        Endpoint {
            ip: IpAddr::from([10, 180, 0, last]),
            port: 80,
            ready: true,
            serving: true,
            terminating: false,
            local,
            zone_hints: Default::default(),
        }
    }

    fn cfg() -> RuleConfig {
        RuleConfig {
            node_ips: vec!["192.168.0.2".parse().expect("ip")],
            cluster_cidr: Some("10.0.0.0/8".into()),
            zone: None,
        }
    }

    fn rules(p: &ServicePort, eps: &[Endpoint]) -> ServiceRules {
        service_rules(Family::V4, &cfg(), &name(), [(p, eps)])
    }

    fn all_rules(r: &ServiceRules) -> Vec<String> {
        r.chains
            .iter()
            .flat_map(|(c, rs)| rs.iter().map(move |x| format!("{c}: {x}")))
            .collect()
    }

    #[test]
    fn chain_names_are_upstreams() {
        // Upstream's own examples (`servicePortChainNameBase` / `…EndpointChainNameBase`
        // doc comments and its unit tests): ns1/svc1/tcp/p80.
        assert_eq!(
            port_chain_base(&name(), &port()),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            endpoint_chain_base(&name(), &port(), &ep(1, false)),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        let long = "x".repeat(300);
        let h = hash_and_truncate(&long);
        assert_eq!(h.len(), CHAIN_BASE_MAX);
        assert!(h.ends_with("..."));
    }

    #[test]
    fn one_numgen_vmap_rule_per_service_port() {
        let r = rules(&port(), &[ep(1, false), ep(2, false), ep(3, false)]);
        let svc = "service-ULMVA6XW-ns1/svc1/tcp/p80";
        let chain = &r.chains[svc];
        let numgen: Vec<_> = chain.iter().filter(|x| x.contains("numgen")).collect();
        assert_eq!(numgen.len(), 1, "{chain:?}");
        assert!(numgen[0].starts_with("numgen random mod 3 vmap { 0 : goto endpoint-"));
        assert!(numgen[0].contains("2 : goto endpoint-"));
        assert!(r.elements.contains(&Element {
            map: SERVICE_IPS,
            key: "172.30.0.41 . tcp . 80".into(),
            value: format!("goto {svc}"),
        }));
        // Non-pod sources to the ClusterIP are masqueraded.
        assert_eq!(
            chain[0],
            "ip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade"
        );
        // Every endpoint chain: hairpin masquerade then DNAT.
        let epc = &r.chains["endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"];
        assert_eq!(
            epc,
            &vec![
                "ip saddr 10.180.0.1 jump mark-for-masquerade".to_string(),
                "meta l4proto tcp dnat to 10.180.0.1:80".to_string()
            ]
        );
        assert_eq!(r.chains.len(), 4);
    }

    #[test]
    fn no_endpoints_rejects_and_local_without_local_endpoint_drops() {
        let mut p = port();
        p.node_port = 30080;
        let r = rules(&p, &[]);
        assert!(r.chains.is_empty());
        let verdicts: Vec<_> = r
            .elements
            .iter()
            .map(|e| (e.map, e.value.as_str()))
            .collect();
        assert_eq!(
            verdicts,
            vec![
                (NO_ENDPOINT_NODEPORTS, "goto reject-chain"),
                (NO_ENDPOINT_SERVICES, "goto reject-chain")
            ]
        );
        p.internal_local = true;
        let r = rules(&p, &[ep(1, false)]);
        assert!(r.elements.contains(&Element {
            map: NO_ENDPOINT_SERVICES,
            key: "172.30.0.41 . tcp . 80".into(),
            value: "drop".into()
        }));
    }

    #[test]
    fn session_affinity_uses_a_timed_set_per_endpoint() {
        let mut p = port();
        p.affinity_seconds = Some(600);
        let r = rules(&p, &[ep(1, false), ep(2, false)]);
        assert_eq!(r.sets.len(), 2);
        assert!(r.sets.values().all(|t| *t == 600));
        let svc = &r.chains["service-ULMVA6XW-ns1/svc1/tcp/p80"];
        assert!(svc[1].starts_with("ip saddr @affinity-") && svc[1].contains(" goto endpoint-"));
        assert!(svc.last().is_some_and(|l| l.starts_with("numgen")));
        let epc = &r.chains["endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"];
        assert_eq!(
            epc[1],
            "update @affinity-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 { ip saddr }"
        );
    }

    #[test]
    fn external_traffic_policy() {
        let mut p = port();
        p.node_port = 30080;
        p.external_ips = vec!["192.0.2.10".parse().expect("ip")];
        p.load_balancer_ips = vec!["192.168.0.2".parse().expect("ip")];
        let ext = "external-ULMVA6XW-ns1/svc1/tcp/p80";
        // Cluster: masquerade, then the cluster chain.
        let r = rules(&p, &[ep(1, false), ep(2, true)]);
        assert_eq!(
            r.chains[ext],
            vec![
                "jump mark-for-masquerade".to_string(),
                "goto service-ULMVA6XW-ns1/svc1/tcp/p80".to_string()
            ]
        );
        let to_ext: Vec<_> = r
            .elements
            .iter()
            .filter(|e| e.value == format!("goto {ext}"))
            .map(|e| e.key.as_str())
            .collect();
        assert_eq!(
            to_ext,
            vec![
                "192.0.2.10 . tcp . 80",
                "192.168.0.2 . tcp . 80",
                "tcp . 30080"
            ]
        );
        // Local: no masquerade of outside clients, only the local endpoint.
        p.external_local = true;
        let r = rules(&p, &[ep(1, false), ep(2, true)]);
        let rules_ext = &r.chains[ext];
        assert!(!rules_ext.contains(&"jump mark-for-masquerade".to_string()));
        assert_eq!(
            rules_ext.last().map(String::as_str),
            Some("goto local-ULMVA6XW-ns1/svc1/tcp/p80")
        );
        assert!(
            rules_ext.contains(
                &"ip saddr 10.0.0.0/8 goto service-ULMVA6XW-ns1/svc1/tcp/p80".to_string()
            )
        );
        let local = &r.chains["local-ULMVA6XW-ns1/svc1/tcp/p80"];
        assert_eq!(local.len(), 1);
        assert!(
            local[0].starts_with("goto endpoint-"),
            "one local endpoint: a plain goto, no map: {local:?}"
        );
        // Local without a local endpoint: outside traffic dropped, the ClusterIP still works.
        let r = rules(&p, &[ep(1, false)]);
        assert!(r.elements.contains(&Element {
            map: NO_ENDPOINT_NODEPORTS,
            key: "tcp . 30080".into(),
            value: "drop".into()
        }));
        assert!(
            r.elements
                .iter()
                .any(|e| e.map == SERVICE_IPS && e.key.starts_with("172.30.0.41"))
        );
    }

    #[test]
    fn hairpin_masquerades_an_endpoint_reaching_itself() {
        let r = rules(&port(), &[ep(7, false)]);
        let all = all_rules(&r);
        assert!(
            all.iter()
                .any(|x| x.ends_with("ip saddr 10.180.0.7 jump mark-for-masquerade"))
        );
    }

    #[test]
    fn partial_transition_touches_only_the_difference() {
        let before = rules(&port(), &[ep(1, false), ep(2, false)]);
        let after = rules(&port(), &[ep(1, false)]);
        let mut s = Script::new(Family::V4);
        let stale = s.service(Some(&before), &after);
        assert_eq!(
            stale,
            vec!["endpoint-".to_string() + &endpoint_chain_base(&name(), &port(), &ep(2, false))]
        );
        assert!(s.text().contains("flush chain ip skerry-proxy endpoint-"));
        // The service-ips element is unchanged: neither deleted nor re-added.
        assert!(!s.text().contains("element ip skerry-proxy service-ips"));
        // Removing the Service entirely deletes its element.
        let mut s = Script::new(Family::V4);
        s.service(Some(&before), &ServiceRules::default());
        assert!(
            s.text()
                .contains("delete element ip skerry-proxy service-ips { 172.30.0.41 . tcp . 80 }")
        );
    }

    #[test]
    fn ipv6_rules() {
        let mut p = port();
        p.cluster_ip = "fd00::41".parse().expect("ip");
        let e = Endpoint {
            ip: "fd00:10::1".parse().expect("ip"),
            ..ep(1, false)
        };
        let cfg = RuleConfig::default();
        let r = service_rules(Family::V6, &cfg, &name(), [(&p, std::slice::from_ref(&e))]);
        let all = all_rules(&r);
        assert!(
            all.iter()
                .any(|x| x.ends_with("meta l4proto tcp dnat to [fd00:10::1]:80"))
        );
        assert!(r.chains.keys().any(|c| c.ends_with("__fd00.10..1/80")));
    }
}
