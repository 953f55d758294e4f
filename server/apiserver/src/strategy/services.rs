//! Services (`pkg/registry/core/service/storage`): a Service that wants a ClusterIP claims
//! one in its create transaction — the address it asks for, or one the allocator picks
//! ([`crate::ipalloc`]) — and a NodePort or LoadBalancer Service claims its node ports
//! ([`crate::portalloc`]) in the same transaction, on create and on every update that
//! changes them; the delete transaction releases them all. An update that leaves the
//! allocated values out keeps them; one that turns the Service into a ClusterIP releases its
//! node ports.

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::{Value, json};
use skerry_api::ApiError;

use super::{Allocation, Ctx, Strategy};
use crate::handler::ApiServer;
use crate::ipalloc;
use crate::portalloc::{self, Assignment};
use crate::storage;

/// The fields the allocator fills.
const ALLOCATED_FIELDS: [&str; 2] = ["clusterIP", "clusterIPs"];

/// What a lost race reports after every attempt (the ClusterIP's wording covers both).
const WHAT: &str = "a serviceIP or nodePort";

/// The Service strategy.
pub struct Services;

impl Strategy for Services {
    fn allocate(
        &self,
        server: &ApiServer,
        ctx: &Ctx<'_>,
        name: &str,
        object: &Value,
    ) -> Result<Option<Allocation>, ApiError> {
        let namespace = ctx.namespace.unwrap_or("");
        let mut object = object.clone();
        let mut claims = Vec::new();
        if ipalloc::wants_cluster_ip(&object) {
            let ip = cluster_ip(server, &object, name)?;
            object["spec"]["clusterIP"] = json!(ip.to_string());
            object["spec"]["clusterIPs"] = json!([ip.to_string()]);
            claims.push((
                ipalloc::claim_key(ip),
                ipalloc::claim_value(ip, namespace, name),
            ));
        }
        if portalloc::wants_node_ports(&object) || portalloc::needs_health_check(&object) {
            let used = used_node_ports(server)?;
            let assignment = portalloc::assign(
                &server.node_port_range,
                None,
                &mut object,
                &used,
                name,
                &mut rand::rng(),
            )?;
            claims.extend(port_claims(&assignment, namespace, name));
        }
        if claims.is_empty() {
            return Ok(None);
        }
        // Every asked-for value was checked against the claims just read: a claim taken
        // since was taken by a concurrent write, and the next attempt reports it.
        Ok(Some(Allocation {
            object,
            claims,
            if_taken: None,
            what: WHAT,
            releases: Vec::new(),
        }))
    }

    fn allocate_update(
        &self,
        server: &ApiServer,
        ctx: &Ctx<'_>,
        name: &str,
        old: &Value,
        new: &Value,
    ) -> Result<Option<Allocation>, ApiError> {
        if ctx.subresource.is_some() {
            // The status subresource keeps the spec it found.
            return Ok(None);
        }
        let touches_ports =
            |s: &Value| portalloc::wants_node_ports(s) || portalloc::needs_health_check(s);
        if !touches_ports(old) && !touches_ports(new) {
            return Ok(None);
        }
        let mut object = new.clone();
        let used = used_node_ports(server)?;
        let assignment = portalloc::assign(
            &server.node_port_range,
            Some(old),
            &mut object,
            &used,
            name,
            &mut rand::rng(),
        )?;
        if assignment == Assignment::default() {
            return Ok(None);
        }
        Ok(Some(Allocation {
            object,
            claims: port_claims(&assignment, ctx.namespace.unwrap_or(""), name),
            if_taken: None,
            what: WHAT,
            releases: assignment
                .releases
                .iter()
                .map(portalloc::claim_key)
                .collect(),
        }))
    }

    /// An update that leaves the allocated values out keeps them (Kubernetes'
    /// `PatchAllocatedValues`): kubectl apply never sends what the server allocated.
    fn prepare_for_update(&self, ctx: &Ctx<'_>, old: &Value, new: &mut Value) {
        skerry_api::meta::prepare_update(ctx.resource, old, new, ctx.subresource);
        for field in ALLOCATED_FIELDS {
            let missing = new["spec"]
                .get(field)
                .is_none_or(|v| v.is_null() || v == "");
            if missing && let Some(v) = old["spec"].get(field) {
                new["spec"][field] = v.clone();
            }
        }
        portalloc::prepare_update(old, new);
    }

    fn held_claims(&self, object: &Value) -> Vec<String> {
        let mut held = ipalloc::held_claims(object);
        held.extend(portalloc::held(object).iter().map(portalloc::claim_key));
        held
    }
}

/// The ClusterIP a new Service gets: the one it asks for if free, else a picked one.
fn cluster_ip(
    server: &ApiServer,
    object: &Value,
    name: &str,
) -> Result<std::net::Ipv4Addr, ApiError> {
    let requested = ipalloc::requested(&server.service_cidr, object, name)?;
    let used = used_cluster_ips(server)?;
    if let Some(ip) = requested {
        let offset = server.service_cidr.offset(ip);
        if offset.is_some_and(|o| used.contains(&o)) {
            return Err(ipalloc::already_allocated(ip, name));
        }
        return Ok(ip);
    }
    let offset = ipalloc::pick(&server.service_cidr, &used, &mut rand::rng()).ok_or_else(|| {
        ApiError::internal(format!(
            "failed to allocate a serviceIP: range is full ({})",
            server.service_cidr
        ))
    })?;
    Ok(server.service_cidr.address(offset))
}

/// The claim keys and values of the ports an assignment claims.
fn port_claims(assignment: &Assignment, namespace: &str, name: &str) -> Vec<(String, Bytes)> {
    assignment
        .claims
        .iter()
        .map(|p| {
            (
                portalloc::claim_key(p),
                portalloc::claim_value(p, namespace, name),
            )
        })
        .collect()
}

/// The keys under `prefix`, without it.
fn claimed(server: &ApiServer, prefix: &str) -> Result<Vec<String>, ApiError> {
    let resp = server
        .store
        .range(&skerry_store::pb::etcdserverpb::RangeRequest {
            key: Bytes::from(prefix.to_string()),
            range_end: Bytes::from(storage::prefix_end(prefix)),
            keys_only: true,
            serializable: true,
            ..Default::default()
        })
        .map_err(storage::store_error)?;
    Ok(resp
        .kvs
        .iter()
        .filter_map(|kv| std::str::from_utf8(&kv.key).ok())
        .map(str::to_string)
        .collect())
}

/// The offsets of every claimed ClusterIP.
fn used_cluster_ips(server: &ApiServer) -> Result<BTreeSet<u32>, ApiError> {
    let prefix = ipalloc::CLAIM_PREFIX;
    Ok(claimed(server, prefix)?
        .iter()
        .filter_map(|k| k.strip_prefix(prefix))
        .filter_map(|ip| ip.parse().ok())
        .filter_map(|ip| server.service_cidr.offset(ip))
        .collect())
}

/// Every claimed node port, by protocol.
fn used_node_ports(server: &ApiServer) -> Result<BTreeSet<portalloc::NodePort>, ApiError> {
    Ok(claimed(server, portalloc::CLAIM_PREFIX)?
        .iter()
        .filter_map(|k| portalloc::parse_claim_key(k))
        .collect())
}
