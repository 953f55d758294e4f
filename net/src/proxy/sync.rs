//! The syncer of one family's table: it keeps the model (Services and EndpointSlices as the
//! informers deliver them, upstream's `ServiceChangeTracker` / `EndpointsChangeTracker`
//! folded into "which Services changed"), and writes it with one `nft -f -` transaction per
//! sync (stdin), as upstream's `syncProxyRules`:
//! - a full sync on start, when the table has drifted, and once an hour: the fixed part is
//!   rewritten, every map flushed and refilled, chains of Services that no longer exist
//!   flushed and deleted a sync later (upstream's `staleChains`);
//! - otherwise a partial sync: only the chains, affinity sets and map elements of the
//!   Services that changed since the last sync.
//!
//! Drift is detected cheaply (skerry's own; upstream does not look): the table holds a
//! one-element set, `sync-generation`, with the number of the last sync, and the
//! `nat-prerouting` chain holds its jump to `services`. Before a partial sync one small `nft list` of those two
//! objects (constant size, whatever the number of Services) checks both; a flushed or deleted
//! table, a flushed chain or an edited generation turns the sync into a full one. The partial
//! transaction itself deletes the old generation element, so a table changed between the
//! check and the write fails the transaction as a whole, and the next sync is full.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tracing::{debug, warn};

use super::model::{
    Endpoint, Family, Protocol, ServiceName, ServicePorts, SliceInfo, service_ports, slice_info,
};
use super::rules::{
    NAT_PREROUTING, PREFIX_AFFINITY, RuleConfig, SERVICES_CHAIN, SYNC_GENERATION, Script,
    ServiceRules, TABLE, service_rules,
};

/// Upstream deletes a stale chain only once it has been unreferenced for a second: before
/// Linux 6.2 the kernel notices a chain lost its last map-element reference a little later
/// (`syncProxyRules`, `oneSecondAgo`).
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);
/// A full resync at least this often even without drift (upstream `proxyutil.FullSyncPeriod`,
/// one hour).
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// What one sync did.
#[derive(Clone, Debug, Default)]
pub struct SyncReport {
    /// A full sync (else partial).
    pub full: bool,
    /// Services whose rules were rewritten.
    pub services: usize,
    /// Rules in the transaction.
    pub rules: usize,
    /// Elements in the transaction.
    pub elements: usize,
    /// Bytes of the script.
    pub script_bytes: usize,
    /// Lines of the script.
    pub script_lines: usize,
    /// Time to run `nft -f` (the kernel's work and nft's parsing).
    pub nft_time: Duration,
    /// Stale chains left to delete in a later sync (the runner schedules one).
    pub stale_pending: usize,
}

/// Runs `nft` (argv prefix, e.g. `["nft"]` or `["ip", "netns", "exec", "ns", "nft"]`).
#[derive(Clone, Debug)]
pub struct Nft {
    argv: Vec<String>,
}

impl Nft {
    /// Over an argv prefix; empty means plain `nft`.
    pub fn new(argv: Vec<String>) -> Nft {
        if argv.is_empty() {
            return Nft {
                argv: vec!["nft".into()],
            };
        }
        Nft { argv }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..]);
        c
    }

    /// Runs `script` as one transaction (`nft -f -`); its stdout on success.
    pub fn run(&self, script: &str) -> anyhow::Result<String> {
        let mut child = self
            .command()
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {:?}: {e}", self.argv))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let first: String = err.lines().take(6).collect::<Vec<_>>().join("; ");
            anyhow::bail!("nft -f failed ({}): {first}", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The names of the chains and sets in `family`'s table (empty when there is no table).
    /// `list chains` and `list sets` take a family and no table (nft 1.0 refuses `list
    /// chains ip t`), and print chains without their rules: each table's block opens with a
    /// `table <family> <name> {` line, so only the lines inside the proxy's block count.
    pub fn list_names(&self, family: Family) -> (BTreeSet<String>, BTreeSet<String>) {
        let fam = family.nft();
        let mut chains = BTreeSet::new();
        let mut sets = BTreeSet::new();
        let Ok(out) = self.run(&format!("list chains {fam}\nlist sets {fam}\n")) else {
            return (chains, sets);
        };
        let mut ours = false;
        for line in out.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("table"), Some(f), Some(name)) => ours = f == fam && name == TABLE,
                (Some("chain"), Some(name), _) if ours => {
                    chains.insert(name.to_string());
                }
                (Some("set"), Some(name), _) if ours => {
                    sets.insert(name.to_string());
                }
                _ => {}
            }
        }
        (chains, sets)
    }
}

/// The model and the table's last known contents for one family.
pub struct Syncer {
    family: Family,
    cfg: RuleConfig,
    node_name: String,
    nft: Nft,
    services: BTreeMap<ServiceName, ServicePorts>,
    slices: BTreeMap<ServiceName, BTreeMap<String, SliceInfo>>,
    dirty: BTreeSet<ServiceName>,
    applied: BTreeMap<ServiceName, ServiceRules>,
    generation: Option<u32>,
    need_full: bool,
    last_full: Option<Instant>,
    /// Flushed chains waiting to be deleted: chain, since, owner.
    stale: BTreeMap<String, (Instant, ServiceName)>,
    /// Which Service holds each map key in the table: nftables refuses a second element with
    /// the same key ("File exists") and fails the whole transaction, so two Services asking
    /// for one address, protocol and port (two `externalIPs`, an external IP on another's
    /// ClusterIP) must not take down every other Service's sync.
    owners: BTreeMap<(&'static str, String), ServiceName>,
    /// Keys a Service wanted but another held at the last full sync: a partial sync touching
    /// one of them is made full, so the key passes to the next Service when its holder goes.
    shadowed: BTreeSet<(&'static str, String)>,
}

impl Syncer {
    /// A syncer for `family` on node `node_name`.
    pub fn new(family: Family, cfg: RuleConfig, node_name: String, nft: Nft) -> Syncer {
        Syncer {
            family,
            cfg,
            node_name,
            nft,
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            dirty: BTreeSet::new(),
            applied: BTreeMap::new(),
            generation: None,
            need_full: true,
            last_full: None,
            stale: BTreeMap::new(),
            owners: BTreeMap::new(),
            shadowed: BTreeSet::new(),
        }
    }

    /// Whether a partial sync of the dirty Services would add a key another Service holds,
    /// or remove or add one a Service was denied: then the sync is made full, where keys are
    /// handed out again in one pass.
    fn partial_conflicts(&self, dirty: &[(ServiceName, ServiceRules)]) -> bool {
        dirty.iter().any(|(name, wanted)| {
            let held = self.applied.get(name);
            wanted
                .elements
                .iter()
                .chain(held.into_iter().flat_map(|r| r.elements.iter()))
                .any(|e| {
                    let k = (e.map, e.key.clone());
                    self.shadowed.contains(&k) || self.owners.get(&k).is_some_and(|o| o != name)
                })
        })
    }

    /// The family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// A Service was added, changed (`old` and `new`) or deleted (`new` is `None`). True
    /// when what the proxy programs for it changed.
    pub fn update_service(&mut self, old: Option<&Service>, new: Option<&Service>) -> bool {
        let mut changed = false;
        if let Some(old) = old
            && let (Some(ns), Some(name)) = (&old.metadata.namespace, &old.metadata.name)
        {
            let key = ServiceName {
                namespace: ns.clone(),
                name: name.clone(),
            };
            if new.is_none() && self.services.remove(&key).is_some() {
                self.dirty.insert(key);
                changed = true;
            }
        }
        if let Some(svc) = new {
            let parsed = service_ports(svc, self.family);
            let key = ServiceName {
                namespace: svc.metadata.namespace.clone().unwrap_or_default(),
                name: svc.metadata.name.clone().unwrap_or_default(),
            };
            match parsed {
                Some((key, ports)) => {
                    if self.services.get(&key) != Some(&ports) {
                        self.services.insert(key.clone(), ports);
                        self.dirty.insert(key);
                        changed = true;
                    }
                }
                None => {
                    if self.services.remove(&key).is_some() {
                        self.dirty.insert(key);
                        changed = true;
                    }
                }
            }
        }
        changed
    }

    /// An EndpointSlice was added or changed (`Some`) or deleted (`None`); `key` is its
    /// `namespace/name`. True when a Service's endpoints changed.
    pub fn update_slice(&mut self, key: &str, slice: Option<&EndpointSlice>) -> bool {
        let info = slice.and_then(|s| slice_info(s, self.family, &self.node_name));
        let mut changed = false;
        // The slice may have moved between Services (its label changed): drop it everywhere.
        let mut emptied = Vec::new();
        for (svc, slices) in self.slices.iter_mut() {
            if let Some(old) = slices.get(key)
                && info.as_ref() != Some(old)
            {
                slices.remove(key);
                self.dirty.insert(svc.clone());
                changed = true;
                if slices.is_empty() {
                    emptied.push(svc.clone());
                }
            }
        }
        for svc in emptied {
            self.slices.remove(&svc);
        }
        if let Some(info) = info {
            let entry = self.slices.entry(info.service.clone()).or_default();
            if entry.get(key) != Some(&info) {
                self.dirty.insert(info.service.clone());
                entry.insert(key.to_string(), info);
                changed = true;
            }
        }
        changed
    }

    /// Services changed since the last successful sync.
    pub fn pending(&self) -> usize {
        self.dirty.len()
    }

    /// Forces the next sync to be full.
    pub fn force_full(&mut self) {
        self.need_full = true;
    }

    /// The endpoints of each port of `name`, merged over its slices, deduplicated by address.
    fn endpoints(&self, name: &ServiceName) -> BTreeMap<(String, Protocol), Vec<Endpoint>> {
        let mut out: BTreeMap<(String, Protocol), Vec<Endpoint>> = BTreeMap::new();
        for info in self.slices.get(name).into_iter().flat_map(|s| s.values()) {
            for (port, eps) in &info.ports {
                let list = out.entry(port.clone()).or_default();
                for ep in eps {
                    if !list.iter().any(|e| e.ip == ep.ip && e.port == ep.port) {
                        list.push(ep.clone());
                    }
                }
            }
        }
        for list in out.values_mut() {
            list.sort();
        }
        out
    }

    /// The rules `name` should have now (empty when it is gone).
    pub fn rules_of(&self, name: &ServiceName) -> ServiceRules {
        let Some(ports) = self.services.get(name) else {
            return ServiceRules::default();
        };
        let eps = self.endpoints(name);
        let none: Vec<Endpoint> = Vec::new();
        service_rules(
            self.family,
            &self.cfg,
            name,
            ports
                .iter()
                .map(|(k, p)| (p, eps.get(k).map_or(none.as_slice(), Vec::as_slice))),
        )
    }

    /// Whether the table still is what the last sync left (see the module docs).
    fn drifted(&self) -> bool {
        let Some(generation) = self.generation else {
            return true;
        };
        let t = format!("{} {TABLE}", self.family.nft());
        // `list chain` of a chain whose rules name a map cannot print them (nft lists the
        // chain without its table's sets), so the check reads the jump in `nat-prerouting`.
        let script = format!("list set {t} {SYNC_GENERATION}\nlist chain {t} {NAT_PREROUTING}\n");
        match self.nft.run(&script) {
            Ok(out) => {
                let element = format!("{generation:#010x}");
                let ok = out.contains(&element) && out.contains(&format!("jump {SERVICES_CHAIN}"));
                if !ok {
                    warn!(family = ?self.family, "the proxy's table has drifted: full resync");
                }
                !ok
            }
            Err(e) => {
                warn!(family = ?self.family, error = %e, "the proxy's table is gone: full resync");
                true
            }
        }
    }

    /// One sync: full or partial as needed, one transaction. On failure the next sync is
    /// full.
    pub fn sync(&mut self) -> anyhow::Result<SyncReport> {
        let now = Instant::now();
        let mut full = self.need_full
            || self
                .last_full
                .is_none_or(|t| now.duration_since(t) >= FULL_SYNC_PERIOD)
            || self.drifted();
        // The dirty Services' rules, computed once: checked for conflicts, then written.
        let dirty: Vec<(ServiceName, ServiceRules)> = if full {
            Vec::new()
        } else {
            self.dirty
                .iter()
                .map(|n| (n.clone(), self.rules_of(n)))
                .collect()
        };
        full = full || self.partial_conflicts(&dirty);
        let next_gen = self.generation.map_or(1, |g| g.wrapping_add(1));
        let mut script = Script::new(self.family);
        let mut new_applied: Vec<(ServiceName, ServiceRules)> = Vec::new();
        let mut new_stale: Vec<(String, ServiceName)> = Vec::new();
        let mut deleted_stale: Vec<String> = Vec::new();
        if full {
            let (existing_chains, existing_sets) = self.nft.list_names(self.family);
            script.setup(&self.cfg);
            script.generation(None, next_gen);
            let names: Vec<ServiceName> = self.services.keys().cloned().collect();
            let mut all: Vec<(ServiceName, ServiceRules)> = names
                .into_iter()
                .map(|n| {
                    let r = self.rules_of(&n);
                    (n, r)
                })
                .collect();
            // One holder per key: the Service that held it at the last sync if it still
            // asks for it (a newcomer does not take a working port away), else the first in
            // name order; the others lose that port (a warning names both) and keep the rest.
            let mut holders: BTreeMap<(&'static str, String), ServiceName> = BTreeMap::new();
            for (name, rules) in &all {
                for e in &rules.elements {
                    let k = (e.map, e.key.clone());
                    if self.owners.get(&k) == Some(name) {
                        holders.insert(k, name.clone());
                    }
                }
            }
            self.shadowed.clear();
            for (name, rules) in &mut all {
                rules.elements.retain(|e| {
                    let k = (e.map, e.key.clone());
                    match holders.get(&k) {
                        Some(holder) if holder == name => true,
                        Some(holder) => {
                            warn!(
                                service = %format!("{}/{}", name.namespace, name.name),
                                holder = %format!("{}/{}", holder.namespace, holder.name),
                                key = %e.key,
                                "two Services ask for one address and port: the first keeps it"
                            );
                            self.shadowed.insert(k);
                            false
                        }
                        None => {
                            holders.insert(k, name.clone());
                            true
                        }
                    }
                });
            }
            let active_chains: BTreeSet<&String> =
                all.iter().flat_map(|(_, r)| r.chains.keys()).collect();
            // Service chains first emptied, so the sets they name can go.
            for c in existing_chains.iter().filter(|c| c.contains('/')) {
                script.flush_chain(c);
            }
            let mut kept_sets: BTreeMap<&String, u32> = BTreeMap::new();
            for (name, rules) in &all {
                for (s, timeout) in &rules.sets {
                    let known = self.applied.get(name).and_then(|a| a.sets.get(s));
                    if existing_sets.contains(s) && known == Some(timeout) {
                        kept_sets.insert(s, *timeout);
                    }
                }
            }
            for s in existing_sets
                .iter()
                .filter(|s| s.starts_with(PREFIX_AFFINITY))
            {
                if !kept_sets.contains_key(s) {
                    script.delete_set(s);
                }
            }
            for (_, rules) in &all {
                let old = ServiceRules {
                    sets: rules
                        .sets
                        .iter()
                        .filter(|(s, _)| kept_sets.contains_key(s))
                        .map(|(s, t)| (s.clone(), *t))
                        .collect(),
                    ..ServiceRules::default()
                };
                script.service(Some(&old), rules);
            }
            for c in existing_chains
                .iter()
                .filter(|c| c.contains('/') && !active_chains.contains(c))
            {
                match self.stale.get(c) {
                    Some((since, _)) if now.duration_since(*since) >= STALE_CHAIN_DELAY => {
                        script.delete_chain(c);
                        deleted_stale.push(c.clone());
                    }
                    Some(_) => {}
                    None => new_stale.push((
                        c.clone(),
                        ServiceName {
                            namespace: String::new(),
                            name: String::new(),
                        },
                    )),
                }
            }
            new_applied = all;
        } else {
            script.generation(self.generation, next_gen);
            for (c, (since, owner)) in &self.stale {
                let reused = self.services.contains_key(owner)
                    && self.rules_of(owner).chains.contains_key(c);
                if now.duration_since(*since) >= STALE_CHAIN_DELAY && !reused {
                    script.delete_chain(c);
                    deleted_stale.push(c.clone());
                }
            }
            for (name, rules) in dirty {
                for c in script.service(self.applied.get(&name), &rules) {
                    new_stale.push((c, name.clone()));
                }
                new_applied.push((name, rules));
            }
        }
        let text = script.text();
        let started = Instant::now();
        let result = self.nft.run(text);
        let nft_time = started.elapsed();
        if let Err(e) = result {
            self.need_full = true;
            return Err(e);
        }
        let report = SyncReport {
            full,
            services: new_applied.len(),
            rules: script.rules,
            elements: script.elements,
            script_bytes: text.len(),
            script_lines: text.lines().count(),
            nft_time,
            stale_pending: 0,
        };
        if full {
            self.applied.clear();
            self.owners.clear();
            self.last_full = Some(now);
            self.need_full = false;
        }
        for (name, rules) in new_applied {
            // A chain that is active again is no longer stale.
            for c in rules.chains.keys() {
                self.stale.remove(c);
            }
            // The map keys change hands only for the Services synced (all of them in a full
            // sync, whose table was cleared above).
            if let Some(old) = self.applied.get(&name) {
                for e in &old.elements {
                    let k = (e.map, e.key.clone());
                    if self.owners.get(&k) == Some(&name) {
                        self.owners.remove(&k);
                    }
                }
            }
            for e in &rules.elements {
                self.owners.insert((e.map, e.key.clone()), name.clone());
            }
            if rules == ServiceRules::default() {
                self.applied.remove(&name);
            } else {
                self.applied.insert(name, rules);
            }
        }
        for c in deleted_stale {
            self.stale.remove(&c);
        }
        for (c, owner) in new_stale {
            self.stale.entry(c).or_insert((now, owner));
        }
        self.dirty.clear();
        self.generation = Some(next_gen);
        debug!(family = ?self.family, ?report, "synced");
        Ok(SyncReport {
            stale_pending: self.stale.len(),
            ..report
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn syncer() -> Syncer {
        // Never run: these tests stay in the model.
        Syncer::new(
            Family::V4,
            RuleConfig::default(),
            "n1".into(),
            Nft::new(vec!["false".into()]),
        )
    }

    fn svc(port: u16) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web"},
            "spec": {"clusterIP": "10.96.0.5", "ports": [{"name": "http", "port": port}]},
        }))
        .expect("service")
    }

    fn slice(svc: &str, ips: &[&str]) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web-1",
                         "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "endpoints": ips.iter().map(|i| json!({"addresses": [i]})).collect::<Vec<_>>(),
            "ports": [{"name": "http", "port": 8080}],
        }))
        .expect("slice")
    }

    #[test]
    fn only_real_changes_mark_a_service_for_the_partial_sync() {
        let mut s = syncer();
        assert!(s.update_service(None, Some(&svc(80))));
        assert!(
            !s.update_service(Some(&svc(80)), Some(&svc(80))),
            "a resync is no change"
        );
        assert!(s.update_service(Some(&svc(80)), Some(&svc(81))));
        assert!(s.update_slice("ns/web-1", Some(&slice("web", &["10.244.0.1"]))));
        assert!(!s.update_slice("ns/web-1", Some(&slice("web", &["10.244.0.1"]))));
        let name = ServiceName {
            namespace: "ns".into(),
            name: "web".into(),
        };
        assert_eq!(
            s.rules_of(&name).chains.len(),
            2,
            "service and endpoint chain"
        );
        // The slice moves to another Service: the first loses its endpoint.
        assert!(s.update_slice("ns/web-1", Some(&slice("other", &["10.244.0.1"]))));
        assert!(s.rules_of(&name).chains.is_empty());
        assert_eq!(s.pending(), 2);
        // A malformed address is skipped, the rest of the slice kept.
        assert!(s.update_slice(
            "ns/web-1",
            Some(&slice("web", &["not-an-ip", "10.244.0.2"]))
        ));
        assert_eq!(s.rules_of(&name).chains.len(), 2);
        assert!(s.update_service(Some(&svc(81)), None));
        assert!(s.rules_of(&name).chains.is_empty());
    }
}
