//! What a new cluster's apiserver writes once: the four system namespaces, the bootstrap
//! RBAC policy (default ClusterRoles with their aggregated rules, and their bindings), the
//! built-in PriorityClasses (`system-node-critical`, `system-cluster-critical`) and the
//! `kubernetes` Service. Each
//! object is created only if missing, so restarts and the other members' apiservers (which
//! all run this) change nothing that exists — a user's edit of a default role survives.

use serde_json::{Value, json};
use skerry_api::catalogue::lookup;
use skerry_api::validation::scheduling::SYSTEM_PRIORITY_CLASSES;
use skerry_api::{ApiError, meta};
use skerry_store::Store;

use crate::auth::bootstrap::{cluster_role_bindings, cluster_roles};
use crate::auth::rbac::aggregate_cluster_roles;
use crate::ipalloc::{self, ServiceCidr};
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

/// The port the `kubernetes` Service exposes (443, as in every cluster) and the port it
/// reaches on the apiservers.
const KUBERNETES_SERVICE_PORT: u16 = 443;

/// The `kubernetes` Service in `default`, at the first address of the Service range, as
/// every cluster has it (in-cluster clients find the API through it).
async fn kubernetes_service(
    store: &Store,
    cidr: &ServiceCidr,
    api_port: u16,
) -> Result<(), ApiError> {
    let info = lookup("", "v1", "services").expect("services are served");
    let ip = cidr.first().to_string();
    let mut object = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ports": [{"name": "https", "port": KUBERNETES_SERVICE_PORT, "protocol": "TCP", "targetPort": api_port}],
            "sessionAffinity": "None",
        },
    });
    meta::prepare_create(info, &mut object, Some("default"))?;
    skerry_api::defaults::apply_defaults(info, &mut object);
    let claim = (
        ipalloc::claim_key(cidr.first()),
        ipalloc::claim_value(cidr.first(), "default", "kubernetes"),
    );
    match storage::create_claiming(store, info, Some("default"), "kubernetes", object, &[claim])
        .await
    {
        Ok(_) | Err(WriteError::AlreadyExists) => Ok(()),
        Err(WriteError::ClaimTaken { key }) => Err(ApiError::internal(format!(
            "the kubernetes Service's address {key} is held by another Service"
        ))),
        Err(e) => Err(e.into_api_error(info, "kubernetes")),
    }
}

/// Seeds the store. Safe to run on every start and on every member.
pub async fn bootstrap(store: &Store, cidr: &ServiceCidr, api_port: u16) -> Result<(), ApiError> {
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
    // kube-apiserver's `scheduling/bootstrap-system-priority-classes` post-start hook.
    for class in SYSTEM_PRIORITY_CLASSES {
        create_if_missing(
            store,
            "priorityclasses",
            "scheduling.k8s.io",
            json!({
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": class.name},
                "value": class.value,
                "description": class.description,
            }),
        )
        .await?;
    }
    kubernetes_service(store, cidr, api_port).await
}
