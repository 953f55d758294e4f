//! Pod specs, on their own (Pods) and inside templates (Deployments, ReplicaSets,
//! DaemonSets, StatefulSets): containers, ports, resources, volumes, and the pod update rule
//! that only images and a few scheduling fields may change.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::quantity::{QUANTITY_FORMAT_ERROR, Quantity};
use super::{
    JsonType, array_of, child, duplicate, each, forbidden, index, invalid, invalid_str, key,
    map_of, meta, names, not_found, not_supported, null, required, str_of, type_check,
};
use crate::Cause;

/// Port protocols, in the sorted order Kubernetes lists them in `NotSupported` messages.
pub(super) const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];
const DNS_POLICIES: &[&str] = &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const TERMINATION_MESSAGE_POLICIES: &[&str] = &["File", "FallbackToLogsOnError"];
/// Resource names a container may request without a domain prefix.
const STANDARD_CONTAINER_RESOURCES: &[&str] = &["cpu", "memory", "ephemeral-storage"];
/// The volume sources of `core/v1.Volume`: exactly one may be set.
const VOLUME_SOURCES: &[&str] = &[
    "hostPath",
    "emptyDir",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "persistentVolumeClaim",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "downwardAPI",
    "fc",
    "azureFile",
    "configMap",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "projected",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "csi",
    "ephemeral",
    "image",
];
/// `activeDeadlineSeconds` is an int64 that must fit Go's `int32` in practice
/// (Kubernetes checks against `math.MaxInt32`).
const ACTIVE_DEADLINE_SECONDS_MAX: i64 = i32::MAX as i64;

/// A Pod: metadata is checked by the caller; here the spec, and on update the spec rule.
pub(super) fn validate_pod(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    if !spec.is_object() {
        out.push(required("spec", ""));
        return;
    }
    validate_pod_spec(spec, "spec", out);
    if let Some(old) = old {
        validate_pod_spec_update(old.get("spec").unwrap_or(null()), spec, out);
        validate_mirror_annotation_update(old, obj, out);
    }
}

/// The annotation that makes a pod a mirror pod (`core.MirrorPodAnnotationKey`): the kubelet's
/// window on a static pod, never run by anyone.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// An update may neither make a pod a mirror pod nor unmake one (Kubernetes'
/// `ValidatePodSpecificAnnotationUpdates`): annotations starting with the mirror key keep
/// their value.
fn validate_mirror_annotation_update(old: &Value, new: &Value, out: &mut Vec<Cause>) {
    let annotations = |pod: &Value| {
        pod.pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let (old, new) = (annotations(old), annotations(new));
    for (key, value) in &old {
        if key.starts_with(MIRROR_POD_ANNOTATION) && new.get(key) != Some(value) {
            out.push(forbidden(
                &format!("metadata.annotations[{key}]"),
                "field is immutable",
            ));
        }
    }
    for key in new.keys() {
        if key.starts_with(MIRROR_POD_ANNOTATION) && !old.contains_key(key) {
            out.push(forbidden(
                &format!("metadata.annotations[{key}]"),
                "field is forbidden",
            ));
        }
    }
}

/// A `PodTemplateSpec` at `path` (`spec.template`): its labels and annotations, then its spec.
pub(super) fn validate_pod_template(template: &Value, path: &str, out: &mut Vec<Cause>) {
    let template_meta = template.get("metadata").unwrap_or(null());
    // Kubernetes reports template labels at `<path>.labels`, not `<path>.metadata.labels`.
    if let Some(labels) = map_of(template_meta, "labels") {
        meta::validate_labels(labels, &child(path, "labels"), out);
    }
    if let Some(annotations) = map_of(template_meta, "annotations") {
        meta::validate_annotations(annotations, &child(path, "annotations"), out);
    }
    let spec = template.get("spec").unwrap_or(null());
    validate_pod_spec(spec, &child(path, "spec"), out);
}

/// core validation `ValidatePodSpec`, the parts users hit.
pub(super) fn validate_pod_spec(spec: &Value, path: &str, out: &mut Vec<Cause>) {
    for field in [
        "containers",
        "initContainers",
        "volumes",
        "tolerations",
        "readinessGates",
    ] {
        type_check(spec, field, path, JsonType::Array, out);
    }
    type_check(spec, "nodeSelector", path, JsonType::Object, out);
    type_check(spec, "hostNetwork", path, JsonType::Bool, out);
    for field in [
        "restartPolicy",
        "dnsPolicy",
        "nodeName",
        "serviceAccountName",
    ] {
        type_check(spec, field, path, JsonType::String, out);
    }
    let volumes = validate_volumes(spec, path, out);
    let mut container_names = BTreeSet::new();
    let init_containers = array_of(spec, "initContainers");
    for (i, container) in init_containers.iter().enumerate() {
        let container_path = index(&child(path, "initContainers"), i);
        validate_container(
            container,
            &container_path,
            &volumes,
            &mut container_names,
            out,
        );
    }
    let containers = array_of(spec, "containers");
    if containers.is_empty() {
        out.push(required(&child(path, "containers"), ""));
    }
    for (i, container) in containers.iter().enumerate() {
        let container_path = index(&child(path, "containers"), i);
        validate_container(
            container,
            &container_path,
            &volumes,
            &mut container_names,
            out,
        );
    }
    let restart_policy = str_of(spec, "restartPolicy");
    match restart_policy {
        "" => out.push(required(&child(path, "restartPolicy"), "")),
        p if RESTART_POLICIES.contains(&p) => {}
        p => out.push(not_supported(
            &child(path, "restartPolicy"),
            &Value::from(p),
            RESTART_POLICIES,
        )),
    }
    let dns_policy = str_of(spec, "dnsPolicy");
    match dns_policy {
        "" => out.push(required(&child(path, "dnsPolicy"), "")),
        p if DNS_POLICIES.contains(&p) => {}
        p => out.push(not_supported(
            &child(path, "dnsPolicy"),
            &Value::from(p),
            DNS_POLICIES,
        )),
    }
    if let Some(selector) = map_of(spec, "nodeSelector") {
        meta::validate_labels(selector, &child(path, "nodeSelector"), out);
    }
    for field in ["hostname", "subdomain"] {
        let value = str_of(spec, field);
        if !value.is_empty() {
            each(out, &child(path, field), value, names::dns1123_label(value));
        }
    }
    let service_account = str_of(spec, "serviceAccountName");
    if !service_account.is_empty() {
        each(
            out,
            &child(path, "serviceAccountName"),
            service_account,
            names::dns1123_subdomain(service_account),
        );
    }
    if let Some(deadline) = spec.get("activeDeadlineSeconds").and_then(Value::as_i64)
        && !(1..=ACTIVE_DEADLINE_SECONDS_MAX).contains(&deadline)
    {
        out.push(invalid(
            &child(path, "activeDeadlineSeconds"),
            &Value::from(deadline),
            &format!("must be between 1 and {ACTIVE_DEADLINE_SECONDS_MAX}, inclusive"),
        ));
    }
}

/// Volumes: names are unique DNS labels and each sets exactly one source.
/// Returns the volume names for the mount check.
fn validate_volumes(spec: &Value, path: &str, out: &mut Vec<Cause>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (i, volume) in array_of(spec, "volumes").iter().enumerate() {
        let volume_path = index(&child(path, "volumes"), i);
        let name = str_of(volume, "name");
        if name.is_empty() {
            out.push(required(&child(&volume_path, "name"), ""));
        } else {
            each(
                out,
                &child(&volume_path, "name"),
                name,
                names::dns1123_label(name),
            );
            if !seen.insert(name.to_string()) {
                out.push(duplicate(&child(&volume_path, "name"), &Value::from(name)));
            }
        }
        let sources: Vec<&str> = VOLUME_SOURCES
            .iter()
            .copied()
            .filter(|s| volume.get(*s).is_some_and(|v| !v.is_null()))
            .collect();
        if sources.is_empty() {
            out.push(required(&volume_path, "must specify a volume type"));
        }
        for extra in sources.iter().skip(1) {
            out.push(forbidden(
                &child(&volume_path, extra),
                "may not specify more than 1 volume type",
            ));
        }
    }
    seen
}

fn validate_container(
    container: &Value,
    path: &str,
    volumes: &BTreeSet<String>,
    names_seen: &mut BTreeSet<String>,
    out: &mut Vec<Cause>,
) {
    let name = str_of(container, "name");
    if name.is_empty() {
        out.push(required(&child(path, "name"), ""));
    } else {
        each(out, &child(path, "name"), name, names::dns1123_label(name));
        if !names_seen.insert(name.to_string()) {
            out.push(duplicate(&child(path, "name"), &Value::from(name)));
        }
    }
    let image = str_of(container, "image");
    if image.is_empty() {
        out.push(required(&child(path, "image"), ""));
    } else if image.trim() != image {
        out.push(invalid_str(
            &child(path, "image"),
            image,
            "must not have leading or trailing whitespace",
        ));
    }
    match str_of(container, "imagePullPolicy") {
        "" => out.push(required(&child(path, "imagePullPolicy"), "")),
        p if PULL_POLICIES.contains(&p) => {}
        p => out.push(not_supported(
            &child(path, "imagePullPolicy"),
            &Value::from(p),
            PULL_POLICIES,
        )),
    }
    match str_of(container, "terminationMessagePolicy") {
        "" => out.push(required(&child(path, "terminationMessagePolicy"), "")),
        p if TERMINATION_MESSAGE_POLICIES.contains(&p) => {}
        p => out.push(not_supported(
            &child(path, "terminationMessagePolicy"),
            &Value::from(p),
            TERMINATION_MESSAGE_POLICIES,
        )),
    }
    validate_container_ports(container, path, out);
    for (i, env) in array_of(container, "env").iter().enumerate() {
        let env_path = index(&child(path, "env"), i);
        let env_name = str_of(env, "name");
        if env_name.is_empty() {
            out.push(required(&child(&env_path, "name"), ""));
        } else {
            each(
                out,
                &child(&env_path, "name"),
                env_name,
                names::env_var_name(env_name),
            );
        }
    }
    for (i, mount) in array_of(container, "volumeMounts").iter().enumerate() {
        let mount_path = index(&child(path, "volumeMounts"), i);
        let volume = str_of(mount, "name");
        if volume.is_empty() {
            out.push(required(&child(&mount_path, "name"), ""));
        } else if !volumes.contains(volume) {
            out.push(not_found(&child(&mount_path, "name"), &Value::from(volume)));
        }
        if str_of(mount, "mountPath").is_empty() {
            out.push(required(&child(&mount_path, "mountPath"), ""));
        }
    }
    validate_resources(
        container.get("resources").unwrap_or(null()),
        &child(path, "resources"),
        out,
    );
}

fn validate_container_ports(container: &Value, path: &str, out: &mut Vec<Cause>) {
    let mut port_names = BTreeSet::new();
    for (i, port) in array_of(container, "ports").iter().enumerate() {
        let port_path = index(&child(path, "ports"), i);
        let name = str_of(port, "name");
        if !name.is_empty() {
            each(
                out,
                &child(&port_path, "name"),
                name,
                names::port_name(name),
            );
            if !port_names.insert(name.to_string()) {
                out.push(duplicate(&child(&port_path, "name"), &Value::from(name)));
            }
        }
        let container_port = port
            .get("containerPort")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        for message in names::port_number(container_port) {
            out.push(invalid(
                &child(&port_path, "containerPort"),
                &Value::from(container_port),
                &message,
            ));
        }
        if let Some(host_port) = port
            .get("hostPort")
            .and_then(Value::as_i64)
            .filter(|p| *p != 0)
        {
            for message in names::port_number(host_port) {
                out.push(invalid(
                    &child(&port_path, "hostPort"),
                    &Value::from(host_port),
                    &message,
                ));
            }
        }
        validate_protocol(port, &port_path, out);
    }
}

/// `protocol` is required (it is defaulted to TCP) and one of [`PROTOCOLS`].
pub(super) fn validate_protocol(port: &Value, port_path: &str, out: &mut Vec<Cause>) {
    match str_of(port, "protocol") {
        "" => out.push(required(&child(port_path, "protocol"), "")),
        p if PROTOCOLS.contains(&p) => {}
        p => out.push(not_supported(
            &child(port_path, "protocol"),
            &Value::from(p),
            PROTOCOLS,
        )),
    }
}

/// Requests and limits: standard names, well-formed non-negative quantities, request ≤ limit.
fn validate_resources(resources: &Value, path: &str, out: &mut Vec<Cause>) {
    let mut parsed: BTreeMap<(&str, String), Quantity> = BTreeMap::new();
    for bag in ["limits", "requests"] {
        let Some(entries) = map_of(resources, bag) else {
            continue;
        };
        let bag_path = child(path, bag);
        for (resource_name, value) in entries {
            let entry_path = key(&bag_path, resource_name);
            validate_resource_name(resource_name, &entry_path, out);
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => {
                    out.push(invalid(&entry_path, other, QUANTITY_FORMAT_ERROR));
                    continue;
                }
            };
            match Quantity::parse(&text) {
                None => out.push(invalid_str(&entry_path, &text, QUANTITY_FORMAT_ERROR)),
                Some(q) if q.is_negative() => {
                    out.push(invalid_str(&entry_path, &text, super::IS_NEGATIVE_MESSAGE));
                }
                Some(q) => {
                    parsed.insert((bag, resource_name.clone()), q);
                }
            }
        }
    }
    let empty = Map::new();
    let requests = map_of(resources, "requests").unwrap_or(&empty);
    let limits = map_of(resources, "limits").unwrap_or(&empty);
    for (resource_name, request_value) in requests {
        let (Some(request), Some(limit)) = (
            parsed.get(&("requests", resource_name.clone())),
            parsed.get(&("limits", resource_name.clone())),
        ) else {
            continue;
        };
        if request > limit {
            let limit_text = limits
                .get(resource_name)
                .map(quantity_text)
                .unwrap_or_default();
            out.push(invalid_str(
                &key(&child(path, "requests"), resource_name),
                &quantity_text(request_value),
                &format!("must be less than or equal to {resource_name} limit of {limit_text}"),
            ));
        }
    }
}

fn quantity_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn validate_resource_name(name: &str, path: &str, out: &mut Vec<Cause>) {
    let messages = names::qualified_name(name);
    if !messages.is_empty() {
        each(out, path, name, messages);
        return;
    }
    let standard = STANDARD_CONTAINER_RESOURCES.contains(&name) || name.starts_with("hugepages-");
    if !name.contains('/') && !standard {
        out.push(invalid_str(
            path,
            name,
            "must be a standard resource for containers",
        ));
    }
}

/// Kubernetes' message for a pod spec change outside the mutable fields (1.32 wording).
const POD_UPDATE_FORBIDDEN: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// core validation `ValidatePodUpdate`: copy the mutable fields from the new spec into the
/// old one; anything still different is a forbidden change.
fn validate_pod_spec_update(old_spec: &Value, new_spec: &Value, out: &mut Vec<Cause>) {
    let mut mock = old_spec.clone();
    let Some(mock_map) = mock.as_object_mut() else {
        return;
    };
    for list in ["containers", "initContainers"] {
        let new_list = array_of(new_spec, list);
        if let Some(Value::Array(old_list)) = mock_map.get_mut(list) {
            if old_list.len() != new_list.len() {
                continue;
            }
            for (old_container, new_container) in old_list.iter_mut().zip(new_list) {
                if let (Some(o), Some(image)) =
                    (old_container.as_object_mut(), new_container.get("image"))
                {
                    o.insert("image".into(), image.clone());
                }
            }
        }
    }
    // activeDeadlineSeconds may be set, or lowered, but not removed or raised.
    let old_deadline = old_spec
        .get("activeDeadlineSeconds")
        .and_then(Value::as_i64);
    let new_deadline = new_spec
        .get("activeDeadlineSeconds")
        .and_then(Value::as_i64);
    match (old_deadline, new_deadline) {
        (None, Some(_)) => {
            mock_map.insert("activeDeadlineSeconds".into(), Value::from(new_deadline));
        }
        (Some(o), Some(n)) if n <= o => {
            mock_map.insert("activeDeadlineSeconds".into(), Value::from(n));
        }
        (Some(_), Some(n)) => out.push(invalid(
            "spec.activeDeadlineSeconds",
            &Value::from(n),
            "must be less than or equal to previous value",
        )),
        (Some(_), None) => out.push(invalid(
            "spec.activeDeadlineSeconds",
            &Value::Null,
            "must not update from a positive integer to nil value",
        )),
        (None, None) => {}
    }
    // Tolerations may only be added; tolerationSeconds of an existing one may change.
    let old_tolerations = array_of(old_spec, "tolerations");
    let new_tolerations = array_of(new_spec, "tolerations");
    let without_seconds = |t: &Value| {
        let mut t = t.clone();
        if let Some(o) = t.as_object_mut() {
            o.remove("tolerationSeconds");
        }
        t
    };
    let kept = old_tolerations.iter().all(|o| {
        new_tolerations
            .iter()
            .any(|n| without_seconds(n) == without_seconds(o))
    });
    if kept {
        mock_map.insert("tolerations".into(), Value::Array(new_tolerations.to_vec()));
    }
    // A negative grace period may be raised to 1.
    let old_grace = old_spec
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    let new_grace = new_spec
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    if old_grace.is_some_and(|g| g < 0) && new_grace == Some(1) {
        mock_map.insert("terminationGracePeriodSeconds".into(), Value::from(1));
    }
    // Scheduling gates may be removed, never added.
    let old_gates = array_of(old_spec, "schedulingGates");
    let new_gates = array_of(new_spec, "schedulingGates");
    if new_gates.iter().all(|g| old_gates.contains(g)) {
        mock_map.insert("schedulingGates".into(), Value::Array(new_gates.to_vec()));
        if new_gates.is_empty() {
            mock_map.remove("schedulingGates");
        }
    }
    if !json_equal_ignoring_empty(&mock, new_spec) {
        out.push(forbidden("spec", POD_UPDATE_FORBIDDEN));
    }
}

/// Structural equality that treats a missing field, `null`, `[]` and `{}` alike, as Go's
/// typed comparison of `omitempty` fields does.
pub(super) fn json_equal_ignoring_empty(a: &Value, b: &Value) -> bool {
    fn is_empty(v: &Value) -> bool {
        match v {
            Value::Null => true,
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        }
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().all(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => json_equal_ignoring_empty(p, q),
                (Some(v), None) | (None, Some(v)) => is_empty(v),
                (None, None) => true,
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(p, q)| json_equal_ignoring_empty(p, q))
        }
        (x, y) if is_empty(x) && is_empty(y) => true,
        (x, y) => x == y,
    }
}
