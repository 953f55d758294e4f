//! Admission: the checks that run after decoding and validation and before the store write.
//!
//! Today: OwnerReferencesPermissionEnforcement — setting `blockOwnerDeletion` on an owner
//! reference needs `update` on the owner's `finalizers`, decided with the seed's single
//! wildcard probe first ("One Wildcard RBAC Probe Instead of N Authorizations",
//! [`crate::auth::rbac::can_set_blocking_owner_finalizers`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;
use skerry_api::catalogue::RESOURCES;
use skerry_api::{ApiError, ResourceInfo};

use crate::auth::UserInfo;
use crate::auth::rbac::{can_set_blocking_owner_finalizers, new_blocking_owner_refs};
use crate::handler::ApiServer;

fn owner_refs(object: &Value) -> Vec<OwnerReference> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

fn check_owner_refs(
    server: &ApiServer,
    resource: &ResourceInfo,
    old: Option<&Value>,
    new: &Value,
    user: &UserInfo,
) -> Result<(), ApiError> {
    let new_refs = owner_refs(new);
    if new_refs.is_empty() {
        return Ok(());
    }
    let old_refs = old.map(owner_refs);
    let blocking = new_blocking_owner_refs(&new_refs, old_refs.as_deref());
    if blocking.is_empty() {
        return Ok(());
    }
    let namespace = new
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut resolve = |owner: &OwnerReference| -> Result<Vec<String>, String> {
        let found: Vec<String> = RESOURCES
            .iter()
            .filter(|r| r.kind == owner.kind && r.api_version() == owner.api_version)
            .map(|r| r.resource.to_string())
            .collect();
        if found.is_empty() {
            Err("no matches for kind".to_string())
        } else {
            Ok(found)
        }
    };
    let decision = can_set_blocking_owner_finalizers(
        user,
        namespace,
        &blocking,
        &mut resolve,
        server.rbac.as_ref(),
    );
    if decision.allowed {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "{} {:?} is forbidden: {}",
            skerry_api::status::qualified(resource.group, resource.resource),
            new.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            decision.reason
        )))
    }
}

/// Admission for a create.
pub async fn admit_create(
    server: &ApiServer,
    resource: &ResourceInfo,
    object: &mut Value,
    user: &UserInfo,
) -> Result<(), ApiError> {
    check_owner_refs(server, resource, None, object, user)
}

/// Admission for an update.
pub async fn admit_update(
    server: &ApiServer,
    resource: &ResourceInfo,
    old: &Value,
    new: &mut Value,
    user: &UserInfo,
) -> Result<(), ApiError> {
    check_owner_refs(server, resource, Some(old), new, user)
}
