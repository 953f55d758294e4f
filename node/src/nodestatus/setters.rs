//! The node's status, computed from what the node knows, as the upstream kubelet's setters
//! do (`pkg/kubelet/nodestatus/setters.go`): pure functions over a [`Node`], so the status
//! loop can compute the new status, compare it with the stored one and post only a change.
//!
//! Heartbeats: every computation stamps `lastHeartbeatTime` on the four conditions, while
//! `lastTransitionTime` moves only when a condition's status flips. [`status_changed`]
//! ignores heartbeats (the kubelet's `nodeStatusHasChanged`), which is what lets an unchanged
//! node go unposted between report periods: the Lease carries the heartbeat.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::readiness::aggregate;
use super::{Image, RuntimeVersion};
use crate::machine::{self, MachineInfo, Pressure, ResourceList, resources};

/// Upstream's cap on the images a node lists (`nodeStatusMaxImages`, kubelet config default):
/// the 50 largest, which are the ones worth scheduling towards (ImageLocality).
pub const MAX_IMAGES_IN_NODE_STATUS: usize = 50;
/// Names reported per image (`setters.go`, `MaxNamesPerImageInNodeStatus`).
pub const MAX_NAMES_PER_IMAGE_IN_NODE_STATUS: usize = 5;

/// Condition types (`k8s.io/api/core/v1`).
pub mod conditions {
    /// `Ready`.
    pub const READY: &str = "Ready";
    /// `MemoryPressure`.
    pub const MEMORY_PRESSURE: &str = "MemoryPressure";
    /// `DiskPressure`.
    pub const DISK_PRESSURE: &str = "DiskPressure";
    /// `PIDPressure`.
    pub const PID_PRESSURE: &str = "PIDPressure";
}

/// `True`, `False`, `Unknown`.
const TRUE: &str = "True";
const FALSE: &str = "False";
const UNKNOWN: &str = "Unknown";

/// Everything the setters read, gathered by the status loop for one computation.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The node's name (event messages).
    pub node_name: &'a str,
    /// The moment of this computation: every heartbeat.
    pub now: Timestamp,
    /// The host.
    pub machine: &'a MachineInfo,
    /// The capacity ([`MachineInfo::capacity`]).
    pub capacity: &'a ResourceList,
    /// The allocatable ([`machine::Reservations::allocatable`]).
    pub allocatable: &'a ResourceList,
    /// InternalIP and Hostname, or why they could not be found.
    pub addresses: Result<Vec<NodeAddress>, String>,
    /// The runtime's `Version` answer, `None` when the call failed (the stored value is
    /// kept).
    pub runtime_version: Option<&'a RuntimeVersion>,
    /// The runtime's images, or why they could not be listed.
    pub images: Result<Vec<Image>, String>,
    /// The errors that keep the node not ready ([`super::Readiness::errors`]).
    pub readiness_errors: Vec<String>,
    /// What is under pressure.
    pub pressure: Pressure,
    /// The kubelet's port, published in `daemonEndpoints`.
    pub kubelet_port: i32,
    /// The kubelet's version (`nodeInfo.kubeletVersion`).
    pub kubelet_version: &'a str,
}

/// An event the setters ask for, about the node: `(type, reason, message)`.
pub type NodeEvent = (&'static str, String, String);

/// `Normal`.
const NORMAL: &str = "Normal";
/// `Warning`.
const WARNING: &str = "Warning";

/// Sets the status the kubelet owns on `node` from `inputs`, in the kubelet's setter order
/// (addresses, machine info, version info, daemon endpoints, images, OS and architecture,
/// memory / disk / PID pressure, Ready last). Returns the events to record, and the errors
/// of setters that could not do their part (the others still ran, as upstream).
pub fn set_node_status(node: &mut Node, inputs: &Inputs<'_>) -> (Vec<NodeEvent>, Vec<String>) {
    let mut events = Vec::new();
    let mut errors = Vec::new();
    let status = node.status.get_or_insert_with(NodeStatus::default);

    match &inputs.addresses {
        Ok(addresses) => status.addresses = Some(addresses.clone()),
        Err(e) => errors.push(e.clone()),
    }

    // Machine info: capacity is merged (resources others advertise are kept), allocatable
    // recomputed for what we know.
    let capacity = status.capacity.get_or_insert_with(BTreeMap::new);
    capacity.extend(machine::to_api(inputs.capacity));
    let allocatable = status.allocatable.get_or_insert_with(BTreeMap::new);
    allocatable.extend(machine::to_api(inputs.allocatable));
    let info = status.node_info.get_or_insert_with(NodeSystemInfo::default);
    info.machine_id = inputs.machine.machine_id.clone();
    info.system_uuid = inputs.machine.system_uuid.clone();
    if !info.boot_id.is_empty() && info.boot_id != inputs.machine.boot_id {
        events.push((
            WARNING,
            "Rebooted".to_string(),
            format!(
                "Node {} has been rebooted, boot id: {}",
                inputs.node_name, inputs.machine.boot_id
            ),
        ));
    }
    info.boot_id = inputs.machine.boot_id.clone();

    // Version info.
    info.kernel_version = inputs.machine.kernel_version.clone();
    info.os_image = inputs.machine.os_image.clone();
    if let Some(v) = inputs.runtime_version {
        info.container_runtime_version = format!("{}://{}", v.runtime_name, v.runtime_version);
    }
    info.kubelet_version = inputs.kubelet_version.to_string();
    // The kube-proxy version is deprecated and no longer set by kubelets (KEP-4004).
    info.kube_proxy_version = String::new();
    info.operating_system = inputs.machine.operating_system.to_string();
    info.architecture = inputs.machine.architecture.to_string();

    status.daemon_endpoints = Some(NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: inputs.kubelet_port,
        }),
    });

    match &inputs.images {
        Ok(images) => status.images = Some(node_images(images)),
        Err(e) => {
            status.images = None;
            errors.push(format!("error getting image list: {e}"));
        }
    }

    let now = Time(inputs.now);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for (kind, under_pressure, [yes, no]) in [
        (
            conditions::MEMORY_PRESSURE,
            inputs.pressure.memory,
            [
                (
                    "KubeletHasInsufficientMemory",
                    "kubelet has insufficient memory available",
                ),
                (
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
            ],
        ),
        (
            conditions::DISK_PRESSURE,
            inputs.pressure.disk,
            [
                ("KubeletHasDiskPressure", "kubelet has disk pressure"),
                ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ],
        ),
        (
            conditions::PID_PRESSURE,
            inputs.pressure.pid,
            [
                (
                    "KubeletHasInsufficientPID",
                    "kubelet has insufficient PID available",
                ),
                (
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
            ],
        ),
    ] {
        let (want, (reason, message)) = if under_pressure {
            (TRUE, yes)
        } else {
            (FALSE, no)
        };
        let condition = condition_mut(conditions, kind);
        condition.last_heartbeat_time = Some(now.clone());
        if condition.status != want {
            condition.status = want.to_string();
            condition.reason = Some(reason.to_string());
            condition.message = Some(message.to_string());
            condition.last_transition_time = Some(now.clone());
            // "NodeHasSufficientMemory" etc.: the reason without its "Kubelet" prefix.
            let event = format!("Node{}", reason.trim_start_matches("Kubelet"));
            events.push((
                NORMAL,
                event.clone(),
                format!("Node {} status is now: {event}", inputs.node_name),
            ));
        }
    }

    // Ready, last (kubernetes/kubernetes#16961: old controllers read the last condition).
    let mut not_ready = inputs.readiness_errors.clone();
    let missing: Vec<&str> = [
        resources::CPU,
        resources::MEMORY,
        resources::PODS,
        resources::EPHEMERAL_STORAGE,
    ]
    .into_iter()
    .filter(|r| !status.capacity.as_ref().is_some_and(|c| c.contains_key(*r)))
    .collect();
    if !missing.is_empty() {
        not_ready.push(format!(
            "missing node capacity for resources: {}",
            missing.join(", ")
        ));
    }
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let (want, reason, message) = if not_ready.is_empty() {
        (
            TRUE,
            "KubeletReady",
            "kubelet is posting ready status".to_string(),
        )
    } else {
        (FALSE, "KubeletNotReady", aggregate(&not_ready))
    };
    let existed = conditions.iter().any(|c| c.type_ == conditions::READY);
    let condition = condition_mut(conditions, conditions::READY);
    if !existed || condition.status != want {
        condition.last_transition_time = Some(now.clone());
        if existed {
            let event = if want == TRUE {
                "NodeReady"
            } else {
                "NodeNotReady"
            };
            events.push((
                NORMAL,
                event.to_string(),
                format!("Node {} status is now: {event}", inputs.node_name),
            ));
        }
    }
    condition.status = want.to_string();
    condition.reason = Some(reason.to_string());
    condition.message = Some(message);
    condition.last_heartbeat_time = Some(now);
    // Ready goes last in the list.
    if let Some(i) = conditions.iter().position(|c| c.type_ == conditions::READY) {
        let ready = conditions.remove(i);
        conditions.push(ready);
    }
    (events, errors)
}

/// The condition of `kind` in `conditions`, appended as `Unknown` when missing (as the
/// pressure setters start a new condition).
fn condition_mut<'a>(conditions: &'a mut Vec<NodeCondition>, kind: &str) -> &'a mut NodeCondition {
    let i = match conditions.iter().position(|c| c.type_ == kind) {
        Some(i) => i,
        None => {
            conditions.push(NodeCondition {
                type_: kind.to_string(),
                status: UNKNOWN.to_string(),
                ..NodeCondition::default()
            });
            conditions.len() - 1
        }
    };
    &mut conditions[i]
}

/// The node's image list: the largest first (ties by id, so the list is stable), at most
/// [`MAX_IMAGES_IN_NODE_STATUS`], each with its digests then its tags, at most
/// [`MAX_NAMES_PER_IMAGE_IN_NODE_STATUS`] names (`setters.go`, `Images`; the image
/// manager's `ByImageSize` order).
pub fn node_images(images: &[Image]) -> Vec<ContainerImage> {
    let mut sorted: Vec<&Image> = images.iter().collect();
    sorted.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| b.id.cmp(&a.id)));
    sorted
        .into_iter()
        .take(MAX_IMAGES_IN_NODE_STATUS)
        .map(|image| {
            let names: Vec<String> = image
                .repo_digests
                .iter()
                .chain(&image.repo_tags)
                .take(MAX_NAMES_PER_IMAGE_IN_NODE_STATUS)
                .cloned()
                .collect();
            ContainerImage {
                names: Some(names),
                size_bytes: i64::try_from(image.size).ok(),
            }
        })
        .collect()
}

/// Whether `new` differs from `old` in anything but heartbeat times (the kubelet's
/// `nodeStatusHasChanged`: conditions compared without `lastHeartbeatTime`, the rest of the
/// status compared whole).
pub fn status_changed(old: Option<&NodeStatus>, new: Option<&NodeStatus>) -> bool {
    let strip = |s: Option<&NodeStatus>| -> NodeStatus {
        let mut s = s.cloned().unwrap_or_default();
        if let Some(conditions) = s.conditions.as_mut() {
            for c in conditions {
                c.last_heartbeat_time = None;
            }
        }
        s
    };
    strip(old) != strip(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{EVICTION_HARD_DEFAULT, HugePages, Reservations};

    fn machine() -> MachineInfo {
        MachineInfo {
            num_cpus: 2,
            memory_capacity: 4 << 30,
            hugepages: vec![HugePages {
                page_size: 2 << 20,
                count: 0,
            }],
            ephemeral_storage: 10 << 30,
            kernel_version: "6.1.0".into(),
            os_image: "Debian GNU/Linux 12 (bookworm)".into(),
            boot_id: "boot-a".into(),
            machine_id: "m".into(),
            system_uuid: String::new(),
            architecture: "amd64",
            operating_system: "linux",
        }
    }

    fn compute(
        node: &mut Node,
        at: i64,
        errors: Vec<String>,
        machine: &MachineInfo,
    ) -> Vec<NodeEvent> {
        let capacity = machine.capacity(110);
        let reservations =
            Reservations::parse("", "", EVICTION_HARD_DEFAULT).expect("the default parses");
        let allocatable = reservations.allocatable(&capacity);
        let runtime = RuntimeVersion {
            runtime_name: "containerd".into(),
            runtime_version: "1.6.20".into(),
        };
        let inputs = Inputs {
            node_name: "n1",
            now: Timestamp::from_second(at).expect("valid time"),
            machine,
            capacity: &capacity,
            allocatable: &allocatable,
            addresses: Ok(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "192.0.2.2".into(),
            }]),
            runtime_version: Some(&runtime),
            images: Ok(vec![
                Image {
                    id: "sha256:small".into(),
                    repo_tags: vec!["small:1".into()],
                    repo_digests: vec![],
                    size: 10,
                },
                Image {
                    id: "sha256:big".into(),
                    repo_tags: (0..7).map(|i| format!("big:{i}")).collect(),
                    repo_digests: vec!["big@sha256:1".into()],
                    size: 1000,
                },
            ]),
            readiness_errors: errors,
            pressure: Pressure::default(),
            kubelet_port: 10250,
            kubelet_version: "v1.32.0",
        };
        let (events, errs) = set_node_status(node, &inputs);
        assert!(errs.is_empty(), "{errs:?}");
        events
    }

    fn condition<'a>(node: &'a Node, kind: &str) -> &'a NodeCondition {
        node.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == kind))
            .expect("the condition is set")
    }

    #[test]
    fn a_new_node_gets_every_field_and_condition() {
        let mut node = Node::default();
        compute(&mut node, 1000, vec![], &machine());
        let status = node.status.as_ref().expect("status");
        let info = status.node_info.as_ref().expect("node info");
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert_eq!(info.kubelet_version, "v1.32.0");
        assert_eq!(info.boot_id, "boot-a");
        assert_eq!(info.architecture, "amd64");
        let capacity = status.capacity.as_ref().expect("capacity");
        assert_eq!(capacity["cpu"].0, "2");
        assert_eq!(capacity["memory"].0, "4Gi");
        assert_eq!(capacity["hugepages-2Mi"].0, "0");
        assert_eq!(
            status.allocatable.as_ref().expect("allocatable")["memory"].0,
            "3996Mi"
        );
        let images = status.images.as_ref().expect("images");
        assert_eq!(images[0].size_bytes, Some(1000), "largest first");
        assert_eq!(
            images[0].names.as_deref().expect("names"),
            ["big@sha256:1", "big:0", "big:1", "big:2", "big:3"],
            "digests first, five names at most"
        );
        let types: Vec<&str> = status
            .conditions
            .as_ref()
            .expect("conditions")
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        );
        let ready = condition(&node, "Ready");
        assert_eq!(ready.status, "True");
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("kubelet is posting ready status")
        );
        let memory = condition(&node, "MemoryPressure");
        assert_eq!(memory.status, "False");
        assert_eq!(memory.reason.as_deref(), Some("KubeletHasSufficientMemory"));
        assert_eq!(
            memory.message.as_deref(),
            Some("kubelet has sufficient memory available")
        );
        assert_eq!(
            condition(&node, "DiskPressure").reason.as_deref(),
            Some("KubeletHasNoDiskPressure")
        );
        assert_eq!(
            condition(&node, "PIDPressure").reason.as_deref(),
            Some("KubeletHasSufficientPID")
        );
    }

    #[test]
    fn heartbeats_move_transitions_only_on_a_flip() {
        let m = machine();
        let mut node = Node::default();
        compute(&mut node, 1000, vec![], &m);
        let before = node.clone();
        let events = compute(&mut node, 1010, vec![], &m);
        assert!(events.is_empty());
        let ready = condition(&node, "Ready");
        assert_eq!(
            ready
                .last_heartbeat_time
                .as_ref()
                .expect("hb")
                .0
                .as_second(),
            1010
        );
        assert_eq!(
            ready
                .last_transition_time
                .as_ref()
                .expect("tt")
                .0
                .as_second(),
            1000
        );
        assert!(
            !status_changed(before.status.as_ref(), node.status.as_ref()),
            "only heartbeats moved"
        );

        let before = node.clone();
        let events = compute(
            &mut node,
            1020,
            vec!["container runtime is down".into()],
            &m,
        );
        let ready = condition(&node, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(ready.message.as_deref(), Some("container runtime is down"));
        assert_eq!(
            ready
                .last_transition_time
                .as_ref()
                .expect("tt")
                .0
                .as_second(),
            1020
        );
        assert!(status_changed(before.status.as_ref(), node.status.as_ref()));
        assert_eq!(events[0].1, "NodeNotReady");
        assert_eq!(events[0].2, "Node n1 status is now: NodeNotReady");

        let events = compute(&mut node, 1030, vec!["a".into(), "b".into()], &m);
        assert!(events.is_empty(), "still not ready: no transition");
        assert_eq!(condition(&node, "Ready").message.as_deref(), Some("[a, b]"));
        assert_eq!(
            condition(&node, "Ready")
                .last_transition_time
                .as_ref()
                .expect("tt")
                .0
                .as_second(),
            1020
        );
    }

    #[test]
    fn a_new_boot_id_is_an_event() {
        let mut m = machine();
        let mut node = Node::default();
        compute(&mut node, 1000, vec![], &m);
        m.boot_id = "boot-b".into();
        let events = compute(&mut node, 1010, vec![], &m);
        assert_eq!(events[0].0, "Warning");
        assert_eq!(events[0].1, "Rebooted");
        assert_eq!(events[0].2, "Node n1 has been rebooted, boot id: boot-b");
    }

    #[test]
    fn image_list_is_capped() {
        let images: Vec<Image> = (0..60u64)
            .map(|i| Image {
                id: format!("sha256:{i:02}"),
                repo_tags: vec![format!("img:{i}")],
                repo_digests: vec![],
                size: i,
            })
            .collect();
        let listed = node_images(&images);
        assert_eq!(listed.len(), MAX_IMAGES_IN_NODE_STATUS);
        assert_eq!(listed[0].size_bytes, Some(59));
        assert_eq!(listed[49].size_bytes, Some(10));
    }
}
