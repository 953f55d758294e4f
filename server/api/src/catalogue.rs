//! The resource catalogue: every resource skerry serves, with its group, version, kind,
//! scope, verbs, short names and subresources, and where its objects live in the store.
//!
//! Discovery, routing, RBAC and the watch caches all read this one table, so a resource is
//! added in one place. Objects are stored under `/registry/<resource>/<namespace>/<name>`
//! (cluster-scoped: `/registry/<resource>/<name>`), Kubernetes' layout.

/// The prefix of every Kubernetes object in the store.
pub const REGISTRY_PREFIX: &str = "/registry/";

/// A subresource of a resource (`pods/status`, `deployments/scale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subresource {
    pub name: &'static str,
    /// The kind the subresource speaks (`Scale` for scale, the parent's kind for status).
    pub kind: &'static str,
    /// The group and version of that kind when it differs from the parent's
    /// (`autoscaling/v1` for scale).
    pub group_version: Option<(&'static str, &'static str)>,
    pub verbs: &'static [&'static str],
    /// A connect subresource (`pods/exec`, `nodes/proxy`): served by a handler of its own
    /// that streams to the kubelet, its kind an options kind read from the query
    /// (`PodExecOptions`) that has no schema of its own in Kubernetes' OpenAPI.
    pub connect: bool,
}

/// One served resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceInfo {
    /// The API group; `""` for the core (legacy) group served under `/api`.
    pub group: &'static str,
    pub version: &'static str,
    /// The plural lower-case name used in URLs (`pods`).
    pub resource: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// `all` makes `kubectl get all` include the resource.
    pub categories: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub subresources: &'static [Subresource],
    /// The OpenAPI definition name of the kind (`io.k8s.api.core.v1.Pod`).
    pub definition: &'static str,
}

impl ResourceInfo {
    /// `v1` for the core group, `apps/v1` for the others: the object's `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The store key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.namespaced => {
                format!("{REGISTRY_PREFIX}{}/{ns}/{name}", self.resource)
            }
            _ => format!("{REGISTRY_PREFIX}{}/{name}", self.resource),
        }
    }

    /// The store prefix of every object of this resource, or of those in one namespace.
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{REGISTRY_PREFIX}{}/{ns}/", self.resource),
            _ => format!("{REGISTRY_PREFIX}{}/", self.resource),
        }
    }

    pub fn subresource(&self, name: &str) -> Option<&'static Subresource> {
        self.subresources.iter().find(|s| s.name == name)
    }

    pub fn has_verb(&self, verb: &str) -> bool {
        self.verbs.contains(&verb)
    }
}

/// The verbs of an ordinary read-write resource.
const RW: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

const fn status(kind: &'static str) -> Subresource {
    Subresource {
        name: "status",
        kind,
        group_version: None,
        verbs: STATUS_VERBS,
        connect: false,
    }
}

/// The verbs of `pods/exec`, `pods/attach` and `pods/portforward` (upstream's connecter
/// methods GET and POST, as discovery lists them).
const POD_CONNECT_VERBS: &[&str] = &["create", "get"];
/// The verbs of `nodes/proxy` (GET, POST, PUT, PATCH, DELETE; HEAD and OPTIONS are not verbs
/// of their own in discovery).
const PROXY_CONNECT_VERBS: &[&str] = &["create", "delete", "get", "patch", "update"];

/// A connect subresource speaking the options kind `kind` of the parent's group-version.
const fn connect(
    name: &'static str,
    kind: &'static str,
    verbs: &'static [&'static str],
) -> Subresource {
    Subresource {
        name,
        kind,
        group_version: None,
        verbs,
        connect: true,
    }
}

const SCALE: Subresource = Subresource {
    name: "scale",
    kind: "Scale",
    group_version: Some(("autoscaling", "v1")),
    verbs: STATUS_VERBS,
    connect: false,
};

macro_rules! resource {
    ($group:expr, $version:expr, $resource:expr, $singular:expr, $kind:expr, $namespaced:expr,
     $short:expr, $categories:expr, $verbs:expr, $sub:expr, $definition:expr) => {
        ResourceInfo {
            group: $group,
            version: $version,
            resource: $resource,
            singular: $singular,
            kind: $kind,
            list_kind: concat!($kind, "List"),
            namespaced: $namespaced,
            short_names: $short,
            categories: $categories,
            verbs: $verbs,
            subresources: $sub,
            definition: $definition,
        }
    };
}

/// Every resource skerry serves, in discovery order within each group.
pub static RESOURCES: &[ResourceInfo] = &[
    resource!(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        &[],
        &[
            "create", "delete", "get", "list", "patch", "update", "watch"
        ],
        &[
            status("Namespace"),
            Subresource {
                name: "finalize",
                kind: "Namespace",
                group_version: None,
                verbs: &["update"],
                connect: false
            }
        ],
        "io.k8s.api.core.v1.Namespace"
    ),
    resource!(
        "",
        "v1",
        "pods",
        "pod",
        "Pod",
        true,
        &["po"],
        &["all"],
        RW,
        // In Kubernetes' discovery order (alphabetical).
        &[
            connect("attach", "PodAttachOptions", POD_CONNECT_VERBS),
            Subresource {
                name: "binding",
                kind: "Binding",
                group_version: None,
                verbs: &["create"],
                connect: false
            },
            // `kubectl drain` finds it in discovery (`pods/eviction`, kind Eviction of
            // policy/v1) and POSTs there; RBAC grants it as `create` on `pods/eviction`.
            Subresource {
                name: "eviction",
                kind: "Eviction",
                group_version: Some(("policy", "v1")),
                verbs: &["create"],
                connect: false
            },
            connect("exec", "PodExecOptions", POD_CONNECT_VERBS),
            // `kubectl logs`: proxied to the pod's kubelet (kind Pod in discovery, as upstream).
            Subresource {
                name: "log",
                kind: "Pod",
                group_version: None,
                verbs: &["get"],
                connect: false
            },
            connect("portforward", "PodPortForwardOptions", POD_CONNECT_VERBS),
            status("Pod")
        ],
        "io.k8s.api.core.v1.Pod"
    ),
    resource!(
        "",
        "v1",
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        &[],
        RW,
        &[
            connect("proxy", "NodeProxyOptions", PROXY_CONNECT_VERBS),
            status("Node")
        ],
        "io.k8s.api.core.v1.Node"
    ),
    resource!(
        "",
        "v1",
        "services",
        "service",
        "Service",
        true,
        &["svc"],
        &["all"],
        &[
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ],
        &[status("Service")],
        "io.k8s.api.core.v1.Service"
    ),
    resource!(
        "",
        "v1",
        "endpoints",
        "endpoints",
        "Endpoints",
        true,
        &["ep"],
        &[],
        RW,
        &[],
        "io.k8s.api.core.v1.Endpoints"
    ),
    resource!(
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        &[],
        RW,
        &[],
        "io.k8s.api.core.v1.ConfigMap"
    ),
    resource!(
        "",
        "v1",
        "secrets",
        "secret",
        "Secret",
        true,
        &[],
        &[],
        RW,
        &[],
        "io.k8s.api.core.v1.Secret"
    ),
    resource!(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        &[],
        RW,
        &[Subresource {
            name: "token",
            kind: "TokenRequest",
            group_version: Some(("authentication.k8s.io", "v1")),
            verbs: &["create"],
            connect: false
        }],
        "io.k8s.api.core.v1.ServiceAccount"
    ),
    resource!(
        "",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        &[],
        RW,
        &[],
        "io.k8s.api.core.v1.Event"
    ),
    resource!(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["deploy"],
        &["all"],
        RW,
        &[status("Deployment"), SCALE],
        "io.k8s.api.apps.v1.Deployment"
    ),
    resource!(
        "apps",
        "v1",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
        &["rs"],
        &["all"],
        RW,
        &[status("ReplicaSet"), SCALE],
        "io.k8s.api.apps.v1.ReplicaSet"
    ),
    resource!(
        "apps",
        "v1",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        &["ds"],
        &["all"],
        RW,
        &[status("DaemonSet")],
        "io.k8s.api.apps.v1.DaemonSet"
    ),
    resource!(
        "apps",
        "v1",
        "statefulsets",
        "statefulset",
        "StatefulSet",
        true,
        &["sts"],
        &["all"],
        RW,
        &[status("StatefulSet"), SCALE],
        "io.k8s.api.apps.v1.StatefulSet"
    ),
    resource!(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        &[],
        RW,
        &[status("PodDisruptionBudget")],
        "io.k8s.api.policy.v1.PodDisruptionBudget"
    ),
    resource!(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
        &[],
        &[],
        RW,
        &[],
        "io.k8s.api.discovery.v1.EndpointSlice"
    ),
    resource!(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "priorityclass",
        "PriorityClass",
        false,
        &["pc"],
        &[],
        RW,
        &[],
        "io.k8s.api.scheduling.v1.PriorityClass"
    ),
    resource!(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        &[],
        RW,
        &[],
        "io.k8s.api.coordination.v1.Lease"
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
        &[],
        &[],
        RW,
        &[],
        "io.k8s.api.rbac.v1.Role"
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        &[],
        &[],
        RW,
        &[],
        "io.k8s.api.rbac.v1.RoleBinding"
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        &[],
        &[],
        RW,
        &[],
        "io.k8s.api.rbac.v1.ClusterRole"
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
        &[],
        RW,
        &[],
        "io.k8s.api.rbac.v1.ClusterRoleBinding"
    ),
    // The reviews: create-only, answered and never stored (no `list`, so no watch cache).
    // Within each group in Kubernetes' discovery order (alphabetical).
    // `kubectl auth whoami`: the requester's own user info.
    resource!(
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "selfsubjectreview",
        "SelfSubjectReview",
        false,
        &[],
        &[],
        &["create"],
        &[],
        "io.k8s.api.authentication.v1.SelfSubjectReview"
    ),
    resource!(
        "authentication.k8s.io",
        "v1",
        "tokenreviews",
        "tokenreview",
        "TokenReview",
        false,
        &[],
        &[],
        &["create"],
        &[],
        "io.k8s.api.authentication.v1.TokenReview"
    ),
    resource!(
        "authorization.k8s.io",
        "v1",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        "LocalSubjectAccessReview",
        true,
        &[],
        &[],
        &["create"],
        &[],
        "io.k8s.api.authorization.v1.LocalSubjectAccessReview"
    ),
    resource!(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        "SelfSubjectAccessReview",
        false,
        &[],
        &[],
        &["create"],
        &[],
        "io.k8s.api.authorization.v1.SelfSubjectAccessReview"
    ),
    resource!(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "subjectaccessreview",
        "SubjectAccessReview",
        false,
        &[],
        &[],
        &["create"],
        &[],
        "io.k8s.api.authorization.v1.SubjectAccessReview"
    ),
];

/// The groups in discovery order (the core group first, served under `/api`).
pub fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !groups.contains(&r.group) {
            groups.push(r.group);
        }
    }
    groups
}

/// The resource served at `group`/`version`/`resource`.
pub fn lookup(group: &str, version: &str, resource: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.resource == resource)
}

/// The resource of a kind, for objects that name their `apiVersion` and `kind`.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
}

/// The resources stored in the store (those with a `list` verb; reviews are computed).
pub fn stored() -> impl Iterator<Item = &'static ResourceInfo> {
    RESOURCES.iter().filter(|r| r.has_verb("list"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_kubernetes_layout() {
        let pods = lookup("", "v1", "pods").expect("pods are served");
        assert_eq!(
            pods.key(Some("default"), "web"),
            "/registry/pods/default/web"
        );
        assert_eq!(pods.prefix(Some("default")), "/registry/pods/default/");
        assert_eq!(pods.prefix(None), "/registry/pods/");
        let nodes = lookup("", "v1", "nodes").expect("nodes are served");
        assert_eq!(nodes.key(Some("ignored"), "n1"), "/registry/nodes/n1");
        assert_eq!(pods.api_version(), "v1");
        let deploy = by_kind("apps/v1", "Deployment").expect("deployments are served");
        assert_eq!(deploy.api_version(), "apps/v1");
        assert_eq!(deploy.list_kind, "DeploymentList");
    }

    #[test]
    fn no_resource_prefix_is_a_prefix_of_another() {
        // `/registry/pods/` must not contain `/registry/podsx/...`: every prefix ends in '/'.
        for a in RESOURCES {
            for b in RESOURCES {
                if a.resource != b.resource {
                    assert!(!b.prefix(None).starts_with(&a.prefix(None)));
                }
            }
        }
    }

    #[test]
    fn core_group_comes_first() {
        assert_eq!(groups()[0], "");
    }
}
