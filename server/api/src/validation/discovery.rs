//! EndpointSlices (discovery.k8s.io): an address type from a fixed set, fixed after
//! creation; addresses of that type; ports with unique DNS-label names.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::Value;

use super::pod::validate_protocol;
use super::{
    IMMUTABLE_MESSAGE, array_of, child, duplicate, each, index, invalid, invalid_str, names,
    not_supported, required, str_of, too_many,
};
use crate::Cause;

/// Address types, sorted as Kubernetes lists them.
const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
/// Endpoints per slice (discovery validation `maxEndpoints`): the EndpointSlice controller
/// splits larger sets, so each slice stays small enough to send in one watch event.
const ENDPOINTS_MAX: usize = 1000;
/// Addresses per endpoint (discovery validation `maxAddresses`).
const ADDRESSES_MAX: usize = 100;
/// Ports per slice (discovery validation `maxPorts`).
const PORTS_MAX: usize = 20_000;

pub(super) fn validate_endpoint_slice(obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let address_type = str_of(obj, "addressType");
    if address_type.is_empty() {
        out.push(required("addressType", ""));
    } else if !ADDRESS_TYPES.contains(&address_type) {
        out.push(not_supported(
            "addressType",
            &Value::from(address_type),
            ADDRESS_TYPES,
        ));
    }
    let endpoints = array_of(obj, "endpoints");
    if endpoints.len() > ENDPOINTS_MAX {
        out.push(too_many("endpoints", endpoints.len(), ENDPOINTS_MAX));
    }
    for (i, endpoint) in endpoints.iter().enumerate() {
        let addresses_path = child(&index("endpoints", i), "addresses");
        let addresses = array_of(endpoint, "addresses");
        if addresses.is_empty() {
            out.push(required(&addresses_path, "must contain at least 1 address"));
        } else if addresses.len() > ADDRESSES_MAX {
            out.push(too_many(&addresses_path, addresses.len(), ADDRESSES_MAX));
        }
        for (j, address) in addresses.iter().enumerate() {
            let text = address.as_str().unwrap_or("");
            let path = index(&addresses_path, j);
            match address_type {
                "IPv4" if text.parse::<Ipv4Addr>().is_err() => {
                    out.push(invalid_str(&path, text, "must be a valid IPv4 address"));
                }
                "IPv6" if text.parse::<Ipv6Addr>().is_err() => {
                    out.push(invalid_str(&path, text, "must be a valid IPv6 address"));
                }
                "FQDN" => each(out, &path, text, names::dns1123_subdomain(text)),
                _ => {}
            }
        }
    }
    let ports = array_of(obj, "ports");
    if ports.len() > PORTS_MAX {
        out.push(too_many("ports", ports.len(), PORTS_MAX));
    }
    let mut port_names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let port_path = index("ports", i);
        let name = str_of(port, "name");
        if !name.is_empty() {
            each(
                out,
                &child(&port_path, "name"),
                name,
                names::dns1123_label(name),
            );
        }
        if !port_names.insert(name.to_string()) {
            out.push(duplicate(&child(&port_path, "name"), &Value::from(name)));
        }
        validate_protocol(port, &port_path, out);
        if let Some(number) = port.get("port").and_then(Value::as_i64) {
            for message in names::port_number(number) {
                out.push(invalid(
                    &child(&port_path, "port"),
                    &Value::from(number),
                    &message,
                ));
            }
        }
    }
    if let Some(old) = old {
        let old_type = str_of(old, "addressType");
        if old_type != address_type {
            out.push(invalid_str("addressType", address_type, IMMUTABLE_MESSAGE));
        }
    }
}
