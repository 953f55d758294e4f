//! What a new cluster's apiserver writes once: the four system namespaces and the bootstrap
//! RBAC policy (default ClusterRoles with their aggregated rules, and their bindings). Each
//! object is created only if missing, so restarts and the other members' apiservers (which
//! all run this) change nothing that exists — a user's edit of a default role survives.

use serde_json::{Value, json};
use skerry_api::catalogue::lookup;
use skerry_api::{ApiError, meta};
use skerry_store::Store;

use crate::auth::bootstrap::{cluster_role_bindings, cluster_roles};
use crate::auth::rbac::aggregate_cluster_roles;
use crate::storage::{self, WriteError};

/// Namespaces every Kubernetes cluster has.
pub const SYSTEM_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

async fn create_if_missing(
    store: &Store,
    resource: &str,
    group: &str,
    mut object: Value,
) -> Result<(), ApiError> {
    let info = lookup(group, "v1", resource).expect("bootstrap resources are served");
    meta::prepare_create(info, &mut object, None)?;
    skerry_api::defaults::apply_defaults(info, &mut object);
    if resource == "namespaces" {
        object["status"] = json!({"phase": "Active"});
    }
    let name = meta::name(&object).to_string();
    match storage::create(store, info, None, &name, object).await {
        Ok(_) | Err(WriteError::AlreadyExists) => Ok(()),
        Err(e) => Err(e.into_api_error(info, &name)),
    }
}

/// Seeds the store. Safe to run on every start and on every member.
pub async fn bootstrap(store: &Store) -> Result<(), ApiError> {
    for ns in SYSTEM_NAMESPACES {
        create_if_missing(
            store,
            "namespaces",
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await?;
    }
    let mut roles = cluster_roles();
    aggregate_cluster_roles(&mut roles);
    for role in roles {
        let value = serde_json::to_value(&role).map_err(|e| ApiError::internal(e.to_string()))?;
        create_if_missing(store, "clusterroles", "rbac.authorization.k8s.io", value).await?;
    }
    for binding in cluster_role_bindings() {
        let value =
            serde_json::to_value(&binding).map_err(|e| ApiError::internal(e.to_string()))?;
        create_if_missing(
            store,
            "clusterrolebindings",
            "rbac.authorization.k8s.io",
            value,
        )
        .await?;
    }
    Ok(())
}
