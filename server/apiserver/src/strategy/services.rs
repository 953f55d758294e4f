//! Services (`pkg/registry/core/service/storage`): a Service that wants a ClusterIP claims
//! one in its create transaction — the address it asks for, or one the allocator picks
//! ([`crate::ipalloc`]) — and releases it in its delete transaction; an update that leaves
//! the allocated addresses out keeps them.

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::{Value, json};
use skerry_api::ApiError;

use super::{Allocation, Ctx, Strategy};
use crate::handler::ApiServer;
use crate::ipalloc;
use crate::storage;

/// The fields the allocator fills.
const ALLOCATED_FIELDS: [&str; 2] = ["clusterIP", "clusterIPs"];

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
        if !ipalloc::wants_cluster_ip(object) {
            return Ok(None);
        }
        let requested = ipalloc::requested(&server.service_cidr, object, name)?;
        let ip = match requested {
            Some(ip) => ip,
            None => {
                let used = used_cluster_ips(server)?;
                let offset = ipalloc::pick(&server.service_cidr, &used, &mut rand::rng())
                    .ok_or_else(|| {
                        ApiError::internal(format!(
                            "failed to allocate a serviceIP: range is full ({})",
                            server.service_cidr
                        ))
                    })?;
                server.service_cidr.address(offset)
            }
        };
        let mut object = object.clone();
        object["spec"]["clusterIP"] = json!(ip.to_string());
        object["spec"]["clusterIPs"] = json!([ip.to_string()]);
        let claim = (
            ipalloc::claim_key(ip),
            ipalloc::claim_value(ip, ctx.namespace.unwrap_or(""), name),
        );
        Ok(Some(Allocation {
            object,
            claims: vec![claim],
            if_taken: requested.map(|ip| ipalloc::already_allocated(ip, name)),
            what: "a serviceIP",
        }))
    }

    /// An update that leaves the allocated addresses out keeps them (Kubernetes'
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
    }

    fn held_claims(&self, object: &Value) -> Vec<String> {
        ipalloc::held_claims(object)
    }
}

/// The offsets of every claimed ClusterIP.
fn used_cluster_ips(server: &ApiServer) -> Result<BTreeSet<u32>, ApiError> {
    let prefix = ipalloc::CLAIM_PREFIX;
    let resp = server
        .store
        .range(&skerry_store::pb::etcdserverpb::RangeRequest {
            key: Bytes::from(prefix),
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
        .filter_map(|k| k.strip_prefix(prefix))
        .filter_map(|ip| ip.parse().ok())
        .filter_map(|ip| server.service_cidr.offset(ip))
        .collect())
}
