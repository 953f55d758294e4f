//! The EndpointSlice reconciler's decision (Kubernetes' `endpointslice.Reconciler`): from a
//! Service, its pods and the slices that exist, the slices to create, update and delete — a
//! pure function, so that every packing rule is tested without an apiserver.
//!
//! The rules, chosen to minimise writes (each write is an event for every proxy in the
//! cluster):
//! - endpoints are grouped by their port set and address type; one slice holds one group and
//!   at most `max_endpoints_per_slice` endpoints;
//! - existing slices are updated in place: endpoints no longer desired are dropped, changed
//!   ones replaced, and a slice left empty is deleted;
//! - remaining new endpoints go first into slices already being updated (fullest first, since
//!   they are written anyway), then into the one unchanged slice they fit best, and only then
//!   into new slices;
//! - a create and a delete in the same sync become one update of the slice being deleted;
//! - a Service with no endpoints keeps one empty "placeholder" slice, so consumers can tell
//!   "no endpoints" from "not yet reconciled";
//! - endpoints are compared by what they say (addresses, pod, conditions, node, zone), never
//!   by the pod's resourceVersion, so a pod update that moves nothing writes nothing.
//!
//! Topology hints are added (or removed) last, over the slices as this plan leaves them; see
//! [`super::topology`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use skerry_client::cache::Indexer;
use skerry_client::key_of;

use super::topology::{
    HintEvent, HintsDisabled, SliceInfo, TopologyCache, ZONE_LABEL, hints_enabled,
    remove_hints_from_slices,
};
use super::{CONTROLLER_NAME, MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
use crate::endpoints::{
    HEADLESS_LABEL, find_port, is_ipv6, is_service_ip_set, pod_ips, pod_reference,
    should_pod_be_in_endpoints, should_set_hostname,
};
use crate::util::{controller_ref, is_pod_ready};

/// The most endpoints in one slice: kube-controller-manager's `--max-endpoints-per-slice`
/// default. Larger slices mean fewer objects but a bigger write (and a bigger event to every
/// proxy) for each endpoint change; 100 keeps a one-pod change to a ~10 KiB write.
pub const DEFAULT_MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// The API's limit on endpoints per slice (EndpointSlice validation), and so on the setting.
pub const MAX_ENDPOINTS_PER_SLICE_LIMIT: usize = 1000;

/// The canonical form of a slice's port set, by which endpoints are grouped.
type PortKey = Vec<(Option<String>, Option<i32>, Option<String>, Option<String>)>;

fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut key: PortKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.port,
                p.protocol.clone(),
                p.app_protocol.clone(),
            )
        })
        .collect();
    key.sort();
    key
}

/// What identifies an endpoint across syncs (Kubernetes' `hashEndpoint`): its addresses,
/// hostname and pod. Everything else about it may change in place.
type EndpointKey = (Vec<String>, Option<String>, Option<String>, Option<String>);

fn endpoint_key(e: &Endpoint) -> EndpointKey {
    let mut addresses = e.addresses.clone();
    addresses.sort();
    let target = e.target_ref.as_ref();
    (
        addresses,
        e.hostname.clone(),
        target.and_then(|r| r.namespace.clone()),
        target.and_then(|r| r.name.clone()),
    )
}

/// Whether two endpoints with the same key say the same thing (Kubernetes'
/// `EndpointsEqualBeyondHash`; hints are the topology step's business, and the pod's
/// resourceVersion is ignored).
fn equal_beyond_key(a: &Endpoint, b: &Endpoint) -> bool {
    let conditions = |e: &Endpoint| {
        let c = e.conditions.clone().unwrap_or_default();
        (c.ready, c.serving, c.terminating)
    };
    let target = |e: &Endpoint| {
        e.target_ref.clone().map(|mut r| {
            r.resource_version = None;
            r
        })
    };
    a.node_name == b.node_name
        && a.zone == b.zone
        && conditions(a) == conditions(b)
        && target(a) == target(b)
}

/// The address types the Service's endpoints are published in (Kubernetes'
/// `getAddressTypesForService`): its `ipFamilies`, else its cluster IP's family, else (an old
/// headless Service) both.
pub fn address_types_for_service(service: &Service) -> BTreeSet<String> {
    let spec = service.spec.as_ref();
    let mut types: BTreeSet<String> = spec
        .and_then(|s| s.ip_families.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|f| matches!(f.as_str(), "IPv4" | "IPv6"))
        .cloned()
        .collect();
    if !types.is_empty() {
        return types;
    }
    if is_service_ip_set(service) {
        let ip = spec
            .and_then(|s| s.cluster_ip.as_deref())
            .unwrap_or_default();
        types.insert(if is_ipv6(ip) { "IPv6" } else { "IPv4" }.into());
        return types;
    }
    types.insert("IPv4".into());
    types.insert("IPv6".into());
    types
}

/// The ports of the pod's endpoint (Kubernetes' `getEndpointPorts`): each Service port whose
/// target the pod has.
pub fn endpoint_ports(service: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let spec = service.spec.as_ref();
    spec.and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|sp| {
            let port = find_port(pod, sp)?;
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

/// The endpoint of a pod (Kubernetes' `podToEndpoint`): `serving` is the pod's readiness,
/// `terminating` its deletion, and `ready` is serving-and-not-terminating — except that
/// `publishNotReadyAddresses` makes every endpoint ready.
pub fn pod_to_endpoint(
    pod: &Pod,
    node: Option<&Node>,
    service: &Service,
    address_type: &str,
) -> Endpoint {
    let serving = is_pod_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let publish = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let ready = publish || (serving && !terminating);
    let want_ipv6 = address_type == "IPv6";
    let spec = pod.spec.as_ref();
    Endpoint {
        addresses: pod_ips(pod)
            .into_iter()
            .filter(|ip| is_ipv6(ip) == want_ipv6)
            .map(str::to_string)
            .collect(),
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname: should_set_hostname(pod, service)
            .then(|| spec.and_then(|s| s.hostname.clone()))
            .flatten(),
        node_name: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        zone: node
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(ZONE_LABEL))
            .filter(|z| !z.is_empty())
            .cloned(),
        target_ref: Some(pod_reference(pod)),
        deprecated_topology: None,
        hints: None,
    }
}

/// The labels a slice of `service` must carry (Kubernetes' `setEndpointSliceLabels`): the
/// Service's own labels except the reserved ones, the headless marker, the service name and
/// the managed-by label.
pub fn slice_labels(service: &Service) -> BTreeMap<String, String> {
    let reserved = [SERVICE_NAME_LABEL, MANAGED_BY_LABEL, HEADLESS_LABEL];
    let mut labels: BTreeMap<String, String> = service
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !reserved.contains(&k.as_str()))
        .collect();
    if !is_service_ip_set(service) {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    }
    labels.insert(
        SERVICE_NAME_LABEL.into(),
        service.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(MANAGED_BY_LABEL.into(), CONTROLLER_NAME.into());
    labels
}

/// A new, empty slice for `service` (Kubernetes' `newEndpointSlice`): named by the apiserver
/// from `<service>-`, controlled by the Service so the garbage collector removes it with the
/// Service.
pub fn new_endpoint_slice(
    service: &Service,
    ports: Vec<EndpointPort>,
    address_type: &str,
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}-",
                service.metadata.name.as_deref().unwrap_or_default()
            )),
            namespace: service.metadata.namespace.clone(),
            labels: Some(slice_labels(service)),
            owner_references: Some(vec![controller_ref("v1", "Service", &service.metadata)]),
            ..ObjectMeta::default()
        },
        address_type: address_type.into(),
        endpoints: Vec::new(),
        ports: Some(ports),
    }
}

/// Whether the slice is controlled by this very Service (same UID, not a deleted namesake).
pub fn owned_by(slice: &EndpointSlice, service: &Service) -> bool {
    slice
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|r| {
            Some(r.uid.as_str()) == service.metadata.uid.as_deref()
                && r.kind == "Service"
                && r.api_version == "v1"
        })
}

/// Whether `slice` is the placeholder `service` would get (no endpoints, no ports, same
/// labels, owner and address type): deleting and re-creating it would be a wasted write.
fn is_placeholder(slice: &EndpointSlice, placeholder: &EndpointSlice) -> bool {
    slice.endpoints.is_empty()
        && slice.ports.as_deref().unwrap_or_default().is_empty()
        && slice.address_type == placeholder.address_type
        && slice.metadata.namespace == placeholder.metadata.namespace
        && slice.metadata.labels.clone().unwrap_or_default()
            == placeholder.metadata.labels.clone().unwrap_or_default()
        && slice.metadata.owner_references == placeholder.metadata.owner_references
}

/// The writes one sync makes, and what it learned.
#[derive(Debug, Default)]
pub struct Plan {
    /// Slices to create (no name yet; `generateName` set).
    pub to_create: Vec<EndpointSlice>,
    /// Slices to replace (full objects with their resourceVersion).
    pub to_update: Vec<EndpointSlice>,
    /// Slices to delete.
    pub to_delete: Vec<EndpointSlice>,
    /// Events to record on the Service (topology hints on or off).
    pub events: Vec<HintEvent>,
    /// Pods left out because their node is not in the cache yet: the Service is retried.
    pub pods_with_missing_node: Vec<String>,
}

impl Plan {
    /// Whether the plan writes nothing.
    pub fn is_empty(&self) -> bool {
        self.to_create.is_empty() && self.to_update.is_empty() && self.to_delete.is_empty()
    }
}

/// The slices of one port set after packing.
#[derive(Default)]
struct Packed {
    to_create: Vec<EndpointSlice>,
    to_update: Vec<EndpointSlice>,
    to_delete: Vec<EndpointSlice>,
    unchanged: Vec<EndpointSlice>,
}

/// The packing rules over one port set (Kubernetes' `reconcileByPortMapping`).
fn reconcile_by_port_mapping(
    service: &Service,
    existing: Vec<EndpointSlice>,
    mut desired: BTreeMap<EndpointKey, Endpoint>,
    ports: &[EndpointPort],
    address_type: &str,
    max_per_slice: usize,
) -> Packed {
    let labels = slice_labels(service);
    let mut to_update: Vec<EndpointSlice> = Vec::new();
    let mut to_delete: Vec<EndpointSlice> = Vec::new();
    let mut unchanged: Vec<EndpointSlice> = Vec::new();

    // 1. Drop endpoints no longer desired, replace changed ones, fix labels.
    for slice in existing {
        let mut kept = Vec::with_capacity(slice.endpoints.len());
        let mut changed = false;
        for e in &slice.endpoints {
            match desired.remove(&endpoint_key(e)) {
                Some(want) => {
                    if !equal_beyond_key(&want, e) {
                        changed = true;
                        kept.push(want);
                    } else {
                        // Keep the existing one, hints included: the topology step decides
                        // whether they still fit.
                        kept.push(e.clone());
                    }
                }
                None => changed = true,
            }
        }
        let labels_changed = slice.metadata.labels.as_ref() != Some(&labels);
        if changed && kept.is_empty() {
            to_delete.push(slice);
        } else if changed || labels_changed {
            let mut s = slice;
            s.endpoints = kept;
            s.metadata.labels = Some(labels.clone());
            to_update.push(s);
        } else {
            unchanged.push(slice);
        }
    }

    // 2. Fill the slices being updated anyway, fullest first.
    to_update.sort_by(|a, b| {
        b.endpoints
            .len()
            .cmp(&a.endpoints.len())
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    for slice in &mut to_update {
        while slice.endpoints.len() < max_per_slice {
            let Some((_, e)) = desired.pop_first() else {
                break;
            };
            slice.endpoints.push(e);
        }
    }

    // 3. Fit what remains into the unchanged slice it fills most exactly, else new slices.
    let mut to_create = Vec::new();
    while !desired.is_empty() {
        let remaining = desired.len();
        let best = (remaining < max_per_slice)
            .then(|| slice_to_fill(&unchanged, remaining, max_per_slice))
            .flatten();
        let mut slice = match best {
            Some(i) => unchanged.remove(i),
            None => new_endpoint_slice(service, ports.to_vec(), address_type),
        };
        while slice.endpoints.len() < max_per_slice {
            let Some((_, e)) = desired.pop_first() else {
                break;
            };
            slice.endpoints.push(e);
        }
        if slice.metadata.name.is_some() {
            to_update.push(slice);
        } else {
            to_create.push(slice);
        }
    }
    Packed {
        to_create,
        to_update,
        to_delete,
        unchanged,
    }
}

/// The index of the unchanged slice that `n` more endpoints would bring closest to full
/// without overflowing it (Kubernetes' `getSliceToFill`).
fn slice_to_fill(slices: &[EndpointSlice], n: usize, max_per_slice: usize) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, s) in slices.iter().enumerate() {
        let after = s.endpoints.len() + n;
        if after > max_per_slice {
            continue;
        }
        let room_left = max_per_slice - after;
        if best.is_none_or(|(_, r)| room_left < r) {
            best = Some((i, room_left));
            if room_left == 0 {
                break;
            }
        }
    }
    best.map(|(i, _)| i)
}

/// The desired endpoints of `service` in `address_type`, grouped by port set.
fn desired_by_ports(
    service: &Service,
    pods: &[Arc<Pod>],
    nodes: &Indexer<Node>,
    address_type: &str,
    missing_node: &mut Vec<String>,
) -> BTreeMap<PortKey, (Vec<EndpointPort>, BTreeMap<EndpointKey, Endpoint>)> {
    let publish = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let mut out: BTreeMap<PortKey, (Vec<EndpointPort>, BTreeMap<EndpointKey, Endpoint>)> =
        BTreeMap::new();
    for pod in pods {
        // Terminating pods are kept: their `serving`/`terminating` conditions let proxies
        // drain them gracefully.
        if !should_pod_be_in_endpoints(pod, true) {
            continue;
        }
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        let node = if node_name.is_empty() {
            // skerry: a pod with an IP but no node can only be hand-written; it is published
            // without a zone rather than hidden (Kubernetes looks up the empty name and skips
            // the pod).
            None
        } else {
            match nodes.get(node_name) {
                Some(n) => Some(n),
                // A node not (yet) in the cache: skip the pod and retry the Service, unless the
                // user asked for every address to be published.
                None if !publish => {
                    missing_node.push(key_of(pod.as_ref()));
                    continue;
                }
                None => None,
            }
        };
        let ports = endpoint_ports(service, pod);
        let endpoint = pod_to_endpoint(pod, node.as_deref(), service, address_type);
        if endpoint.addresses.is_empty() {
            continue;
        }
        out.entry(port_key(&ports))
            .or_insert_with(|| (ports, BTreeMap::new()))
            .1
            .insert(endpoint_key(&endpoint), endpoint);
    }
    out
}

/// The slices of one address type (Kubernetes' `reconcileByAddressType`), topology included.
#[allow(
    clippy::too_many_arguments,
    reason = "the reconciler's inputs, named at the one call site"
)]
fn reconcile_by_address_type(
    service: &Service,
    pods: &[Arc<Pod>],
    nodes: &Indexer<Node>,
    existing: Vec<EndpointSlice>,
    address_type: &str,
    max_per_slice: usize,
    topology: &TopologyCache,
    plan: &mut Plan,
) {
    let service_key = key_of(service);
    let existing_names: BTreeSet<Option<String>> =
        existing.iter().map(|s| s.metadata.name.clone()).collect();
    let existing_count = existing.len();
    let mut to_create = Vec::new();
    let mut to_update = Vec::new();
    let mut to_delete = Vec::new();

    let mut by_ports: BTreeMap<PortKey, Vec<EndpointSlice>> = BTreeMap::new();
    for slice in existing {
        if owned_by(&slice, service) {
            by_ports
                .entry(port_key(slice.ports.as_deref().unwrap_or_default()))
                .or_default()
                .push(slice);
        } else {
            to_delete.push(slice);
        }
    }
    let desired = desired_by_ports(
        service,
        pods,
        nodes,
        address_type,
        &mut plan.pods_with_missing_node,
    );
    let mut unchanged = Vec::new();
    for (key, (ports, endpoints)) in desired {
        let existing = by_ports.remove(&key).unwrap_or_default();
        let packed = reconcile_by_port_mapping(
            service,
            existing,
            endpoints,
            &ports,
            address_type,
            max_per_slice,
        );
        to_create.extend(packed.to_create);
        to_update.extend(packed.to_update);
        to_delete.extend(packed.to_delete);
        unchanged.extend(packed.unchanged);
    }
    // Port sets no longer desired at all.
    for (_, slices) in by_ports {
        to_delete.extend(slices);
    }

    // A Service with no endpoints keeps exactly one placeholder.
    if existing_count == to_delete.len() && to_create.is_empty() {
        let placeholder = new_endpoint_slice(service, Vec::new(), address_type);
        if to_delete.len() == 1 && is_placeholder(&to_delete[0], &placeholder) {
            if let Some(kept) = to_delete.pop() {
                unchanged.push(kept);
            }
        } else {
            to_create.push(placeholder);
        }
    }

    let mut info = SliceInfo {
        service_key: service_key.clone(),
        address_type: address_type.into(),
        to_create,
        to_update,
        unchanged,
    };
    let annotations = service.metadata.annotations.as_ref();
    if hints_enabled(annotations) {
        plan.events.extend(topology.add_hints(&mut info));
    } else {
        if topology.has_populated_hints(&service_key) {
            plan.events.push(HintEvent {
                type_: "Warning",
                reason: super::topology::REASON_DISABLED,
                message: format!(
                    "{}, addressType: {address_type}",
                    HintsDisabled::AnnotationRemoved
                ),
            });
        }
        topology.remove_hints(&service_key, address_type);
        remove_hints_from_slices(&mut info);
    }
    debug_assert!(
        info.to_update
            .iter()
            .all(|s| existing_names.contains(&s.metadata.name)),
        "an update of a slice that does not exist"
    );
    plan.to_create.extend(info.to_create);
    plan.to_update.extend(info.to_update);
    plan.to_delete.extend(to_delete);
}

/// The plan for `service` over `pods` (already filtered by its selector) and its `existing`
/// slices (managed by this controller, not being deleted), packing at most `max_per_slice`
/// endpoints a slice.
pub fn reconcile(
    service: &Service,
    pods: &[Arc<Pod>],
    nodes: &Indexer<Node>,
    existing: Vec<EndpointSlice>,
    max_per_slice: usize,
    topology: &TopologyCache,
) -> Plan {
    let mut plan = Plan::default();
    let address_types = address_types_for_service(service);
    let mut by_type: BTreeMap<String, Vec<EndpointSlice>> = BTreeMap::new();
    for slice in existing {
        if address_types.contains(&slice.address_type) {
            by_type
                .entry(slice.address_type.clone())
                .or_default()
                .push(slice);
        } else {
            // The Service no longer has this family.
            topology.remove_hints(&key_of(service), &slice.address_type);
            plan.to_delete.push(slice);
        }
    }
    for address_type in &address_types {
        let existing = by_type.remove(address_type).unwrap_or_default();
        reconcile_by_address_type(
            service,
            pods,
            nodes,
            existing,
            address_type,
            max_per_slice,
            topology,
            &mut plan,
        );
    }
    finalize(service, &mut plan);
    plan
}

/// Turns create+delete pairs into updates of the slices being deleted (same address type,
/// owned by this Service), and drops creates for a Service being deleted (the garbage
/// collector is removing its slices) — Kubernetes' `finalize`, minus the IO.
fn finalize(service: &Service, plan: &mut Plan) {
    let mut i = 0;
    while i < plan.to_delete.len() && !plan.to_create.is_empty() {
        let Some(last) = plan.to_create.last() else {
            break;
        };
        let reusable = plan.to_delete[i].address_type == last.address_type
            && owned_by(&plan.to_delete[i], service);
        if !reusable {
            i += 1;
            continue;
        }
        let old = plan.to_delete.remove(i);
        if let Some(mut slice) = plan.to_create.pop() {
            slice.metadata.name = old.metadata.name;
            slice.metadata.generate_name = None;
            slice.metadata.uid = old.metadata.uid;
            slice.metadata.resource_version = old.metadata.resource_version;
            slice.metadata.generation = old.metadata.generation;
            slice.metadata.annotations = old.metadata.annotations;
            plan.to_update.push(slice);
        }
    }
    if service.metadata.deletion_timestamp.is_some() {
        plan.to_create.clear();
    }
    plan.to_update
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use crate::endpoints::tests::{pod, port, service};
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn web() -> Service {
        service(vec![port("http", 80, IntOrString::String("http".into()))])
    }

    fn nodes() -> Indexer<Node> {
        let nodes = Indexer::new();
        for (name, zone) in [("node-a", "zone-a"), ("node-b", "zone-b")] {
            nodes.upsert(
                name,
                Arc::new(Node {
                    metadata: ObjectMeta {
                        name: Some(name.into()),
                        labels: Some(BTreeMap::from([(ZONE_LABEL.into(), zone.into())])),
                        ..ObjectMeta::default()
                    },
                    spec: None,
                    status: Some(NodeStatus::default()),
                }),
            );
        }
        nodes
    }

    fn pods(n: usize) -> Vec<Arc<Pod>> {
        (0..n)
            .map(|i| {
                Arc::new(pod(
                    &format!("p{i:03}"),
                    &format!("10.1.{}.{}", i / 200, i % 200),
                    true,
                ))
            })
            .collect()
    }

    /// What the apiserver would store: names, UIDs and versions for created slices, bumped
    /// versions for updated ones, deleted ones gone.
    fn apply(existing: Vec<EndpointSlice>, plan: &Plan, next_id: &mut usize) -> Vec<EndpointSlice> {
        let mut by_name: BTreeMap<String, EndpointSlice> = existing
            .into_iter()
            .map(|s| (s.metadata.name.clone().unwrap(), s))
            .collect();
        for d in &plan.to_delete {
            by_name.remove(d.metadata.name.as_ref().unwrap());
        }
        for u in &plan.to_update {
            let mut u = u.clone();
            *next_id += 1;
            u.metadata.resource_version = Some(next_id.to_string());
            by_name.insert(u.metadata.name.clone().unwrap(), u);
        }
        for c in &plan.to_create {
            let mut c = c.clone();
            *next_id += 1;
            let name = format!("{}{next_id}", c.metadata.generate_name.clone().unwrap());
            c.metadata.name = Some(name.clone());
            c.metadata.uid = Some(format!("uid-{next_id}"));
            c.metadata.resource_version = Some(next_id.to_string());
            by_name.insert(name, c);
        }
        by_name.into_values().collect()
    }

    fn sizes(slices: &[EndpointSlice]) -> Vec<usize> {
        let mut s: Vec<usize> = slices.iter().map(|s| s.endpoints.len()).collect();
        s.sort_unstable();
        s
    }

    #[test]
    fn endpoint_conditions_follow_readiness_and_termination() {
        let svc = web();
        let ready = pod("a", "10.0.0.1", true);
        let e = pod_to_endpoint(&ready, None, &svc, "IPv4");
        let c = e.conditions.unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(true), Some(true), Some(false))
        );

        let mut terminating = pod("b", "10.0.0.2", true);
        terminating.metadata.deletion_timestamp =
            Some(Time("2024-05-01T11:00:00Z".parse().unwrap()));
        let c = pod_to_endpoint(&terminating, None, &svc, "IPv4")
            .conditions
            .unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true))
        );

        let mut terminating_unready = terminating.clone();
        terminating_unready
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".into();
        let c = pod_to_endpoint(&terminating_unready, None, &svc, "IPv4")
            .conditions
            .unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(false), Some(true))
        );

        let mut publish = svc.clone();
        publish.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let c = pod_to_endpoint(&terminating_unready, None, &publish, "IPv4")
            .conditions
            .unwrap();
        assert_eq!(c.ready, Some(true));
    }

    #[test]
    fn a_fresh_service_gets_one_slice_with_zone_ports_and_labels() {
        let svc = web();
        let plan = reconcile(
            &svc,
            &pods(3),
            &nodes(),
            Vec::new(),
            100,
            &TopologyCache::new(),
        );
        assert_eq!(plan.to_create.len(), 1);
        let s = &plan.to_create[0];
        assert_eq!(s.address_type, "IPv4");
        assert_eq!(s.metadata.generate_name.as_deref(), Some("web-"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "web");
        assert_eq!(labels[MANAGED_BY_LABEL], CONTROLLER_NAME);
        assert_eq!(labels["tier"], "front");
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Service", "svc-uid")
        );
        assert_eq!(owner.controller, Some(true));
        let ports = s.ports.as_ref().unwrap();
        assert_eq!(ports[0].port, Some(8080));
        assert_eq!(ports[0].name.as_deref(), Some("http"));
        assert_eq!(s.endpoints.len(), 3);
        assert!(
            s.endpoints
                .iter()
                .all(|e| e.zone.as_deref() == Some("zone-a"))
        );
        assert!(
            s.endpoints
                .iter()
                .all(|e| e.node_name.as_deref() == Some("node-a"))
        );
    }

    #[test]
    fn two_hundred_fifty_endpoints_pack_into_three_slices_and_an_update_touches_one() {
        let svc = web();
        let topology = TopologyCache::new();
        let mut id = 0;
        let all = pods(250);
        let plan = reconcile(&svc, &all, &nodes(), Vec::new(), 100, &topology);
        assert_eq!(sizes(&plan.to_create), vec![50, 100, 100]);
        let existing = apply(Vec::new(), &plan, &mut id);

        // Same pods again: nothing to write.
        let plan = reconcile(&svc, &all, &nodes(), existing.clone(), 100, &topology);
        assert!(plan.is_empty(), "{plan:?}");

        // One pod becomes unready: exactly its slice is rewritten.
        let mut changed = all.clone();
        changed[137] = Arc::new(pod("p137", "10.1.0.137", false));
        let plan = reconcile(&svc, &changed, &nodes(), existing.clone(), 100, &topology);
        assert!(plan.to_create.is_empty() && plan.to_delete.is_empty());
        assert_eq!(plan.to_update.len(), 1);
        let e = plan.to_update[0]
            .endpoints
            .iter()
            .find(|e| e.addresses == ["10.1.0.137"])
            .unwrap();
        assert_eq!(e.conditions.as_ref().unwrap().ready, Some(false));

        // One pod added: it goes into the half-full slice, no new slice.
        let mut more = all.clone();
        more.push(Arc::new(pod("p999", "10.9.9.9", true)));
        let plan = reconcile(&svc, &more, &nodes(), existing.clone(), 100, &topology);
        assert!(plan.to_create.is_empty() && plan.to_delete.is_empty());
        assert_eq!(plan.to_update.len(), 1);
        assert_eq!(plan.to_update[0].endpoints.len(), 51);

        // One pod removed: only its slice.
        let fewer: Vec<Arc<Pod>> = all
            .iter()
            .filter(|p| p.metadata.name.as_deref() != Some("p003"))
            .cloned()
            .collect();
        let plan = reconcile(&svc, &fewer, &nodes(), existing, 100, &topology);
        assert_eq!(plan.to_update.len(), 1);
        assert!(plan.to_create.is_empty() && plan.to_delete.is_empty());
    }

    #[test]
    fn a_resync_with_new_pod_resource_versions_writes_nothing() {
        let svc = web();
        let topology = TopologyCache::new();
        let mut id = 0;
        let plan = reconcile(&svc, &pods(3), &nodes(), Vec::new(), 100, &topology);
        let existing = apply(Vec::new(), &plan, &mut id);
        let bumped: Vec<Arc<Pod>> = pods(3)
            .into_iter()
            .map(|p| {
                let mut p = (*p).clone();
                p.metadata.resource_version = Some("99".into());
                Arc::new(p)
            })
            .collect();
        assert!(reconcile(&svc, &bumped, &nodes(), existing, 100, &topology).is_empty());
    }

    #[test]
    fn no_endpoints_means_one_placeholder_kept_across_syncs() {
        let svc = web();
        let topology = TopologyCache::new();
        let mut id = 0;
        let plan = reconcile(&svc, &[], &nodes(), Vec::new(), 100, &topology);
        assert_eq!(plan.to_create.len(), 1);
        assert!(plan.to_create[0].endpoints.is_empty());
        let existing = apply(Vec::new(), &plan, &mut id);
        assert!(reconcile(&svc, &[], &nodes(), existing.clone(), 100, &topology).is_empty());

        // Pods arrive: the placeholder is reused (a create+delete becomes one update).
        let plan = reconcile(&svc, &pods(2), &nodes(), existing.clone(), 100, &topology);
        assert!(
            plan.to_create.is_empty() && plan.to_delete.is_empty(),
            "{plan:?}"
        );
        assert_eq!(plan.to_update.len(), 1);
        assert_eq!(plan.to_update[0].metadata.name, existing[0].metadata.name);
        assert_eq!(plan.to_update[0].endpoints.len(), 2);
    }

    #[test]
    fn foreign_edits_and_foreign_slices_are_reverted() {
        let svc = web();
        let topology = TopologyCache::new();
        let mut id = 0;
        let plan = reconcile(&svc, &pods(3), &nodes(), Vec::new(), 100, &topology);
        let mut existing = apply(Vec::new(), &plan, &mut id);
        // Someone adds a bogus endpoint and strips a label.
        existing[0].endpoints.push(Endpoint {
            addresses: vec!["192.0.2.1".into()],
            ..Endpoint::default()
        });
        existing[0].metadata.labels.as_mut().unwrap().remove("tier");
        let plan = reconcile(&svc, &pods(3), &nodes(), existing.clone(), 100, &topology);
        assert_eq!(plan.to_update.len(), 1);
        assert_eq!(plan.to_update[0].endpoints.len(), 3);
        assert_eq!(
            plan.to_update[0].metadata.labels.as_ref().unwrap()["tier"],
            "front"
        );

        // A slice owned by a deleted namesake Service is replaced.
        let mut stale = existing[0].clone();
        stale.metadata.owner_references.as_mut().unwrap()[0].uid = "old-uid".into();
        let plan = reconcile(&svc, &pods(3), &nodes(), vec![stale], 100, &topology);
        assert_eq!(plan.to_create.len(), 1);
        assert_eq!(plan.to_delete.len(), 1);
    }

    #[test]
    fn pods_on_unknown_nodes_are_skipped_and_reported() {
        let svc = web();
        let mut lost = pod("x", "10.0.0.9", true);
        lost.spec.as_mut().unwrap().node_name = Some("node-gone".into());
        let mut all = pods(2);
        all.push(Arc::new(lost));
        let plan = reconcile(&svc, &all, &nodes(), Vec::new(), 100, &TopologyCache::new());
        assert_eq!(plan.to_create[0].endpoints.len(), 2);
        assert_eq!(plan.pods_with_missing_node, vec!["ns/x".to_string()]);
    }

    #[test]
    fn different_port_sets_get_different_slices() {
        let svc = service(vec![
            port("http", 80, IntOrString::String("http".into())),
            port("admin", 81, IntOrString::String("admin".into())),
        ]);
        let mut with_admin = pod("z", "10.0.0.50", true);
        with_admin.spec.as_mut().unwrap().containers[0]
            .ports
            .as_mut()
            .unwrap()
            .push(k8s_openapi::api::core::v1::ContainerPort {
                name: Some("admin".into()),
                container_port: 8081,
                ..Default::default()
            });
        let mut all = pods(2);
        all.push(Arc::new(with_admin));
        let plan = reconcile(&svc, &all, &nodes(), Vec::new(), 100, &TopologyCache::new());
        assert_eq!(sizes(&plan.to_create), vec![1, 2]);
    }

    #[test]
    fn dual_stack_services_get_one_slice_per_family() {
        let mut svc = web();
        svc.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        let mut p = pod("a", "10.0.0.1", true);
        p.status.as_mut().unwrap().pod_ips = Some(vec![
            k8s_openapi::api::core::v1::PodIP {
                ip: "10.0.0.1".into(),
            },
            k8s_openapi::api::core::v1::PodIP {
                ip: "fd00::1".into(),
            },
        ]);
        let plan = reconcile(
            &svc,
            &[Arc::new(p)],
            &nodes(),
            Vec::new(),
            100,
            &TopologyCache::new(),
        );
        let mut got: Vec<(String, Vec<String>)> = plan
            .to_create
            .iter()
            .map(|s| (s.address_type.clone(), s.endpoints[0].addresses.clone()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("IPv4".to_string(), vec!["10.0.0.1".to_string()]),
                ("IPv6".to_string(), vec!["fd00::1".to_string()])
            ]
        );
    }
}
