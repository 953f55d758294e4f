//! Topology hints by CPU share (`docs/tricks.md` #35, the controller half; Kubernetes'
//! `endpointslice/topologycache`).
//!
//! For a Service annotated `service.kubernetes.io/topology-mode: Auto`, every ready endpoint
//! gets a hint naming the zone whose clients should use it. The [`TopologyCache`] knows each
//! zone's share of the allocatable CPU of the ready nodes, taken as a stand-in for the share
//! of the traffic that zone's clients send. A zone with share `s` of `n` endpoints should be
//! given `s·n` of them ("desired"); a zone given `h` endpoints makes each of them serve
//! `s·n/h` times its fair share, so hints are published only when every zone gets at least
//! `⌈s·n / (1 + OVERLOAD_THRESHOLD)⌉` endpoints: no endpoint ever takes more than 20 % over its
//! fair share because of hints.
//!
//! The allocation, per Service and address type:
//! 1. refuse outright (and remove all hints) when node information is missing, all ready
//!    nodes are in one zone, there are fewer ready endpoints than zones, or the zones'
//!    minimums already add up to more endpoints than exist;
//! 2. keep the hints of slices that are not being rewritten when they still fit, and give
//!    every endpoint in a slice being written a hint for its own zone;
//! 3. move hints from zones with more than desired to zones with fewer;
//! 4. check the result: if any zone ended below its minimum (possible when the surplus sits
//!    in slices step 2 kept), retry with every slice rewritten, and failing that remove the
//!    hints. The check is skerry's addition to Kubernetes' algorithm, which can stop a
//!    fraction short; it makes the 20 % guarantee unconditional.
//!
//! The consumer's half of the contract (the proxy, a later issue): a proxy must ignore the
//! hints of a Service entirely unless **every** ready endpoint has one. Otherwise a zone whose
//! clients see only the few hinted endpoints would pour all its traffic into them — the
//! difference between spreading traffic and starving two pods. This module therefore always
//! hints all ready endpoints of a Service or none.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice, ForZone};
use parking_lot::Mutex;
use skerry_api::validation::quantity::Quantity;

/// The most any endpoint may be overloaded by hints, as a fraction over its fair share
/// (Kubernetes' `OverloadThreshold = 0.2`). Higher lets hints stay on with fewer or less evenly
/// spread endpoints at the cost of hotter pods; lower turns hints off more often.
pub const OVERLOAD_THRESHOLD: f64 = 0.2;

/// Fewest zones with ready nodes for hints to mean anything: with one zone every endpoint
/// would get the same hint, which only costs writes.
pub const ZONES_MIN: usize = 2;

/// The node label naming its zone (`v1.LabelTopologyZone`).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The annotation that turns hints on (`v1.AnnotationTopologyMode`), value `Auto`/`auto`.
pub const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";

/// The older annotation with the same meaning (`v1.DeprecatedAnnotationTopologyAwareHints`);
/// it wins when both are set, as in Kubernetes.
pub const TOPOLOGY_AWARE_HINTS_ANNOTATION: &str = "service.kubernetes.io/topology-aware-hints";

/// Node labels that exclude a node from the CPU shares (Kubernetes' `hasExcludedLabels`):
/// upstream assumes control-plane nodes run no Service backends, so their CPU would attract
/// traffic to zones that cannot serve it.
///
/// NOTE for skerry: every appliance node is a control-plane node *and* a worker. The node
/// agent should therefore not set these labels (or hints will be off for lack of nodes).
pub const EXCLUDED_NODE_LABELS: &[&str] = &[
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// Millicores per core, for [`Quantity`] (nano-units) to millicores.
const NANO_PER_MILLI: i128 = 1_000_000;

/// Event reasons, as Kubernetes records them on the Service.
pub const REASON_DISABLED: &str = "TopologyAwareHintsDisabled";
/// See [`REASON_DISABLED`].
pub const REASON_ENABLED: &str = "TopologyAwareHintsEnabled";

/// Whether the Service asks for hints (Kubernetes' `hintsEnabled`).
pub fn hints_enabled(annotations: Option<&BTreeMap<String, String>>) -> bool {
    let Some(a) = annotations else {
        return false;
    };
    let value = a
        .get(TOPOLOGY_AWARE_HINTS_ANNOTATION)
        .or_else(|| a.get(TOPOLOGY_MODE_ANNOTATION));
    matches!(value.map(String::as_str), Some("Auto" | "auto"))
}

/// Whether an endpoint counts as ready for hints (`EndpointReady`: unset means ready).
pub fn endpoint_ready(e: &Endpoint) -> bool {
    e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
}

/// Why hints were turned off (the message of a `TopologyAwareHintsDisabled` event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HintsDisabled {
    /// A ready node lacks a zone label or allocatable CPU, or no CPU was found at all.
    #[error(
        "Insufficient Node information: allocatable CPU or zone not specified on one or more nodes"
    )]
    InsufficientNodeInfo,
    /// Fewer than [`ZONES_MIN`] zones have ready nodes.
    #[error("Nodes only ready in one zone")]
    NodesReadyInOneZoneOnly,
    /// Fewer ready endpoints than zones: some zone would get none of its own.
    #[error("Insufficient number of endpoints ({endpoints} endpoints, {zones} zones)")]
    InsufficientNumberOfEndpoints {
        /// Ready endpoints.
        endpoints: usize,
        /// Zones with ready nodes.
        zones: usize,
    },
    /// The zones' minimum allocations (each within the overload threshold) need more
    /// endpoints than exist.
    #[error(
        "Unable to allocate minimum required endpoints to each zone without exceeding overload threshold ({endpoints} endpoints, {zones} zones)"
    )]
    MinAllocationExceedsOverloadThreshold {
        /// Ready endpoints.
        endpoints: usize,
        /// Zones with ready nodes.
        zones: usize,
    },
    /// A ready endpoint has no zone (its node has no zone label).
    #[error("One or more endpoints do not have a zone specified")]
    NoZoneSpecified,
    /// The allocation could not bring every zone to its minimum.
    #[error("Unable to allocate endpoints to every zone within the overload threshold")]
    ZoneWouldOverload,
    /// The Service no longer asks for hints.
    #[error("Topology Aware Hints has been disabled")]
    AnnotationRemoved,
}

/// An event to record on the Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HintEvent {
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// [`REASON_ENABLED`] or [`REASON_DISABLED`].
    pub reason: &'static str,
    /// The human-readable reason, with the address type.
    pub message: String,
}

impl HintEvent {
    fn disabled(why: &HintsDisabled, address_type: &str) -> HintEvent {
        HintEvent {
            type_: "Warning",
            reason: REASON_DISABLED,
            message: format!("{why}, addressType: {address_type}"),
        }
    }
}

/// How many endpoints one zone should be given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allocation {
    /// Fewest endpoints keeping each of them within the overload threshold.
    pub minimum: usize,
    /// Most endpoints while still leaving every other zone its minimum.
    pub maximum: usize,
    /// The zone's CPU share of the endpoints (never below `minimum`).
    pub desired: f64,
}

/// The allocations for `endpoints` ready endpoints over zones with the given CPU ratios
/// (Kubernetes' `getAllocations`).
pub fn allocations(
    ratios: &BTreeMap<String, f64>,
    endpoints: usize,
) -> Result<BTreeMap<String, Allocation>, HintsDisabled> {
    let zones = ratios.len();
    if zones < ZONES_MIN {
        return Err(HintsDisabled::NodesReadyInOneZoneOnly);
    }
    if zones > endpoints {
        return Err(HintsDisabled::InsufficientNumberOfEndpoints { endpoints, zones });
    }
    let mut out = BTreeMap::new();
    let mut minimum_total = 0usize;
    for (zone, ratio) in ratios {
        let desired = ratio * endpoints as f64;
        let minimum = minimum_for(desired);
        minimum_total += minimum;
        if minimum_total > endpoints {
            return Err(HintsDisabled::MinAllocationExceedsOverloadThreshold { endpoints, zones });
        }
        out.insert(
            zone.clone(),
            Allocation {
                minimum,
                maximum: 0,
                desired: desired.max(minimum as f64),
            },
        );
    }
    for a in out.values_mut() {
        a.maximum = a.minimum + endpoints - minimum_total;
    }
    Ok(out)
}

/// `⌈desired / (1 + OVERLOAD_THRESHOLD)⌉`, the fewest endpoints that keep each within the
/// threshold. Computed with a small tolerance so that float noise (`6.0000000001`) does not
/// demand an extra endpoint.
fn minimum_for(desired: f64) -> usize {
    /// Float noise tolerated below an integer before rounding up.
    const EPSILON: f64 = 1e-9;
    let exact = desired / (1.0 + OVERLOAD_THRESHOLD);
    // Truncation is intended: the value is a small non-negative count.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "small non-negative count"
    )]
    let minimum = (exact - EPSILON).ceil().max(0.0) as usize;
    minimum
}

/// Each zone's share of the allocatable CPU of the ready, non-excluded nodes (Kubernetes'
/// `SetNodes`), or why there is none.
pub fn cpu_ratios_by_zone<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Result<BTreeMap<String, f64>, HintsDisabled> {
    let mut cpu_by_zone: BTreeMap<String, i128> = BTreeMap::new();
    let mut total: i128 = 0;
    for node in nodes {
        let labels = node.metadata.labels.as_ref();
        if labels.is_some_and(|l| EXCLUDED_NODE_LABELS.iter().any(|x| l.contains_key(*x))) {
            continue;
        }
        if !is_node_ready(node) {
            continue;
        }
        let zone = labels
            .and_then(|l| l.get(ZONE_LABEL))
            .filter(|z| !z.is_empty());
        let cpu = node_cpu_millis(node);
        let (Some(zone), Some(cpu)) = (zone, cpu.filter(|c| *c > 0)) else {
            // Kubernetes bails out entirely: a partial picture would skew every ratio.
            return Err(HintsDisabled::InsufficientNodeInfo);
        };
        *cpu_by_zone.entry(zone.clone()).or_default() += cpu;
        total += cpu;
    }
    if total == 0 {
        return Err(HintsDisabled::InsufficientNodeInfo);
    }
    if cpu_by_zone.len() < ZONES_MIN {
        return Err(HintsDisabled::NodesReadyInOneZoneOnly);
    }
    Ok(cpu_by_zone
        .into_iter()
        .map(|(z, c)| (z, c as f64 / total as f64))
        .collect())
}

/// The node's `Ready` condition is `True`.
fn is_node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The node's allocatable CPU in millicores, rounded up (`Quantity.MilliValue`).
pub fn node_cpu_millis(node: &Node) -> Option<i128> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get("cpu")?;
    let nano = Quantity::parse(&q.0)?.0;
    Some((nano + NANO_PER_MILLI - 1).div_euclid(NANO_PER_MILLI))
}

/// The slices of one Service and address type, as the reconciler is about to leave them.
#[derive(Debug, Clone, Default)]
pub struct SliceInfo {
    /// `namespace/name` of the Service.
    pub service_key: String,
    /// `IPv4` or `IPv6`.
    pub address_type: String,
    /// Slices to create.
    pub to_create: Vec<EndpointSlice>,
    /// Slices to update.
    pub to_update: Vec<EndpointSlice>,
    /// Existing slices nothing else changes.
    pub unchanged: Vec<EndpointSlice>,
}

impl SliceInfo {
    fn ready_endpoints(&self) -> usize {
        self.to_create
            .iter()
            .chain(&self.to_update)
            .chain(&self.unchanged)
            .flat_map(|s| &s.endpoints)
            .filter(|e| endpoint_ready(e))
            .count()
    }
}

/// Hint counts per zone.
pub type ZoneCounts = BTreeMap<String, usize>;

/// The zone an endpoint's hint names (hints of one zone only are ever written here).
fn hinted_zones(e: &Endpoint) -> Vec<&str> {
    e.hints
        .as_ref()
        .and_then(|h| h.for_zones.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|z| z.name.as_str())
        .collect()
}

fn hint_for(zone: &str) -> Option<EndpointHints> {
    Some(EndpointHints {
        for_zones: Some(vec![ForZone { name: zone.into() }]),
    })
}

/// The hint counts of an unchanged slice, or `None` when its hints must be rewritten: an
/// endpoint without a hint, a hint for a zone no longer allocated, or more than a zone's
/// maximum (Kubernetes' `getHintsByZone`).
fn hints_by_zone(
    slice: &EndpointSlice,
    already: &ZoneCounts,
    allocations: &BTreeMap<String, Allocation>,
) -> Option<ZoneCounts> {
    let mut counts = ZoneCounts::new();
    for e in slice.endpoints.iter().filter(|e| endpoint_ready(e)) {
        let zones = hinted_zones(e);
        if zones.is_empty() {
            return None;
        }
        for z in zones {
            if !allocations.contains_key(z) {
                return None;
            }
            *counts.entry(z.to_string()).or_default() += 1;
        }
    }
    for (zone, n) in &counts {
        let allocation = allocations.get(zone)?;
        if n + already.get(zone).copied().unwrap_or(0) > allocation.maximum {
            return None;
        }
    }
    Some(counts)
}

/// The zone with the most in `m` (ties to the first name, for determinism).
fn most(m: &BTreeMap<String, f64>) -> Option<(String, f64)> {
    let mut best: Option<(&String, f64)> = None;
    for (zone, v) in m {
        if best.is_none_or(|(_, b)| *v > b) {
            best = Some((zone, *v));
        }
    }
    best.map(|(z, v)| (z.clone(), v))
}

/// How many hints each zone should give and receive to approach `desired` from `allocated`
/// (Kubernetes' `getGivingAndReceivingZones`).
fn giving_and_receiving(
    allocations: &BTreeMap<String, Allocation>,
    allocated: &ZoneCounts,
) -> (ZoneCounts, ZoneCounts) {
    let mut giving_desired = BTreeMap::new();
    let mut receiving_desired = BTreeMap::new();
    for (zone, a) in allocations {
        let have = allocated.get(zone).copied().unwrap_or(0) as f64;
        if have > a.desired {
            giving_desired.insert(zone.clone(), have - a.desired);
        } else if have < a.desired {
            receiving_desired.insert(zone.clone(), a.desired - have);
        }
    }
    let mut giving = ZoneCounts::new();
    let mut receiving = ZoneCounts::new();
    while let (Some((g, give)), Some((r, receive))) =
        (most(&giving_desired), most(&receiving_desired))
    {
        if give < 1.0 && receive < 1.0 {
            break;
        }
        *giving.entry(g.clone()).or_default() += 1;
        *receiving.entry(r.clone()).or_default() += 1;
        if let Some(v) = giving_desired.get_mut(&g) {
            *v -= 1.0;
            if *v <= 0.0 {
                giving_desired.remove(&g);
            }
        }
        if let Some(v) = receiving_desired.get_mut(&r) {
            *v -= 1.0;
            if *v <= 0.0 {
                receiving_desired.remove(&r);
            }
        }
    }
    (giving, receiving)
}

/// Re-points hints of endpoints in giving zones at receiving zones; returns the change per
/// zone (Kubernetes' `redistributeHints`).
fn redistribute(
    slices: &mut [&mut EndpointSlice],
    giving: &mut ZoneCounts,
    receiving: &mut ZoneCounts,
) -> BTreeMap<String, i64> {
    let mut changes: BTreeMap<String, i64> = BTreeMap::new();
    for slice in slices.iter_mut() {
        for e in slice.endpoints.iter_mut() {
            if giving.is_empty() || receiving.is_empty() {
                return changes;
            }
            if !endpoint_ready(e) {
                continue;
            }
            let Some(zone) = e.zone.clone().filter(|z| !z.is_empty()) else {
                continue;
            };
            // Only an endpoint still hinted for its own zone is moved, once.
            if hinted_zones(e) != [zone.as_str()] || !giving.contains_key(&zone) {
                continue;
            }
            let Some(target) = receiving.keys().next().cloned() else {
                break;
            };
            e.hints = hint_for(&target);
            decrement(giving, &zone);
            decrement(receiving, &target);
            *changes.entry(target).or_default() += 1;
            *changes.entry(zone).or_default() -= 1;
        }
    }
    changes
}

fn decrement(m: &mut ZoneCounts, zone: &str) {
    if let Some(n) = m.get_mut(zone) {
        *n -= 1;
        if *n == 0 {
            m.remove(zone);
        }
    }
}

/// Removes hints from every endpoint of `info`: from the slices already being written, and
/// by moving unchanged slices that carry hints into `to_update` (Kubernetes'
/// `RemoveHintsFromSlices`).
pub fn remove_hints_from_slices(info: &mut SliceInfo) {
    for slice in info.to_create.iter_mut().chain(info.to_update.iter_mut()) {
        for e in &mut slice.endpoints {
            e.hints = None;
        }
    }
    let (with_hints, without): (Vec<_>, Vec<_>) = std::mem::take(&mut info.unchanged)
        .into_iter()
        .partition(|s| s.endpoints.iter().any(|e| e.hints.is_some()));
    info.unchanged = without;
    for mut slice in with_hints {
        for e in &mut slice.endpoints {
            e.hints = None;
        }
        info.to_update.push(slice);
    }
}

/// Assigns hints to the slices of `info` against `allocations`: keeps fitting unchanged
/// slices, hints the rest for their own zone, then redistributes. Returns the hint counts per
/// zone, or why not.
fn assign(
    info: &mut SliceInfo,
    allocations: &BTreeMap<String, Allocation>,
) -> Result<ZoneCounts, HintsDisabled> {
    let mut allocated = ZoneCounts::new();
    let mut keep = Vec::new();
    for slice in std::mem::take(&mut info.unchanged) {
        match hints_by_zone(&slice, &allocated, allocations) {
            Some(counts) => {
                for (zone, n) in counts {
                    *allocated.entry(zone).or_default() += n;
                }
                keep.push(slice);
            }
            None => info.to_update.push(slice),
        }
    }
    info.unchanged = keep;

    let mut writable: Vec<&mut EndpointSlice> = info
        .to_create
        .iter_mut()
        .chain(info.to_update.iter_mut())
        .collect();
    for slice in writable.iter_mut() {
        for e in slice.endpoints.iter_mut() {
            if !endpoint_ready(e) {
                e.hints = None;
                continue;
            }
            let Some(zone) = e.zone.clone().filter(|z| !z.is_empty()) else {
                return Err(HintsDisabled::NoZoneSpecified);
            };
            *allocated.entry(zone.clone()).or_default() += 1;
            e.hints = hint_for(&zone);
        }
    }

    let (mut giving, mut receiving) = giving_and_receiving(allocations, &allocated);
    let changes = redistribute(&mut writable, &mut giving, &mut receiving);
    apply_changes(&mut allocated, &changes);

    // skerry's second pass: any zone still below its minimum takes from the zone furthest
    // above its own (there is one: the minimums sum to at most the endpoints).
    loop {
        let short = allocations
            .iter()
            .find(|(z, a)| allocated.get(*z).copied().unwrap_or(0) < a.minimum)
            .map(|(z, _)| z.clone());
        let Some(short) = short else { break };
        let donor = allocations
            .iter()
            .filter(|(z, a)| allocated.get(*z).copied().unwrap_or(0) > a.minimum)
            .max_by_key(|(z, a)| allocated.get(*z).copied().unwrap_or(0) - a.minimum)
            .map(|(z, _)| z.clone());
        let Some(donor) = donor else { break };
        let moved = move_one_hint(&mut writable, &donor, &short);
        if !moved {
            break;
        }
        apply_changes(&mut allocated, &BTreeMap::from([(short, 1), (donor, -1)]));
    }
    allocated.retain(|_, n| *n > 0);
    Ok(allocated)
}

fn apply_changes(allocated: &mut ZoneCounts, changes: &BTreeMap<String, i64>) {
    for (zone, diff) in changes {
        let n = allocated.entry(zone.clone()).or_default();
        *n = usize::try_from(i64::try_from(*n).unwrap_or(i64::MAX) + diff).unwrap_or(0);
    }
}

/// Re-points one writable endpoint's hint from `from` to `to`; false if none is hinted `from`.
fn move_one_hint(slices: &mut [&mut EndpointSlice], from: &str, to: &str) -> bool {
    for slice in slices.iter_mut() {
        for e in slice.endpoints.iter_mut() {
            if endpoint_ready(e) && hinted_zones(e) == [from] {
                e.hints = hint_for(to);
                return true;
            }
        }
    }
    false
}

/// Whether every allocated zone is within its minimum and maximum.
fn within_threshold(allocations: &BTreeMap<String, Allocation>, allocated: &ZoneCounts) -> bool {
    allocations.iter().all(|(zone, a)| {
        let n = allocated.get(zone).copied().unwrap_or(0);
        n >= a.minimum && n <= a.maximum
    })
}

/// Whether a Service's hints, as counted per zone, overload some zone under `ratios`
/// (Kubernetes' `serviceOverloaded`): checked when nodes change.
pub fn service_overloaded(counts: &ZoneCounts, ratios: Option<&BTreeMap<String, f64>>) -> bool {
    if counts.is_empty() {
        return false;
    }
    let Some(ratios) = ratios else {
        return true;
    };
    let total: usize = counts.values().sum();
    ratios.iter().any(|(zone, ratio)| {
        let have = counts.get(zone).copied().unwrap_or(0);
        have < minimum_for(total as f64 * ratio)
    })
}

#[derive(Default)]
struct State {
    /// `None` while the nodes do not allow hints.
    cpu_ratios_by_zone: Option<BTreeMap<String, f64>>,
    /// Why the nodes do not allow hints.
    node_problem: Option<HintsDisabled>,
    /// Service key → address type → hints per zone, for the Services with hints.
    endpoints_by_service: HashMap<String, HashMap<String, ZoneCounts>>,
    /// Services whose slices carry hints.
    hints_populated: HashSet<String>,
}

/// The zones' CPU shares and the hints each Service was given (Kubernetes' `TopologyCache`).
/// Shared by the EndpointSlice controller's workers and its node event handler.
pub struct TopologyCache {
    /// Short critical sections (a lookup or an insert), never held across an `.await`.
    state: Mutex<State>,
}

impl Default for TopologyCache {
    fn default() -> Self {
        TopologyCache {
            state: Mutex::new(State {
                node_problem: Some(HintsDisabled::InsufficientNodeInfo),
                ..State::default()
            }),
        }
    }
}

impl TopologyCache {
    /// A cache that knows no nodes yet (hints off until [`Self::set_nodes`]).
    pub fn new() -> TopologyCache {
        TopologyCache::default()
    }

    /// Recomputes the zones' CPU shares from `nodes`.
    pub fn set_nodes<'a>(&self, nodes: impl IntoIterator<Item = &'a Node>) {
        let ratios = cpu_ratios_by_zone(nodes);
        let mut state = self.state.lock();
        match ratios {
            Ok(r) => {
                state.cpu_ratios_by_zone = Some(r);
                state.node_problem = None;
            }
            Err(why) => {
                tracing::debug!(reason = %why, "topology hints unavailable");
                state.cpu_ratios_by_zone = None;
                state.node_problem = Some(why);
            }
        }
    }

    /// The zones' CPU shares, if the nodes allow hints.
    pub fn cpu_ratios(&self) -> Option<BTreeMap<String, f64>> {
        self.state.lock().cpu_ratios_by_zone.clone()
    }

    /// The Services with hints that the current shares would overload.
    pub fn overloaded_services(&self) -> Vec<String> {
        let state = self.state.lock();
        let mut keys: Vec<String> = state
            .endpoints_by_service
            .iter()
            .filter(|(_, by_type)| {
                by_type
                    .values()
                    .any(|c| service_overloaded(c, state.cpu_ratios_by_zone.as_ref()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// Whether the Service's slices carry hints.
    pub fn has_populated_hints(&self, service_key: &str) -> bool {
        self.state.lock().hints_populated.contains(service_key)
    }

    /// Forgets the Service's hints for `address_type`.
    pub fn remove_hints(&self, service_key: &str, address_type: &str) {
        let mut state = self.state.lock();
        if let Some(by_type) = state.endpoints_by_service.get_mut(service_key) {
            by_type.remove(address_type);
            if by_type.is_empty() {
                state.endpoints_by_service.remove(service_key);
            }
        }
        state.hints_populated.remove(service_key);
    }

    fn set_hints(&self, service_key: &str, address_type: &str, counts: ZoneCounts) -> bool {
        let mut state = self.state.lock();
        let was_populated = state.hints_populated.contains(service_key);
        state
            .endpoints_by_service
            .entry(service_key.to_string())
            .or_default()
            .insert(address_type.to_string(), counts);
        state.hints_populated.insert(service_key.to_string());
        was_populated
    }

    /// Adds hints to `info`'s slices (moving unchanged slices into `to_update` where their
    /// hints must change), or removes them all when they cannot be allocated within the
    /// overload threshold. Returns the events to record on the Service.
    pub fn add_hints(&self, info: &mut SliceInfo) -> Vec<HintEvent> {
        let ready = info.ready_endpoints();
        let allocated = self.allocate(info, ready);
        match allocated {
            Ok(counts) => {
                let was_populated = self.set_hints(&info.service_key, &info.address_type, counts);
                if was_populated {
                    Vec::new()
                } else {
                    tracing::info!(service = %info.service_key, address_type = %info.address_type, "topology aware hints enabled");
                    vec![HintEvent {
                        type_: "Normal",
                        reason: REASON_ENABLED,
                        message: format!(
                            "Topology Aware Hints has been enabled, addressType: {}",
                            info.address_type
                        ),
                    }]
                }
            }
            Err(why) => {
                tracing::info!(service = %info.service_key, address_type = %info.address_type, reason = %why, "removing topology hints");
                self.remove_hints(&info.service_key, &info.address_type);
                remove_hints_from_slices(info);
                vec![HintEvent::disabled(&why, &info.address_type)]
            }
        }
    }

    fn allocate(&self, info: &mut SliceInfo, ready: usize) -> Result<ZoneCounts, HintsDisabled> {
        let (ratios, problem) = {
            let state = self.state.lock();
            (state.cpu_ratios_by_zone.clone(), state.node_problem.clone())
        };
        let Some(ratios) = ratios else {
            return Err(problem.unwrap_or(HintsDisabled::InsufficientNodeInfo));
        };
        let allocations = allocations(&ratios, ready)?;
        // First with the fewest writes; if the hints kept in unchanged slices make the
        // threshold unreachable, once more with every slice rewritten.
        let attempt = info.clone();
        let counts = assign(info, &allocations)?;
        if within_threshold(&allocations, &counts) {
            return Ok(counts);
        }
        *info = attempt;
        info.to_update.append(&mut info.unchanged);
        let counts = assign(info, &allocations)?;
        if within_threshold(&allocations, &counts) {
            return Ok(counts);
        }
        Err(HintsDisabled::ZoneWouldOverload)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::api::discovery::v1::EndpointConditions;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use rand::{Rng, SeedableRng};

    fn node(name: &str, zone: Option<&str>, cpu: &str, ready: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: zone.map(|z| BTreeMap::from([(ZONE_LABEL.to_string(), z.to_string())])),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([("cpu".into(), K8sQuantity(cpu.into()))])),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
        }
    }

    fn endpoint(i: usize, zone: &str) -> Endpoint {
        Endpoint {
            addresses: vec![format!("10.0.{}.{}", i / 200, i % 200)],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            zone: Some(zone.into()),
            ..Endpoint::default()
        }
    }

    fn slice(endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints,
            metadata: ObjectMeta::default(),
            ports: None,
        }
    }

    /// A cache over zones a/b/c with 5/3/2 cores (50/30/20 %).
    fn cache_50_30_20() -> TopologyCache {
        let cache = TopologyCache::new();
        let nodes = [
            node("n1", Some("a"), "5", true),
            node("n2", Some("b"), "3000m", true),
            node("n3", Some("c"), "2", true),
        ];
        cache.set_nodes(&nodes);
        cache
    }

    fn info_of(zones: &[&str]) -> SliceInfo {
        let endpoints = zones
            .iter()
            .enumerate()
            .map(|(i, z)| endpoint(i, z))
            .collect();
        SliceInfo {
            service_key: "ns/web".into(),
            address_type: "IPv4".into(),
            to_create: vec![slice(endpoints)],
            ..SliceInfo::default()
        }
    }

    fn hint_counts(info: &SliceInfo) -> ZoneCounts {
        let mut counts = ZoneCounts::new();
        for e in info
            .to_create
            .iter()
            .chain(&info.to_update)
            .chain(&info.unchanged)
            .flat_map(|s| &s.endpoints)
        {
            for z in hinted_zones(e) {
                *counts.entry(z.to_string()).or_default() += 1;
            }
        }
        counts
    }

    fn counts(pairs: &[(&str, usize)]) -> ZoneCounts {
        pairs.iter().map(|(z, n)| (z.to_string(), *n)).collect()
    }

    #[test]
    fn cpu_shares_50_30_20_give_10_endpoints_5_3_2_hints_wherever_they_run() {
        let cache = cache_50_30_20();
        let ratios = cache.cpu_ratios().unwrap();
        assert!((ratios["a"] - 0.5).abs() < 1e-12);
        assert!((ratios["b"] - 0.3).abs() < 1e-12);
        // All in one zone, evenly spread, and skewed the other way: always 5/3/2.
        for layout in [
            vec!["a"; 10],
            vec!["a", "a", "a", "a", "b", "b", "b", "b", "c", "c"],
            vec!["c", "c", "c", "c", "c", "c", "b", "b", "b", "a"],
        ] {
            let mut info = info_of(&layout);
            let events = cache.add_hints(&mut info);
            assert_eq!(
                hint_counts(&info),
                counts(&[("a", 5), ("b", 3), ("c", 2)]),
                "layout {layout:?}"
            );
            assert!(
                events.iter().all(|e| e.reason != REASON_DISABLED),
                "{events:?}"
            );
        }
        // The first success is announced once.
        assert!(cache.has_populated_hints("ns/web"));
    }

    #[test]
    fn endpoints_keep_their_own_zone_when_the_spread_already_fits() {
        let cache = cache_50_30_20();
        let mut info = info_of(&["a", "a", "a", "a", "a", "b", "b", "b", "c", "c"]);
        cache.add_hints(&mut info);
        for e in &info.to_create[0].endpoints {
            assert_eq!(hinted_zones(e), vec![e.zone.as_deref().unwrap()]);
        }
    }

    #[test]
    fn a_starved_zone_means_no_hints_at_all() {
        let cache = cache_50_30_20();
        // Two endpoints for three zones: one zone would have none.
        let mut info = info_of(&["a", "b"]);
        let events = cache.add_hints(&mut info);
        assert!(hint_counts(&info).is_empty());
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, REASON_DISABLED);
        assert!(
            events[0]
                .message
                .contains("Insufficient number of endpoints"),
            "{events:?}"
        );
        assert!(!cache.has_populated_hints("ns/web"));
    }

    #[test]
    fn more_than_20_percent_overload_means_no_hints() {
        let cache = cache_50_30_20();
        // 3 endpoints: zone a's fair share is 1.5; with 1 endpoint it would take 50 % over,
        // and the minimums (2 + 1 + 1) need 4 endpoints.
        assert_eq!(
            allocations(&cache.cpu_ratios().unwrap(), 3),
            Err(HintsDisabled::MinAllocationExceedsOverloadThreshold {
                endpoints: 3,
                zones: 3
            })
        );
        let mut info = info_of(&["a", "b", "c"]);
        let events = cache.add_hints(&mut info);
        assert!(hint_counts(&info).is_empty());
        assert!(
            events[0].message.contains("overload threshold"),
            "{events:?}"
        );

        // Three equal zones and four endpoints: each zone's 1.33 needs 2 within 20 %.
        let equal = TopologyCache::new();
        equal.set_nodes(&[
            node("n1", Some("a"), "2", true),
            node("n2", Some("b"), "2", true),
            node("n3", Some("c"), "2", true),
        ]);
        let mut info = info_of(&["a", "b", "c", "a"]);
        equal.add_hints(&mut info);
        assert!(hint_counts(&info).is_empty());
    }

    #[test]
    fn hints_that_were_on_are_removed_from_unchanged_slices_too() {
        let cache = cache_50_30_20();
        let mut info = info_of(&["a"; 10]);
        cache.add_hints(&mut info);
        // Next sync: the slice exists unchanged with hints, but nodes went to one zone.
        cache.set_nodes(&[
            node("n1", Some("a"), "4", true),
            node("n2", Some("b"), "4", false),
        ]);
        let mut next = SliceInfo {
            service_key: "ns/web".into(),
            address_type: "IPv4".into(),
            unchanged: std::mem::take(&mut info.to_create),
            ..SliceInfo::default()
        };
        let events = cache.add_hints(&mut next);
        assert!(next.unchanged.is_empty());
        assert_eq!(next.to_update.len(), 1);
        assert!(hint_counts(&next).is_empty());
        assert!(events[0].message.contains("one zone"), "{events:?}");
    }

    #[test]
    fn unchanged_slices_that_still_fit_are_not_rewritten() {
        let cache = cache_50_30_20();
        let mut first = info_of(&["a", "a", "a", "a", "a", "b", "b", "b", "c", "c"]);
        cache.add_hints(&mut first);
        let mut next = SliceInfo {
            service_key: "ns/web".into(),
            address_type: "IPv4".into(),
            unchanged: std::mem::take(&mut first.to_create),
            ..SliceInfo::default()
        };
        let events = cache.add_hints(&mut next);
        assert!(events.is_empty(), "already enabled: {events:?}");
        assert!(next.to_update.is_empty());
        assert_eq!(next.unchanged.len(), 1);
    }

    #[test]
    fn nodes_without_zone_or_cpu_and_excluded_or_unready_nodes() {
        assert_eq!(
            cpu_ratios_by_zone(&[
                node("n1", Some("a"), "2", true),
                node("n2", None, "2", true)
            ]),
            Err(HintsDisabled::InsufficientNodeInfo)
        );
        // Unready nodes do not count, so one zone remains.
        assert_eq!(
            cpu_ratios_by_zone(&[
                node("n1", Some("a"), "2", true),
                node("n2", Some("b"), "2", false)
            ]),
            Err(HintsDisabled::NodesReadyInOneZoneOnly)
        );
        let mut control_plane = node("n3", Some("c"), "8", true);
        control_plane.metadata.labels.as_mut().unwrap().insert(
            "node-role.kubernetes.io/control-plane".into(),
            String::new(),
        );
        let ratios = cpu_ratios_by_zone(&[
            node("n1", Some("a"), "1", true),
            node("n2", Some("b"), "3", true),
            control_plane,
        ])
        .unwrap();
        assert_eq!(ratios.len(), 2);
        assert!((ratios["b"] - 0.75).abs() < 1e-12);
    }

    #[test]
    fn an_endpoint_without_zone_turns_hints_off() {
        let cache = cache_50_30_20();
        let mut info = info_of(&["a", "a", "a", "a", "a", "b", "b", "b", "c", "c"]);
        info.to_create[0].endpoints[3].zone = None;
        let events = cache.add_hints(&mut info);
        assert!(hint_counts(&info).is_empty());
        assert!(events[0].message.contains("zone specified"));
    }

    #[test]
    fn not_ready_endpoints_get_no_hint_and_do_not_count() {
        let cache = cache_50_30_20();
        let mut info = info_of(&["a", "a", "a", "a", "a", "b", "b", "b", "c", "c", "a"]);
        info.to_create[0].endpoints[10].conditions = Some(EndpointConditions {
            ready: Some(false),
            serving: Some(false),
            terminating: Some(true),
        });
        cache.add_hints(&mut info);
        assert_eq!(hint_counts(&info), counts(&[("a", 5), ("b", 3), ("c", 2)]));
        assert!(info.to_create[0].endpoints[10].hints.is_none());
    }

    #[test]
    fn losing_a_zones_cpu_marks_the_service_overloaded() {
        let cache = cache_50_30_20();
        let mut info = info_of(&["a", "a", "a", "a", "a", "b", "b", "b", "c", "c"]);
        cache.add_hints(&mut info);
        assert!(cache.overloaded_services().is_empty());
        // Zone c grows to 10 cores: its 2 hints of 10 are far below 10/18 of the traffic.
        cache.set_nodes(&[
            node("n1", Some("a"), "5", true),
            node("n2", Some("b"), "3", true),
            node("n3", Some("c"), "10", true),
        ]);
        assert_eq!(cache.overloaded_services(), vec!["ns/web".to_string()]);
    }

    /// Property: whenever hints are published, every zone's endpoints carry at most 20 % over
    /// their fair share, every ready endpoint has exactly one hint, and the hint counts add up.
    #[test]
    fn published_hints_never_overload_a_zone_by_more_than_20_percent() {
        let seed: u64 = 0x5eed_0006;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut published = 0;
        for round in 0..2000 {
            let zones = rng.random_range(2..=4usize);
            let names: Vec<String> = (0..zones).map(|z| format!("z{z}")).collect();
            let nodes: Vec<Node> = names
                .iter()
                .enumerate()
                .map(|(i, z)| {
                    node(
                        &format!("n{i}"),
                        Some(z),
                        &format!("{}", rng.random_range(1..=16)),
                        true,
                    )
                })
                .collect();
            let cache = TopologyCache::new();
            cache.set_nodes(&nodes);
            let ratios = cache.cpu_ratios().unwrap();
            let n = rng.random_range(1..=40usize);
            let layout: Vec<&str> = (0..n)
                .map(|_| names[rng.random_range(0..zones)].as_str())
                .collect();
            // Some endpoints in an already-hinted unchanged slice, the rest new.
            let split = rng.random_range(0..=n);
            let mut info = info_of(&layout[..split]);
            cache.add_hints(&mut info);
            let mut info = SliceInfo {
                service_key: "ns/web".into(),
                address_type: "IPv4".into(),
                unchanged: std::mem::take(&mut info.to_create),
                to_create: info_of(&layout[split..]).to_create,
                ..SliceInfo::default()
            };
            cache.add_hints(&mut info);
            let got = hint_counts(&info);
            if got.is_empty() {
                continue;
            }
            published += 1;
            assert_eq!(got.values().sum::<usize>(), n, "seed {seed} round {round}");
            for (zone, ratio) in &ratios {
                let have = got.get(zone).copied().unwrap_or(0) as f64;
                let share = ratio * n as f64;
                assert!(
                    share / have <= 1.0 + OVERLOAD_THRESHOLD + 1e-9,
                    "seed {seed} round {round}: zone {zone} share {share} on {have} endpoints"
                );
            }
        }
        assert!(published > 100, "only {published} rounds published hints");
    }
}
