//! The Node authorizer (Kubernetes' `plugin/pkg/auth/authorizer/node/node_authorizer.go`)
//! and the authorizer chain every decision goes through: `system:masters`, then Node, then
//! RBAC — kube-apiserver's `--authorization-mode=Node,RBAC` behind its privileged-group
//! authorizer.
//!
//! A node (`system:node:<name>` in `system:nodes`, [`node_identity`]) may read a secret,
//! configmap or persistentvolumeclaim, and create a token for a service account, only when
//! one of the pods bound to it references that object ([`crate::node_graph`]); a
//! PersistentVolume only when it is bound to such a claim, and that volume's secrets; it may reach
//! only its own Lease in `kube-node-lease`; everything else it asks is decided by the node
//! rules (`bootstrappolicy.NodeRules()`, [`crate::auth::bootstrap::node_rules`]). What the
//! authorizer refuses is "no opinion", as upstream: RBAC may still grant it, and the 403
//! carries the reasons of both, joined as kube-apiserver's union authorizer joins them.
//!
//! Pods and Nodes are decided as upstream with its `AuthorizeNodeWithSelectors` gate (beta,
//! on by default in 1.32): a node reads only its own Node (get, or list/watch with
//! `fieldSelector=metadata.name=<self>`, which the request's attributes carry as its name),
//! gets only the pods bound to it, lists and watches pods only with
//! `fieldSelector=spec.nodeName=<self>`; it may create, update and patch Nodes and their
//! status, and create and delete pods, update their status and evict them, which
//! NodeRestriction ([`crate::noderestriction`]) narrows to its own. Anything else on pods and
//! nodes is no opinion, without the node rules.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::PolicyRule;
use parking_lot::Mutex;

use crate::auth::rbac::{self, Attributes, Decision, RbacSource};
use crate::auth::{GROUP_MASTERS, UserInfo};
use crate::node_graph::{Graph, Kind};
use crate::watch_cache::WatchCache;

/// The prefix of a node's user name (Kubernetes' `pkg/auth/nodeidentifier/default.go`).
pub const NODE_USER_PREFIX: &str = "system:node:";

/// The group every node is in (`user.NodesGroup`).
pub const NODES_GROUP: &str = "system:nodes";

/// The namespace of the nodes' heartbeat Leases (`api.NamespaceNodeLease`).
pub const NAMESPACE_NODE_LEASE: &str = "kube-node-lease";

/// Whether `user` is a node, and which (Kubernetes' default `NodeIdentifier`): `None` for a
/// non-node; `Some("")` for a node whose name could not be told (`system:node:` alone).
pub fn node_identity(user: &UserInfo) -> Option<&str> {
    let name = user.name.strip_prefix(NODE_USER_PREFIX)?;
    user.in_group(NODES_GROUP).then_some(name)
}

/// The Node authorizer's answer: allow, or no opinion with the reason (possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeDecision {
    Allow,
    NoOpinion(String),
}

/// The Node authorizer over the pods' watch cache.
pub struct NodeAuthorizer {
    /// The pods' watch cache the graph follows; `None` for a graph set by hand (tests).
    pods: Option<Arc<WatchCache>>,
    /// The PersistentVolumes' watch cache, when the apiserver serves them.
    volumes: Option<Arc<WatchCache>>,
    /// The graph and the pods' and volumes' cache resourceVersions it was brought to.
    graph: Mutex<(i64, i64, Graph)>,
    rules: Vec<PolicyRule>,
}

impl NodeAuthorizer {
    /// An authorizer whose graph follows `pods` and, when served, the PersistentVolumes'
    /// cache `volumes`.
    pub fn new(pods: Arc<WatchCache>, volumes: Option<Arc<WatchCache>>) -> Self {
        NodeAuthorizer {
            pods: Some(pods),
            volumes,
            graph: Mutex::new((-1, -1, Graph::default())),
            rules: crate::auth::bootstrap::node_rules(),
        }
    }

    /// An authorizer over a fixed graph.
    pub fn with_graph(graph: Graph) -> Self {
        NodeAuthorizer {
            pods: None,
            volumes: None,
            graph: Mutex::new((0, 0, graph)),
            rules: crate::auth::bootstrap::node_rules(),
        }
    }

    /// Whether one of `node`'s pods references `kind` `namespace/name`, the graph first
    /// brought to the pods' cache if that has moved.
    fn has_path(&self, node: &str, kind: Kind, namespace: &str, name: &str) -> bool {
        let mut state = self.graph.lock();
        if let Some(pods) = &self.pods
            && pods.is_ready()
        {
            // The version is read before the items: if the cache moves in between, the
            // graph is newer than the version it records and the next decision syncs again.
            let version = pods.resource_version();
            if state.0 != version {
                state.2.sync(pods.items());
                state.0 = version;
            }
        }
        if let Some(volumes) = &self.volumes
            && volumes.is_ready()
        {
            let version = volumes.resource_version();
            if state.1 != version {
                state.2.sync_volumes(volumes.items());
                state.1 = version;
            }
        }
        state.2.has_path(node, kind, namespace, name)
    }

    /// Decides `a` (Kubernetes' `NodeAuthorizer.Authorize`).
    pub fn authorize(&self, a: &Attributes) -> NodeDecision {
        let Some(node) = node_identity(&a.user) else {
            return NodeDecision::NoOpinion(String::new());
        };
        if node.is_empty() {
            return NodeDecision::NoOpinion(format!("unknown node for user {:?}", a.user.name));
        }
        if a.is_resource_request() {
            match (a.api_group.as_str(), a.resource.as_str()) {
                ("", "secrets") => return self.read_namespaced(node, Kind::Secret, a),
                ("", "configmaps") => return self.read_namespaced(node, Kind::ConfigMap, a),
                ("", "persistentvolumeclaims") => {
                    if a.subresource == "status" {
                        return self.status_update(node, a);
                    }
                    return self.get(node, Kind::PersistentVolumeClaim, a);
                }
                ("", "persistentvolumes") => return self.get(node, Kind::PersistentVolume, a),
                ("", "serviceaccounts") => return self.create_token(node, a),
                ("coordination.k8s.io", "leases") => return lease(node, a),
                ("", "nodes") => return authorize_node(node, a),
                ("", "pods") => return self.authorize_pod(node, a),
                _ => {}
            }
        }
        if self.rules.iter().any(|rule| rbac::rule_allows(a, rule)) {
            NodeDecision::Allow
        } else {
            NodeDecision::NoOpinion(String::new())
        }
    }

    /// get, list and watch of one named object (upstream's `authorizeReadNamespacedObject`).
    fn read_namespaced(&self, node: &str, kind: Kind, a: &Attributes) -> NodeDecision {
        if !matches!(a.verb.as_str(), "get" | "list" | "watch") {
            return no("can only read resources of this type");
        }
        if !a.subresource.is_empty() {
            return no("cannot read subresource");
        }
        if a.namespace.is_empty() {
            return no("can only read namespaced object of this type");
        }
        self.related(node, kind, a)
    }

    /// get of one object (upstream's `authorizeGet`).
    fn get(&self, node: &str, kind: Kind, a: &Attributes) -> NodeDecision {
        if a.verb != "get" {
            return no("can only get individual resources of this type");
        }
        if !a.subresource.is_empty() {
            return no("cannot get subresource");
        }
        self.related(node, kind, a)
    }

    /// Pods (upstream's `authorizePod`): a get of one bound to the node, a list or watch
    /// selecting `spec.nodeName=<node>` (or named, and bound to it), create and delete (mirror
    /// pods), a status write, an eviction; nothing else.
    fn authorize_pod(&self, node: &str, a: &Attributes) -> NodeDecision {
        match (a.subresource.as_str(), a.verb.as_str()) {
            ("", "get") => self.get(node, Kind::Pod, a),
            ("", "list" | "watch") => {
                let selected = a
                    .field_selector
                    .as_ref()
                    .is_some_and(|s| s.exact("spec.nodeName") == Some(node));
                if selected {
                    NodeDecision::Allow
                } else if !a.name.is_empty() {
                    self.related(node, Kind::Pod, a)
                } else {
                    no("can only list/watch pods with spec.nodeName field selector")
                }
            }
            ("", "create" | "delete") | ("status", "update" | "patch") | ("eviction", "create") => {
                NodeDecision::Allow
            }
            _ => no(""),
        }
    }

    /// A claim's status (upstream's `authorizeStatusUpdate`).
    fn status_update(&self, node: &str, a: &Attributes) -> NodeDecision {
        if !matches!(a.verb.as_str(), "update" | "patch") {
            return no("can only get/update/patch this type");
        }
        self.related(node, Kind::PersistentVolumeClaim, a)
    }

    /// `serviceaccounts/token` (upstream's `authorizeCreateToken`).
    fn create_token(&self, node: &str, a: &Attributes) -> NodeDecision {
        if a.verb != "create" || a.name.is_empty() {
            return no("can only create tokens for individual service accounts");
        }
        if a.subresource != "token" {
            return no("can only create token subresource of serviceaccount");
        }
        self.related(node, Kind::ServiceAccount, a)
    }

    /// upstream's `authorize`: a named object with a path to the node.
    fn related(&self, node: &str, kind: Kind, a: &Attributes) -> NodeDecision {
        if a.name.is_empty() {
            return no("No Object name found");
        }
        if self.has_path(node, kind, &a.namespace, &a.name) {
            NodeDecision::Allow
        } else {
            no_relationship(node)
        }
    }
}

fn no(reason: &str) -> NodeDecision {
    NodeDecision::NoOpinion(reason.to_string())
}

fn no_relationship(node: &str) -> NodeDecision {
    NodeDecision::NoOpinion(format!(
        "no relationship found between node '{node}' and this object"
    ))
}

/// A node's own Lease (upstream's `authorizeLease`); the name of a create is NodeRestriction's
/// to check, since the authorizer does not see the body.
fn lease(node: &str, a: &Attributes) -> NodeDecision {
    if !matches!(
        a.verb.as_str(),
        "get" | "create" | "update" | "patch" | "delete"
    ) {
        return no("can only get, create, update, patch, or delete a node lease");
    }
    if a.namespace != NAMESPACE_NODE_LEASE {
        return NodeDecision::NoOpinion(format!(
            "can only access leases in the {NAMESPACE_NODE_LEASE:?} system namespace"
        ));
    }
    if a.verb != "create" && a.name != node {
        return no("can only access node lease with the same name as the requesting node");
    }
    NodeDecision::Allow
}

/// Nodes (upstream's `authorizeNode`): create, update and patch of Nodes and their status
/// (NodeRestriction keeps a node to its own); get, list and watch of its own by name only,
/// compared directly so a kubelet may look before it registers.
fn authorize_node(node: &str, a: &Attributes) -> NodeDecision {
    match (a.subresource.as_str(), a.verb.as_str()) {
        ("", "create" | "update" | "patch") | ("status", "update" | "patch") => NodeDecision::Allow,
        ("", "get" | "list" | "watch") => match a.name.as_str() {
            name if name == node => NodeDecision::Allow,
            "" => NodeDecision::NoOpinion(format!(
                "node '{node}' cannot read all nodes, only its own Node object"
            )),
            name => NodeDecision::NoOpinion(format!(
                "node '{node}' cannot read '{name}', only its own Node object"
            )),
        },
        _ => no(""),
    }
}

/// The chain: `system:masters`, the Node authorizer, RBAC. The first that allows decides;
/// otherwise the request is denied with the non-empty reasons joined by newlines, as
/// kube-apiserver's union authorizer (`authorizer/union`) reports them.
pub fn authorize(a: &Attributes, node: &NodeAuthorizer, source: &dyn RbacSource) -> Decision {
    let mut reasons = Vec::new();
    if !a.user.in_group(GROUP_MASTERS) {
        match node.authorize(a) {
            NodeDecision::Allow => {
                return Decision {
                    allowed: true,
                    reason: String::new(),
                };
            }
            NodeDecision::NoOpinion(reason) if !reason.is_empty() => reasons.push(reason),
            NodeDecision::NoOpinion(_) => {}
        }
    }
    let decision = rbac::authorize(a, source);
    if decision.allowed {
        return decision;
    }
    if !decision.reason.is_empty() {
        reasons.push(decision.reason);
    }
    Decision {
        allowed: false,
        reason: reasons.join("\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::rbac::RbacSnapshot;
    use crate::watch_cache::object::CachedObject;
    use serde_json::json;

    fn node_user(name: &str) -> UserInfo {
        UserInfo::authenticated(format!("system:node:{name}"), "", vec![NODES_GROUP.into()])
    }

    fn authorizer() -> NodeAuthorizer {
        let mut graph = Graph::default();
        graph.set_pod(
            "default/web".into(),
            CachedObject::new(
                json!({
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"nodeName": "a", "serviceAccountName": "runner", "containers": [],
                             "volumes": [{"name": "s", "secret": {"secretName": "db"}},
                                         {"name": "c", "configMap": {"name": "conf"}},
                                         {"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}
                }),
                None,
            ),
        );
        graph.set_volume(CachedObject::new(
            json!({
                "metadata": {"name": "pv1"},
                "spec": {"claimRef": {"namespace": "default", "name": "data"},
                         "iscsi": {"targetPortal": "t", "iqn": "q", "lun": 0,
                                   "secretRef": {"name": "chap"}}}
            }),
            None,
        ));
        graph.set_volume(CachedObject::new(
            json!({"metadata": {"name": "pv2"},
                   "spec": {"claimRef": {"namespace": "default", "name": "unused"}}}),
            None,
        ));
        NodeAuthorizer::with_graph(graph)
    }

    fn get(user: UserInfo, resource: &str, ns: &str, name: &str) -> Attributes {
        Attributes::resource(user, "get", "", resource, ns, name)
    }

    #[test]
    fn who_is_a_node() {
        assert_eq!(node_identity(&node_user("a")), Some("a"));
        assert_eq!(node_identity(&node_user("")), Some(""));
        // The name without the group is not a node, nor the group without the name.
        let no_group = UserInfo::authenticated("system:node:a", "", vec![]);
        assert_eq!(node_identity(&no_group), None);
        let no_name = UserInfo::authenticated("jane", "", vec![NODES_GROUP.into()]);
        assert_eq!(node_identity(&no_name), None);
    }

    #[test]
    fn a_node_reads_only_what_its_pods_reference() {
        let z = authorizer();
        for (resource, name) in [
            ("secrets", "db"),
            ("configmaps", "conf"),
            ("persistentvolumeclaims", "data"),
        ] {
            assert_eq!(
                z.authorize(&get(node_user("a"), resource, "default", name)),
                NodeDecision::Allow,
                "{resource}"
            );
            assert_eq!(
                z.authorize(&get(node_user("b"), resource, "default", name)),
                no("no relationship found between node 'b' and this object"),
                "{resource}"
            );
            assert_eq!(
                z.authorize(&get(node_user("a"), resource, "other", name)),
                no("no relationship found between node 'a' and this object"),
            );
        }
        assert_eq!(
            z.authorize(&get(node_user("a"), "secrets", "default", "unrelated")),
            no("no relationship found between node 'a' and this object"),
        );
        // No listing all secrets, no writing one.
        assert_eq!(
            z.authorize(&Attributes::resource(
                node_user("a"),
                "list",
                "",
                "secrets",
                "default",
                ""
            )),
            no("No Object name found")
        );
        assert_eq!(
            z.authorize(&Attributes::resource(
                node_user("a"),
                "list",
                "",
                "secrets",
                "",
                ""
            )),
            no("can only read namespaced object of this type")
        );
        assert_eq!(
            z.authorize(&Attributes::resource(
                node_user("a"),
                "update",
                "",
                "secrets",
                "default",
                "db"
            )),
            no("can only read resources of this type")
        );
        assert_eq!(
            z.authorize(&Attributes::resource(
                node_user("a"),
                "list",
                "",
                "persistentvolumeclaims",
                "default",
                "data"
            )),
            no("can only get individual resources of this type")
        );
    }

    #[test]
    fn a_node_gets_the_volume_bound_to_its_pods_claim_and_the_volume_s_secret() {
        let z = authorizer();
        assert_eq!(
            z.authorize(&get(node_user("a"), "persistentvolumes", "", "pv1")),
            NodeDecision::Allow
        );
        assert_eq!(
            z.authorize(&get(node_user("a"), "secrets", "default", "chap")),
            NodeDecision::Allow
        );
        for (user, resource, ns, name) in [
            ("b", "persistentvolumes", "", "pv1"),
            ("b", "secrets", "default", "chap"),
            ("a", "persistentvolumes", "", "pv2"),
            ("a", "persistentvolumes", "", "missing"),
        ] {
            assert_eq!(
                z.authorize(&get(node_user(user), resource, ns, name)),
                no(&format!(
                    "no relationship found between node '{user}' and this object"
                )),
                "{user} {resource} {name}"
            );
        }
        let list = Attributes::resource(node_user("a"), "list", "", "persistentvolumes", "", "");
        assert_eq!(
            z.authorize(&list),
            no("can only get individual resources of this type")
        );
        let status = get(node_user("a"), "persistentvolumes", "", "pv1").with_subresource("status");
        assert_eq!(z.authorize(&status), no("cannot get subresource"));
    }

    #[test]
    fn a_node_reads_only_its_own_node_and_lists_only_its_own_pods() {
        let z = authorizer();
        let on = |verb: &str, resource: &str, ns: &str, name: &str, selector: Option<&str>| {
            z.authorize(
                &Attributes::resource(node_user("a"), verb, "", resource, ns, name)
                    .with_field_selector(selector),
            )
        };
        // Nodes: its own by name (a list or watch pinned by metadata.name arrives named).
        for verb in ["get", "list", "watch"] {
            assert_eq!(
                on(verb, "nodes", "", "a", None),
                NodeDecision::Allow,
                "{verb}"
            );
            assert_eq!(
                on(verb, "nodes", "", "b", None),
                no("node 'a' cannot read 'b', only its own Node object")
            );
        }
        assert_eq!(
            on("list", "nodes", "", "", None),
            no("node 'a' cannot read all nodes, only its own Node object")
        );
        for verb in ["create", "update", "patch"] {
            assert_eq!(
                on(verb, "nodes", "", "b", None),
                NodeDecision::Allow,
                "{verb}"
            );
        }
        let status = |verb: &str| {
            z.authorize(
                &Attributes::resource(node_user("a"), verb, "", "nodes", "", "a")
                    .with_subresource("status"),
            )
        };
        assert_eq!(status("patch"), NodeDecision::Allow);
        assert_eq!(status("get"), no(""));
        // No deleting Nodes, not even its own (the node rules are not consulted).
        assert_eq!(on("delete", "nodes", "", "a", None), no(""));

        // Pods: a get of one bound to it.
        assert_eq!(
            on("get", "pods", "default", "web", None),
            NodeDecision::Allow
        );
        assert_eq!(
            z.authorize(&get(node_user("b"), "pods", "default", "web")),
            no("no relationship found between node 'b' and this object")
        );
        assert_eq!(
            on("get", "pods", "default", "other", None),
            no("no relationship found between node 'a' and this object")
        );
        // Lists and watches with its spec.nodeName only.
        for verb in ["list", "watch"] {
            assert_eq!(
                on(verb, "pods", "", "", Some("spec.nodeName=a")),
                NodeDecision::Allow
            );
            assert_eq!(
                on(
                    verb,
                    "pods",
                    "",
                    "",
                    Some("status.phase!=Failed,spec.nodeName==a")
                ),
                NodeDecision::Allow
            );
            for selector in [
                None,
                Some("spec.nodeName=b"),
                Some("spec.nodeName!=a"),
                Some("garbage"),
            ] {
                assert_eq!(
                    on(verb, "pods", "", "", selector),
                    no("can only list/watch pods with spec.nodeName field selector"),
                    "{selector:?}"
                );
            }
            // Pinned to one pod by name: that pod's binding decides.
            assert_eq!(
                on(verb, "pods", "default", "web", None),
                NodeDecision::Allow
            );
        }
        assert_eq!(
            on("create", "pods", "default", "", None),
            NodeDecision::Allow
        );
        assert_eq!(
            on("delete", "pods", "default", "x", None),
            NodeDecision::Allow
        );
        assert_eq!(on("update", "pods", "default", "web", None), no(""));
        let sub = |verb: &str, sub: &str| {
            z.authorize(
                &Attributes::resource(node_user("a"), verb, "", "pods", "default", "web")
                    .with_subresource(sub),
            )
        };
        assert_eq!(sub("update", "status"), NodeDecision::Allow);
        assert_eq!(sub("create", "eviction"), NodeDecision::Allow);
        assert_eq!(sub("get", "log"), no(""));
    }

    #[test]
    fn tokens_only_for_the_service_accounts_of_its_pods() {
        let z = authorizer();
        let token = |node: &str, name: &str| {
            Attributes::resource(
                node_user(node),
                "create",
                "",
                "serviceaccounts",
                "default",
                name,
            )
            .with_subresource("token")
        };
        assert_eq!(z.authorize(&token("a", "runner")), NodeDecision::Allow);
        assert_eq!(
            z.authorize(&token("b", "runner")),
            no("no relationship found between node 'b' and this object")
        );
        assert_eq!(
            z.authorize(&get(node_user("a"), "serviceaccounts", "default", "runner")),
            no("can only create tokens for individual service accounts")
        );
    }

    #[test]
    fn only_its_own_lease_in_the_node_lease_namespace() {
        let z = authorizer();
        let lease = |verb: &str, ns: &str, name: &str| {
            Attributes::resource(
                node_user("a"),
                verb,
                "coordination.k8s.io",
                "leases",
                ns,
                name,
            )
        };
        assert_eq!(
            z.authorize(&lease("update", "kube-node-lease", "a")),
            NodeDecision::Allow
        );
        assert_eq!(
            z.authorize(&lease("create", "kube-node-lease", "")),
            NodeDecision::Allow
        );
        assert_eq!(
            z.authorize(&lease("update", "kube-node-lease", "b")),
            no("can only access node lease with the same name as the requesting node")
        );
        assert_eq!(
            z.authorize(&lease("get", "default", "a")),
            no("can only access leases in the \"kube-node-lease\" system namespace")
        );
        assert_eq!(
            z.authorize(&lease("list", "kube-node-lease", "")),
            no("can only get, create, update, patch, or delete a node lease")
        );
    }

    #[test]
    fn other_resources_by_the_node_rules_and_non_nodes_untouched() {
        let z = authorizer();
        let a = |verb: &str, resource: &str| {
            Attributes::resource(node_user("a"), verb, "", resource, "default", "x")
        };
        assert_eq!(z.authorize(&a("create", "events")), NodeDecision::Allow);
        assert_eq!(z.authorize(&a("delete", "services")), no(""));
        let jane = UserInfo::authenticated("jane", "", vec![]);
        assert_eq!(
            z.authorize(&get(jane, "secrets", "default", "db")),
            NodeDecision::NoOpinion(String::new())
        );
        assert_eq!(
            z.authorize(&get(node_user(""), "secrets", "default", "db")),
            no("unknown node for user \"system:node:\"")
        );
    }

    #[test]
    fn the_chain_joins_reasons_and_lets_rbac_grant_what_the_node_authorizer_does_not() {
        let z = authorizer();
        let empty = RbacSnapshot::default();
        let d = authorize(&get(node_user("b"), "secrets", "default", "db"), &z, &empty);
        assert_eq!(
            d,
            Decision {
                allowed: false,
                reason: "no relationship found between node 'b' and this object".into()
            }
        );
        // The bootstrap policy binds `system:node` to nobody: a node gets nothing from RBAC.
        let bootstrap = RbacSnapshot::bootstrap();
        assert!(
            !authorize(
                &get(node_user("b"), "secrets", "default", "db"),
                &z,
                &bootstrap
            )
            .allowed
        );
        assert!(
            authorize(
                &get(node_user("a"), "secrets", "default", "db"),
                &z,
                &bootstrap
            )
            .allowed
        );
        // A binding granting secrets to the node wins over the node authorizer's no opinion.
        let mut granted = RbacSnapshot::bootstrap();
        granted.insert_cluster_role_binding(
            serde_json::from_value(json!({
                "metadata": {"name": "b-reads-secrets"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view-secrets"},
                "subjects": [{"kind": "User", "name": "system:node:b"}]
            }))
            .expect("a binding"),
        );
        granted.insert_cluster_role(
            serde_json::from_value(json!({
                "metadata": {"name": "view-secrets"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
            }))
            .expect("a role"),
        );
        assert!(
            authorize(
                &get(node_user("b"), "secrets", "default", "db"),
                &z,
                &granted
            )
            .allowed
        );
    }
}
