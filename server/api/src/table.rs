//! Server-side printing: the `Table` columns and row cells `kubectl get` shows for each
//! resource, as Kubernetes 1.32 prints them (pkg/printers/internalversion/printers.go).
//!
//! kubectl asks for `as=Table` and prints whatever columns the server sends; columns with
//! priority 1 appear only with `-o wide`. Like Kubernetes' table convertor, rows always carry
//! every cell (the wide ones included) and the client hides what it does not show.
//! The apiserver wraps [`row_cells`] in `meta.k8s.io/v1` rows with the object's
//! `PartialObjectMetadata`.
//!
//! Invariants: `row_cells(r, ..)` has exactly as many cells as `column_definitions(r)` has
//! columns, for every resource and any object JSON; printing never fails — a missing or
//! malformed field prints as Kubernetes prints a zero value.

use std::collections::BTreeSet;
use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::ResourceInfo;

/// Entries shown before `+ N more...` in endpoint and port lists (printers.go's `max := 3`).
const LIST_ITEMS_SHOWN_MAX: usize = 3;

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const CONTAINERS_DESCRIPTION: &str = "Names of each container in the template.";
const IMAGES_DESCRIPTION: &str = "Images referenced by each container in the template.";

/// One `TableColumnDefinition`.
fn column(name: &str, kind: &str, description: &str, priority: i32) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": kind, "format": format, "description": description, "priority": priority})
}

fn name_column() -> Value {
    column("Name", "string", NAME_DESCRIPTION, 0)
}

fn age_column() -> Value {
    column("Age", "string", AGE_DESCRIPTION, 0)
}

/// The columns of `resource`'s table, as a JSON array of `TableColumnDefinition`.
pub fn column_definitions(resource: &ResourceInfo) -> Value {
    let s = "string";
    let i = "integer";
    let columns = match (resource.group, resource.resource) {
        ("", "pods") => vec![
            name_column(),
            column(
                "Ready",
                s,
                "The aggregate readiness state of this pod for accepting traffic.",
                0,
            ),
            column(
                "Status",
                s,
                "The aggregate status of the containers in this pod.",
                0,
            ),
            column(
                "Restarts",
                s,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                0,
            ),
            age_column(),
            column(
                "IP",
                s,
                "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
                1,
            ),
            column(
                "Node",
                s,
                "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename",
                1,
            ),
            column(
                "Nominated Node",
                s,
                "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.",
                1,
            ),
            column(
                "Readiness Gates",
                s,
                "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates",
                1,
            ),
        ],
        ("apps", "deployments") => vec![
            name_column(),
            column("Ready", s, "Number of the pod with ready state", 0),
            column(
                "Up-to-date",
                s,
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                0,
            ),
            column(
                "Available",
                s,
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                0,
            ),
            age_column(),
            column("Containers", s, CONTAINERS_DESCRIPTION, 1),
            column("Images", s, IMAGES_DESCRIPTION, 1),
            column(
                "Selector",
                s,
                "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
                1,
            ),
        ],
        ("apps", "replicasets") => vec![
            name_column(),
            column(
                "Desired",
                i,
                "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/#what-is-a-replicationcontroller",
                0,
            ),
            column(
                "Current",
                i,
                "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/#what-is-a-replicationcontroller",
                0,
            ),
            column(
                "Ready",
                i,
                "The number of ready replicas for this replica set.",
                0,
            ),
            age_column(),
            column("Containers", s, CONTAINERS_DESCRIPTION, 1),
            column("Images", s, IMAGES_DESCRIPTION, 1),
            column(
                "Selector",
                s,
                "Selector is a label query over pods that should match the replica count. If the selector is empty, it is defaulted to the labels present on the pod template. Label keys and values that must match in order to be controlled by this replica set. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
                1,
            ),
        ],
        ("apps", "daemonsets") => vec![
            name_column(),
            column(
                "Desired",
                i,
                "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
                0,
            ),
            column(
                "Current",
                i,
                "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
                0,
            ),
            column(
                "Ready",
                i,
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
                0,
            ),
            column(
                "Up-to-date",
                i,
                "The total number of nodes that are running updated daemon pod",
                0,
            ),
            column(
                "Available",
                i,
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
                0,
            ),
            column(
                "Node Selector",
                s,
                "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
                0,
            ),
            age_column(),
            column("Containers", s, CONTAINERS_DESCRIPTION, 1),
            column("Images", s, IMAGES_DESCRIPTION, 1),
            column(
                "Selector",
                s,
                "A label query over pods that are managed by the daemon set. Must match in order to be controlled. If empty, defaulted to labels on Pod template. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
                1,
            ),
        ],
        ("apps", "statefulsets") => vec![
            name_column(),
            column("Ready", s, "Number of the pod with ready state", 0),
            age_column(),
            column("Containers", s, CONTAINERS_DESCRIPTION, 1),
            column("Images", s, IMAGES_DESCRIPTION, 1),
        ],
        ("", "services") => vec![
            name_column(),
            column(
                "Type",
                s,
                "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types",
                0,
            ),
            column(
                "Cluster-IP",
                s,
                "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
                0,
            ),
            column(
                "External-IP",
                s,
                "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system.",
                0,
            ),
            column(
                "Port(s)",
                s,
                "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
                0,
            ),
            age_column(),
            column(
                "Selector",
                s,
                "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/",
                1,
            ),
        ],
        ("", "endpoints") => vec![
            name_column(),
            column(
                "Endpoints",
                s,
                "The set of all endpoints is the union of all subsets. Addresses are placed into subsets according to the IPs they share. A single address with multiple ports, some of which are ready and some of which are not (because they come from different containers) will result in the address being displayed in different subsets for the different ports. No address will appear in both Addresses and NotReadyAddresses in the same subset. Sets of addresses and ports that comprise a service.",
                0,
            ),
            age_column(),
        ],
        ("", "nodes") => vec![
            name_column(),
            column("Status", s, "The status of the node", 0),
            column("Roles", s, "The roles of the node", 0),
            age_column(),
            column("Version", s, "Kubelet Version reported by the node.", 0),
            column("Internal-IP", s, NODE_ADDRESSES_DESCRIPTION, 1),
            column("External-IP", s, NODE_ADDRESSES_DESCRIPTION, 1),
            column(
                "OS-Image",
                s,
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
                1,
            ),
            column(
                "Kernel-Version",
                s,
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
                1,
            ),
            column(
                "Container-Runtime",
                s,
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
                1,
            ),
        ],
        ("", "events") => vec![
            column(
                "Last Seen",
                s,
                "The time at which the most recent occurrence of this event was recorded.",
                0,
            ),
            column(
                "Type",
                s,
                "Type of this event (Normal, Warning), new types could be added in the future",
                0,
            ),
            column(
                "Reason",
                s,
                "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
                0,
            ),
            column("Object", s, "The object that this event is about.", 0),
            column(
                "Subobject",
                s,
                "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2]. For example, if the object reference is to a container within a pod, this would take on a value like: \"spec.containers{name}\" (where \"name\" refers to the name of the container that triggered the event) or if no container name is specified \"spec.containers[2]\" (container with index 2 in this pod). This syntax is chosen only to have some well-defined way of referencing a part of an object.",
                1,
            ),
            column(
                "Source",
                s,
                "The component reporting this event. Should be a short machine understandable string.",
                1,
            ),
            column(
                "Message",
                s,
                "A human-readable description of the status of this operation.",
                0,
            ),
            column(
                "First Seen",
                s,
                "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
                1,
            ),
            column(
                "Count",
                s,
                "The number of times this event has occurred.",
                1,
            ),
            column("Name", s, NAME_DESCRIPTION, 1),
        ],
        ("", "namespaces") => vec![
            name_column(),
            column("Status", s, "The status of the namespace", 0),
            age_column(),
        ],
        ("", "secrets") => vec![
            name_column(),
            column(
                "Type",
                s,
                "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
                0,
            ),
            column(
                "Data",
                s,
                "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
                0,
            ),
            age_column(),
        ],
        ("", "serviceaccounts") => vec![
            name_column(),
            column(
                "Secrets",
                s,
                "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use. Pods are only limited to this list if this service account has a \"kubernetes.io/enforce-mountable-secrets\" annotation set to \"true\". The \"kubernetes.io/enforce-mountable-secrets\" annotation is deprecated since v1.32. Prefer separate namespaces to isolate access to mounted secrets. This field should not be used to find auto-generated service account token secrets for use outside of pods. Instead, tokens can be requested directly using the TokenRequest API, or service account token secrets can be manually created. More info: https://kubernetes.io/docs/concepts/configuration/secret",
                0,
            ),
            age_column(),
        ],
        ("", "configmaps") => vec![
            name_column(),
            column(
                "Data",
                s,
                "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
                0,
            ),
            age_column(),
        ],
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => {
            let what = if resource.resource == "rolebindings" {
                "roleBinding"
            } else {
                "clusterRoleBinding"
            };
            let role_ref = if resource.resource == "rolebindings" {
                "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable."
            } else {
                "RoleRef can only reference a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable."
            };
            vec![
                name_column(),
                column("Role", s, role_ref, 0),
                age_column(),
                column("Users", s, &format!("Users in the {what}"), 1),
                column("Groups", s, &format!("Groups in the {what}"), 1),
                column(
                    "ServiceAccounts",
                    s,
                    &format!("ServiceAccounts in the {what}"),
                    1,
                ),
            ]
        }
        ("coordination.k8s.io", "leases") => vec![
            name_column(),
            column(
                "Holder",
                s,
                "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
                0,
            ),
            age_column(),
        ],
        ("discovery.k8s.io", "endpointslices") => vec![
            name_column(),
            column(
                "AddressType",
                s,
                "addressType specifies the type of address carried by this EndpointSlice. All addresses in this slice must be the same type. This field is immutable after creation. The following address types are currently supported: * IPv4: Represents an IPv4 Address. * IPv6: Represents an IPv6 Address. * FQDN: Represents a Fully Qualified Domain Name.",
                0,
            ),
            column(
                "Ports",
                s,
                "ports specifies the list of network ports exposed by each endpoint in this slice. Each port must have a unique name. When ports is empty, it indicates that there are no defined ports. When a port is defined with a nil port value, it indicates \"all ports\". Each slice may include a maximum of 100 ports.",
                0,
            ),
            column(
                "Endpoints",
                s,
                "endpoints is a list of unique endpoints in this slice. Each slice may include a maximum of 1000 endpoints.",
                0,
            ),
            age_column(),
        ],
        ("scheduling.k8s.io", "priorityclasses") => vec![
            name_column(),
            column("Value", i, PRIORITY_CLASS_VALUE_DESCRIPTION, 0),
            column(
                "Global-Default",
                "boolean",
                PRIORITY_CLASS_GLOBAL_DEFAULT_DESCRIPTION,
                0,
            ),
            age_column(),
            column(
                "PreemptionPolicy",
                s,
                PRIORITY_CLASS_PREEMPTION_POLICY_DESCRIPTION,
                0,
            ),
        ],
        ("policy", "poddisruptionbudgets") => vec![
            name_column(),
            column(
                "Min Available",
                s,
                "The minimum number of pods that must be available.",
                0,
            ),
            column(
                "Max Unavailable",
                s,
                "The maximum number of pods that may be unavailable.",
                0,
            ),
            column(
                "Allowed Disruptions",
                i,
                "Calculated number of pods that may be disrupted at this time.",
                0,
            ),
            age_column(),
        ],
        // Roles, ClusterRoles, and any resource without a printer: Kubernetes' default table.
        _ => vec![
            name_column(),
            column("Created At", "date", AGE_DESCRIPTION, 0),
        ],
    };
    Value::Array(columns)
}

/// scheduling/v1 `PriorityClass` SwaggerDoc for the columns kubectl shows.
const PRIORITY_CLASS_VALUE_DESCRIPTION: &str = "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.";
const PRIORITY_CLASS_GLOBAL_DEFAULT_DESCRIPTION: &str = "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority.";
const PRIORITY_CLASS_PREEMPTION_POLICY_DESCRIPTION: &str = "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset.";

const NODE_ADDRESSES_DESCRIPTION: &str = "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).";

/// The cells of `obj`'s row, one per column of [`column_definitions`], with `now` as the
/// reference for ages.
pub fn row_cells(resource: &ResourceInfo, obj: &Value, now: SystemTime) -> Vec<Value> {
    let ctx = Printer { obj, now };
    match (resource.group, resource.resource) {
        ("", "pods") => ctx.pod(),
        ("apps", "deployments") => ctx.deployment(),
        ("apps", "replicasets") => ctx.replica_set(),
        ("apps", "daemonsets") => ctx.daemon_set(),
        ("apps", "statefulsets") => ctx.stateful_set(),
        ("", "services") => ctx.service(),
        ("", "endpoints") => vec![ctx.name(), json!(format_endpoints(obj)), ctx.age()],
        ("", "nodes") => ctx.node(),
        ("", "events") => ctx.event(),
        ("", "namespaces") => vec![ctx.name(), json!(text(obj, "/status/phase")), ctx.age()],
        ("", "secrets") => vec![
            ctx.name(),
            json!(text(obj, "/type")),
            json!(map_len(obj, "/data")),
            ctx.age(),
        ],
        ("", "serviceaccounts") => vec![ctx.name(), json!(list(obj, "/secrets").len()), ctx.age()],
        ("", "configmaps") => vec![
            ctx.name(),
            json!(map_len(obj, "/data") + map_len(obj, "/binaryData")),
            ctx.age(),
        ],
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => ctx.binding(),
        ("coordination.k8s.io", "leases") => {
            vec![
                ctx.name(),
                json!(text(obj, "/spec/holderIdentity")),
                ctx.age(),
            ]
        }
        ("discovery.k8s.io", "endpointslices") => vec![
            ctx.name(),
            json!(text(obj, "/addressType")),
            json!(format_slice_ports(list(obj, "/ports"))),
            json!(format_slice_endpoints(list(obj, "/endpoints"))),
            ctx.age(),
        ],
        ("scheduling.k8s.io", "priorityclasses") => vec![
            ctx.name(),
            json!(int(obj, "/value")),
            json!(
                obj.get("globalDefault")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            ),
            ctx.age(),
            json!(text(obj, "/preemptionPolicy")),
        ],
        ("policy", "poddisruptionbudgets") => vec![
            ctx.name(),
            json!(int_or_string_or_na(obj.pointer("/spec/minAvailable"))),
            json!(int_or_string_or_na(obj.pointer("/spec/maxUnavailable"))),
            json!(int(obj, "/status/disruptionsAllowed")),
            ctx.age(),
        ],
        _ => vec![ctx.name(), json!(created_at(obj))],
    }
}

/// A PDB amount as printPodDisruptionBudget shows it: the IntOrString's `String()`, or `N/A`
/// when unset.
fn int_or_string_or_na(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "N/A".to_string(),
    }
}

// ----- JSON access -----

fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn int(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn list<'a>(obj: &'a Value, pointer: &str) -> &'a [Value] {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn map_len(obj: &Value, pointer: &str) -> usize {
    obj.pointer(pointer)
        .and_then(Value::as_object)
        .map_or(0, Map::len)
}

// ----- durations -----

/// apimachinery `duration.HumanDuration`: `5s`, `3m2s`, `2d3h`, `4y10d`, coarser as it grows.
pub fn human_duration(seconds_total: i64) -> String {
    if seconds_total < -1 {
        // A clock more than a second behind is a skew, not "just now".
        return "<invalid>".to_string();
    }
    if seconds_total < 0 {
        return "0s".to_string();
    }
    if seconds_total < 60 * 2 {
        return format!("{seconds_total}s");
    }
    let minutes = seconds_total / 60;
    if minutes < 10 {
        let seconds = seconds_total % 60;
        return if seconds == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{seconds}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds_total / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Whole seconds from an RFC 3339 timestamp to `now` (Go's `int(d.Seconds())`, truncating).
fn seconds_since(timestamp: &str, now: SystemTime) -> Option<i64> {
    let then: Timestamp = timestamp.parse().ok()?;
    let now = Timestamp::try_from(now).ok()?;
    let nanos = now.as_nanosecond() - then.as_nanosecond();
    i64::try_from(nanos / 1_000_000_000).ok()
}

/// printers.go `translateTimestampSince`: `<unknown>` for a missing time.
fn since(timestamp: &str, now: SystemTime) -> String {
    match seconds_since(timestamp, now) {
        Some(seconds) if !timestamp.is_empty() => human_duration(seconds),
        _ => "<unknown>".to_string(),
    }
}

/// `Created At` of the default table: the creation time in RFC 3339, UTC.
fn created_at(obj: &Value) -> String {
    let raw = text(obj, "/metadata/creationTimestamp");
    raw.parse::<Timestamp>()
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

// ----- formatting helpers -----

/// labels.FormatLabels: `k=v,k2=v2` sorted by key, `<none>` when empty.
fn format_labels(labels: Option<&Value>) -> String {
    let Some(map) = labels.and_then(Value::as_object).filter(|m| !m.is_empty()) else {
        return "<none>".to_string();
    };
    map.iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join(",")
}

/// metav1 `LabelSelectorAsSelector(..).String()`: requirements sorted by key; `""` for a
/// selector that selects everything or nothing, `None` for a malformed one.
fn selector_string(selector: Option<&Value>) -> Option<String> {
    let Some(selector) = selector.filter(|s| s.is_object()) else {
        return Some(String::new());
    };
    let mut requirements: Vec<(String, String)> = Vec::new();
    if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            requirements.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for expr in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let k = text(expr, "/key");
        let values: BTreeSet<&str> = list(expr, "/values")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let joined = values.into_iter().collect::<Vec<_>>().join(",");
        let rendered = match text(expr, "/operator") {
            "In" => format!("{k} in ({joined})"),
            "NotIn" => format!("{k} notin ({joined})"),
            "Exists" => k.to_string(),
            "DoesNotExist" => format!("!{k}"),
            _ => return None,
        };
        requirements.push((k.to_string(), rendered));
    }
    requirements.sort_by(|a, b| a.0.cmp(&b.0));
    Some(
        requirements
            .into_iter()
            .map(|(_, r)| r)
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// metav1 `FormatLabelSelector`: `<none>` when empty, `<error>` when malformed.
fn format_label_selector(selector: Option<&Value>) -> String {
    match selector_string(selector) {
        None => "<error>".to_string(),
        Some(s) if s.is_empty() => "<none>".to_string(),
        Some(s) => s,
    }
}

/// printers.go `layoutContainerCells`: names and images, comma-joined.
fn container_cells(template_spec: Option<&Value>) -> (String, String) {
    let containers = template_spec
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let names = containers
        .iter()
        .map(|c| text(c, "/name"))
        .collect::<Vec<_>>()
        .join(",");
    let images = containers
        .iter()
        .map(|c| text(c, "/image"))
        .collect::<Vec<_>>()
        .join(",");
    (names, images)
}

fn with_more(shown: Vec<String>, total: usize) -> String {
    let joined = shown.join(",");
    if total > shown.len() {
        format!("{joined} + {} more...", total - shown.len())
    } else if joined.is_empty() {
        "<unset>".to_string()
    } else {
        joined
    }
}

/// printers.go `formatEndpoints`: up to three `ip:port`, then `+ N more...`.
fn format_endpoints(obj: &Value) -> String {
    let subsets = list(obj, "/subsets");
    if subsets.is_empty() {
        return "<none>".to_string();
    }
    let mut shown = Vec::new();
    let mut total = 0usize;
    for subset in subsets {
        let addresses = list(subset, "/addresses");
        let ports = list(subset, "/ports");
        let mut push = |entry: String| {
            if shown.len() < LIST_ITEMS_SHOWN_MAX {
                shown.push(entry);
            }
            total += 1;
        };
        if ports.is_empty() {
            // Headless services may have no ports.
            for address in addresses {
                push(text(address, "/ip").to_string());
            }
        } else {
            for port in ports {
                for address in addresses {
                    let ip = text(address, "/ip");
                    let host = if ip.contains(':') {
                        format!("[{ip}]")
                    } else {
                        ip.to_string()
                    };
                    push(format!("{host}:{}", int(port, "/port")));
                }
            }
        }
    }
    let joined = shown.join(",");
    if total > shown.len() {
        format!("{joined} + {} more...", total - shown.len())
    } else {
        joined
    }
}

fn format_slice_ports(ports: &[Value]) -> String {
    let shown = ports
        .iter()
        .take(LIST_ITEMS_SHOWN_MAX)
        .map(|p| {
            match (
                p.get("port").and_then(Value::as_i64),
                p.get("name").and_then(Value::as_str),
            ) {
                (Some(n), _) => n.to_string(),
                (None, Some(name)) => name.to_string(),
                (None, None) => "*".to_string(),
            }
        })
        .collect();
    with_more(shown, ports.len())
}

fn format_slice_endpoints(endpoints: &[Value]) -> String {
    let addresses: Vec<&str> = endpoints
        .iter()
        .flat_map(|e| list(e, "/addresses").iter().filter_map(Value::as_str))
        .collect();
    let shown = addresses
        .iter()
        .take(LIST_ITEMS_SHOWN_MAX)
        .map(|a| a.to_string())
        .collect();
    with_more(shown, addresses.len())
}

// ----- per-kind rows -----

struct Printer<'a> {
    obj: &'a Value,
    now: SystemTime,
}

impl Printer<'_> {
    fn name(&self) -> Value {
        json!(text(self.obj, "/metadata/name"))
    }

    fn age(&self) -> Value {
        json!(since(
            text(self.obj, "/metadata/creationTimestamp"),
            self.now
        ))
    }

    fn containers(&self) -> (Value, Value) {
        let (names, images) = container_cells(self.obj.pointer("/spec/template/spec"));
        (json!(names), json!(images))
    }

    /// printers.go `printPod` (1.32: sidecar-aware, scheduling gates, Terminating).
    fn pod(&self) -> Vec<Value> {
        let pod = self.obj;
        let phase = text(pod, "/status/phase");
        let mut reason = match text(pod, "/status/reason") {
            "" => phase.to_string(),
            r => r.to_string(),
        };
        let conditions = list(pod, "/status/conditions");
        let condition_true = |kind: &str| {
            conditions
                .iter()
                .any(|c| text(c, "/type") == kind && text(c, "/status") == "True")
        };
        if conditions
            .iter()
            .any(|c| text(c, "/type") == "PodScheduled" && text(c, "/reason") == "SchedulingGated")
        {
            reason = "SchedulingGated".to_string();
        }
        let init_specs = list(pod, "/spec/initContainers");
        let restartable = |name: &str| {
            init_specs
                .iter()
                .any(|c| text(c, "/name") == name && text(c, "/restartPolicy") == "Always")
        };
        let total = list(pod, "/spec/containers").len()
            + init_specs
                .iter()
                .filter(|c| text(c, "/restartPolicy") == "Always")
                .count();
        let mut ready = 0usize;
        let mut restarts = 0i64;
        let mut sidecar_restarts = 0i64;
        let mut last_restart: Option<Timestamp> = None;
        let mut last_sidecar_restart: Option<Timestamp> = None;
        let finished_at = |status: &Value| {
            status
                .pointer("/lastState/terminated/finishedAt")
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<Timestamp>().ok())
        };
        let mut initializing = false;
        let init_statuses = list(pod, "/status/initContainerStatuses");
        for (i, status) in init_statuses.iter().enumerate() {
            let name = text(status, "/name");
            restarts += int(status, "/restartCount");
            last_restart = last_restart.max(finished_at(status));
            if restartable(name) {
                sidecar_restarts += int(status, "/restartCount");
                last_sidecar_restart = last_sidecar_restart.max(finished_at(status));
            }
            let terminated = status
                .pointer("/state/terminated")
                .filter(|t| t.is_object());
            let waiting_reason = text(status, "/state/waiting/reason");
            if terminated.is_some_and(|t| int(t, "/exitCode") == 0) {
                continue;
            }
            if restartable(name) && status.get("started").and_then(Value::as_bool) == Some(true) {
                if status.get("ready").and_then(Value::as_bool) == Some(true) {
                    ready += 1;
                }
                continue;
            }
            if let Some(t) = terminated {
                reason = match text(t, "/reason") {
                    "" if int(t, "/signal") != 0 => format!("Init:Signal:{}", int(t, "/signal")),
                    "" => format!("Init:ExitCode:{}", int(t, "/exitCode")),
                    r => format!("Init:{r}"),
                };
            } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
                reason = format!("Init:{waiting_reason}");
            } else {
                reason = format!("Init:{i}/{}", init_specs.len());
            }
            initializing = true;
            break;
        }
        if !initializing || condition_true("Initialized") {
            restarts = sidecar_restarts;
            last_restart = last_sidecar_restart;
            let mut has_running = false;
            for status in list(pod, "/status/containerStatuses").iter().rev() {
                restarts += int(status, "/restartCount");
                last_restart = last_restart.max(finished_at(status));
                let waiting_reason = text(status, "/state/waiting/reason");
                let terminated = status
                    .pointer("/state/terminated")
                    .filter(|t| t.is_object());
                let running = status
                    .pointer("/state/running")
                    .is_some_and(Value::is_object);
                if !waiting_reason.is_empty() {
                    reason = waiting_reason.to_string();
                } else if let Some(t) = terminated {
                    reason = match text(t, "/reason") {
                        "" if int(t, "/signal") != 0 => format!("Signal:{}", int(t, "/signal")),
                        "" => format!("ExitCode:{}", int(t, "/exitCode")),
                        r => r.to_string(),
                    };
                } else if status.get("ready").and_then(Value::as_bool) == Some(true) && running {
                    has_running = true;
                    ready += 1;
                }
            }
            if reason == "Completed" && has_running {
                reason = if condition_true("Ready") {
                    "Running"
                } else {
                    "NotReady"
                }
                .to_string();
            }
        }
        let deleting = pod
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|d| !d.is_null());
        if deleting && text(pod, "/status/reason") == "NodeLost" {
            reason = "Unknown".to_string();
        } else if deleting && phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".to_string();
        }
        let restarts_cell = match last_restart {
            Some(at) if restarts != 0 => {
                let ago = Timestamp::try_from(self.now)
                    .map(|now| {
                        human_duration(
                            ((now.as_nanosecond() - at.as_nanosecond()) / 1_000_000_000) as i64,
                        )
                    })
                    .unwrap_or_else(|_| "<unknown>".to_string());
                format!("{restarts} ({ago} ago)")
            }
            _ => restarts.to_string(),
        };
        let or_none = |s: &str| {
            if s.is_empty() {
                "<none>".to_string()
            } else {
                s.to_string()
            }
        };
        let pod_ip = list(pod, "/status/podIPs")
            .first()
            .map(|p| text(p, "/ip"))
            .unwrap_or("");
        let gates = list(pod, "/spec/readinessGates");
        let gates_cell = if gates.is_empty() {
            "<none>".to_string()
        } else {
            let satisfied = gates
                .iter()
                .filter(|g| {
                    let kind = text(g, "/conditionType");
                    conditions
                        .iter()
                        .find(|c| text(c, "/type") == kind)
                        .is_some_and(|c| text(c, "/status") == "True")
                })
                .count();
            format!("{satisfied}/{}", gates.len())
        };
        vec![
            self.name(),
            json!(format!("{ready}/{total}")),
            json!(reason),
            json!(restarts_cell),
            self.age(),
            json!(or_none(pod_ip)),
            json!(or_none(text(pod, "/spec/nodeName"))),
            json!(or_none(text(pod, "/status/nominatedNodeName"))),
            json!(gates_cell),
        ]
    }

    fn deployment(&self) -> Vec<Value> {
        let d = self.obj;
        let (names, images) = self.containers();
        let selector =
            selector_string(d.pointer("/spec/selector")).unwrap_or_else(|| "<invalid>".to_string());
        vec![
            self.name(),
            json!(format!(
                "{}/{}",
                int(d, "/status/readyReplicas"),
                int(d, "/spec/replicas")
            )),
            json!(int(d, "/status/updatedReplicas")),
            json!(int(d, "/status/availableReplicas")),
            self.age(),
            names,
            images,
            json!(selector),
        ]
    }

    fn replica_set(&self) -> Vec<Value> {
        let r = self.obj;
        let (names, images) = self.containers();
        vec![
            self.name(),
            json!(int(r, "/spec/replicas")),
            json!(int(r, "/status/replicas")),
            json!(int(r, "/status/readyReplicas")),
            self.age(),
            names,
            images,
            json!(format_label_selector(r.pointer("/spec/selector"))),
        ]
    }

    fn daemon_set(&self) -> Vec<Value> {
        let d = self.obj;
        let (names, images) = self.containers();
        vec![
            self.name(),
            json!(int(d, "/status/desiredNumberScheduled")),
            json!(int(d, "/status/currentNumberScheduled")),
            json!(int(d, "/status/numberReady")),
            json!(int(d, "/status/updatedNumberScheduled")),
            json!(int(d, "/status/numberAvailable")),
            json!(format_labels(d.pointer("/spec/template/spec/nodeSelector"))),
            self.age(),
            names,
            images,
            json!(format_label_selector(d.pointer("/spec/selector"))),
        ]
    }

    fn stateful_set(&self) -> Vec<Value> {
        let s = self.obj;
        let (names, images) = self.containers();
        vec![
            self.name(),
            json!(format!(
                "{}/{}",
                int(s, "/status/readyReplicas"),
                int(s, "/spec/replicas")
            )),
            self.age(),
            names,
            images,
        ]
    }

    fn service(&self) -> Vec<Value> {
        let svc = self.obj;
        let cluster_ip = list(svc, "/spec/clusterIPs")
            .first()
            .and_then(Value::as_str)
            .unwrap_or("<none>");
        let external_ips: Vec<&str> = list(svc, "/spec/externalIPs")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let external = match text(svc, "/spec/type") {
            "ClusterIP" | "NodePort" if !external_ips.is_empty() => external_ips.join(","),
            "ClusterIP" | "NodePort" => "<none>".to_string(),
            "LoadBalancer" => {
                let ingress: BTreeSet<&str> = list(svc, "/status/loadBalancer/ingress")
                    .iter()
                    .map(|i| match text(i, "/ip") {
                        "" => text(i, "/hostname"),
                        ip => ip,
                    })
                    .filter(|s| !s.is_empty())
                    .collect();
                let mut all: Vec<&str> = ingress.into_iter().collect();
                all.extend(external_ips);
                if all.is_empty() {
                    "<pending>".to_string()
                } else {
                    all.join(",")
                }
            }
            "ExternalName" => text(svc, "/spec/externalName").to_string(),
            _ => "<unknown>".to_string(),
        };
        let ports = list(svc, "/spec/ports")
            .iter()
            .map(|p| {
                let protocol = text(p, "/protocol");
                match int(p, "/nodePort") {
                    0 => format!("{}/{protocol}", int(p, "/port")),
                    node_port => format!("{}:{node_port}/{protocol}", int(p, "/port")),
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        vec![
            self.name(),
            json!(text(svc, "/spec/type")),
            json!(cluster_ip),
            json!(external),
            json!(if ports.is_empty() {
                "<none>".to_string()
            } else {
                ports
            }),
            self.age(),
            json!(format_labels(svc.pointer("/spec/selector"))),
        ]
    }

    fn node(&self) -> Vec<Value> {
        let node = self.obj;
        let mut status: Vec<String> = list(node, "/status/conditions")
            .iter()
            .filter(|c| text(c, "/type") == "Ready")
            .take(1)
            .map(|c| {
                if text(c, "/status") == "True" {
                    "Ready"
                } else {
                    "NotReady"
                }
                .to_string()
            })
            .collect();
        if status.is_empty() {
            status.push("Unknown".to_string());
        }
        if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
            status.push("SchedulingDisabled".to_string());
        }
        let mut roles = BTreeSet::new();
        if let Some(labels) = node.pointer("/metadata/labels").and_then(Value::as_object) {
            for (k, v) in labels {
                if let Some(role) = k
                    .strip_prefix("node-role.kubernetes.io/")
                    .filter(|r| !r.is_empty())
                {
                    roles.insert(role.to_string());
                } else if k == "kubernetes.io/role" && v.as_str().is_some_and(|r| !r.is_empty()) {
                    roles.insert(v.as_str().unwrap_or("").to_string());
                }
            }
        }
        let roles = if roles.is_empty() {
            "<none>".to_string()
        } else {
            roles.into_iter().collect::<Vec<_>>().join(",")
        };
        let address = |kind: &str| {
            list(node, "/status/addresses")
                .iter()
                .find(|a| text(a, "/type") == kind)
                .map_or("<none>", |a| text(a, "/address"))
                .to_string()
        };
        let info = |field: &str| match text(node, &format!("/status/nodeInfo/{field}")) {
            "" => "<unknown>".to_string(),
            v => v.to_string(),
        };
        vec![
            self.name(),
            json!(status.join(",")),
            json!(roles),
            self.age(),
            json!(text(node, "/status/nodeInfo/kubeletVersion")),
            json!(address("InternalIP")),
            json!(address("ExternalIP")),
            json!(info("osImage")),
            json!(info("kernelVersion")),
            json!(info("containerRuntimeVersion")),
        ]
    }

    fn event(&self) -> Vec<Value> {
        let e = self.obj;
        let first_raw = text(e, "/firstTimestamp");
        let first = if first_raw.is_empty() {
            since(text(e, "/eventTime"), self.now)
        } else {
            since(first_raw, self.now)
        };
        let mut last = match text(e, "/lastTimestamp") {
            "" => first.clone(),
            t => since(t, self.now),
        };
        let mut count = int(e, "/count");
        if e.get("series").is_some_and(Value::is_object) {
            last = since(text(e, "/series/lastObservedTime"), self.now);
            count = int(e, "/series/count");
        } else if count == 0 {
            // Singleton events of the new API carry no count.
            count = 1;
        }
        let kind = text(e, "/involvedObject/kind").to_lowercase();
        let target = match text(e, "/involvedObject/name") {
            "" => kind,
            name => format!("{kind}/{name}"),
        };
        let component = match text(e, "/source/component") {
            "" => text(e, "/reportingComponent"),
            c => c,
        };
        let instance = match text(e, "/source/host") {
            "" => text(e, "/reportingInstance"),
            h => h,
        };
        let source = if instance.is_empty() {
            component.to_string()
        } else {
            format!("{component}, {instance}")
        };
        vec![
            json!(last),
            json!(text(e, "/type")),
            json!(text(e, "/reason")),
            json!(target),
            json!(text(e, "/involvedObject/fieldPath")),
            json!(source),
            json!(text(e, "/message").trim()),
            json!(first),
            json!(count),
            self.name(),
        ]
    }

    fn binding(&self) -> Vec<Value> {
        let b = self.obj;
        let mut users = Vec::new();
        let mut groups = Vec::new();
        let mut service_accounts = Vec::new();
        for subject in list(b, "/subjects") {
            let name = text(subject, "/name");
            match text(subject, "/kind") {
                "User" => users.push(name.to_string()),
                "Group" => groups.push(name.to_string()),
                "ServiceAccount" => {
                    service_accounts.push(format!("{}/{name}", text(subject, "/namespace")))
                }
                _ => {}
            }
        }
        vec![
            self.name(),
            json!(format!(
                "{}/{}",
                text(b, "/roleRef/kind"),
                text(b, "/roleRef/name")
            )),
            self.age(),
            json!(users.join(", ")),
            json!(groups.join(", ")),
            json!(service_accounts.join(", ")),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::RESOURCES;

    /// 2024-06-01T12:00:00Z.
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_717_243_200)
    }

    fn resource(group: &str, name: &str) -> &'static ResourceInfo {
        crate::catalogue::lookup(group, "v1", name).expect("resource is served")
    }

    fn names(resource: &ResourceInfo) -> Vec<String> {
        column_definitions(resource)
            .as_array()
            .expect("columns are an array")
            .iter()
            .map(|c| {
                let name = c["name"].as_str().unwrap_or("").to_uppercase();
                if c["priority"] == 1 {
                    format!("{name}*")
                } else {
                    name
                }
            })
            .collect()
    }

    // Reference: `kubectl get <r> -o wide` headers on 1.32 (* marks -o wide only).
    #[test]
    fn columns_match_kubectl_headers() {
        assert_eq!(
            names(resource("", "pods")),
            [
                "NAME",
                "READY",
                "STATUS",
                "RESTARTS",
                "AGE",
                "IP*",
                "NODE*",
                "NOMINATED NODE*",
                "READINESS GATES*"
            ]
        );
        assert_eq!(
            names(resource("apps", "deployments")),
            [
                "NAME",
                "READY",
                "UP-TO-DATE",
                "AVAILABLE",
                "AGE",
                "CONTAINERS*",
                "IMAGES*",
                "SELECTOR*"
            ]
        );
        assert_eq!(
            names(resource("", "services")),
            [
                "NAME",
                "TYPE",
                "CLUSTER-IP",
                "EXTERNAL-IP",
                "PORT(S)",
                "AGE",
                "SELECTOR*"
            ]
        );
        assert_eq!(names(resource("", "namespaces")), ["NAME", "STATUS", "AGE"]);
        assert_eq!(names(resource("", "configmaps")), ["NAME", "DATA", "AGE"]);
        assert_eq!(
            names(resource("", "secrets")),
            ["NAME", "TYPE", "DATA", "AGE"]
        );
        assert_eq!(
            names(resource("rbac.authorization.k8s.io", "roles")),
            ["NAME", "CREATED AT"]
        );
        let pods = column_definitions(resource("", "pods"));
        assert_eq!(pods[0]["format"], "name");
        assert_eq!(pods[3]["type"], "string");
    }

    // Reference: `kubectl get pc` and `kubectl get pdb` on 1.32.
    #[test]
    fn priority_class_and_pdb_rows_read_like_kubectl() {
        assert_eq!(
            names(resource("scheduling.k8s.io", "priorityclasses")),
            ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
        );
        let class = json!({
            "metadata": {"name": "system-node-critical", "creationTimestamp": "2024-06-01T11:59:00Z"},
            "value": 2_000_001_000, "preemptionPolicy": "PreemptLowerPriority",
        });
        let pc = resource("scheduling.k8s.io", "priorityclasses");
        assert_eq!(
            row_cells(pc, &class, now()),
            vec![
                json!("system-node-critical"),
                json!(2_000_001_000),
                json!(false),
                json!("60s"),
                json!("PreemptLowerPriority")
            ]
        );
        assert_eq!(
            names(resource("policy", "poddisruptionbudgets")),
            [
                "NAME",
                "MIN AVAILABLE",
                "MAX UNAVAILABLE",
                "ALLOWED DISRUPTIONS",
                "AGE"
            ]
        );
        let pdb = json!({
            "metadata": {"name": "web", "creationTimestamp": "2024-06-01T11:59:00Z"},
            "spec": {"maxUnavailable": "25%"}, "status": {"disruptionsAllowed": 1},
        });
        let cells = row_cells(resource("policy", "poddisruptionbudgets"), &pdb, now());
        assert_eq!(
            cells,
            vec![
                json!("web"),
                json!("N/A"),
                json!("25%"),
                json!(1),
                json!("60s")
            ]
        );
        let floor = json!({"metadata": {"name": "db"}, "spec": {"minAvailable": 2}});
        let cells = row_cells(resource("policy", "poddisruptionbudgets"), &floor, now());
        assert_eq!(cells[1], json!("2"));
        assert_eq!(cells[2], json!("N/A"));
        assert_eq!(cells[3], json!(0));
    }

    #[test]
    fn every_row_has_one_cell_per_column() {
        for r in RESOURCES {
            let columns = column_definitions(r).as_array().map_or(0, Vec::len);
            assert_eq!(
                row_cells(r, &json!({}), now()).len(),
                columns,
                "{}",
                r.resource
            );
            assert_eq!(
                row_cells(r, &json!({"spec": 5, "status": []}), now()).len(),
                columns,
                "{}",
                r.resource
            );
        }
    }

    // Reference: apimachinery duration.HumanDuration test cases.
    #[test]
    fn human_durations() {
        for (seconds, text) in [
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (182, "3m2s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (8 * 3600, "8h"),
            (47 * 3600 + 59 * 60, "47h"),
            (48 * 3600, "2d"),
            (51 * 3600, "2d3h"),
            (8 * 86400, "8d"),
            (729 * 86400, "729d"),
            (730 * 86400, "2y"),
            (740 * 86400, "2y10d"),
            (8 * 365 * 86400, "8y"),
        ] {
            assert_eq!(human_duration(seconds), text, "{seconds}s");
        }
    }

    #[test]
    fn pod_cells() {
        let running = json!({
            "metadata": {"name": "web", "creationTimestamp": "2024-06-01T11:57:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {
                "phase": "Running", "podIPs": [{"ip": "10.0.0.5"}],
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 0, "state": {"running": {}}},
                    {"name": "b", "ready": false, "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                     "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2024-06-01T11:59:30Z"}}}
                ]
            }
        });
        assert_eq!(
            row_cells(resource("", "pods"), &running, now()),
            vec![
                json!("web"),
                json!("1/2"),
                json!("CrashLoopBackOff"),
                json!("3 (30s ago)"),
                json!("3m"),
                json!("10.0.0.5"),
                json!("n1"),
                json!("<none>"),
                json!("<none>"),
            ]
        );
        let completed = json!({
            "metadata": {"name": "job", "creationTimestamp": "2024-05-30T09:00:00Z"},
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Succeeded", "containerStatuses": [{"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
        });
        let cells = row_cells(resource("", "pods"), &completed, now());
        assert_eq!(
            (&cells[1], &cells[2], &cells[4]),
            (&json!("0/1"), &json!("Completed"), &json!("2d3h"))
        );
        let initializing = json!({
            "metadata": {"name": "i", "deletionTimestamp": null},
            "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i1", "state": {"terminated": {"exitCode": 0}}},
                {"name": "i2", "state": {"running": {}}}
            ]}
        });
        let cells = row_cells(resource("", "pods"), &initializing, now());
        assert_eq!(
            (&cells[2], &cells[4]),
            (&json!("Init:1/2"), &json!("<unknown>"))
        );
        let terminating = json!({
            "metadata": {"name": "t", "deletionTimestamp": "2024-06-01T11:59:00Z"},
            "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Running"}
        });
        assert_eq!(
            row_cells(resource("", "pods"), &terminating, now())[2],
            "Terminating"
        );
    }

    #[test]
    fn workload_and_service_cells() {
        let deployment = json!({
            "metadata": {"name": "web", "creationTimestamp": "2024-06-01T10:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe", "be"]}]},
                     "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}, {"name": "log", "image": "busybox"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}
        });
        assert_eq!(
            row_cells(resource("apps", "deployments"), &deployment, now()),
            vec![
                json!("web"),
                json!("2/3"),
                json!(3),
                json!(2),
                json!("120m"),
                json!("nginx,log"),
                json!("nginx:1.27,busybox"),
                json!("app=web,tier in (be,fe)"),
            ]
        );
        let service = json!({
            "metadata": {"name": "web", "creationTimestamp": "2024-06-01T11:59:55Z"},
            "spec": {"type": "NodePort", "clusterIPs": ["10.96.0.10"], "selector": {"app": "web"},
                     "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]}
        });
        assert_eq!(
            row_cells(resource("", "services"), &service, now()),
            vec![
                json!("web"),
                json!("NodePort"),
                json!("10.96.0.10"),
                json!("<none>"),
                json!("80:30080/TCP,53/UDP"),
                json!("5s"),
                json!("app=web"),
            ]
        );
        let lb = json!({"spec": {"type": "LoadBalancer"}});
        assert_eq!(
            row_cells(resource("", "services"), &lb, now())[3],
            "<pending>"
        );
    }

    #[test]
    fn other_kinds_cells() {
        let cm = json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
        assert_eq!(row_cells(resource("", "configmaps"), &cm, now())[1], 3);
        let secret = json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"a": "MQ=="}});
        assert_eq!(
            row_cells(resource("", "secrets"), &secret, now())[1..3],
            [json!("Opaque"), json!(1)]
        );
        let ns = json!({"metadata": {"name": "default"}, "status": {"phase": "Active"}});
        assert_eq!(
            row_cells(resource("", "namespaces"), &ns, now())[1],
            "Active"
        );
        let node = json!({
            "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.32.0"},
                       "addresses": [{"type": "InternalIP", "address": "192.168.1.10"}]}
        });
        assert_eq!(
            row_cells(resource("", "nodes"), &node, now())[..6],
            [
                json!("n1"),
                json!("Ready,SchedulingDisabled"),
                json!("control-plane"),
                json!("<unknown>"),
                json!("v1.32.0"),
                json!("192.168.1.10"),
            ]
        );
        let endpoints = json!({"subsets": [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}, {"ip": "10.0.0.4"}], "ports": [{"port": 80}]}]});
        assert_eq!(
            row_cells(resource("", "endpoints"), &endpoints, now())[1],
            "10.0.0.1:80,10.0.0.2:80,10.0.0.3:80 + 1 more..."
        );
        let slice = json!({"addressType": "IPv4", "ports": [{"port": 80}], "endpoints": [{"addresses": ["10.0.0.1"]}]});
        assert_eq!(
            row_cells(
                resource("discovery.k8s.io", "endpointslices"),
                &slice,
                now()
            )[1..4],
            [json!("IPv4"), json!("80"), json!("10.0.0.1")]
        );
        let binding = json!({"metadata": {"name": "b"}, "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "namespace": "ns", "name": "sa"}]});
        assert_eq!(
            row_cells(
                resource("rbac.authorization.k8s.io", "rolebindings"),
                &binding,
                now()
            )[3..],
            [json!("alice"), json!(""), json!("ns/sa")]
        );
        assert_eq!(
            row_cells(
                resource("rbac.authorization.k8s.io", "roles"),
                &json!({"metadata": {"name": "r", "creationTimestamp": "2024-06-01T10:00:00Z"}}),
                now()
            ),
            [json!("r"), json!("2024-06-01T10:00:00Z")]
        );
        let event = json!({"metadata": {"name": "e1"}, "type": "Warning", "reason": "BackOff", "message": " Back-off restarting ",
            "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{a}"}, "source": {"component": "kubelet", "host": "n1"},
            "firstTimestamp": "2024-06-01T11:00:00Z", "lastTimestamp": "2024-06-01T11:59:00Z", "count": 7});
        assert_eq!(
            row_cells(resource("", "events"), &event, now()),
            vec![
                json!("60s"),
                json!("Warning"),
                json!("BackOff"),
                json!("pod/web"),
                json!("spec.containers{a}"),
                json!("kubelet, n1"),
                json!("Back-off restarting"),
                json!("60m"),
                json!(7),
                json!("e1"),
            ]
        );
    }
}
