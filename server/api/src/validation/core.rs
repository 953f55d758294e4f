//! The core group's kinds besides Pod: Service, ConfigMap, Secret, Namespace, Node,
//! Endpoints and Event.
//!
//! Invariant: ConfigMap and Secret payloads are capped at [`DATA_BYTES_MAX`] in total,
//! counting decoded bytes, because the whole object must fit one store value.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde_json::Value;

use super::pod::{json_equal_ignoring_empty, validate_protocol};
use super::{
    IMMUTABLE_MESSAGE, array_of, child, duplicate, each, forbidden, index, invalid, invalid_str,
    key, map_of, meta, names, not_supported, null, required, str_of, too_long,
};
use crate::Cause;

/// Total bytes of a ConfigMap's or Secret's data (core `MaxSecretSize`, 1 MiB): it bounds the
/// size of one stored object and of every volume file set the kubelet writes.
pub const DATA_BYTES_MAX: usize = 1024 * 1024;

/// Service types, sorted as Kubernetes lists them.
const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const SESSION_AFFINITIES: &[&str] = &["ClientIP", "None"];
const TAINT_EFFECTS: &[&str] = &["NoExecute", "NoSchedule", "PreferNoSchedule"];
const IMMUTABLE_WHEN_SET: &str = "field is immutable when `immutable` is set";

pub(super) fn validate_service(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    let service_type = str_of(spec, "type");
    let cluster_ip = str_of(spec, "clusterIP");
    let headless = cluster_ip == "None";
    let ports = array_of(spec, "ports");
    if !SERVICE_TYPES.contains(&service_type) {
        out.push(not_supported(
            "spec.type",
            &Value::from(service_type),
            SERVICE_TYPES,
        ));
    }
    if service_type == "ExternalName" {
        let external_name = str_of(spec, "externalName");
        if external_name.is_empty() {
            out.push(required("spec.externalName", ""));
        } else {
            each(
                out,
                "spec.externalName",
                external_name,
                names::dns1123_subdomain(external_name),
            );
        }
        if !cluster_ip.is_empty() {
            out.push(forbidden(
                "spec.clusterIP",
                "may not be set for ExternalName services",
            ));
        }
    } else if ports.is_empty() && !headless {
        out.push(required("spec.ports", ""));
    }
    if !cluster_ip.is_empty() && !headless && cluster_ip.parse::<IpAddr>().is_err() {
        out.push(invalid_str(
            "spec.clusterIP",
            cluster_ip,
            "must be empty, 'None', or a valid IP address",
        ));
    }
    let mut port_names = BTreeSet::new();
    let mut port_keys = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let port_path = index("spec.ports", i);
        let name = str_of(port, "name");
        if ports.len() > 1 && name.is_empty() {
            out.push(required(&child(&port_path, "name"), ""));
        } else if !name.is_empty() {
            each(
                out,
                &child(&port_path, "name"),
                name,
                names::dns1123_label(name),
            );
            if !port_names.insert(name.to_string()) {
                out.push(duplicate(&child(&port_path, "name"), &Value::from(name)));
            }
        }
        let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
        for message in names::port_number(number) {
            out.push(invalid(
                &child(&port_path, "port"),
                &Value::from(number),
                &message,
            ));
        }
        validate_protocol(port, &port_path, out);
        validate_port_number_or_name(
            port.get("targetPort"),
            &child(&port_path, "targetPort"),
            out,
        );
        let node_port = port.get("nodePort").and_then(Value::as_i64).unwrap_or(0);
        if node_port != 0 && service_type == "ClusterIP" {
            out.push(forbidden(
                &child(&port_path, "nodePort"),
                "may not be used when `type` is 'ClusterIP'",
            ));
        }
        let protocol = str_of(port, "protocol");
        if !port_keys.insert((protocol.to_string(), number)) {
            // Kubernetes renders the internal ServicePort key it compares, fields by Go name.
            let rendered = serde_json::json!({
                "Name": "", "Protocol": protocol, "AppProtocol": null, "Port": number,
                "TargetPort": 0, "NodePort": 0,
            });
            out.push(duplicate(&port_path, &rendered));
        }
    }
    if let Some(selector) = map_of(spec, "selector") {
        meta::validate_labels(selector, "spec.selector", out);
    }
    let affinity = str_of(spec, "sessionAffinity");
    if !SESSION_AFFINITIES.contains(&affinity) {
        out.push(not_supported(
            "spec.sessionAffinity",
            &Value::from(affinity),
            SESSION_AFFINITIES,
        ));
    }
    if let Some(old) = old {
        validate_service_update(old.get("spec").unwrap_or(null()), spec, out);
    }
}

/// An IntOrString port: a number in range or an IANA port name.
pub(super) fn validate_port_number_or_name(port: Option<&Value>, path: &str, out: &mut Vec<Cause>) {
    match port {
        Some(Value::Number(n)) => {
            let number = n.as_i64().unwrap_or(0);
            for message in names::port_number(number) {
                out.push(invalid(path, &Value::from(number), &message));
            }
        }
        Some(Value::String(s)) => each(out, path, s, names::port_name(s)),
        Some(Value::Null) | None => {}
        Some(other) => out.push(invalid(path, other, "must be an integer or a string")),
    }
}

/// The cluster IP is fixed once allocated, unless the type moves to or from ExternalName.
fn validate_service_update(old_spec: &Value, new_spec: &Value, out: &mut Vec<Cause>) {
    if str_of(old_spec, "type") == "ExternalName" || str_of(new_spec, "type") == "ExternalName" {
        return;
    }
    let old_ips = array_of(old_spec, "clusterIPs");
    let new_ips = array_of(new_spec, "clusterIPs");
    if old_ips.len() == new_ips.len() {
        for (i, (o, n)) in old_ips.iter().zip(new_ips).enumerate() {
            if o != n {
                out.push(invalid(
                    &index("spec.clusterIPs", i),
                    &Value::Array(new_ips.to_vec()),
                    "may not change once set",
                ));
            }
        }
    }
    let old_ip = str_of(old_spec, "clusterIP");
    let new_ip = str_of(new_spec, "clusterIP");
    if !old_ip.is_empty() && !new_ip.is_empty() && old_ip != new_ip {
        out.push(invalid_str("spec.clusterIP", new_ip, IMMUTABLE_MESSAGE));
    }
}

/// Byte length a base64 string decodes to (Secret `data`, ConfigMap `binaryData`).
fn base64_decoded_len(text: &str) -> usize {
    let trimmed = text.trim_end_matches('=');
    trimmed.len() * 3 / 4
}

fn is_base64(text: &str) -> bool {
    text.len().is_multiple_of(4)
        && text.trim_end_matches('=').len() + 2 >= text.len()
        && text
            .trim_end_matches('=')
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
}

pub(super) fn validate_config_map(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let empty = serde_json::Map::new();
    let data = map_of(obj, "data").unwrap_or(&empty);
    let binary = map_of(obj, "binaryData").unwrap_or(&empty);
    let mut total_bytes = 0usize;
    for (k, v) in data {
        let path = key("data", k);
        each(out, &path, k, names::config_map_key(k));
        if binary.contains_key(k) {
            out.push(invalid_str(
                &path,
                k,
                "duplicate of key present in binaryData",
            ));
        }
        total_bytes += v.as_str().map_or(0, str::len);
    }
    for (k, v) in binary {
        let path = key("binaryData", k);
        each(out, &path, k, names::config_map_key(k));
        if data.contains_key(k) {
            out.push(invalid_str(&path, k, "duplicate of key present in data"));
        }
        let text = v.as_str().unwrap_or("");
        if !is_base64(text) {
            out.push(invalid_str(
                &path,
                "<binary data redacted>",
                "must be base64-encoded",
            ));
        }
        total_bytes += base64_decoded_len(text);
    }
    if total_bytes > DATA_BYTES_MAX {
        // Kubernetes reports the whole object, with an empty field path.
        out.push(too_long("", DATA_BYTES_MAX));
    }
    if let Some(old) = old {
        validate_immutable_data(old, obj, &["data", "binaryData"], out);
    }
}

/// `immutable: true` freezes the payload and itself.
fn validate_immutable_data(old: &Value, new: &Value, fields: &[&str], out: &mut Vec<Cause>) {
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return;
    }
    if new.get("immutable").and_then(Value::as_bool) != Some(true) {
        out.push(forbidden("immutable", IMMUTABLE_WHEN_SET));
    }
    for field in fields {
        let o = old.get(*field).unwrap_or(null());
        let n = new.get(*field).unwrap_or(null());
        if !json_equal_ignoring_empty(o, n) {
            out.push(forbidden(field, IMMUTABLE_WHEN_SET));
        }
    }
}

pub(super) fn validate_secret(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let empty = serde_json::Map::new();
    let data = map_of(obj, "data").unwrap_or(&empty);
    let mut total_bytes = 0usize;
    for (k, v) in data {
        let path = key("data", k);
        each(out, &path, k, names::config_map_key(k));
        let text = v.as_str().unwrap_or("");
        if !is_base64(text) {
            out.push(invalid_str(
                &path,
                "<secret contents redacted>",
                "must be base64-encoded",
            ));
        }
        total_bytes += base64_decoded_len(text);
    }
    if total_bytes > DATA_BYTES_MAX {
        out.push(too_long("data", DATA_BYTES_MAX));
    }
    let has = |k: &str| data.contains_key(k);
    match str_of(obj, "type") {
        "kubernetes.io/service-account-token" => {
            let meta = obj.get("metadata").unwrap_or(null());
            let name_key = "kubernetes.io/service-account.name";
            let annotations = meta.get("annotations").unwrap_or(null());
            if str_of(annotations, name_key).is_empty() {
                out.push(required(&key("metadata.annotations", name_key), ""));
            }
        }
        "kubernetes.io/dockercfg" if !has(".dockercfg") => {
            out.push(required("data[.dockercfg]", ""))
        }
        "kubernetes.io/dockerconfigjson" if !has(".dockerconfigjson") => {
            out.push(required("data[.dockerconfigjson]", ""));
        }
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            out.push(required("data[username]", ""));
            out.push(required("data[password]", ""));
        }
        "kubernetes.io/ssh-auth"
            if str_of(obj.get("data").unwrap_or(null()), "ssh-privatekey").is_empty() =>
        {
            out.push(required("data[ssh-privatekey]", ""));
        }
        "kubernetes.io/tls" => {
            for k in ["tls.crt", "tls.key"] {
                if !has(k) {
                    out.push(required(&key("data", k), ""));
                }
            }
        }
        _ => {}
    }
    if let Some(old) = old {
        let old_type = str_of(old, "type");
        let new_type = str_of(obj, "type");
        if old_type != new_type {
            out.push(invalid_str("type", new_type, IMMUTABLE_MESSAGE));
        }
        validate_immutable_data(old, obj, &["data"], out);
    }
}

pub(super) fn validate_namespace(obj: &Value, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    meta::validate_finalizers(array_of(spec, "finalizers"), "spec.finalizers", out);
}

pub(super) fn validate_node(obj: &Value, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    for (i, taint) in array_of(spec, "taints").iter().enumerate() {
        let path = index("spec.taints", i);
        let taint_key = str_of(taint, "key");
        if taint_key.is_empty() {
            out.push(required(&child(&path, "key"), ""));
        } else {
            each(
                out,
                &child(&path, "key"),
                taint_key,
                names::qualified_name(taint_key),
            );
        }
        let value = str_of(taint, "value");
        each(
            out,
            &child(&path, "value"),
            value,
            names::label_value(value),
        );
        let effect = str_of(taint, "effect");
        if effect.is_empty() {
            out.push(required(&child(&path, "effect"), ""));
        } else if !TAINT_EFFECTS.contains(&effect) {
            out.push(not_supported(
                &child(&path, "effect"),
                &Value::from(effect),
                TAINT_EFFECTS,
            ));
        }
    }
}

pub(super) fn validate_endpoints(obj: &Value, out: &mut Vec<Cause>) {
    for (i, subset) in array_of(obj, "subsets").iter().enumerate() {
        let subset_path = index("subsets", i);
        for list in ["addresses", "notReadyAddresses"] {
            for (j, address) in array_of(subset, list).iter().enumerate() {
                let ip = str_of(address, "ip");
                if ip.parse::<IpAddr>().is_err() {
                    out.push(invalid_str(
                        &child(&index(&child(&subset_path, list), j), "ip"),
                        ip,
                        "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                    ));
                }
            }
        }
        let ports = array_of(subset, "ports");
        for (j, port) in ports.iter().enumerate() {
            let port_path = index(&child(&subset_path, "ports"), j);
            let name = str_of(port, "name");
            if ports.len() > 1 && name.is_empty() {
                out.push(required(&child(&port_path, "name"), ""));
            } else if !name.is_empty() {
                each(
                    out,
                    &child(&port_path, "name"),
                    name,
                    names::dns1123_label(name),
                );
            }
            let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
            for message in names::port_number(number) {
                out.push(invalid(
                    &child(&port_path, "port"),
                    &Value::from(number),
                    &message,
                ));
            }
            validate_protocol(port, &port_path, out);
        }
    }
}

/// An Event's namespace must agree with its involved object's.
pub(super) fn validate_event(obj: &Value, out: &mut Vec<Cause>) {
    let namespace = str_of(obj.get("metadata").unwrap_or(null()), "namespace");
    let involved = str_of(obj.get("involvedObject").unwrap_or(null()), "namespace");
    let agrees = if involved.is_empty() {
        namespace.is_empty() || namespace == "default"
    } else {
        namespace == involved
    };
    if !agrees {
        out.push(invalid_str(
            "involvedObject.namespace",
            involved,
            "does not match event.namespace",
        ));
    }
}
