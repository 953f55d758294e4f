//! The Endpoints controller (kube-controller-manager's `pkg/controller/endpoint`): for every
//! Service with a selector, one `v1/Endpoints` object of the same name listing the IPs of the
//! matching pods, ready ones under `addresses` and the others under `notReadyAddresses`, with
//! the ports resolved from each Service port's `targetPort`.
//!
//! It is the legacy half of what the service proxy reads (`docs/tricks.md`, networking): the
//! EndpointSlice controller ([`crate::endpointslice`]) is the one the proxy reads; this one exists
//! for the clients that still read Endpoints. The pieces both controllers share — which pods count
//! ([`should_pod_be_in_endpoints`]), how a port is found ([`find_port`]), when a hostname is
//! published ([`should_set_hostname`]) and the last-change trigger time ([`TriggerTimeTracker`]) —
//! live here.
//!
//! Invariants:
//! - the controller writes only when the subsets, the labels or the over-capacity annotation
//!   would change: a pod update that does not move an address (an annotation, a resync) costs
//!   no write;
//! - an Endpoints object holds at most [`MAX_CAPACITY`] addresses; past it ready addresses are
//!   kept before not-ready ones and the object carries
//!   `endpoints.kubernetes.io/over-capacity: truncated`;
//! - an Endpoints object is deleted by this controller only when it carries the
//!   `endpoints.kubernetes.io/managed-by: endpoint-controller` label, so hand-written Endpoints
//!   of selector-less Services are never touched.
//!
//! Where to start: [`EndpointsController::sync_service`]; the decision itself is the pure
//! [`desired_endpoints`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Weak};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
    ServicePort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use skerry_api::selector::set_matches;
use skerry_client::cache::Indexer;
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Client, DeleteParams, PostParams, key_of};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::Context;
use crate::runtime::{self, Reconciler};
use crate::util::{self, is_pod_ready};

/// The most addresses (ready + not ready) one Endpoints object carries. Kubernetes'
/// `maxCapacity`: past it the object is truncated and annotated, and consumers that need every
/// endpoint must read EndpointSlices, which split without limit. Borrowed, not tuned: clients
/// rely on the number.
pub const MAX_CAPACITY: usize = 1000;

/// The label naming the controller that manages an Endpoints object (Kubernetes 1.33,
/// `endpoints.kubernetes.io/managed-by`).
pub const MANAGED_BY_LABEL: &str = "endpoints.kubernetes.io/managed-by";

/// This controller's value of [`MANAGED_BY_LABEL`] (Kubernetes' `ControllerName`).
pub const CONTROLLER_NAME: &str = "endpoint-controller";

/// Annotation with the time of the last pod or Service change the object reflects, so that
/// the proxy can measure programming latency (`v1.EndpointsLastChangeTriggerTime`).
pub const LAST_CHANGE_TRIGGER_TIME_ANNOTATION: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";

/// Annotation set when addresses were dropped past [`MAX_CAPACITY`]
/// (`v1.EndpointsOverCapacity`), with the value [`TRUNCATED`].
pub const OVER_CAPACITY_ANNOTATION: &str = "endpoints.kubernetes.io/over-capacity";

/// The value of [`OVER_CAPACITY_ANNOTATION`].
pub const TRUNCATED: &str = "truncated";

/// The label on the Endpoints and EndpointSlices of a headless Service (`v1.IsHeadlessService`).
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// The annotation of the old Endpoints-based leader-election locks: such objects have no
/// Service by design and must never be cleaned up as leftovers.
const LEADER_ELECTION_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// Workers syncing Services at once: kube-controller-manager's
/// `--concurrent-endpoint-syncs` default.
pub const DEFAULT_WORKERS: usize = 5;

// ---- shared facts about Services and pods -----------------------------------------------------

/// Whether the Service has a cluster IP (is not headless): `helper.IsServiceIPSet`.
pub fn is_service_ip_set(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// The selector this controller acts on: `None` for a Service without one (its endpoints are
/// written by hand) and for `ExternalName` Services, which have no endpoints.
pub fn managed_selector(service: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref()
}

/// The pod's IPs, from `status.podIPs`, else `status.podIP`.
pub fn pod_ips(pod: &Pod) -> Vec<&str> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let ips: Vec<&str> = status
        .pod_ips
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|ip| ip.ip.as_str())
        .filter(|ip| !ip.is_empty())
        .collect();
    if !ips.is_empty() {
        return ips;
    }
    status
        .pod_ip
        .as_deref()
        .filter(|ip| !ip.is_empty())
        .into_iter()
        .collect()
}

/// Whether `ip` is an IPv6 address (anything unparseable counts as IPv4, like
/// `utilnet.IsIPv6String` returning false).
pub fn is_ipv6(ip: &str) -> bool {
    matches!(ip.parse::<IpAddr>(), Ok(IpAddr::V6(_)))
}

/// Whether the pod belongs in a Service's endpoints at all (Kubernetes'
/// `ShouldPodBeInEndpoints`): not finished, has an IP, and — unless `include_terminating` —
/// not being deleted.
pub fn should_pod_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return false;
    }
    if pod_ips(pod).is_empty() {
        return false;
    }
    include_terminating || pod.metadata.deletion_timestamp.is_none()
}

/// The container port a Service port reaches on `pod` (Kubernetes' `podutil.FindPort`): a
/// numeric `targetPort` as is (unset means the Service port), a named one looked up among the
/// containers' (and restartable init containers') ports with the same protocol. `None` when
/// the pod has no such named port: that port is then left out for this pod.
pub fn find_port(pod: &Pod, service_port: &ServicePort) -> Option<i32> {
    let protocol = service_port.protocol.as_deref().unwrap_or("TCP");
    match &service_port.target_port {
        None => Some(service_port.port),
        Some(IntOrString::Int(port)) => Some(*port),
        Some(IntOrString::String(name)) => {
            if let Ok(port) = name.parse::<i32>() {
                // A quoted number is still a number (intstr.Parse).
                return Some(port);
            }
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .as_deref()
                .unwrap_or_default()
                .iter()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.as_deref().unwrap_or_default())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|p| p.container_port)
        }
    }
}

/// Whether the pod's `spec.hostname` is published (Kubernetes' `ShouldSetHostname`): the pod
/// names this Service as its subdomain, in the same namespace.
pub fn should_set_hostname(pod: &Pod, service: &Service) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.hostname.as_deref().is_some_and(|h| !h.is_empty())
        && spec.subdomain.is_some()
        && spec.subdomain == service.metadata.name
        && pod.metadata.namespace == service.metadata.namespace
}

/// A reference to the pod, as endpoints carry it (`targetRef`).
pub fn pod_reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

/// Whether a pod update can change any Service's endpoints: anything endpoints are built from
/// (IPs, readiness, deletion, node, hostname, ports, phase). A resync (same resourceVersion)
/// changes nothing.
pub fn pod_endpoints_changed(old: &Pod, new: &Pod) -> bool {
    if old.metadata.resource_version == new.metadata.resource_version {
        return false;
    }
    let facts = |p: &Pod| {
        let spec = p.spec.as_ref();
        (
            pod_ips(p)
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>(),
            is_pod_ready(p),
            p.metadata.deletion_timestamp.is_some(),
            spec.and_then(|s| s.node_name.clone()),
            spec.and_then(|s| s.hostname.clone()),
            spec.and_then(|s| s.subdomain.clone()),
            spec.map(|s| {
                s.containers
                    .iter()
                    .map(|c| c.ports.clone())
                    .collect::<Vec<_>>()
            }),
            p.status.as_ref().and_then(|s| s.phase.clone()),
        )
    };
    facts(old) != facts(new)
}

/// The keys of the Services in `services` whose selector matches `pod`.
pub fn services_for_pod(services: &Indexer<Service>, pod: &Pod) -> BTreeSet<String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    services
        .list_namespace(namespace)
        .into_iter()
        .filter(|s| {
            managed_selector(s).is_some_and(|sel| set_matches(sel, pod.metadata.labels.as_ref()))
        })
        .map(|s| key_of(s.as_ref()))
        .collect()
}

/// The Services to sync after a pod update: those matching the old pod and those matching the
/// new one when labels changed, or those matching it when its endpoint facts changed
/// (Kubernetes' `GetServicesToUpdateOnPodChange`).
pub fn services_for_pod_update(
    services: &Indexer<Service>,
    old: &Pod,
    new: &Pod,
) -> BTreeSet<String> {
    let labels_changed = old.metadata.labels != new.metadata.labels;
    if !labels_changed && !pod_endpoints_changed(old, new) {
        return BTreeSet::new();
    }
    let mut keys = services_for_pod(services, new);
    if labels_changed {
        keys.extend(services_for_pod(services, old));
    }
    keys
}

// ---- the trigger time --------------------------------------------------------------------

/// What the tracker remembers of one Service between syncs.
#[derive(Default)]
struct TriggerState {
    pod_trigger_times: HashMap<String, Timestamp>,
    service_trigger_time: Option<Timestamp>,
}

/// Computes the `endpoints.kubernetes.io/last-change-trigger-time` of a sync (Kubernetes'
/// `TriggerTimeTracker`): the earliest pod Ready-transition or Service creation that changed
/// since the previous sync of the same Service, or the Service's creation on its first sync.
/// `None` means no trigger is known and the annotation is cleared.
#[derive(Default)]
pub struct TriggerTimeTracker {
    /// Short critical sections (a map update per sync), never held across an `.await`.
    states: Mutex<HashMap<String, TriggerState>>,
}

impl TriggerTimeTracker {
    /// A tracker with no history.
    pub fn new() -> TriggerTimeTracker {
        TriggerTimeTracker::default()
    }

    /// The trigger time for a sync of `service` over `pods`, recording them for the next one.
    pub fn compute(&self, service: &Service, pods: &[Arc<Pod>]) -> Option<Timestamp> {
        let key = key_of(service);
        let mut states = self.states.lock();
        let was_known = states.contains_key(&key);
        let state = states.entry(key).or_default();
        let mut min_changed: Option<Timestamp> = None;
        let mut pod_times = HashMap::new();
        for pod in pods {
            let Some(t) = util::ready_condition(pod)
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0)
            else {
                continue;
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            if state
                .pod_trigger_times
                .get(&name)
                .is_none_or(|last| t > *last)
            {
                min_changed = Some(min_changed.map_or(t, |m| m.min(t)));
            }
            pod_times.insert(name, t);
        }
        let service_time = service.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if let Some(t) = service_time
            && state.service_trigger_time.is_none_or(|last| t > last)
        {
            min_changed = Some(min_changed.map_or(t, |m| m.min(t)));
        }
        state.pod_trigger_times = pod_times;
        state.service_trigger_time = service_time;
        if !was_known {
            return service_time;
        }
        min_changed
    }

    /// Forgets a deleted Service.
    pub fn delete_service(&self, key: &str) {
        self.states.lock().remove(key);
    }
}

// ---- the pure decision -------------------------------------------------------------------------

/// Orders subsets, addresses and ports canonically, so that equal contents compare equal.
fn address_order(a: &EndpointAddress, b: &EndpointAddress) -> std::cmp::Ordering {
    let uid = |x: &EndpointAddress| x.target_ref.as_ref().and_then(|r| r.uid.clone());
    a.ip.cmp(&b.ip).then_with(|| uid(a).cmp(&uid(b)))
}

fn port_sort_key(p: &EndpointPort) -> PortSortKey {
    (
        p.name.clone(),
        p.port,
        p.protocol.clone(),
        p.app_protocol.clone(),
    )
}

/// The identity of an address within the repacking: its IP and its pod's UID.
type AddressKey = (String, Option<String>);

/// A port in canonical order: name, number, protocol, appProtocol.
type PortSortKey = (Option<String>, i32, Option<String>, Option<String>);

/// The identity of an address within the repacking: its IP and its pod.
fn address_key(a: &EndpointAddress) -> AddressKey {
    (
        a.ip.clone(),
        a.target_ref.as_ref().and_then(|r| r.uid.clone()),
    )
}

/// Groups one-address-one-port entries into the canonical subsets (Kubernetes'
/// `RepackSubsets`): addresses offering the same set of ports share a subset; an address ready
/// on a port in one entry is ready on it. Entries with no port (a headless Service without
/// ports) form their own port-less subset.
pub fn repack_subsets(
    entries: &[(EndpointAddress, Option<EndpointPort>, bool)],
) -> Vec<EndpointSubset> {
    // `None` for the port-less entries of a headless Service.
    type PortKey = Option<PortSortKey>;
    let mut addresses: BTreeMap<AddressKey, EndpointAddress> = BTreeMap::new();
    let mut ports: BTreeMap<PortKey, EndpointPort> = BTreeMap::new();
    // port -> address -> ready
    let mut by_port: BTreeMap<PortKey, BTreeMap<AddressKey, bool>> = BTreeMap::new();
    for (address, port, ready) in entries {
        let a = address_key(address);
        addresses
            .entry(a.clone())
            .or_insert_with(|| address.clone());
        let p = port.as_ref().map(port_sort_key);
        if let Some(port) = port {
            ports.entry(p.clone()).or_insert_with(|| port.clone());
        }
        let slot = by_port.entry(p).or_default().entry(a).or_insert(*ready);
        *slot |= *ready;
    }
    // The set of (address, ready) pairs -> the ports offering exactly that set.
    let mut by_addresses: BTreeMap<Vec<(AddressKey, bool)>, Vec<PortKey>> = BTreeMap::new();
    for (p, set) in by_port {
        by_addresses
            .entry(set.into_iter().collect())
            .or_default()
            .push(p);
    }
    let mut subsets: Vec<EndpointSubset> = by_addresses
        .into_iter()
        .map(|(set, port_keys)| {
            let mut ready = Vec::new();
            let mut not_ready = Vec::new();
            for (a, is_ready) in set {
                if let Some(address) = addresses.get(&a) {
                    if is_ready {
                        ready.push(address.clone());
                    } else {
                        not_ready.push(address.clone());
                    }
                }
            }
            ready.sort_by(address_order);
            not_ready.sort_by(address_order);
            let mut subset_ports: Vec<EndpointPort> = port_keys
                .iter()
                .filter_map(|k| ports.get(k).cloned())
                .collect();
            subset_ports.sort_by_key(port_sort_key);
            EndpointSubset {
                addresses: (!ready.is_empty()).then_some(ready),
                not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                ports: (!subset_ports.is_empty()).then_some(subset_ports),
            }
        })
        .collect();
    subsets.sort_by_key(|s| {
        (
            s.ports
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(port_sort_key)
                .collect::<Vec<_>>(),
            s.addresses
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(address_key)
                .collect::<Vec<_>>(),
        )
    });
    subsets
}

/// The IP of `pod` in the Service's family (Kubernetes' `podToEndpointAddressForService`):
/// the cluster IP's family, or for a headless Service its first `ipFamilies` entry.
fn pod_ip_for_service<'a>(service: &Service, pod: &'a Pod) -> Option<&'a str> {
    let spec = service.spec.as_ref();
    let want_ipv6 = if is_service_ip_set(service) {
        spec.and_then(|s| s.cluster_ip.as_deref())
            .is_some_and(is_ipv6)
    } else {
        match spec
            .and_then(|s| s.ip_families.as_deref())
            .and_then(|f| f.first())
        {
            Some(family) => family == "IPv6",
            // A headless Service with no families (an old object): the pod's first IP.
            None => return pod_ips(pod).first().copied(),
        }
    };
    pod_ips(pod).into_iter().find(|ip| is_ipv6(ip) == want_ipv6)
}

/// The subsets of `service` over `pods` (already filtered to the Service's namespace and
/// selector), canonically packed, with the numbers of ready and not-ready entries.
pub fn compute_subsets(service: &Service, pods: &[Arc<Pod>]) -> Vec<EndpointSubset> {
    let spec = service.spec.clone().unwrap_or_default();
    let tolerate_unready = spec.publish_not_ready_addresses.unwrap_or(false);
    let service_ports = spec.ports.unwrap_or_default();
    let headless = !is_service_ip_set(service);
    let mut entries = Vec::new();
    for pod in pods {
        if !should_pod_be_in_endpoints(pod, tolerate_unready) {
            continue;
        }
        let Some(ip) = pod_ip_for_service(service, pod) else {
            continue;
        };
        let pod_spec = pod.spec.as_ref();
        let address = EndpointAddress {
            ip: ip.to_string(),
            hostname: should_set_hostname(pod, service)
                .then(|| pod_spec.and_then(|s| s.hostname.clone()))
                .flatten(),
            node_name: pod_spec
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            target_ref: Some(pod_reference(pod)),
        };
        let ready = tolerate_unready || is_pod_ready(pod);
        if service_ports.is_empty() {
            // A headless Service may have no ports; a cluster-IP one without ports has no
            // endpoints.
            if headless {
                entries.push((address, None, ready));
            }
            continue;
        }
        for service_port in &service_ports {
            let Some(port) = find_port(pod, service_port) else {
                tracing::debug!(pod = %key_of(pod.as_ref()), port = ?service_port.name, "no such port on pod");
                continue;
            };
            let endpoint_port = EndpointPort {
                name: service_port.name.clone(),
                port,
                protocol: Some(
                    service_port
                        .protocol
                        .clone()
                        .unwrap_or_else(|| "TCP".into()),
                ),
                app_protocol: service_port.app_protocol.clone(),
            };
            entries.push((address.clone(), Some(endpoint_port), ready));
        }
    }
    repack_subsets(&entries)
}

/// Truncates `subsets` to [`MAX_CAPACITY`] addresses, ready ones first, sharing the room
/// between subsets in proportion to their size (Kubernetes' `truncateEndpoints`). Returns
/// whether anything was dropped.
pub fn truncate_subsets(subsets: &mut [EndpointSubset]) -> bool {
    let count = |v: &Option<Vec<EndpointAddress>>| v.as_ref().map_or(0, Vec::len);
    let total_ready: usize = subsets.iter().map(|s| count(&s.addresses)).sum();
    let total_not_ready: usize = subsets.iter().map(|s| count(&s.not_ready_addresses)).sum();
    if total_ready + total_not_ready <= MAX_CAPACITY {
        return false;
    }
    let truncate_ready = total_ready > MAX_CAPACITY;
    let (room, total) = if truncate_ready {
        (MAX_CAPACITY, total_ready)
    } else {
        (MAX_CAPACITY - total_ready, total_not_ready)
    };
    let mut can_be_added = room;
    for subset in subsets.iter_mut() {
        let in_subset = if truncate_ready {
            count(&subset.addresses)
        } else {
            count(&subset.not_ready_addresses)
        };
        // Each subset's share of the room, rounded up; the last ones get what is left.
        let share = (in_subset * room).div_ceil(total.max(1));
        let to_keep = share.min(can_be_added);
        if truncate_ready {
            if let Some(a) = subset.addresses.as_mut() {
                a.truncate(to_keep);
                can_be_added -= a.len();
            }
            subset.not_ready_addresses = None;
        } else if let Some(a) = subset.not_ready_addresses.as_mut() {
            a.truncate(to_keep);
            can_be_added -= a.len();
        }
    }
    true
}

/// The labels of a Service's Endpoints: the Service's own, the headless marker, and the
/// managed-by label.
pub fn endpoints_labels(service: &Service) -> BTreeMap<String, String> {
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    if is_service_ip_set(service) {
        labels.remove(HEADLESS_LABEL);
    } else {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    }
    labels.insert(MANAGED_BY_LABEL.into(), CONTROLLER_NAME.into());
    labels
}

/// Whether the over-capacity annotation agrees with `subsets` (Kubernetes'
/// `capacityAnnotationSetCorrectly`): subsets over capacity always need a (truncating) write.
fn capacity_annotation_set_correctly(current: &Endpoints) -> bool {
    let n: usize = current
        .subsets
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            s.addresses.as_ref().map_or(0, Vec::len)
                + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
        })
        .sum();
    if n > MAX_CAPACITY {
        return false;
    }
    !current
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(OVER_CAPACITY_ANNOTATION))
}

/// Subsets compared for equality with empty lists and `None` alike and `targetRef`
/// resourceVersions ignored (a pod update that moved nothing must not cause a write).
fn normalized(subsets: Option<&[EndpointSubset]>) -> Vec<EndpointSubset> {
    let norm_addresses = |v: &Option<Vec<EndpointAddress>>| {
        let v: Vec<EndpointAddress> = v
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|a| {
                let mut a = a.clone();
                if let Some(r) = a.target_ref.as_mut() {
                    r.resource_version = None;
                }
                a
            })
            .collect();
        (!v.is_empty()).then_some(v)
    };
    subsets
        .unwrap_or_default()
        .iter()
        .map(|s| EndpointSubset {
            addresses: norm_addresses(&s.addresses),
            not_ready_addresses: norm_addresses(&s.not_ready_addresses),
            ports: s.ports.clone().filter(|p| !p.is_empty()),
        })
        .collect()
}

/// The Endpoints to write for `service` (create when `current` is `None`, else replace), or
/// `None` when `current` already says it all (Kubernetes' `syncService` comparison: subsets,
/// labels and the capacity annotation; a new trigger time alone is not worth a write).
pub fn desired_endpoints(
    service: &Service,
    pods: &[Arc<Pod>],
    current: Option<&Endpoints>,
    trigger_time: Option<Timestamp>,
) -> Option<Endpoints> {
    let subsets = compute_subsets(service, pods);
    let labels = endpoints_labels(service);
    if let Some(current) = current
        && normalized(current.subsets.as_deref()) == normalized(Some(&subsets))
        && current.metadata.labels.clone().unwrap_or_default() == labels
        && capacity_annotation_set_correctly(current)
    {
        return None;
    }
    let mut new = current.cloned().unwrap_or_else(|| Endpoints {
        metadata: ObjectMeta {
            name: service.metadata.name.clone(),
            namespace: service.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        subsets: None,
    });
    let mut subsets = subsets;
    let truncated = truncate_subsets(&mut subsets);
    new.subsets = Some(subsets);
    new.metadata.labels = Some(labels);
    let annotations = new.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match trigger_time {
        Some(t) => {
            annotations.insert(LAST_CHANGE_TRIGGER_TIME_ANNOTATION.into(), t.to_string());
        }
        None => {
            annotations.remove(LAST_CHANGE_TRIGGER_TIME_ANNOTATION);
        }
    }
    if truncated {
        annotations.insert(OVER_CAPACITY_ANNOTATION.into(), TRUNCATED.into());
    } else {
        annotations.remove(OVER_CAPACITY_ANNOTATION);
    }
    Some(new)
}

// ---- the controller ----------------------------------------------------------------------------

/// The Endpoints controller. Build it with [`EndpointsController::new`], then run it with
/// [`EndpointsController::run`] once the informers are started.
pub struct EndpointsController {
    client: Client,
    services: Indexer<Service>,
    pods: Indexer<Pod>,
    endpoints: Indexer<Endpoints>,
    trigger_times: TriggerTimeTracker,
    queue: WorkQueue<String>,
    informers: (
        SharedInformer<Service>,
        SharedInformer<Pod>,
        SharedInformer<Endpoints>,
    ),
}

impl EndpointsController {
    /// A controller over the context's shared Service, Pod and Endpoints informers, with its
    /// event handlers registered.
    pub fn new(ctx: &Context) -> Arc<EndpointsController> {
        let services = ctx.informers.informer::<Service>();
        let pods = ctx.informers.informer::<Pod>();
        let endpoints = ctx.informers.informer::<Endpoints>();
        let controller = Arc::new(EndpointsController {
            client: ctx.client.clone(),
            services: services.store(),
            pods: pods.store(),
            endpoints: endpoints.store(),
            trigger_times: TriggerTimeTracker::new(),
            queue: WorkQueue::new("endpoint"),
            informers: (services.clone(), pods.clone(), endpoints.clone()),
        });
        let weak = Arc::downgrade(&controller);
        services.add_handler(ServiceHandler(weak.clone()));
        pods.add_handler(PodHandler(weak.clone()));
        endpoints.add_handler(EndpointsHandler(weak));
        controller
    }

    /// The controller's work queue of Service keys.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Waits for the informers' first lists, queues leftover managed Endpoints (their Service
    /// may have gone while no controller ran), then runs `workers` workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        let (services, pods, endpoints) = &self.informers;
        if !services.wait_for_sync(&stop).await
            || !pods.wait_for_sync(&stop).await
            || !endpoints.wait_for_sync(&stop).await
        {
            tracing::info!("endpoint controller stopped before its caches synced");
            return;
        }
        self.check_leftover_endpoints();
        tracing::info!(workers, "starting endpoint controller");
        let queue = self.queue.clone();
        runtime::run_workers(self, queue, workers, stop).await;
    }

    /// Queues every Endpoints object this controller manages, so those whose Service is gone
    /// are deleted (Kubernetes' `checkLeftoverEndpoints`, limited to managed objects).
    fn check_leftover_endpoints(&self) {
        for ep in self.endpoints.list() {
            if is_managed(&ep) {
                self.queue.add(key_of(ep.as_ref()));
            }
        }
    }

    /// Brings the Endpoints of the Service at `key` in line with its pods.
    pub async fn sync_service(&self, key: &str) -> anyhow::Result<()> {
        let (namespace, name) = util::split_key(key);
        let api = self.client.api::<Endpoints>(Some(namespace));
        let Some(service) = self.services.get_by(namespace, name) else {
            self.trigger_times.delete_service(key);
            // Only an Endpoints this controller wrote goes with its Service.
            if self
                .endpoints
                .get_by(namespace, name)
                .is_some_and(|e| is_managed(&e))
            {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => tracing::info!(service = %key, "deleted endpoints of deleted service"),
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e).context("delete endpoints"),
                }
            }
            return Ok(());
        };
        let Some(selector) = managed_selector(&service) else {
            return Ok(());
        };
        let pods: Vec<Arc<Pod>> = self
            .pods
            .list_namespace(namespace)
            .into_iter()
            .filter(|p| set_matches(selector, p.metadata.labels.as_ref()))
            .collect();
        // Computed even when nothing is written, so the tracker sees every state.
        let trigger_time = self.trigger_times.compute(&service, &pods);
        let current = self.endpoints.get_by(namespace, name);
        let Some(new) = desired_endpoints(&service, &pods, current.as_deref(), trigger_time) else {
            tracing::trace!(service = %key, "endpoints unchanged");
            return Ok(());
        };
        let result = match current {
            None => api.create(&PostParams::default(), &new).await,
            Some(_) => api.replace(name, &PostParams::default(), &new).await,
        };
        match result {
            Ok(_) => {
                tracing::debug!(service = %key, "wrote endpoints");
                Ok(())
            }
            // A Conflict or AlreadyExists means the cache is behind: the watch will bring the
            // newer object and the retry compares against it.
            Err(e) => Err(e).with_context(|| format!("write endpoints {key}")),
        }
    }
}

/// Whether this controller manages the Endpoints object.
fn is_managed(ep: &Endpoints) -> bool {
    let labels = ep.metadata.labels.as_ref();
    let annotations = ep.metadata.annotations.as_ref();
    labels
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .map(String::as_str)
        == Some(CONTROLLER_NAME)
        && !annotations.is_some_and(|a| a.contains_key(LEADER_ELECTION_ANNOTATION))
}

impl Reconciler for EndpointsController {
    fn name(&self) -> &'static str {
        "endpoint"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        let span = tracing::debug_span!("sync", controller = "endpoint", service = %key);
        self.sync_service(key).instrument(span).await
    }
}

struct ServiceHandler(Weak<EndpointsController>);

impl EventHandler<Service> for ServiceHandler {
    fn on_add(&self, obj: &Arc<Service>, _is_initial_list: bool) {
        if let Some(c) = self.0.upgrade() {
            c.queue.add(key_of(obj.as_ref()));
        }
    }
    fn on_update(&self, _old: &Arc<Service>, new: &Arc<Service>) {
        if let Some(c) = self.0.upgrade() {
            c.queue.add(key_of(new.as_ref()));
        }
    }
    fn on_delete(&self, obj: &Deleted<Service>) {
        if let Some(c) = self.0.upgrade() {
            c.queue.add(key_of(obj.object().as_ref()));
        }
    }
}

struct PodHandler(Weak<EndpointsController>);

impl EventHandler<Pod> for PodHandler {
    fn on_add(&self, obj: &Arc<Pod>, _is_initial_list: bool) {
        if let Some(c) = self.0.upgrade() {
            for key in services_for_pod(&c.services, obj) {
                c.queue.add(key);
            }
        }
    }
    fn on_update(&self, old: &Arc<Pod>, new: &Arc<Pod>) {
        if let Some(c) = self.0.upgrade() {
            for key in services_for_pod_update(&c.services, old, new) {
                c.queue.add(key);
            }
        }
    }
    fn on_delete(&self, obj: &Deleted<Pod>) {
        if let Some(c) = self.0.upgrade() {
            for key in services_for_pod(&c.services, obj.object()) {
                c.queue.add(key);
            }
        }
    }
}

/// Endpoints events: a deleted one is re-created if its Service still wants it, and a changed
/// managed one is compared again (someone else's edit is reverted; our own write is a no-op).
struct EndpointsHandler(Weak<EndpointsController>);

impl EventHandler<Endpoints> for EndpointsHandler {
    fn on_add(&self, obj: &Arc<Endpoints>, _is_initial_list: bool) {
        if let Some(c) = self.0.upgrade()
            && is_managed(obj)
        {
            c.queue.add(key_of(obj.as_ref()));
        }
    }
    fn on_update(&self, old: &Arc<Endpoints>, new: &Arc<Endpoints>) {
        if old.metadata.resource_version == new.metadata.resource_version {
            return;
        }
        if let Some(c) = self.0.upgrade()
            && (is_managed(old) || is_managed(new))
        {
            c.queue.add(key_of(new.as_ref()));
        }
    }
    fn on_delete(&self, obj: &Deleted<Endpoints>) {
        if let Some(c) = self.0.upgrade() {
            c.queue.add(key_of(obj.object().as_ref()));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, PodCondition, PodIP, PodSpec, PodStatus, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    pub(crate) fn pod(name: &str, ip: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-a".into()),
                containers: vec![Container {
                    name: "web".into(),
                    ports: Some(vec![
                        ContainerPort {
                            name: Some("http".into()),
                            container_port: 8080,
                            ..ContainerPort::default()
                        },
                        ContainerPort {
                            name: Some("metrics".into()),
                            container_port: 9090,
                            ..ContainerPort::default()
                        },
                    ]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some(ip.into()),
                pod_ips: Some(vec![PodIP { ip: ip.into() }]),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    last_transition_time: Some(Time(ts("2024-05-01T10:00:00Z"))),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    pub(crate) fn service(ports: Vec<ServicePort>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("svc-uid".into()),
                labels: Some(BTreeMap::from([("tier".into(), "front".into())])),
                creation_timestamp: Some(Time(ts("2024-05-01T09:00:00Z"))),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([("app".into(), "web".into())])),
                cluster_ip: Some("10.96.0.10".into()),
                ip_families: Some(vec!["IPv4".into()]),
                ports: Some(ports),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    pub(crate) fn port(name: &str, port: i32, target: IntOrString) -> ServicePort {
        ServicePort {
            name: Some(name.into()),
            port,
            target_port: Some(target),
            protocol: Some("TCP".into()),
            ..ServicePort::default()
        }
    }

    fn ips(addresses: &Option<Vec<EndpointAddress>>) -> Vec<&str> {
        addresses
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|a| a.ip.as_str())
            .collect()
    }

    #[test]
    fn named_target_port_resolves_per_pod_and_numeric_passes_through() {
        let p = pod("a", "10.0.0.1", true);
        assert_eq!(
            find_port(&p, &port("http", 80, IntOrString::String("http".into()))),
            Some(8080)
        );
        assert_eq!(
            find_port(&p, &port("x", 80, IntOrString::Int(7000))),
            Some(7000)
        );
        assert_eq!(
            find_port(&p, &port("x", 80, IntOrString::String("nope".into()))),
            None
        );
        // Same name, other protocol: no match.
        let mut udp = port("http", 80, IntOrString::String("http".into()));
        udp.protocol = Some("UDP".into());
        assert_eq!(find_port(&p, &udp), None);
    }

    #[test]
    fn ready_and_not_ready_pods_land_in_their_lists_with_ports_by_name() {
        let svc = service(vec![
            port("http", 80, IntOrString::String("http".into())),
            port("metrics", 9000, IntOrString::String("metrics".into())),
        ]);
        let pods = vec![
            Arc::new(pod("a", "10.0.0.1", true)),
            Arc::new(pod("b", "10.0.0.2", false)),
            Arc::new(pod("c", "10.0.0.3", true)),
        ];
        let subsets = compute_subsets(&svc, &pods);
        assert_eq!(subsets.len(), 1, "{subsets:?}");
        let s = &subsets[0];
        assert_eq!(ips(&s.addresses), vec!["10.0.0.1", "10.0.0.3"]);
        assert_eq!(ips(&s.not_ready_addresses), vec!["10.0.0.2"]);
        let ports: Vec<(Option<&str>, i32)> = s
            .ports
            .as_deref()
            .unwrap()
            .iter()
            .map(|p| (p.name.as_deref(), p.port))
            .collect();
        assert_eq!(ports, vec![(Some("http"), 8080), (Some("metrics"), 9090)]);
        let a = &s.addresses.as_ref().unwrap()[0];
        assert_eq!(a.node_name.as_deref(), Some("node-a"));
        assert_eq!(a.target_ref.as_ref().unwrap().name.as_deref(), Some("a"));
    }

    #[test]
    fn a_port_only_some_pods_have_gets_its_own_subset() {
        let svc = service(vec![
            port("http", 80, IntOrString::String("http".into())),
            port("admin", 81, IntOrString::String("admin".into())),
        ]);
        let mut with_admin = pod("a", "10.0.0.1", true);
        with_admin.spec.as_mut().unwrap().containers[0]
            .ports
            .as_mut()
            .unwrap()
            .push(ContainerPort {
                name: Some("admin".into()),
                container_port: 8081,
                ..ContainerPort::default()
            });
        let pods = vec![Arc::new(with_admin), Arc::new(pod("b", "10.0.0.2", true))];
        let subsets = compute_subsets(&svc, &pods);
        // Reference: Kubernetes' RepackSubsets groups *ports* by the set of addresses that
        // offer them: http is on both pods, admin only on the first.
        assert_eq!(subsets.len(), 2, "{subsets:?}");
        let by_port: BTreeMap<String, (i32, Vec<&str>)> = subsets
            .iter()
            .map(|s| {
                let ports = s.ports.as_ref().unwrap();
                assert_eq!(ports.len(), 1, "{s:?}");
                (
                    ports[0].name.clone().unwrap(),
                    (ports[0].port, ips(&s.addresses)),
                )
            })
            .collect();
        assert_eq!(by_port["http"], (8080, vec!["10.0.0.1", "10.0.0.2"]));
        assert_eq!(by_port["admin"], (8081, vec!["10.0.0.1"]));
    }

    #[test]
    fn pods_without_ip_finished_or_terminating_are_left_out_unless_published() {
        let svc = service(vec![port("http", 80, IntOrString::Int(8080))]);
        let mut no_ip = pod("a", "", true);
        no_ip.status.as_mut().unwrap().pod_ips = None;
        let mut done = pod("b", "10.0.0.2", true);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut terminating = pod("c", "10.0.0.3", true);
        terminating.metadata.deletion_timestamp = Some(Time(ts("2024-05-01T11:00:00Z")));
        let pods = vec![Arc::new(no_ip), Arc::new(done), Arc::new(terminating)];
        assert!(compute_subsets(&svc, &pods).is_empty());

        // publishNotReadyAddresses: the terminating (and any unready) pod is published ready.
        let mut published = svc.clone();
        published.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let subsets = compute_subsets(&published, &pods);
        assert_eq!(ips(&subsets[0].addresses), vec!["10.0.0.3"]);
    }

    #[test]
    fn headless_service_without_ports_lists_addresses_and_hostnames() {
        let mut svc = service(vec![]);
        svc.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        let mut p = pod("a", "10.0.0.1", true);
        let spec = p.spec.as_mut().unwrap();
        spec.hostname = Some("a-0".into());
        spec.subdomain = Some("web".into());
        let subsets = compute_subsets(&svc, &[Arc::new(p)]);
        assert_eq!(subsets.len(), 1);
        assert!(subsets[0].ports.is_none());
        assert_eq!(
            subsets[0].addresses.as_ref().unwrap()[0]
                .hostname
                .as_deref(),
            Some("a-0")
        );
        assert_eq!(
            endpoints_labels(&svc)
                .get(HEADLESS_LABEL)
                .map(String::as_str),
            Some("")
        );
    }

    #[test]
    fn truncation_keeps_ready_addresses_first_and_annotates() {
        let svc = service(vec![port("http", 80, IntOrString::Int(8080))]);
        let pods: Vec<Arc<Pod>> = (0..1100)
            .map(|i| {
                Arc::new(pod(
                    &format!("p{i}"),
                    &format!("10.1.{}.{}", i / 250, i % 250),
                    i < 950,
                ))
            })
            .collect();
        let ep = desired_endpoints(&svc, &pods, None, None).unwrap();
        let subsets = ep.subsets.as_deref().unwrap();
        let ready: usize = subsets.iter().map(|s| ips(&s.addresses).len()).sum();
        let not_ready: usize = subsets
            .iter()
            .map(|s| ips(&s.not_ready_addresses).len())
            .sum();
        assert_eq!(ready, 950);
        assert_eq!(not_ready, MAX_CAPACITY - 950);
        assert_eq!(
            ep.metadata.annotations.as_ref().unwrap()[OVER_CAPACITY_ANNOTATION],
            TRUNCATED
        );
    }

    #[test]
    fn no_write_when_nothing_changed_and_a_write_when_a_pod_turns_unready() {
        let svc = service(vec![port("http", 80, IntOrString::Int(8080))]);
        let pods = vec![
            Arc::new(pod("a", "10.0.0.1", true)),
            Arc::new(pod("b", "10.0.0.2", true)),
        ];
        let first = desired_endpoints(&svc, &pods, None, None).unwrap();
        assert_eq!(
            first.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            CONTROLLER_NAME
        );
        assert_eq!(first.metadata.labels.as_ref().unwrap()["tier"], "front");
        assert!(desired_endpoints(&svc, &pods, Some(&first), None).is_none());
        // A different trigger time alone is not a change.
        assert!(
            desired_endpoints(&svc, &pods, Some(&first), Some(ts("2030-01-01T00:00:00Z")))
                .is_none()
        );

        let pods = vec![
            Arc::new(pod("a", "10.0.0.1", true)),
            Arc::new(pod("b", "10.0.0.2", false)),
        ];
        let second = desired_endpoints(&svc, &pods, Some(&first), None).unwrap();
        let s = &second.subsets.as_ref().unwrap()[0];
        assert_eq!(ips(&s.addresses), vec!["10.0.0.1"]);
        assert_eq!(ips(&s.not_ready_addresses), vec!["10.0.0.2"]);
    }

    #[test]
    fn trigger_time_is_creation_first_then_the_earliest_changed_pod() {
        let tracker = TriggerTimeTracker::new();
        let svc = service(vec![]);
        let a = Arc::new(pod("a", "10.0.0.1", true));
        assert_eq!(
            tracker.compute(&svc, std::slice::from_ref(&a)),
            Some(ts("2024-05-01T09:00:00Z"))
        );
        // Nothing changed since.
        assert_eq!(tracker.compute(&svc, std::slice::from_ref(&a)), None);
        let mut b = pod("b", "10.0.0.2", true);
        b.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
            Some(Time(ts("2024-05-01T12:00:00Z")));
        assert_eq!(
            tracker.compute(&svc, &[a, Arc::new(b)]),
            Some(ts("2024-05-01T12:00:00Z"))
        );
    }

    #[test]
    fn pod_updates_wake_services_only_when_endpoints_could_move() {
        let services = Indexer::new();
        let svc = service(vec![]);
        services.upsert(&key_of(&svc), Arc::new(svc));
        let old = pod("a", "10.0.0.1", true);
        let mut annotated = old.clone();
        annotated.metadata.resource_version = Some("2".into());
        annotated.metadata.annotations = Some(BTreeMap::from([("x".into(), "y".into())]));
        assert!(services_for_pod_update(&services, &old, &annotated).is_empty());
        let mut unready = pod("a", "10.0.0.1", false);
        unready.metadata.resource_version = Some("3".into());
        assert_eq!(
            services_for_pod_update(&services, &old, &unready),
            BTreeSet::from(["ns/web".to_string()])
        );
        let mut relabelled = old.clone();
        relabelled.metadata.resource_version = Some("4".into());
        relabelled.metadata.labels = Some(BTreeMap::from([("app".into(), "other".into())]));
        assert_eq!(
            services_for_pod_update(&services, &old, &relabelled),
            BTreeSet::from(["ns/web".to_string()])
        );
    }
}
