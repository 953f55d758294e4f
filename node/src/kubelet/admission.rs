//! The node's own admission of a new pod (upstream `pkg/kubelet/lifecycle/predicate.go`
//! `predicateAdmitHandler.Admit` and `generalFilter`, over the scheduler's `AdmissionCheck`):
//! a pod bound to the node without the scheduler (`spec.nodeName` set by its author) is
//! checked before anything of it starts, against the Node object and the pods already
//! admitted: the node name, the node selector and required node affinity, the `NoExecute`
//! taints it does not tolerate (upstream's kubelet looks at no other effect), the resources
//! (requests against allocatable minus the admitted pods' requests, and the pod count), and
//! the host ports.
//!
//! A pod these predicates admit then goes through the topology manager's admit handler
//! (`crate::cm`: NUMA hints merged, exclusive CPUs and memory allocated) and the device
//! manager's allocation (its plugins' `Allocate`), whose refusal is upstream's
//! `TopologyAffinityError` or `UnexpectedAdmissionError`.
//!
//! Pure: [`admit`] takes the node and the other pods and gives the first failure with
//! upstream's reason and message; the kubelet sets the pod `Failed` with
//! `Pod was rejected: <message>` and records a `Warning` event (`kubelet.go` `rejectPod`).
//! The pod requests and the affinity and taint readings are `skerry_api::pod`'s, the ones the
//! scheduler uses, so a pod the scheduler placed is never refused for a different reading.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use skerry_client::events::object_reference;
use tracing::warn;

use super::Kubelet;
use super::pod_workers::pod_name;
use crate::env::EVENT_WARNING;
use skerry_api::pod::nodeaffinity::RequiredNodeAffinity;
use skerry_api::pod::resources::{
    PodResourcesOptions, RESOURCE_CPU, RESOURCE_MEMORY, ResourceList, add_resource_list,
    pod_requests, resource_list,
};
use skerry_api::pod::taints::{
    find_matching_untolerated_taint, is_no_execute_taint, taints_of, tolerations_of,
};
use skerry_api::validation::quantity::Quantity;

/// The prefix of a rejected pod's status message (`kubelet.go` `rejectPod`).
pub const REJECTED_PREFIX: &str = "Pod was rejected: ";
/// The resource name of the pod count.
const RESOURCE_PODS: &str = "pods";
/// Nano-units per milli-unit and per unit ([`Quantity`] counts nano-units).
const NANO_PER_MILLI: i128 = 1_000_000;
const NANO_PER_UNIT: i128 = 1_000_000_000;

/// Why a pod is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// `OutOfcpu`, `NodeAffinity`, `NodePorts`, `TaintToleration`...
    pub reason: String,
    /// The message without [`REJECTED_PREFIX`].
    pub message: String,
}

fn predicate(name: &str, desc: &str) -> Rejection {
    // `PredicateFailureError.Error`.
    Rejection {
        reason: name.to_string(),
        message: format!("Predicate {name} failed: {desc}"),
    }
}

/// A quantity as upstream's integers for the resource: milli-units for CPU, units (rounded
/// up, as `Quantity.Value`) for the rest.
fn amount(resource: &str, q: Quantity) -> i128 {
    let per = if resource == RESOURCE_CPU {
        NANO_PER_MILLI
    } else {
        NANO_PER_UNIT
    };
    (q.0 + per - 1).div_euclid(per)
}

/// Checks `pod` against `node` and the pods already admitted there (`Admit`); the first
/// failure in upstream's order (resources, then node affinity, node name, host ports, then
/// `NoExecute` taints).
pub fn admit(pod: &Pod, node: &Node, others: &[&Pod]) -> Result<(), Rejection> {
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let options = PodResourcesOptions::default();
    let allocatable = resource_list(node.status.as_ref().and_then(|s| s.allocatable.as_ref()));
    // Resources (`noderesources.Fits`): the pod count first, then each requested resource.
    if let Some(max) = allocatable.get(RESOURCE_PODS) {
        let max = amount(RESOURCE_PODS, *max);
        let used = others.len() as i128;
        if used + 1 > max {
            return Err(insufficient(RESOURCE_PODS, 1, used, max));
        }
    }
    let wanted = pod_requests(pod, &options);
    let mut used = ResourceList::new();
    for o in others {
        add_resource_list(&mut used, &pod_requests(o, &options));
    }
    let mut names: Vec<&String> = wanted.keys().collect();
    // CPU, memory, then the rest by name (upstream's order of checks).
    names.sort_by_key(|n| match n.as_str() {
        RESOURCE_CPU => (0, n.as_str()),
        RESOURCE_MEMORY => (1, n.as_str()),
        _ => (2, n.as_str()),
    });
    for name in names {
        let want = amount(name, wanted[name]);
        if want <= 0 {
            continue;
        }
        let Some(capacity) = allocatable.get(name) else {
            // An extended resource the node does not have is left out
            // (`removeMissingExtendedResources`); cpu and memory always count.
            if name == RESOURCE_CPU || name == RESOURCE_MEMORY {
                return Err(insufficient(name, want, 0, 0));
            }
            continue;
        };
        let capacity = amount(name, *capacity);
        let in_use = used.get(name).map_or(0, |q| amount(name, *q));
        if want > capacity - in_use {
            return Err(insufficient(name, want, in_use, capacity));
        }
    }
    // Node selector and required node affinity.
    if !RequiredNodeAffinity::from_pod(pod).matches(node) {
        return Err(predicate(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    // The node name.
    let wanted_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if wanted_node.is_some_and(|n| !n.is_empty() && n != node_name) {
        return Err(predicate(
            "NodeName",
            "node(s) didn't match the requested node name",
        ));
    }
    // Host ports.
    let in_use: Vec<HostPort> = others.iter().flat_map(|o| host_ports(o)).collect();
    if host_ports(pod)
        .iter()
        .any(|p| in_use.iter().any(|u| u.conflicts(p)))
    {
        return Err(predicate(
            "NodePorts",
            "node(s) didn't have free ports for the requested pod ports",
        ));
    }
    // Taints: only NoExecute.
    if find_matching_untolerated_taint(taints_of(node), tolerations_of(pod), is_no_execute_taint)
        .is_some()
    {
        return Err(predicate(
            "TaintToleration",
            "node(s) had untolerated taint",
        ));
    }
    Ok(())
}

fn insufficient(resource: &str, requested: i128, used: i128, capacity: i128) -> Rejection {
    let reason = format!("OutOf{resource}");
    Rejection {
        reason,
        // `InsufficientResourceError.Error`.
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// A host port a pod takes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HostPort {
    ip: String,
    protocol: String,
    port: i32,
}

impl HostPort {
    /// Same protocol and port, and the addresses overlap (`0.0.0.0` takes them all:
    /// `HostPortInfo.CheckConflict`).
    fn conflicts(&self, other: &HostPort) -> bool {
        const ANY: &str = "0.0.0.0";
        self.protocol == other.protocol
            && self.port == other.port
            && (self.ip == other.ip || self.ip == ANY || other.ip == ANY)
    }
}

fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut seen = BTreeMap::new();
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for p in c.ports.iter().flatten() {
            let Some(port) = p.host_port.filter(|p| *p > 0) else {
                continue;
            };
            let ip = p
                .host_ip
                .clone()
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| "0.0.0.0".to_string());
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".to_string());
            seen.insert(
                (ip.clone(), protocol.clone(), port),
                HostPort { ip, protocol, port },
            );
        }
    }
    seen.into_values().collect()
}

impl Kubelet {
    /// Admits a pod the first time its worker sees it (`HandlePodAdditions` -> `canAdmitPod`);
    /// returns whether it may run. A rejected pod is set `Failed` with upstream's reason and
    /// message and gets a `Warning` event. A pod already known to the runtime (the kubelet
    /// restarted under it) or already admitted is not checked again; an error (the Node not
    /// readable) is retried by the worker.
    pub async fn admit(&self, pod: &Pod) -> anyhow::Result<bool> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if self.admitted_lock().contains_key(&uid) {
            return Ok(true);
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or_default();
        if super::status::is_terminal_phase(phase) {
            return Ok(true);
        }
        let rt = super::runtime::pod_status(&self.cri, &uid).await?;
        if rt.sandboxes.is_empty() && rt.containers.is_empty() {
            let node: Node = self
                .client
                .api::<Node>(None)
                .get(&self.config.node_name)
                .await
                .context("read the node for admission")?;
            // The eviction manager's `Admit` comes first, as upstream adds its handler first.
            let pressure = *self.config.node_pressure.borrow();
            if let Err(r) = crate::eviction::admit(pod, &pressure) {
                warn!(pod = %pod_name(pod), reason = %r.reason, message = %r.message, "pod rejected");
                self.events
                    .event(&object_reference(pod), EVENT_WARNING, &r.reason, &r.message);
                let mut status = pod.status.clone().unwrap_or_default();
                status.phase = Some(super::status::PHASE_FAILED.to_string());
                status.reason = Some(r.reason);
                status.message = Some(format!("{REJECTED_PREFIX}{}", r.message));
                self.set_status(pod, &status).await?;
                return Ok(false);
            }
            let verdict = {
                let mut admitted = self.admitted_lock();
                let others: Vec<&Pod> = admitted.values().map(|p| p.as_ref()).collect();
                let mut verdict = admit(pod, &node, &others);
                // Then the topology manager's admit handler, which allocates the pod's
                // exclusive CPUs (`kubelet.go` appends it after the predicate handler).
                if verdict.is_ok()
                    && let Some(m) = &self.config.resource_managers
                {
                    verdict = m.admit(pod).map_err(|e| Rejection {
                        reason: e.reason,
                        message: e.message,
                    });
                }
                if verdict.is_ok() {
                    admitted.insert(uid.clone(), Arc::new(pod.clone()));
                }
                verdict
            };
            // Then the devices (the device manager's `Allocate`, a call to each plugin).
            let verdict = match (verdict, &self.config.resource_managers) {
                (Ok(()), Some(m)) => {
                    let active = self.active_uids();
                    let allocated = m.allocate_devices(pod, &active).await;
                    allocated.map_err(|e| {
                        self.admitted_lock().remove(&uid);
                        Rejection {
                            reason: e.reason,
                            message: e.message,
                        }
                    })
                }
                (verdict, _) => verdict,
            };
            if let Err(r) = verdict {
                warn!(pod = %pod_name(pod), reason = %r.reason, message = %r.message, "pod rejected");
                self.events
                    .event(&object_reference(pod), EVENT_WARNING, &r.reason, &r.message);
                let mut status = pod.status.clone().unwrap_or_default();
                status.phase = Some(super::status::PHASE_FAILED.to_string());
                status.reason = Some(r.reason);
                status.message = Some(format!("{REJECTED_PREFIX}{}", r.message));
                self.set_status(pod, &status).await?;
                return Ok(false);
            }
            return Ok(true);
        }
        // Running from before a restart: the resource managers take it back as it is
        // (its exclusive CPUs come from their checkpoint), never refusing it.
        if let Some(m) = &self.config.resource_managers
            && let Err(e) = m.admit(pod)
        {
            warn!(pod = %pod_name(pod), reason = %e.reason, message = %e.message, "a running pod does not fit the resource managers");
        }
        self.admitted_lock().insert(uid, Arc::new(pod.clone()));
        // Its devices come back from the device manager's checkpoint.
        if let Some(m) = &self.config.resource_managers {
            let active = self.active_uids();
            if let Err(e) = m.allocate_devices(pod, &active).await {
                warn!(pod = %pod_name(pod), reason = %e.reason, message = %e.message, "a running pod's devices cannot be allocated");
            }
        }
        Ok(true)
    }

    /// The UIDs of the pods holding resources (the device manager forgets the others').
    fn active_uids(&self) -> std::collections::HashSet<String> {
        self.pods_holding_resources()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect()
    }

    /// Forgets an admitted pod (it stopped: its requests, ports and exclusive CPUs are free
    /// again).
    pub fn release_admission(&self, uid: &str) {
        self.admitted_lock().remove(uid);
        if let Some(m) = &self.config.resource_managers {
            m.release_pod(uid);
        }
    }

    fn admitted_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Pod>>> {
        self.admitted.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        let mut base = serde_json::json!({
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "status": {"allocatable": {"cpu": "1900m", "memory": "1Gi", "pods": "3"}}
        });
        merge(&mut base, json);
        serde_json::from_value(base).expect("node")
    }

    fn pod(json: serde_json::Value) -> Pod {
        let mut base = serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}
        });
        merge(&mut base, json);
        serde_json::from_value(base).expect("pod")
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn cpu(m: &str) -> serde_json::Value {
        serde_json::json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": m}}}]}})
    }

    #[test]
    fn too_much_cpu_is_out_of_cpu_with_upstreams_message() {
        let n = node(serde_json::json!({}));
        let r = admit(&pod(cpu("3")), &n, &[]).expect_err("rejected");
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 1900"
        );
        // What the admitted pods use counts.
        let running = pod(cpu("1"));
        assert_eq!(admit(&pod(cpu("900m")), &n, &[&running]), Ok(()));
        let r = admit(&pod(cpu("901m")), &n, &[&running]).expect_err("rejected");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 901, used: 1000, capacity: 1900"
        );
        let mem = pod(
            serde_json::json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "2Gi"}}}]}}),
        );
        assert_eq!(
            admit(&mem, &n, &[]).expect_err("rejected").reason,
            "OutOfmemory"
        );
        let (a, b, c) = (pod(cpu("1m")), pod(cpu("1m")), pod(cpu("1m")));
        assert_eq!(
            admit(&pod(cpu("1m")), &n, &[&a, &b, &c])
                .expect_err("rejected")
                .reason,
            "OutOfpods"
        );
    }

    #[test]
    fn affinity_name_ports_and_no_execute_taints() {
        let n = node(serde_json::json!({}));
        let sel = pod(serde_json::json!({"spec": {"nodeSelector": {"zone": "b"}}}));
        assert_eq!(
            admit(&sel, &n, &[]).expect_err("rejected"),
            Rejection {
                reason: "NodeAffinity".into(),
                message: "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".into()
            }
        );
        let other = pod(serde_json::json!({"spec": {"nodeName": "n2"}}));
        assert_eq!(
            admit(&other, &n, &[]).expect_err("rejected").reason,
            "NodeName"
        );
        let port = |ip: &str| {
            pod(
                serde_json::json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080, "hostIP": ip}]}]}}),
            )
        };
        let taken = port("");
        assert_eq!(
            admit(&port("10.0.0.1"), &n, &[&taken])
                .expect_err("rejected")
                .reason,
            "NodePorts"
        );
        assert_eq!(admit(&port("10.0.0.1"), &n, &[&port("10.0.0.2")]), Ok(()));
        let tainted = node(serde_json::json!({"spec": {"taints": [
            {"key": "k", "effect": "NoSchedule"}
        ]}}));
        assert_eq!(
            admit(&pod(serde_json::json!({})), &tainted, &[]),
            Ok(()),
            "NoSchedule is the scheduler's"
        );
        let evicting = node(serde_json::json!({"spec": {"taints": [
            {"key": "k", "effect": "NoExecute"}
        ]}}));
        assert_eq!(
            admit(&pod(serde_json::json!({})), &evicting, &[])
                .expect_err("rejected")
                .message,
            "Predicate TaintToleration failed: node(s) had untolerated taint"
        );
        let tolerant =
            pod(serde_json::json!({"spec": {"tolerations": [{"key": "k", "operator": "Exists"}]}}));
        assert_eq!(admit(&tolerant, &evicting, &[]), Ok(()));
    }
}
