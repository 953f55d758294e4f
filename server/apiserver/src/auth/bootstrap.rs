//! Kubernetes' default RBAC policy: the ClusterRoles and ClusterRoleBindings an apiserver
//! creates on start (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy`), as k8s-openapi objects.
//!
//! The rules are Kubernetes' own, with its default feature gates (DRA and other alpha/beta-off
//! roles left out), for the roles skerry needs: the user-facing `cluster-admin`, `admin`, `edit`,
//! `view` (aggregated from the `system:aggregate-to-*` roles through their labels), the discovery
//! and public-info roles, the scheduler's, controller manager's, node's and proxy's roles, and
//! `system:controller:<name>` for each controller skerry runs, bound to the
//! `kube-system/<name>` service account the controller runs as.
//!
//! Invariants: every object carries Kubernetes' `kubernetes.io/bootstrapping: rbac-defaults`
//! label and `rbac.authorization.kubernetes.io/autoupdate: "true"` annotation; rule lists are
//! sorted within each rule as Kubernetes' `PolicyRuleBuilder` sorts them; the roles
//! [`cluster_roles`] returns are already aggregated.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::rbac::aggregate_cluster_roles;

/// Label on every bootstrap object.
pub const LABEL_BOOTSTRAPPING: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");
/// Annotation on every bootstrap object: the apiserver may reconcile it on upgrade.
pub const ANNOTATION_AUTOUPDATE: (&str, &str) =
    ("rbac.authorization.kubernetes.io/autoupdate", "true");
/// Label that aggregates a ClusterRole into `admin`.
pub const AGGREGATE_TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
/// Label that aggregates a ClusterRole into `edit`.
pub const AGGREGATE_TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
/// Label that aggregates a ClusterRole into `view`.
pub const AGGREGATE_TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";
/// The prefix of controller roles and their bindings (Kubernetes `saRolePrefix`).
pub const CONTROLLER_ROLE_PREFIX: &str = "system:controller:";
/// The API group of RBAC, for role references and User/Group subjects.
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Kubernetes' `Read` verbs.
const READ: &[&str] = &["get", "list", "watch"];
/// Kubernetes' `Write` verbs.
const WRITE: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
/// Kubernetes' `ReadWrite` verbs.
const READ_WRITE: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// The controllers skerry runs, by the name of their service account in `kube-system`.
pub const CONTROLLERS: [&str; 12] = [
    "daemon-set-controller",
    "deployment-controller",
    "disruption-controller",
    "endpoint-controller",
    "endpointslice-controller",
    "generic-garbage-collector",
    "namespace-controller",
    "node-controller",
    "replicaset-controller",
    "root-ca-cert-publisher",
    "service-account-controller",
    "statefulset-controller",
];

fn sorted(items: &[&str]) -> Vec<String> {
    let mut items: Vec<String> = items.iter().map(|s| s.to_string()).collect();
    items.sort();
    items.dedup();
    items
}

/// A resource rule: `verbs` on `resources` in `groups`.
fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: sorted(verbs),
        api_groups: Some(sorted(groups)),
        resources: Some(sorted(resources)),
        resource_names: None,
        non_resource_urls: None,
    }
}

/// A resource rule limited to `names`.
fn named(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule {
        resource_names: Some(sorted(names)),
        ..rule(verbs, groups, resources)
    }
}

/// A non-resource rule: `verbs` on `urls`.
fn urls(verbs: &[&str], urls: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: sorted(verbs),
        non_resource_urls: Some(sorted(urls)),
        api_groups: None,
        resources: None,
        resource_names: None,
    }
}

/// Kubernetes' `eventsRule()`: every controller may write events in both event groups.
fn events() -> PolicyRule {
    rule(
        &["create", "update", "patch"],
        &["", "events.k8s.io"],
        &["events"],
    )
}

fn metadata(name: &str, extra_labels: &[&str]) -> ObjectMeta {
    let mut labels = BTreeMap::from([(
        LABEL_BOOTSTRAPPING.0.to_string(),
        LABEL_BOOTSTRAPPING.1.to_string(),
    )]);
    for label in extra_labels {
        labels.insert(label.to_string(), "true".to_string());
    }
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(labels),
        annotations: Some(BTreeMap::from([(
            ANNOTATION_AUTOUPDATE.0.to_string(),
            ANNOTATION_AUTOUPDATE.1.to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

fn role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: metadata(name, &[]),
        rules: Some(rules),
        aggregation_rule: None,
    }
}

fn labelled_role(name: &str, label: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: metadata(name, &[label]),
        rules: Some(rules),
        aggregation_rule: None,
    }
}

fn aggregated_role(name: &str, own_labels: &[&str], aggregates: &str) -> ClusterRole {
    ClusterRole {
        metadata: metadata(name, own_labels),
        rules: None,
        aggregation_rule: Some(AggregationRule {
            cluster_role_selectors: Some(vec![LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    aggregates.to_string(),
                    "true".to_string(),
                )])),
                match_expressions: None,
            }]),
        }),
    }
}

/// Kubernetes' default ClusterRoles (those skerry needs), with the aggregated roles' rules
/// filled in.
pub fn cluster_roles() -> Vec<ClusterRole> {
    let mut roles = vec![
        // A root role which can do anything.
        role(
            "cluster-admin",
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
        ),
        // Enough to learn whether the server is ready and which APIs it serves.
        role(
            "system:discovery",
            vec![urls(
                &["get"],
                &[
                    "/livez",
                    "/readyz",
                    "/healthz",
                    "/version",
                    "/version/",
                    "/openapi",
                    "/openapi/*",
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                ],
            )],
        ),
        // Enough to ask what one may do.
        role(
            "system:basic-user",
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        // Insensitive cluster information, for everyone.
        role(
            "system:public-info-viewer",
            vec![urls(
                &["get"],
                &["/livez", "/readyz", "/healthz", "/version", "/version/"],
            )],
        ),
        role(
            "system:monitoring",
            vec![urls(
                &["get"],
                &[
                    "/metrics",
                    "/metrics/slis",
                    "/livez",
                    "/readyz",
                    "/healthz",
                    "/livez/*",
                    "/readyz/*",
                    "/healthz/*",
                ],
            )],
        ),
        role(
            "system:service-account-issuer-discovery",
            vec![urls(
                &["get"],
                &["/.well-known/openid-configuration", "/openid/v1/jwks"],
            )],
        ),
        role(
            "system:auth-delegator",
            vec![
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        aggregated_role("admin", &[], AGGREGATE_TO_ADMIN),
        aggregated_role("edit", &[AGGREGATE_TO_ADMIN], AGGREGATE_TO_EDIT),
        aggregated_role("view", &[AGGREGATE_TO_EDIT], AGGREGATE_TO_VIEW),
        labelled_role(
            "system:aggregate-to-admin",
            AGGREGATE_TO_ADMIN,
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                ),
                rule(
                    READ_WRITE,
                    &["rbac.authorization.k8s.io"],
                    &["roles", "rolebindings"],
                ),
            ],
        ),
        labelled_role(
            "system:aggregate-to-edit",
            AGGREGATE_TO_EDIT,
            aggregate_to_edit(),
        ),
        labelled_role(
            "system:aggregate-to-view",
            AGGREGATE_TO_VIEW,
            aggregate_to_view(),
        ),
        role("system:kube-controller-manager", kube_controller_manager()),
        role("system:kube-scheduler", kube_scheduler()),
        role(
            "system:volume-scheduler",
            vec![
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumes"],
                ),
                rule(READ, &["storage.k8s.io"], &["storageclasses"]),
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumeclaims"],
                ),
            ],
        ),
        role("system:node", node()),
        role(
            "system:node-proxier",
            vec![
                rule(&["list", "watch"], &[""], &["services", "endpoints"]),
                rule(READ, &[""], &["nodes"]),
                events(),
                rule(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
        ),
        role(
            "system:kube-dns",
            vec![rule(&["list", "watch"], &[""], &["endpoints", "services"])],
        ),
    ];
    roles.extend(controller_roles());
    aggregate_cluster_roles(&mut roles);
    roles
}

fn aggregate_to_edit() -> Vec<PolicyRule> {
    vec![
        // Read on escalating resources.
        rule(
            READ,
            &[""],
            &[
                "pods/attach",
                "pods/proxy",
                "pods/exec",
                "pods/portforward",
                "secrets",
                "services/proxy",
            ],
        ),
        rule(&["impersonate"], &[""], &["serviceaccounts"]),
        rule(
            WRITE,
            &[""],
            &[
                "pods",
                "pods/attach",
                "pods/proxy",
                "pods/exec",
                "pods/portforward",
            ],
        ),
        rule(&["create"], &[""], &["pods/eviction"]),
        rule(
            WRITE,
            &[""],
            &[
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/proxy",
                "persistentvolumeclaims",
                "configmaps",
                "secrets",
                "events",
            ],
        ),
        rule(&["create"], &[""], &["serviceaccounts/token"]),
        rule(
            WRITE,
            &["apps"],
            &[
                "statefulsets",
                "statefulsets/scale",
                "daemonsets",
                "deployments",
                "deployments/scale",
                "deployments/rollback",
                "replicasets",
                "replicasets/scale",
            ],
        ),
        rule(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
        rule(WRITE, &["batch"], &["jobs", "cronjobs"]),
        rule(
            WRITE,
            &["extensions"],
            &[
                "daemonsets",
                "deployments",
                "deployments/scale",
                "deployments/rollback",
                "ingresses",
                "replicasets",
                "replicasets/scale",
                "replicationcontrollers/scale",
                "networkpolicies",
            ],
        ),
        rule(WRITE, &["policy"], &["poddisruptionbudgets"]),
        rule(
            WRITE,
            &["networking.k8s.io"],
            &["networkpolicies", "ingresses"],
        ),
        rule(READ_WRITE, &["coordination.k8s.io"], &["leases"]),
    ]
}

fn aggregate_to_view() -> Vec<PolicyRule> {
    vec![
        rule(
            READ,
            &[""],
            &[
                "pods",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/status",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "configmaps",
            ],
        ),
        rule(
            READ,
            &[""],
            &[
                "limitranges",
                "resourcequotas",
                "bindings",
                "events",
                "pods/status",
                "resourcequotas/status",
                "namespaces/status",
                "replicationcontrollers/status",
                "pods/log",
            ],
        ),
        // Read of namespaces at namespace scope means reading *this* namespace.
        rule(READ, &[""], &["namespaces"]),
        rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
        rule(
            READ,
            &["apps"],
            &[
                "controllerrevisions",
                "statefulsets",
                "statefulsets/status",
                "statefulsets/scale",
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/status",
                "deployments/scale",
                "replicasets",
                "replicasets/status",
                "replicasets/scale",
            ],
        ),
        rule(
            READ,
            &["autoscaling"],
            &[
                "horizontalpodautoscalers",
                "horizontalpodautoscalers/status",
            ],
        ),
        rule(
            READ,
            &["batch"],
            &["jobs", "cronjobs", "cronjobs/status", "jobs/status"],
        ),
        rule(
            READ,
            &["extensions"],
            &[
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "ingresses",
                "ingresses/status",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
                "replicationcontrollers/scale",
                "networkpolicies",
            ],
        ),
        rule(
            READ,
            &["policy"],
            &["poddisruptionbudgets", "poddisruptionbudgets/status"],
        ),
        rule(
            READ,
            &["networking.k8s.io"],
            &["ingresses", "ingresses/status", "networkpolicies"],
        ),
    ]
}

fn kube_controller_manager() -> Vec<PolicyRule> {
    vec![
        events(),
        // Leader election.
        rule(&["create"], &["coordination.k8s.io"], &["leases"]),
        named(
            &["get", "update"],
            &["coordination.k8s.io"],
            &["leases"],
            &["kube-controller-manager"],
        ),
        // Its own service accounts and their tokens.
        rule(&["create"], &[""], &["secrets", "serviceaccounts"]),
        rule(&["delete"], &[""], &["secrets"]),
        rule(
            &["get"],
            &[""],
            &["namespaces", "secrets", "serviceaccounts", "configmaps"],
        ),
        rule(&["update"], &[""], &["secrets", "serviceaccounts"]),
        // Delegated authentication and authorization.
        rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        rule(
            &["create"],
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
        ),
        // Shared informers read everything.
        rule(&["list", "watch"], &["*"], &["*"]),
        rule(&["create"], &[""], &["serviceaccounts/token"]),
    ]
}

fn kube_scheduler() -> Vec<PolicyRule> {
    vec![
        events(),
        rule(&["create"], &["coordination.k8s.io"], &["leases"]),
        named(
            &["get", "update"],
            &["coordination.k8s.io"],
            &["leases"],
            &["kube-scheduler"],
        ),
        rule(READ, &[""], &["nodes"]),
        rule(&["get", "list", "watch", "delete"], &[""], &["pods"]),
        rule(&["create"], &[""], &["pods/binding", "bindings"]),
        rule(&["patch", "update"], &[""], &["pods/status"]),
        rule(READ, &[""], &["replicationcontrollers", "services"]),
        rule(READ, &["apps", "extensions"], &["replicasets"]),
        rule(READ, &["apps"], &["statefulsets"]),
        rule(READ, &["policy"], &["poddisruptionbudgets"]),
        rule(
            READ,
            &[""],
            &["persistentvolumeclaims", "persistentvolumes"],
        ),
        rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        rule(
            &["create"],
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
        ),
        rule(READ, &["storage.k8s.io"], &["csinodes"]),
        rule(READ, &[""], &["namespaces"]),
        rule(READ, &["storage.k8s.io"], &["csidrivers"]),
        rule(READ, &["storage.k8s.io"], &["csistoragecapacities"]),
    ]
}

/// The rules the Node authorizer applies to a node's requests for resources it does not
/// subdivide by its graph (Kubernetes' `bootstrappolicy.NodeRules()`, which is also the
/// `system:node` ClusterRole's rules).
pub fn node_rules() -> Vec<PolicyRule> {
    node()
}

fn node() -> Vec<PolicyRule> {
    vec![
        rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        rule(
            &["create"],
            &["authorization.k8s.io"],
            &["subjectaccessreviews", "localsubjectaccessreviews"],
        ),
        rule(READ, &[""], &["services"]),
        rule(&["create", "get", "list", "watch"], &[""], &["nodes"]),
        rule(&["update", "patch"], &[""], &["nodes/status"]),
        rule(&["update", "patch"], &[""], &["nodes"]),
        rule(&["create", "update", "patch"], &[""], &["events"]),
        rule(READ, &[""], &["pods"]),
        rule(&["create", "delete"], &[""], &["pods"]),
        rule(&["update", "patch"], &[""], &["pods/status"]),
        rule(&["create"], &[""], &["pods/eviction"]),
        rule(READ, &[""], &["secrets", "configmaps"]),
        rule(
            &["get"],
            &[""],
            &["persistentvolumeclaims", "persistentvolumes"],
        ),
        rule(&["get"], &[""], &["endpoints"]),
        rule(
            &["create", "get", "list", "watch"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
        ),
        rule(
            &["get", "create", "update", "patch", "delete"],
            &["coordination.k8s.io"],
            &["leases"],
        ),
        rule(&["get"], &["storage.k8s.io"], &["volumeattachments"]),
        rule(&["create"], &[""], &["serviceaccounts/token"]),
        rule(
            &["get", "update", "patch"],
            &[""],
            &["persistentvolumeclaims/status"],
        ),
        rule(READ, &["storage.k8s.io"], &["csidrivers"]),
        rule(
            &["get", "create", "update", "patch", "delete"],
            &["storage.k8s.io"],
            &["csinodes"],
        ),
        rule(READ, &["node.k8s.io"], &["runtimeclasses"]),
    ]
}

/// The `system:controller:*` roles of [`CONTROLLERS`] (Kubernetes' `controller_policy.go`).
fn controller_roles() -> Vec<ClusterRole> {
    let controller = |name: &str, rules: Vec<PolicyRule>| {
        role(&format!("{CONTROLLER_ROLE_PREFIX}{name}"), rules)
    };
    vec![
        controller(
            "daemon-set-controller",
            vec![
                rule(READ, &["extensions", "apps"], &["daemonsets"]),
                rule(&["update"], &["extensions", "apps"], &["daemonsets/status"]),
                rule(
                    &["update"],
                    &["extensions", "apps"],
                    &["daemonsets/finalizers"],
                ),
                rule(&["list", "watch"], &[""], &["nodes"]),
                rule(
                    &["list", "watch", "create", "delete", "patch"],
                    &[""],
                    &["pods"],
                ),
                rule(&["create"], &[""], &["pods/binding"]),
                rule(
                    &[
                        "get", "list", "watch", "create", "delete", "update", "patch",
                    ],
                    &["apps"],
                    &["controllerrevisions"],
                ),
                events(),
            ],
        ),
        controller(
            "deployment-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update"],
                    &["extensions", "apps"],
                    &["deployments"],
                ),
                rule(
                    &["update"],
                    &["extensions", "apps"],
                    &["deployments/status"],
                ),
                rule(
                    &["update"],
                    &["extensions", "apps"],
                    &["deployments/finalizers"],
                ),
                rule(
                    &[
                        "get", "list", "watch", "create", "update", "patch", "delete",
                    ],
                    &["apps", "extensions"],
                    &["replicasets"],
                ),
                rule(&["get", "list", "watch", "update"], &[""], &["pods"]),
                events(),
            ],
        ),
        controller(
            "disruption-controller",
            vec![
                rule(READ, &["extensions", "apps"], &["deployments"]),
                rule(READ, &["apps", "extensions"], &["replicasets"]),
                rule(READ, &[""], &["replicationcontrollers"]),
                rule(READ, &["policy"], &["poddisruptionbudgets"]),
                rule(READ, &["apps"], &["statefulsets"]),
                rule(&["update"], &["policy"], &["poddisruptionbudgets/status"]),
                // Clearing stale DisruptionTarget pod conditions.
                rule(&["patch", "update"], &[""], &["pods/status"]),
                // The expected pod count of any controller with a scale subresource.
                rule(&["get"], &["*"], &["*/scale"]),
                events(),
            ],
        ),
        controller(
            "endpoint-controller",
            vec![
                rule(READ, &[""], &["services", "pods"]),
                rule(
                    &["get", "list", "create", "update", "delete"],
                    &[""],
                    &["endpoints"],
                ),
                rule(&["create"], &[""], &["endpoints/restricted"]),
                events(),
            ],
        ),
        controller(
            "endpointslice-controller",
            vec![
                rule(READ, &[""], &["services", "pods", "nodes"]),
                // To own EndpointSlices with blockOwnerDeletion pointing at the Service.
                rule(&["update"], &[""], &["services/finalizers"]),
                rule(
                    &["get", "list", "create", "update", "delete"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
                events(),
            ],
        ),
        controller(
            "generic-garbage-collector",
            vec![
                rule(
                    &["get", "list", "watch", "patch", "update", "delete"],
                    &["*"],
                    &["*"],
                ),
                events(),
            ],
        ),
        controller(
            "namespace-controller",
            vec![
                rule(&["get", "list", "watch", "delete"], &[""], &["namespaces"]),
                rule(
                    &["update"],
                    &[""],
                    &["namespaces/finalize", "namespaces/status"],
                ),
                rule(
                    &["get", "list", "delete", "deletecollection"],
                    &["*"],
                    &["*"],
                ),
            ],
        ),
        controller(
            "node-controller",
            vec![
                rule(
                    &["get", "list", "update", "delete", "patch"],
                    &[""],
                    &["nodes"],
                ),
                rule(&["patch", "update"], &[""], &["nodes/status"]),
                // Marking pods of lost nodes not ready, and deleting them.
                rule(&["patch", "update"], &[""], &["pods/status"]),
                rule(&["list", "get", "delete"], &[""], &["pods"]),
                events(),
            ],
        ),
        controller(
            "replicaset-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update"],
                    &["apps", "extensions"],
                    &["replicasets"],
                ),
                rule(
                    &["update"],
                    &["apps", "extensions"],
                    &["replicasets/status"],
                ),
                rule(
                    &["update"],
                    &["apps", "extensions"],
                    &["replicasets/finalizers"],
                ),
                rule(
                    &["list", "watch", "patch", "create", "delete"],
                    &[""],
                    &["pods"],
                ),
                events(),
            ],
        ),
        controller(
            "root-ca-cert-publisher",
            vec![
                rule(&["create", "update"], &[""], &["configmaps"]),
                events(),
            ],
        ),
        controller(
            "service-account-controller",
            vec![rule(&["create"], &[""], &["serviceaccounts"]), events()],
        ),
        controller(
            "statefulset-controller",
            vec![
                rule(&["list", "watch"], &[""], &["pods"]),
                rule(READ, &["apps"], &["statefulsets"]),
                rule(&["update"], &["apps"], &["statefulsets/status"]),
                rule(&["update"], &["apps"], &["statefulsets/finalizers"]),
                rule(
                    &["get", "create", "delete", "update", "patch"],
                    &[""],
                    &["pods"],
                ),
                rule(
                    &[
                        "get", "create", "delete", "update", "patch", "list", "watch",
                    ],
                    &["apps"],
                    &["controllerrevisions"],
                ),
                rule(&["get", "create"], &[""], &["persistentvolumeclaims"]),
                events(),
                // StatefulSetAutoDeletePVC, on by default since Kubernetes 1.27.
                rule(&["update", "delete"], &[""], &["persistentvolumeclaims"]),
            ],
        ),
    ]
}

fn user_subject(kind: &str, name: &str) -> Subject {
    Subject {
        api_group: Some(RBAC_GROUP.to_string()),
        kind: kind.to_string(),
        name: name.to_string(),
        namespace: None,
    }
}

fn service_account_subject(namespace: &str, name: &str) -> Subject {
    Subject {
        api_group: Some(String::new()),
        kind: "ServiceAccount".to_string(),
        name: name.to_string(),
        namespace: Some(namespace.to_string()),
    }
}

fn binding(role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: metadata(role, &[]),
        role_ref: RoleRef {
            api_group: RBAC_GROUP.to_string(),
            kind: "ClusterRole".to_string(),
            name: role.to_string(),
        },
        subjects: (!subjects.is_empty()).then_some(subjects),
    }
}

/// kube-proxy's user (upstream `user.KubeProxy`), bound to `system:node-proxier` (Services,
/// EndpointSlices and Nodes read, events written). Every node's network (`skerry-net`: the
/// service proxy, routes, cluster DNS) calls the API as this user, with a certificate of its
/// own beside the kubelet's, as a k3s agent's kube-proxy does: the node's own identity keeps
/// reading only its own Node and pods (AuthorizeNodeWithSelectors).
pub const KUBE_PROXY_USER: &str = "system:kube-proxy";

/// Kubernetes' default ClusterRoleBindings for [`cluster_roles`], each named for its role.
pub fn cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    let group = |name: &str| user_subject("Group", name);
    let user = |name: &str| user_subject("User", name);
    let mut bindings = vec![
        binding("cluster-admin", vec![group(super::GROUP_MASTERS)]),
        binding("system:monitoring", vec![group("system:monitoring")]),
        binding("system:discovery", vec![group(super::GROUP_AUTHENTICATED)]),
        binding("system:basic-user", vec![group(super::GROUP_AUTHENTICATED)]),
        binding(
            "system:public-info-viewer",
            vec![
                group(super::GROUP_AUTHENTICATED),
                group(super::GROUP_UNAUTHENTICATED),
            ],
        ),
        binding("system:node-proxier", vec![user(KUBE_PROXY_USER)]),
        binding(
            "system:kube-controller-manager",
            vec![user("system:kube-controller-manager")],
        ),
        binding(
            "system:kube-dns",
            vec![service_account_subject("kube-system", "kube-dns")],
        ),
        binding("system:kube-scheduler", vec![user("system:kube-scheduler")]),
        binding(
            "system:volume-scheduler",
            vec![user("system:kube-scheduler")],
        ),
        // Kept with no subjects since 1.8: nodes are authorized by the Node authorizer.
        binding("system:node", Vec::new()),
        binding(
            "system:service-account-issuer-discovery",
            vec![group(super::serviceaccount::GROUP_ALL)],
        ),
    ];
    for controller in CONTROLLERS {
        bindings.push(binding(
            &format!("{CONTROLLER_ROLE_PREFIX}{controller}"),
            vec![service_account_subject("kube-system", controller)],
        ));
    }
    bindings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::UserInfo;
    use crate::auth::rbac::{Attributes, RbacSnapshot, authorize};

    fn find<'a>(roles: &'a [ClusterRole], name: &str) -> &'a ClusterRole {
        roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no role {name}"))
    }

    #[test]
    fn every_binding_names_an_existing_role_and_names_are_unique() {
        let roles = cluster_roles();
        let mut names: Vec<&str> = roles
            .iter()
            .filter_map(|r| r.metadata.name.as_deref())
            .collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "duplicate role names");
        for binding in cluster_role_bindings() {
            assert!(
                names.contains(&binding.role_ref.name.as_str()),
                "binding to missing role {}",
                binding.role_ref.name
            );
            assert_eq!(
                binding
                    .metadata
                    .labels
                    .as_ref()
                    .map(|l| l[LABEL_BOOTSTRAPPING.0].as_str()),
                Some("rbac-defaults")
            );
        }
        for controller in CONTROLLERS {
            find(&roles, &format!("system:controller:{controller}"));
        }
    }

    #[test]
    fn the_disruption_controller_may_write_budget_status_and_read_scales() {
        let policy = RbacSnapshot::bootstrap();
        let user = UserInfo::authenticated(
            "system:serviceaccount:kube-system:disruption-controller",
            "",
            vec!["system:serviceaccounts".into()],
        );
        let allowed = |verb: &str, group: &str, resource: &str, subresource: &str| {
            let attributes = Attributes::resource(user.clone(), verb, group, resource, "ns", "x");
            let attributes = if subresource.is_empty() {
                attributes
            } else {
                attributes.with_subresource(subresource)
            };
            authorize(&attributes, &policy).allowed
        };
        assert!(allowed(
            "update",
            "policy",
            "poddisruptionbudgets",
            "status"
        ));
        assert!(allowed("watch", "policy", "poddisruptionbudgets", ""));
        assert!(allowed("get", "apps", "deployments", "scale"));
        assert!(allowed("get", "example.com", "widgets", "scale"));
        assert!(allowed("update", "", "pods", "status"));
        assert!(!allowed("update", "apps", "deployments", "scale"));
        assert!(!allowed("update", "policy", "poddisruptionbudgets", ""));
        assert!(!allowed("delete", "", "pods", ""));
    }

    #[test]
    fn aggregated_roles_nest() {
        let roles = cluster_roles();
        let rules = |name: &str| find(&roles, name).rules.clone().unwrap_or_default();
        let view = rules("view");
        let edit = rules("edit");
        let admin = rules("admin");
        assert_eq!(view, aggregate_to_view());
        assert!(view.iter().all(|r| edit.contains(r)), "edit includes view");
        assert!(
            edit.iter().all(|r| admin.contains(r)),
            "admin includes edit"
        );
        assert!(aggregate_to_edit().iter().all(|r| edit.contains(r)));
        assert!(admin.len() > edit.len() && edit.len() > view.len());
    }

    #[test]
    fn the_network_reads_what_it_needs_and_nodes_get_no_cluster_wide_read() {
        let policy = RbacSnapshot::bootstrap();
        let network = UserInfo::authenticated(KUBE_PROXY_USER, "", Vec::new());
        let node = UserInfo::authenticated(
            "system:node:a",
            "",
            vec![crate::node_authz::NODES_GROUP.into()],
        );
        let can = |user: &UserInfo, verb: &str, group: &str, resource: &str| {
            authorize(
                &Attributes::resource(user.clone(), verb, group, resource, "", ""),
                &policy,
            )
            .allowed
        };
        for verb in ["list", "watch"] {
            assert!(can(&network, verb, "discovery.k8s.io", "endpointslices"));
            assert!(can(&network, verb, "", "services"));
            assert!(can(&network, verb, "", "nodes"));
            // The node's own identity reads Nodes only through the Node authorizer, which
            // gives it its own Node alone: RBAC must not give it every Node.
            assert!(!can(&node, verb, "", "nodes"), "{verb} nodes");
            assert!(!can(&node, verb, "discovery.k8s.io", "endpointslices"));
        }
        assert!(!can(&network, "create", "", "services"));
        assert!(!can(
            &network,
            "update",
            "discovery.k8s.io",
            "endpointslices"
        ));
        assert!(!can(&network, "list", "", "secrets"));
    }

    #[test]
    fn the_auth_delegator_creates_token_and_subject_access_reviews_only() {
        let mut policy = RbacSnapshot::bootstrap();
        // Kubernetes binds the role to nobody; a delegating component's installer does.
        assert!(
            cluster_role_bindings()
                .iter()
                .all(|b| b.role_ref.name != "system:auth-delegator")
        );
        policy.insert_cluster_role_binding(binding(
            "system:auth-delegator",
            vec![user_subject("User", "kubelet-api")],
        ));
        let delegate = UserInfo::authenticated("kubelet-api", "", Vec::new());
        let create = |group: &str, resource: &str, namespace: &str| {
            authorize(
                &Attributes::resource(delegate.clone(), "create", group, resource, namespace, ""),
                &policy,
            )
            .allowed
        };
        assert!(create("authentication.k8s.io", "tokenreviews", ""));
        assert!(create("authorization.k8s.io", "subjectaccessreviews", ""));
        assert!(!create(
            "authorization.k8s.io",
            "localsubjectaccessreviews",
            "a"
        ));
        let plain = UserInfo::authenticated("someone", "", Vec::new());
        assert!(
            !authorize(
                &Attributes::resource(
                    plain,
                    "create",
                    "authorization.k8s.io",
                    "subjectaccessreviews",
                    "",
                    ""
                ),
                &policy
            )
            .allowed
        );
    }

    #[test]
    fn default_subjects_get_their_powers() {
        let policy = RbacSnapshot::bootstrap();
        let authenticated = UserInfo::authenticated("someone", "", Vec::new());
        let anonymous = UserInfo::anonymous();
        let get = |user: &UserInfo, path: &str| {
            authorize(
                &Attributes::non_resource(user.clone(), "get", path),
                &policy,
            )
            .allowed
        };
        assert!(get(&authenticated, "/apis"));
        assert!(get(&authenticated, "/api/v1"));
        assert!(get(&anonymous, "/healthz"));
        assert!(get(&anonymous, "/version"));
        assert!(!get(&anonymous, "/apis"));
        assert!(!get(&authenticated, "/metrics"));
        let ssar = Attributes::resource(
            authenticated.clone(),
            "create",
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            "",
            "",
        );
        assert!(authorize(&ssar, &policy).allowed);
        assert!(
            !authorize(
                &Attributes {
                    user: anonymous,
                    ..ssar
                },
                &policy
            )
            .allowed
        );

        let scheduler = UserInfo::authenticated("system:kube-scheduler", "", Vec::new());
        let bind = Attributes::resource(scheduler.clone(), "create", "", "pods", "ns", "p")
            .with_subresource("binding");
        assert!(authorize(&bind, &policy).allowed);
        let secrets = Attributes::resource(scheduler, "get", "", "secrets", "ns", "s");
        assert!(!authorize(&secrets, &policy).allowed);

        let rs = UserInfo::authenticated(
            "system:serviceaccount:kube-system:replicaset-controller",
            "",
            vec!["system:serviceaccounts".into()],
        );
        let create_pod = Attributes::resource(rs.clone(), "create", "", "pods", "team-a", "");
        let allowed = authorize(&create_pod, &policy);
        assert!(allowed.allowed);
        assert_eq!(
            allowed.reason,
            "RBAC: allowed by ClusterRoleBinding \"system:controller:replicaset-controller\" of ClusterRole \"system:controller:replicaset-controller\" to ServiceAccount \"replicaset-controller/kube-system\""
        );
        let delete_node = Attributes::resource(rs, "delete", "", "nodes", "", "n1");
        assert!(!authorize(&delete_node, &policy).allowed);
    }
}
