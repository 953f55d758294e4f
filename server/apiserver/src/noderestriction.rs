//! The NodeRestriction admission plugin (Kubernetes'
//! `plugin/pkg/admission/noderestriction/admission.go`): what a node's kubelet may write.
//!
//! The Node authorizer ([`crate::node_authz`]) lets every node create and delete pods,
//! write pod status, and write Nodes and Leases, since it decides before the body is read;
//! this plugin, which sees the objects, narrows that to the node's own: mirror pods bound to
//! itself that reference no secret, configmap, service account or claim; status, deletion
//! and eviction of pods bound to itself; its own Node (without restricted labels, taints or
//! a configSource) and its own Lease; tokens only bound to a pod on itself. Every refusal is
//! a 403 worded as upstream's `admission.NewForbidden`: `<resource> "<name>" is forbidden:
//! <reason>`. Requests of non-nodes pass untouched.
//!
//! The verbs call it where they hold the objects: `admission::admit_create` /
//! `admit_update` (create and update, subresources included), `verbs::delete`, and the
//! `eviction` and `token` subresources.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;
use skerry_api::{ApiError, ResourceInfo};

use crate::auth::UserInfo;
use crate::handler::ApiServer;
use crate::node_authz::{NAMESPACE_NODE_LEASE, node_identity};
use crate::node_graph::{Kind, pod_references};

/// The annotation that marks a mirror pod (`api.MirrorPodAnnotationKey`).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The label namespace no kubelet may set (`v1.LabelNamespaceNodeRestriction`).
pub const LABEL_NAMESPACE_NODE_RESTRICTION: &str = "node-restriction.kubernetes.io";

/// The `kubernetes.io` / `k8s.io` labels a kubelet may set on its own Node
/// (`k8s.io/kubelet/pkg/apis` `kubeletLabels`).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// The label namespaces (and their subdomains) a kubelet may set (`kubeletLabelNamespaces`).
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The admission operation, as upstream spells it in its messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// One admission request as the plugin sees it.
pub struct Request<'a> {
    pub resource: &'a ResourceInfo,
    pub subresource: Option<&'a str>,
    pub operation: Operation,
    /// The name from the path (empty on a create; then the object's).
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    /// The new object (create, update).
    pub object: Option<&'a Value>,
    /// The stored object (update, delete).
    pub old: Option<&'a Value>,
    pub user: &'a UserInfo,
}

impl Request<'_> {
    /// upstream's `admission.NewForbidden`: the resource (group-qualified, never the
    /// subresource) and the name from the request, or else from the object.
    fn forbidden(&self, reason: impl std::fmt::Display) -> ApiError {
        let name = if self.name.is_empty() {
            self.object
                .and_then(|o| o.pointer("/metadata/name"))
                .and_then(Value::as_str)
                .unwrap_or("")
        } else {
            self.name
        };
        forbidden(self.resource, name, reason)
    }
}

fn forbidden(resource: &ResourceInfo, name: &str, reason: impl std::fmt::Display) -> ApiError {
    let qualified = skerry_api::status::qualified(resource.group, resource.resource);
    let message = if name.is_empty() {
        format!("{qualified} is forbidden: {reason}")
    } else {
        format!("{qualified} {name:?} is forbidden: {reason}")
    };
    let mut e = ApiError::forbidden(message);
    e.group = Some(resource.group.to_string());
    e.kind = Some(resource.resource.to_string());
    e.name = (!name.is_empty()).then(|| name.to_string());
    e
}

/// Admits one request (upstream's `Plugin.Admit`). A pod create needs the node's UID, read
/// from the nodes' watch cache (else the store).
pub async fn admit(server: &ApiServer, r: &Request<'_>) -> Result<(), ApiError> {
    let Some(node) = node_identity(r.user) else {
        return Ok(());
    };
    if node.is_empty() {
        return Err(r.forbidden(format!(
            "could not determine node from user {:?}",
            r.user.name
        )));
    }
    match (r.resource.group, r.resource.resource) {
        ("", "pods") => match r.subresource {
            None => match r.operation {
                Operation::Create => {
                    let pod = decode_pod(r, r.object)?;
                    let owner_uid = mirror_pod_owner(node, r, &pod)?;
                    let uid = node_uid(server, node).await?;
                    node_uid_matches(node, r, &owner_uid, uid.as_deref())?;
                    mirror_pod_references(node, r, &pod)
                }
                Operation::Delete => only_own_pods(node, r, "delete"),
                Operation::Update => Err(r.forbidden(format!(
                    "unexpected operation {:?}, node {node:?} can only create and delete mirror pods",
                    r.operation.as_str()
                ))),
            },
            Some("status") => admit_pod_status(node, r),
            Some("eviction") => admit_eviction(node, r),
            Some(other) => Err(r.forbidden(format!(
                "unexpected pod subresource {other:?}, only 'status' and 'eviction' are allowed"
            ))),
        },
        ("", "nodes") => admit_node(node, r),
        ("", "persistentvolumeclaims") => match r.subresource {
            // The claim's status is not served: nothing reaches here with it.
            Some("status") => Ok(()),
            _ => Err(r.forbidden("may only update PVC status")),
        },
        ("", "serviceaccounts") => admit_token(server, node, r).await,
        ("coordination.k8s.io", "leases") => admit_lease(node, r),
        _ => Ok(()),
    }
}

/// The node's UID, for the mirror pod's owner reference; `Ok(None)` never: a missing node is
/// upstream's 404.
async fn node_uid(server: &ApiServer, node: &str) -> Result<Option<String>, ApiError> {
    let nodes = skerry_api::catalogue::lookup("", "v1", "nodes").expect("nodes are served");
    let found = match server.caches.get("nodes").and_then(|c| c.get(None, node)) {
        Some(o) => Some(o),
        None => {
            server
                .timed(
                    "get",
                    nodes,
                    crate::storage::get(&server.store, nodes, None, node),
                )
                .await?
        }
    };
    match found {
        Some(o) => Ok(o
            .value()
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_string)),
        None => Err(ApiError::not_found("", "nodes", node)),
    }
}

fn decode_pod(r: &Request<'_>, value: Option<&Value>) -> Result<Pod, ApiError> {
    value
        .and_then(|v| Pod::deserialize(v).ok())
        .ok_or_else(|| r.forbidden("unexpected type: not a Pod"))
}

fn node_name_of(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// upstream's `admitPodCreate`: only mirror pods, bound to this node, owned by its Node,
/// referencing nothing the node could not read anyway. The node's UID is looked up only
/// once the checks before it passed, as upstream, so a node that does not exist yet is
/// refused for what it asked before a 404.
#[cfg(test)]
fn admit_pod_create(node: &str, node_uid: Option<&str>, r: &Request<'_>) -> Result<(), ApiError> {
    let pod = decode_pod(r, r.object)?;
    let owner_uid = mirror_pod_owner(node, r, &pod)?;
    node_uid_matches(node, r, &owner_uid, node_uid)?;
    mirror_pod_references(node, r, &pod)
}

/// The owner UID of a mirror pod that passed the checks before the node lookup.
fn mirror_pod_owner(node: &str, r: &Request<'_>, pod: &Pod) -> Result<String, ApiError> {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION));
    if !mirror {
        return Err(r.forbidden(format!(
            "pod does not have {MIRROR_POD_ANNOTATION:?} annotation, node {node:?} can only create mirror pods"
        )));
    }
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.node_name.as_deref()).unwrap_or("") != node {
        return Err(r.forbidden(format!(
            "node {node:?} can only create pods with spec.nodeName set to itself"
        )));
    }
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    match owners {
        [] => Err(r.forbidden(format!(
            "node {node:?} can only create pods with an owner reference set to itself"
        ))),
        [owner] => {
            if owner.api_version != "v1" || owner.kind != "Node" || owner.name != node {
                return Err(r.forbidden(format!(
                    "node {node:?} can only create pods with an owner reference set to itself"
                )));
            }
            if owner.controller != Some(true) {
                return Err(r.forbidden(format!(
                    "node {node:?} can only create pods with a controller owner reference set to itself"
                )));
            }
            if owner.block_owner_deletion == Some(true) {
                return Err(r.forbidden(format!(
                    "node {node:?} must not set blockOwnerDeletion on an owner reference"
                )));
            }
            Ok(owner.uid.clone())
        }
        _ => Err(r.forbidden(format!(
            "node {node:?} can only create pods with a single owner reference set to itself"
        ))),
    }
}

fn node_uid_matches(
    node: &str,
    r: &Request<'_>,
    owner_uid: &str,
    node_uid: Option<&str>,
) -> Result<(), ApiError> {
    let actual = node_uid.unwrap_or("");
    if owner_uid != actual {
        return Err(r.forbidden(format!(
            "node {node} UID mismatch: expected {owner_uid} got {actual}"
        )));
    }
    Ok(())
}

/// A mirror pod references no service account, secret, configmap, trust bundle or claim.
fn mirror_pod_references(node: &str, r: &Request<'_>, pod: &Pod) -> Result<(), ApiError> {
    let spec = pod.spec.as_ref();
    let references = pod_references(pod);
    let refers = |kind: Kind| references.iter().any(|(k, _)| *k == kind);
    if refers(Kind::ServiceAccount) {
        return Err(r.forbidden(format!(
            "node {node:?} can not create pods that reference a service account"
        )));
    }
    if refers(Kind::Secret) {
        return Err(r.forbidden(format!(
            "node {node:?} can not create pods that reference secrets"
        )));
    }
    if refers(Kind::ConfigMap) {
        return Err(r.forbidden(format!(
            "node {node:?} can not create pods that reference configmaps"
        )));
    }
    let trust_bundles = spec
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .any(|s| s.cluster_trust_bundle.is_some());
    if trust_bundles {
        return Err(r.forbidden(format!(
            "node {node:?} can not create pods that reference clustertrustbundles"
        )));
    }
    let claims = spec
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .any(|v| v.persistent_volume_claim.is_some());
    if claims {
        return Err(r.forbidden(format!(
            "node {node:?} can not create pods that reference persistentvolumeclaims"
        )));
    }
    Ok(())
}

/// A pod delete: only of a pod bound to this node.
fn only_own_pods(node: &str, r: &Request<'_>, verb: &str) -> Result<(), ApiError> {
    let old = r.old.map(node_name_of).unwrap_or("");
    if old != node {
        return Err(r.forbidden(format!(
            "node {node:?} can only {verb} pods with spec.nodeName set to itself"
        )));
    }
    Ok(())
}

/// upstream's `admitPodStatus`.
fn admit_pod_status(node: &str, r: &Request<'_>) -> Result<(), ApiError> {
    if r.operation != Operation::Update {
        return Err(r.forbidden(format!("unexpected operation {:?}", r.operation.as_str())));
    }
    let old = r.old.unwrap_or(&Value::Null);
    if node_name_of(old) != node {
        return Err(r.forbidden(format!(
            "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
        )));
    }
    let new = r.object.unwrap_or(&Value::Null);
    if labels(old) != labels(new) {
        return Err(r.forbidden(format!(
            "node {node:?} cannot update labels through pod status"
        )));
    }
    let claims = |v: &Value| v.pointer("/status/resourceClaimStatuses").cloned();
    if claims(old) != claims(new) {
        return Err(r.forbidden(format!(
            "node {node:?} cannot update resource claim statues"
        )));
    }
    Ok(())
}

/// upstream's `admitPodEviction`; `r.old` is the pod evicted.
fn admit_eviction(node: &str, r: &Request<'_>) -> Result<(), ApiError> {
    if r.operation != Operation::Create {
        return Err(r.forbidden(format!("unexpected operation {}", r.operation.as_str())));
    }
    if r.old.map(node_name_of).unwrap_or("") != node {
        return Err(r.forbidden(format!(
            "node {node} can only evict pods with spec.nodeName set to itself"
        )));
    }
    Ok(())
}

fn labels(object: &Value) -> std::collections::BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// upstream's `admitNode`: only its own Node; no configSource, no taint changes, no
/// restricted labels.
fn admit_node(node: &str, r: &Request<'_>) -> Result<(), ApiError> {
    let requested = if r.name.is_empty() {
        r.object
            .and_then(|o| o.pointer("/metadata/name"))
            .and_then(Value::as_str)
            .unwrap_or("")
    } else {
        r.name
    };
    if requested != node {
        return Err(r.forbidden(format!(
            "node {node:?} is not allowed to modify node {requested:?}"
        )));
    }
    let new = r.object.unwrap_or(&Value::Null);
    let config_source = |v: &Value| {
        v.pointer("/spec/configSource")
            .filter(|c| !c.is_null())
            .cloned()
    };
    match r.operation {
        Operation::Create => {
            if config_source(new).is_some() {
                return Err(r.forbidden(format!(
                    "node {node:?} is not allowed to create pods with a non-nil configSource"
                )));
            }
            let forbidden = forbidden_labels(&labels(new), &Default::default());
            if !forbidden.is_empty() {
                return Err(r.forbidden(format!(
                    "node {node:?} is not allowed to set the following labels: {}",
                    forbidden.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        Operation::Update => {
            let old = r.old.unwrap_or(&Value::Null);
            if config_source(new).is_some() && config_source(new) != config_source(old) {
                return Err(r.forbidden(format!(
                    "node {node:?} is not allowed to update configSource to a new non-nil configSource"
                )));
            }
            let taints = |v: &Value| {
                v.pointer("/spec/taints")
                    .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
                    .cloned()
            };
            if taints(new) != taints(old) {
                return Err(r.forbidden(format!("node {node:?} is not allowed to modify taints")));
            }
            let forbidden = forbidden_labels(&labels(new), &labels(old));
            if !forbidden.is_empty() {
                return Err(r.forbidden(format!(
                    "is not allowed to modify labels: {}",
                    forbidden.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        Operation::Delete => {}
    }
    Ok(())
}

/// The keys added, removed or changed between `a` and `b` that a kubelet may not touch
/// (upstream's `getModifiedLabels` + `getForbiddenLabels`), sorted as Go's `sets.List`.
pub fn forbidden_labels(
    a: &std::collections::BTreeMap<String, String>,
    b: &std::collections::BTreeMap<String, String>,
) -> BTreeSet<String> {
    let modified = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .chain(b.iter().filter(|(k, v)| a.get(*k) != Some(*v)))
        .map(|(k, _)| k);
    modified
        .filter(|key| {
            let namespace = key.split_once('/').map(|(ns, _)| ns).unwrap_or("");
            let restricted = in_domain(namespace, LABEL_NAMESPACE_NODE_RESTRICTION);
            let kubernetes =
                in_domain(namespace, "kubernetes.io") || in_domain(namespace, "k8s.io");
            restricted || (kubernetes && !is_kubelet_label(key, namespace))
        })
        .cloned()
        .collect()
}

/// `namespace` is `domain` or one of its subdomains.
fn in_domain(namespace: &str, domain: &str) -> bool {
    namespace == domain
        || namespace
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// upstream's `kubeletapis.IsKubeletLabel`.
fn is_kubelet_label(key: &str, namespace: &str) -> bool {
    KUBELET_LABELS.contains(&key)
        || KUBELET_LABEL_NAMESPACES
            .iter()
            .any(|allowed| in_domain(namespace, allowed))
}

/// upstream's `admitServiceAccount`: a node's token must be bound to a pod on itself.
async fn admit_token(server: &ApiServer, node: &str, r: &Request<'_>) -> Result<(), ApiError> {
    if r.operation != Operation::Create || r.subresource != Some("token") {
        return Ok(());
    }
    let body = r.object.unwrap_or(&Value::Null);
    let reference = body
        .pointer("/spec/boundObjectRef")
        .filter(|v| !v.is_null());
    let field = |name: &str| {
        reference
            .and_then(|v| v.get(name))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    if reference.is_none()
        || field("apiVersion") != "v1"
        || field("kind") != "Pod"
        || field("name").is_empty()
    {
        return Err(r.forbidden("node requested token not bound to a pod"));
    }
    let uid = field("uid");
    if uid.is_empty() {
        return Err(r.forbidden("node requested token with a pod binding without a uid"));
    }
    let pods = skerry_api::catalogue::lookup("", "v1", "pods").expect("pods are served");
    let namespace = r.namespace.unwrap_or("");
    let pod = crate::verbs::current(server, pods, Some(namespace), field("name")).await?;
    if pod.value().pointer("/metadata/uid").and_then(Value::as_str) != Some(uid) {
        return Err(r.forbidden(format!(
            "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
        )));
    }
    if node_name_of(pod.value()) != node {
        return Err(
            r.forbidden("node requested token bound to a pod scheduled on a different node")
        );
    }
    Ok(())
}

/// upstream's `admitLease`.
fn admit_lease(node: &str, r: &Request<'_>) -> Result<(), ApiError> {
    if r.namespace != Some(NAMESPACE_NODE_LEASE) {
        return Err(r.forbidden(format!(
            "can only access leases in the {NAMESPACE_NODE_LEASE:?} system namespace"
        )));
    }
    let name = if r.operation == Operation::Create {
        r.object
            .and_then(|o| o.pointer("/metadata/name"))
            .and_then(Value::as_str)
            .unwrap_or("")
    } else {
        r.name
    };
    if name != node {
        return Err(
            r.forbidden("can only access node lease with the same name as the requesting node")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node_user(name: &str) -> UserInfo {
        UserInfo::authenticated(
            format!("system:node:{name}"),
            "",
            vec![crate::node_authz::NODES_GROUP.into()],
        )
    }

    fn resource(group: &str, name: &str) -> &'static ResourceInfo {
        skerry_api::catalogue::lookup(group, "v1", name).expect("served")
    }

    fn mirror(node: &str) -> Value {
        json!({
            "metadata": {"name": "static-web-a", "namespace": "default",
                         "annotations": {MIRROR_POD_ANNOTATION: "hash"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                              "uid": "uid-a", "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}
        })
    }

    fn create_pod(user: &UserInfo, pod: &Value) -> Result<(), ApiError> {
        let r = Request {
            resource: resource("", "pods"),
            subresource: None,
            operation: Operation::Create,
            name: "",
            namespace: Some("default"),
            object: Some(pod),
            old: None,
            user,
        };
        admit_pod_create("a", Some("uid-a"), &r)
    }

    fn message(r: Result<(), ApiError>) -> String {
        let e = r.expect_err("refused");
        assert_eq!(e.code, 403);
        e.message
    }

    #[test]
    fn a_node_creates_only_clean_mirror_pods_of_its_own() {
        let a = node_user("a");
        create_pod(&a, &mirror("a")).expect("a mirror pod of its own");
        let mut plain = mirror("a");
        plain["metadata"]["annotations"] = json!({});
        assert_eq!(
            message(create_pod(&a, &plain)),
            "pods \"static-web-a\" is forbidden: pod does not have \"kubernetes.io/config.mirror\" annotation, node \"a\" can only create mirror pods"
        );
        assert_eq!(
            message(create_pod(&a, &mirror("b"))),
            "pods \"static-web-a\" is forbidden: node \"a\" can only create pods with spec.nodeName set to itself"
        );
        let mut secret = mirror("a");
        secret["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "x"}}]);
        assert_eq!(
            message(create_pod(&a, &secret)),
            "pods \"static-web-a\" is forbidden: node \"a\" can not create pods that reference secrets"
        );
        let mut config = mirror("a");
        config["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "x"}}]);
        assert!(
            message(create_pod(&a, &config))
                .ends_with("can not create pods that reference configmaps")
        );
        let mut account = mirror("a");
        account["spec"]["serviceAccountName"] = json!("default");
        assert!(
            message(create_pod(&a, &account))
                .ends_with("can not create pods that reference a service account")
        );
        let mut wrong_uid = mirror("a");
        wrong_uid["metadata"]["ownerReferences"][0]["uid"] = json!("other");
        assert!(
            message(create_pod(&a, &wrong_uid))
                .ends_with("node a UID mismatch: expected other got uid-a")
        );
    }

    #[test]
    fn pod_status_only_of_its_own_pods_and_without_labels() {
        let b = node_user("b");
        let old = mirror("a");
        let r = Request {
            resource: resource("", "pods"),
            subresource: Some("status"),
            operation: Operation::Update,
            name: "static-web-a",
            namespace: Some("default"),
            object: Some(&old),
            old: Some(&old),
            user: &b,
        };
        assert_eq!(
            message(admit_pod_status("b", &r)),
            "pods \"static-web-a\" is forbidden: node \"b\" can only update pod status for pods with spec.nodeName set to itself"
        );
        admit_pod_status("a", &r).expect("its own pod");
        let mut relabelled = mirror("a");
        relabelled["metadata"]["labels"] = json!({"x": "y"});
        let r = Request {
            object: Some(&relabelled),
            ..r
        };
        assert!(
            message(admit_pod_status("a", &r)).ends_with("cannot update labels through pod status")
        );
    }

    #[test]
    fn deletion_and_eviction_only_of_its_own_pods() {
        let b = node_user("b");
        let pod = mirror("a");
        let eviction = json!({"metadata": {"name": "static-web-a", "namespace": "default"}});
        let r = Request {
            resource: resource("", "pods"),
            subresource: Some("eviction"),
            operation: Operation::Create,
            name: "static-web-a",
            namespace: Some("default"),
            object: Some(&eviction),
            old: Some(&pod),
            user: &b,
        };
        assert_eq!(
            message(admit_eviction("b", &r)),
            "pods \"static-web-a\" is forbidden: node b can only evict pods with spec.nodeName set to itself"
        );
        admit_eviction("a", &r).expect("its own pod");
        let r = Request {
            subresource: None,
            operation: Operation::Delete,
            object: None,
            ..r
        };
        assert_eq!(
            message(only_own_pods("b", &r, "delete")),
            "pods \"static-web-a\" is forbidden: node \"b\" can only delete pods with spec.nodeName set to itself"
        );
        only_own_pods("a", &r, "delete").expect("its own pod");
    }

    #[test]
    fn restricted_labels() {
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let old = map(&[("kubernetes.io/hostname", "a")]);
        let new = map(&[
            ("kubernetes.io/hostname", "a2"),
            ("node.kubernetes.io/instance-type", "x"),
            ("foo.node.kubernetes.io/ok", "x"),
            ("node-restriction.kubernetes.io/tier", "gold"),
            ("sub.node-restriction.kubernetes.io/x", "y"),
            ("node-role.kubernetes.io/control-plane", ""),
            ("example.com/free", "x"),
            ("k8s.io/nope", "x"),
        ]);
        let got: Vec<String> = forbidden_labels(&new, &old).into_iter().collect();
        assert_eq!(
            got,
            [
                "k8s.io/nope",
                "node-restriction.kubernetes.io/tier",
                "node-role.kubernetes.io/control-plane",
                "sub.node-restriction.kubernetes.io/x",
            ]
        );
        // Removing a restricted label is a modification too.
        let removed = forbidden_labels(
            &Default::default(),
            &map(&[("node-restriction.kubernetes.io/x", "1")]),
        );
        assert_eq!(removed.len(), 1);
    }

    #[test]
    fn nodes_and_leases_only_their_own() {
        let a = node_user("a");
        let node_b = json!({"metadata": {"name": "b"}});
        let r = Request {
            resource: resource("", "nodes"),
            subresource: Some("status"),
            operation: Operation::Update,
            name: "b",
            namespace: None,
            object: Some(&node_b),
            old: Some(&node_b),
            user: &a,
        };
        assert_eq!(
            message(admit_node("a", &r)),
            "nodes \"b\" is forbidden: node \"a\" is not allowed to modify node \"b\""
        );
        let tainted_old = json!({"metadata": {"name": "a"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
        let untainted = json!({"metadata": {"name": "a"}, "spec": {}});
        let r = Request {
            name: "a",
            object: Some(&untainted),
            old: Some(&tainted_old),
            ..r
        };
        assert!(message(admit_node("a", &r)).ends_with("is not allowed to modify taints"));
        let lease = json!({"metadata": {"name": "b", "namespace": "kube-node-lease"}});
        let r = Request {
            resource: resource("coordination.k8s.io", "leases"),
            subresource: None,
            operation: Operation::Create,
            name: "",
            namespace: Some("kube-node-lease"),
            object: Some(&lease),
            old: None,
            user: &a,
        };
        assert_eq!(
            message(admit_lease("a", &r)),
            "leases.coordination.k8s.io \"b\" is forbidden: can only access node lease with the same name as the requesting node"
        );
    }
}
