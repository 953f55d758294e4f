//! Defaulting: the fields Kubernetes fills in when a user leaves them out, so that
//! `kubectl get -o yaml` on skerry shows what it shows on a real cluster.
//!
//! [`apply_defaults`] runs on every create and update body before validation, as the
//! apiserver's decoder runs the generated `SetObjectDefaults_*` functions. It follows
//! `pkg/apis/*/v1/defaults.go` of Kubernetes 1.32 field by field (feature gates at their 1.32
//! defaults), plus three things the registry does on write that users see as defaults:
//! a Namespace's `kubernetes` finalizer and `Active` phase, a Service's IP family fields,
//! and a Secret's `stringData` folded into base64 `data`.
//!
//! Invariants: defaulting only fills fields that are absent, `null` or (for string enums)
//! empty, never overwrites what the user wrote, and is idempotent — running it twice gives
//! the same object, so an update of an already-defaulted object changes nothing. It never
//! fails: a field of the wrong JSON type is left alone for validation to report.

use serde_json::{Map, Value, json};

use crate::ResourceInfo;
use crate::validation::quantity::Quantity;

/// `terminationGracePeriodSeconds` when unset (core/v1 `DefaultTerminationGracePeriodSeconds`):
/// how long the kubelet waits between SIGTERM and SIGKILL.
pub const TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
/// Where a container writes its termination message (core/v1 `TerminationMessagePathDefault`).
pub const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// `defaultMode` of secret, configMap, downwardAPI and projected volumes: 0644 (core/v1
/// `SecretVolumeSourceDefaultMode` and friends), written in decimal as the API stores it.
pub const VOLUME_DEFAULT_MODE: i64 = 0o644;
/// Lifetime of a projected service account token when unset: one hour (core/v1
/// `SetDefaults_ServiceAccountTokenProjection`).
pub const PROJECTED_TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// Probe defaults (core/v1 `SetDefaults_Probe`).
pub const PROBE_TIMEOUT_SECONDS: i64 = 1;
pub const PROBE_PERIOD_SECONDS: i64 = 10;
pub const PROBE_SUCCESS_THRESHOLD: i64 = 1;
pub const PROBE_FAILURE_THRESHOLD: i64 = 3;
/// Old ReplicaSets/ControllerRevisions kept for rollback (apps/v1 defaults).
pub const REVISION_HISTORY_LIMIT: i64 = 10;
/// Seconds a Deployment may make no progress before it is reported failed (apps/v1 defaults).
pub const PROGRESS_DEADLINE_SECONDS: i64 = 600;
/// A Deployment's rolling-update surge and unavailability budget (apps/v1 defaults).
pub const DEPLOYMENT_MAX_SURGE: &str = "25%";
pub const DEPLOYMENT_MAX_UNAVAILABLE: &str = "25%";
/// ClientIP session affinity timeout: three hours (core/v1
/// `DefaultClientIPServiceAffinitySeconds`).
pub const CLIENT_IP_AFFINITY_SECONDS: i64 = 10_800;
/// The IP family of Service cluster IPs: skerry's service network is single-stack IPv4, so this
/// is what the allocator would record (Kubernetes' `defaultServiceIPFamily`).
pub const SERVICE_IP_FAMILY: &str = "IPv4";
/// The label every Namespace carries with its own name (core/v1 `LabelMetadataName`).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// A PriorityClass's `preemptionPolicy` when unset (scheduling/v1
/// `SetDefaults_PriorityClass`): pods of the class may preempt lower-priority pods.
pub const PREEMPT_LOWER_PRIORITY: &str = "PreemptLowerPriority";

/// Fills in the defaults of `obj`, an object of `resource`, in place.
pub fn apply_defaults(resource: &ResourceInfo, obj: &mut Value) {
    if !obj.is_object() {
        return;
    }
    match (resource.group, resource.kind) {
        ("", "Pod") => default_pod(obj),
        ("", "Service") => default_service(obj),
        ("", "Namespace") => default_namespace(obj),
        ("", "Secret") => default_secret(obj),
        ("", "Node") => default_node(obj),
        ("", "Endpoints") => default_endpoints(obj),
        ("apps", "Deployment") => default_deployment(obj),
        ("apps", "ReplicaSet") => default_replica_set(obj),
        ("apps", "DaemonSet") => default_daemon_set(obj),
        ("apps", "StatefulSet") => default_stateful_set(obj),
        ("discovery.k8s.io", "EndpointSlice") => default_endpoint_slice(obj),
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => default_binding(obj),
        ("scheduling.k8s.io", "PriorityClass") => default_priority_class(obj),
        // ConfigMap, ServiceAccount, Event, Lease, Role, ClusterRole, PodDisruptionBudget
        // (policy/v1 has no defaults.go) and SelfSubjectAccessReview have no defaults in
        // Kubernetes 1.32.
        _ => {}
    }
}

// ----- helpers -----

/// The object at `key`, created as `{}` when absent or null; `None` when it is something else.
fn object_at<'a>(parent: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    let map = parent.as_object_mut()?;
    let slot = map.entry(key.to_string()).or_insert(Value::Null);
    if slot.is_null() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut()
}

/// Each object element of the array at `key` (missing or non-array: none).
fn each_item(parent: &mut Value, key: &str, mut f: impl FnMut(&mut Value)) {
    if let Some(Value::Array(items)) = parent.get_mut(key) {
        items.iter_mut().filter(|i| i.is_object()).for_each(&mut f);
    }
}

/// Sets `key` when absent or null (Go: a nil pointer).
fn default_value(obj: &mut Value, key: &str, value: Value) {
    if let Some(map) = obj.as_object_mut() {
        let slot = map.entry(key.to_string()).or_insert(Value::Null);
        if slot.is_null() {
            *slot = value;
        }
    }
}

/// Sets `key` when absent, null or `""` (Go: a string field's zero value).
fn default_string(obj: &mut Value, key: &str, value: &str) {
    if let Some(map) = obj.as_object_mut() {
        let slot = map.entry(key.to_string()).or_insert(Value::Null);
        if slot.is_null() || slot.as_str() == Some("") {
            *slot = Value::String(value.to_string());
        }
    }
}

// ----- scheduling -----

/// scheduling/v1 `SetDefaults_PriorityClass`.
fn default_priority_class(obj: &mut Value) {
    default_string(obj, "preemptionPolicy", PREEMPT_LOWER_PRIORITY);
}

// ----- pods -----

fn default_pod(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default_pod_spec(spec);
    // SetDefaults_Pod: only for Pods, not templates.
    for list in ["containers", "initContainers"] {
        each_item(spec, list, default_requests_from_limits);
    }
    default_value(spec, "enableServiceLinks", Value::Bool(true));
    if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
        for list in ["containers", "initContainers"] {
            each_item(spec, list, |container| {
                each_item(container, "ports", |port| {
                    let container_port = port.get("containerPort").cloned().unwrap_or(Value::Null);
                    let host_port = port.get("hostPort").and_then(Value::as_i64).unwrap_or(0);
                    if host_port == 0 && !container_port.is_null() {
                        port["hostPort"] = container_port;
                    }
                });
            });
        }
    }
}

/// A limit without a request requests the limit.
fn default_requests_from_limits(container: &mut Value) {
    let Some(limits) = container
        .get("resources")
        .and_then(|r| r.get("limits"))
        .and_then(Value::as_object)
        .cloned()
    else {
        return;
    };
    if limits.is_empty() {
        return;
    }
    let Some(resources) = object_at(container, "resources") else {
        return;
    };
    let requests = resources.entry("requests").or_insert(Value::Null);
    if requests.is_null() {
        *requests = Value::Object(Map::new());
    }
    if let Some(requests) = requests.as_object_mut() {
        for (name, quantity) in limits {
            requests.entry(name).or_insert(quantity);
        }
    }
}

/// core/v1 `SetDefaults_PodSpec` and everything nested in a pod spec (containers, probes,
/// volumes); shared by Pods and pod templates.
fn default_pod_spec(spec: &mut Value) {
    default_string(spec, "dnsPolicy", "ClusterFirst");
    default_string(spec, "restartPolicy", "Always");
    default_value(spec, "securityContext", json!({}));
    default_value(
        spec,
        "terminationGracePeriodSeconds",
        json!(TERMINATION_GRACE_PERIOD_SECONDS),
    );
    default_string(spec, "schedulerName", "default-scheduler");
    for list in ["containers", "initContainers"] {
        each_item(spec, list, default_container);
    }
    each_item(spec, "volumes", default_volume);
}

fn default_container(container: &mut Value) {
    default_string(
        container,
        "terminationMessagePath",
        TERMINATION_MESSAGE_PATH,
    );
    default_string(container, "terminationMessagePolicy", "File");
    let image = container
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    default_string(container, "imagePullPolicy", image_pull_policy(&image));
    each_item(container, "ports", |port| {
        default_string(port, "protocol", "TCP")
    });
    each_item(container, "env", |env| {
        if let Some(field_ref) = env.get_mut("valueFrom").and_then(|v| v.get_mut("fieldRef")) {
            default_string(field_ref, "apiVersion", "v1");
        }
    });
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(probe) = container.get_mut(probe).filter(|p| p.is_object()) {
            default_value(probe, "timeoutSeconds", json!(PROBE_TIMEOUT_SECONDS));
            default_value(probe, "periodSeconds", json!(PROBE_PERIOD_SECONDS));
            default_value(probe, "successThreshold", json!(PROBE_SUCCESS_THRESHOLD));
            default_value(probe, "failureThreshold", json!(PROBE_FAILURE_THRESHOLD));
            default_handler(probe);
        }
    }
    if let Some(lifecycle) = container.get_mut("lifecycle").filter(|l| l.is_object()) {
        for hook in ["postStart", "preStop"] {
            if let Some(handler) = lifecycle.get_mut(hook).filter(|h| h.is_object()) {
                default_handler(handler);
            }
        }
    }
}

/// `httpGet` path `/` and scheme HTTP; `grpc` service `""`.
fn default_handler(handler: &mut Value) {
    if let Some(http) = handler.get_mut("httpGet").filter(|h| h.is_object()) {
        default_string(http, "path", "/");
        default_string(http, "scheme", "HTTP");
    }
    if let Some(grpc) = handler.get_mut("grpc").filter(|g| g.is_object()) {
        default_value(grpc, "service", json!(""));
    }
}

/// `Always` for `:latest` or an untagged image, `IfNotPresent` otherwise (core/v1
/// `SetDefaults_Container`, via the image reference's tag; an unparsable reference has
/// no tag and gets `IfNotPresent`, as in Kubernetes).
pub fn image_pull_policy(image: &str) -> &'static str {
    match image_tag(image) {
        Some(tag) if tag == "latest" => "Always",
        _ => "IfNotPresent",
    }
}

/// The tag of an image reference: `Some("latest")` when it has neither tag nor digest,
/// `None` when it has only a digest or does not parse.
fn image_tag(image: &str) -> Option<String> {
    if image.is_empty() || image.trim() != image {
        return None;
    }
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let (repository, tag) = match name[last_slash..].rfind(':') {
        Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
        None => (name, None),
    };
    // Path components must be lower case; the first may be a registry host (with a dot,
    // a port, or `localhost`), which may not.
    let mut components = repository.split('/').collect::<Vec<_>>();
    if components.len() > 1 {
        let first = components[0];
        if first.contains('.') || first.contains(':') || first == "localhost" {
            components.remove(0);
        }
    }
    let path_ok = components.iter().all(|c| {
        !c.is_empty()
            && c.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    });
    if !path_ok {
        return None;
    }
    match (tag, digest) {
        (Some(tag), _) => Some(tag.to_string()),
        (None, Some(_)) => None,
        (None, None) => Some("latest".to_string()),
    }
}

fn default_volume(volume: &mut Value) {
    const SOURCES: &[&str] = &[
        "hostPath",
        "emptyDir",
        "gcePersistentDisk",
        "awsElasticBlockStore",
        "gitRepo",
        "secret",
        "nfs",
        "iscsi",
        "glusterfs",
        "persistentVolumeClaim",
        "rbd",
        "flexVolume",
        "cinder",
        "cephfs",
        "flocker",
        "downwardAPI",
        "fc",
        "azureFile",
        "configMap",
        "vsphereVolume",
        "quobyte",
        "azureDisk",
        "photonPersistentDisk",
        "projected",
        "portworxVolume",
        "scaleIO",
        "storageos",
        "csi",
        "ephemeral",
        "image",
    ];
    if !SOURCES
        .iter()
        .any(|s| volume.get(*s).is_some_and(|v| !v.is_null()))
    {
        volume["emptyDir"] = json!({});
    }
    for source in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(s) = volume.get_mut(source).filter(|s| s.is_object()) {
            default_value(s, "defaultMode", json!(VOLUME_DEFAULT_MODE));
        }
    }
    if let Some(host_path) = volume.get_mut("hostPath").filter(|h| h.is_object()) {
        default_value(host_path, "type", json!(""));
    }
    if let Some(downward) = volume.get_mut("downwardAPI").filter(|d| d.is_object()) {
        default_downward_items(downward);
    }
    if let Some(projected) = volume.get_mut("projected").filter(|p| p.is_object()) {
        each_item(projected, "sources", |source| {
            if let Some(token) = source
                .get_mut("serviceAccountToken")
                .filter(|t| t.is_object())
            {
                default_value(
                    token,
                    "expirationSeconds",
                    json!(PROJECTED_TOKEN_EXPIRATION_SECONDS),
                );
            }
            if let Some(downward) = source.get_mut("downwardAPI").filter(|d| d.is_object()) {
                default_downward_items(downward);
            }
        });
    }
}

fn default_downward_items(downward: &mut Value) {
    each_item(downward, "items", |item| {
        if let Some(field_ref) = item.get_mut("fieldRef").filter(|f| f.is_object()) {
            default_string(field_ref, "apiVersion", "v1");
        }
    });
}

/// The status a Pod is created with: `Pending`, and its QoS class (the pod strategy's
/// `PrepareForCreate`). Call after [`apply_defaults`], so requests are defaulted from limits.
pub fn initial_pod_status(pod: &Value) -> Value {
    json!({"phase": "Pending", "qosClass": qos_class(pod)})
}

/// `Guaranteed`, `Burstable` or `BestEffort` (core `GetPodQOS`): Guaranteed when every
/// container limits cpu and memory and requests exactly that; BestEffort when no container
/// requests or limits either.
pub fn qos_class(pod: &Value) -> &'static str {
    let spec = pod.get("spec").unwrap_or(&Value::Null);
    let containers = ["containers", "initContainers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_array))
        .flatten();
    let mut any_set = false;
    let mut guaranteed = true;
    for container in containers {
        let resources = container.get("resources").unwrap_or(&Value::Null);
        let bag = |name: &str, resource: &str| {
            resources
                .get(name)
                .and_then(|b| b.get(resource))
                .and_then(|q| match q {
                    Value::String(s) => Quantity::parse(s),
                    Value::Number(n) => Quantity::parse(&n.to_string()),
                    _ => None,
                })
                .filter(|q| q.0 != 0)
        };
        for resource in ["cpu", "memory"] {
            let request = bag("requests", resource);
            let limit = bag("limits", resource);
            any_set |= request.is_some() || limit.is_some();
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    if !any_set {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

// ----- apps -----

fn default_template(obj: &mut Value) {
    if let Some(template_spec) = obj
        .get_mut("spec")
        .and_then(|s| s.get_mut("template"))
        .and_then(|t| t.get_mut("spec"))
        .filter(|s| s.is_object())
    {
        default_pod_spec(template_spec);
    }
}

fn default_deployment(obj: &mut Value) {
    let Some(spec) = object_at(obj, "spec") else {
        return;
    };
    let mut spec_value = Value::Object(std::mem::take(spec));
    default_value(&mut spec_value, "replicas", json!(1));
    if let Some(strategy) = object_at(&mut spec_value, "strategy") {
        let mut strategy_value = Value::Object(std::mem::take(strategy));
        default_string(&mut strategy_value, "type", "RollingUpdate");
        if strategy_value["type"] == "RollingUpdate"
            && let Some(rolling) = object_at(&mut strategy_value, "rollingUpdate")
        {
            rolling
                .entry("maxUnavailable")
                .or_insert(json!(DEPLOYMENT_MAX_UNAVAILABLE));
            rolling
                .entry("maxSurge")
                .or_insert(json!(DEPLOYMENT_MAX_SURGE));
        }
        spec_value["strategy"] = strategy_value;
    }
    default_value(
        &mut spec_value,
        "revisionHistoryLimit",
        json!(REVISION_HISTORY_LIMIT),
    );
    default_value(
        &mut spec_value,
        "progressDeadlineSeconds",
        json!(PROGRESS_DEADLINE_SECONDS),
    );
    obj["spec"] = spec_value;
    default_template(obj);
}

fn default_replica_set(obj: &mut Value) {
    if let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) {
        default_value(spec, "replicas", json!(1));
    }
    default_template(obj);
}

fn default_daemon_set(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    if let Some(strategy) = object_at(spec, "updateStrategy") {
        let mut strategy_value = Value::Object(std::mem::take(strategy));
        default_string(&mut strategy_value, "type", "RollingUpdate");
        if strategy_value["type"] == "RollingUpdate"
            && let Some(rolling) = object_at(&mut strategy_value, "rollingUpdate")
        {
            rolling.entry("maxUnavailable").or_insert(json!(1));
            rolling.entry("maxSurge").or_insert(json!(0));
        }
        spec["updateStrategy"] = strategy_value;
    }
    default_value(spec, "revisionHistoryLimit", json!(REVISION_HISTORY_LIMIT));
    default_template(obj);
}

fn default_stateful_set(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default_string(spec, "podManagementPolicy", "OrderedReady");
    if let Some(strategy) = object_at(spec, "updateStrategy") {
        let mut strategy_value = Value::Object(std::mem::take(strategy));
        let type_unset = strategy_value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty();
        if type_unset {
            strategy_value["type"] = json!("RollingUpdate");
            // RollingUpdate then takes the defaults below.
            default_value(&mut strategy_value, "rollingUpdate", json!({}));
        }
        if strategy_value["type"] == "RollingUpdate"
            && let Some(rolling) = strategy_value
                .get_mut("rollingUpdate")
                .filter(|r| r.is_object())
        {
            default_value(rolling, "partition", json!(0));
        }
        spec["updateStrategy"] = strategy_value;
    }
    // StatefulSetAutoDeletePVC is on by default in 1.32.
    if let Some(policy) = object_at(spec, "persistentVolumeClaimRetentionPolicy") {
        let mut policy_value = Value::Object(std::mem::take(policy));
        default_string(&mut policy_value, "whenDeleted", "Retain");
        default_string(&mut policy_value, "whenScaled", "Retain");
        spec["persistentVolumeClaimRetentionPolicy"] = policy_value;
    }
    default_value(spec, "replicas", json!(1));
    default_value(spec, "revisionHistoryLimit", json!(REVISION_HISTORY_LIMIT));
    each_item(spec, "volumeClaimTemplates", |claim| {
        if let Some(claim_spec) = claim.get_mut("spec").filter(|s| s.is_object()) {
            default_value(claim_spec, "volumeMode", json!("Filesystem"));
        }
        if let Some(status) = object_at(claim, "status") {
            let mut status_value = Value::Object(std::mem::take(status));
            default_string(&mut status_value, "phase", "Pending");
            claim["status"] = status_value;
        }
    });
    default_template(obj);
}

// ----- core kinds besides pods -----

fn default_service(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default_string(spec, "sessionAffinity", "None");
    match spec["sessionAffinity"].as_str() {
        Some("None") => {
            if let Some(map) = spec.as_object_mut() {
                map.remove("sessionAffinityConfig");
            }
        }
        Some("ClientIP") => {
            let timeout_set = spec
                .pointer("/sessionAffinityConfig/clientIP/timeoutSeconds")
                .is_some_and(|t| !t.is_null());
            if !timeout_set {
                spec["sessionAffinityConfig"] =
                    json!({"clientIP": {"timeoutSeconds": CLIENT_IP_AFFINITY_SECONDS}});
            }
        }
        _ => {}
    }
    default_string(spec, "type", "ClusterIP");
    each_item(spec, "ports", |port| {
        default_string(port, "protocol", "TCP");
        let target_unset = match port.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => n.as_i64() == Some(0),
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        if target_unset && let Some(p) = port.get("port").cloned() {
            port["targetPort"] = p;
        }
    });
    let service_type = spec["type"].as_str().unwrap_or("").to_string();
    let has_external_ips = spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let externally_accessible = service_type == "LoadBalancer"
        || service_type == "NodePort"
        || (service_type == "ClusterIP" && has_external_ips);
    if externally_accessible {
        default_string(spec, "externalTrafficPolicy", "Cluster");
    }
    if matches!(
        service_type.as_str(),
        "ClusterIP" | "NodePort" | "LoadBalancer"
    ) {
        default_value(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if service_type == "LoadBalancer" {
        default_value(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
    if service_type == "ExternalName" {
        return;
    }
    // The registry's IP family defaulting (pkg/registry/core/service/storage/alloc.go).
    let cluster_ip = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let has_ips = spec
        .get("clusterIPs")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !cluster_ip.is_empty() && !has_ips {
        spec["clusterIPs"] = json!([cluster_ip]);
    } else if cluster_ip.is_empty() && has_ips {
        spec["clusterIP"] = spec["clusterIPs"][0].clone();
    }
    let selectorless = spec
        .get("selector")
        .and_then(Value::as_object)
        .is_none_or(Map::is_empty);
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    let policy = if headless && selectorless {
        "RequireDualStack"
    } else {
        "SingleStack"
    };
    default_value(spec, "ipFamilyPolicy", json!(policy));
    let has_families = spec
        .get("ipFamilies")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !has_families {
        spec["ipFamilies"] = json!([SERVICE_IP_FAMILY]);
    }
}

fn default_namespace(obj: &mut Value) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    // Nameless namespaces (generateName) are labelled once named.
    if !name.is_empty()
        && let Some(labels) = object_at(obj, "metadata").and_then(|m| {
            let slot = m.entry("labels").or_insert(Value::Null);
            if slot.is_null() {
                *slot = Value::Object(Map::new());
            }
            slot.as_object_mut()
        })
    {
        labels.insert(NAMESPACE_NAME_LABEL.to_string(), Value::String(name));
    }
    if let Some(spec) = object_at(obj, "spec") {
        let finalizers = spec.entry("finalizers").or_insert(Value::Null);
        if finalizers.is_null() {
            *finalizers = json!([]);
        }
        if let Some(list) = finalizers.as_array_mut()
            && !list.iter().any(|f| f == "kubernetes")
        {
            list.push(json!("kubernetes"));
        }
    }
    if let Some(status) = object_at(obj, "status") {
        let phase = status.entry("phase").or_insert(Value::Null);
        if phase.is_null() || phase.as_str() == Some("") {
            *phase = json!("Active");
        }
    }
}

fn default_secret(obj: &mut Value) {
    default_string(obj, "type", "Opaque");
    // stringData is write-only: merged into data (winning on conflicts), then dropped.
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let Some(Value::Object(string_data)) = map.remove("stringData") else {
        return;
    };
    let data = map.entry("data").or_insert(Value::Null);
    if data.is_null() {
        *data = Value::Object(Map::new());
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in string_data {
            if let Some(text) = v.as_str() {
                data.insert(k, Value::String(base64_encode(text.as_bytes())));
            }
        }
    }
}

/// Standard base64 with padding (RFC 4648 section 4), as Secret `data` is stored.
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn default_node(obj: &mut Value) {
    if let Some(status) = obj.get_mut("status").filter(|s| s.is_object()) {
        let capacity = status.get("capacity").cloned();
        if let Some(capacity) = capacity.filter(|c| !c.is_null()) {
            default_value(status, "allocatable", capacity);
        }
    }
}

fn default_endpoints(obj: &mut Value) {
    each_item(obj, "subsets", |subset| {
        each_item(subset, "ports", |port| {
            default_string(port, "protocol", "TCP")
        });
    });
}

fn default_endpoint_slice(obj: &mut Value) {
    each_item(obj, "ports", |port| {
        default_value(port, "name", json!(""));
        default_value(port, "protocol", json!("TCP"));
    });
}

fn default_binding(obj: &mut Value) {
    if let Some(role_ref) = obj.get_mut("roleRef").filter(|r| r.is_object()) {
        default_string(role_ref, "apiGroup", RBAC_GROUP);
    }
    each_item(obj, "subjects", |subject| {
        let kind = subject.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind == "User" || kind == "Group" {
            default_string(subject, "apiGroup", RBAC_GROUP);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::lookup;

    fn defaulted(group: &str, resource: &str, mut obj: Value) -> Value {
        let info = lookup(group, "v1", resource).expect("resource is served");
        apply_defaults(info, &mut obj);
        let once = obj.clone();
        apply_defaults(info, &mut obj);
        assert_eq!(obj, once, "defaulting must be idempotent");
        obj
    }

    // Reference: core/v1 SetDefaults_Pod, SetDefaults_PodSpec, SetDefaults_Container — the
    // spec `kubectl run web --image=nginx` gets back from a 1.32 cluster, minus what admission
    // plugins add (serviceAccountName, tolerations, priority, the kube-api-access volume).
    #[test]
    fn minimal_pod_gets_kubernetes_defaults() {
        let pod = defaulted(
            "",
            "pods",
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}]}
            }),
        );
        assert_eq!(
            pod["spec"],
            json!({
                "containers": [{
                    "name": "web", "image": "nginx", "imagePullPolicy": "Always",
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File"
                }],
                "dnsPolicy": "ClusterFirst",
                "enableServiceLinks": true,
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
                "securityContext": {},
                "terminationGracePeriodSeconds": 30
            })
        );
        assert_eq!(
            initial_pod_status(&pod),
            json!({"phase": "Pending", "qosClass": "BestEffort"})
        );
    }

    // Reference: apps/v1 SetDefaults_Deployment (`kubectl create deployment web --image=nginx:1.27`).
    #[test]
    fn minimal_deployment_gets_kubernetes_defaults() {
        let deployment = defaulted(
            "apps",
            "deployments",
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}
                    }
                }
            }),
        );
        assert_eq!(
            deployment["spec"],
            json!({
                "progressDeadlineSeconds": 600,
                "replicas": 1,
                "revisionHistoryLimit": 10,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}, "type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [{
                            "image": "nginx:1.27", "imagePullPolicy": "IfNotPresent", "name": "nginx",
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "File"
                        }],
                        "dnsPolicy": "ClusterFirst",
                        "restartPolicy": "Always",
                        "schedulerName": "default-scheduler",
                        "securityContext": {},
                        "terminationGracePeriodSeconds": 30
                    }
                }
            })
        );
    }

    #[test]
    fn recreate_strategy_gets_no_rolling_update() {
        let deployment = defaulted(
            "apps",
            "deployments",
            json!({
                "metadata": {"name": "d"}, "spec": {"strategy": {"type": "Recreate"}}
            }),
        );
        assert_eq!(deployment["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn statefulset_and_daemonset_defaults() {
        let sts = defaulted(
            "apps",
            "statefulsets",
            json!({
                "metadata": {"name": "db"},
                "spec": {"volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}]}
            }),
        );
        assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(
            sts["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        );
        assert_eq!(
            sts["spec"]["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
        );
        assert_eq!(sts["spec"]["replicas"], 1);
        assert_eq!(
            sts["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"],
            "Filesystem"
        );
        assert_eq!(
            sts["spec"]["volumeClaimTemplates"][0]["status"]["phase"],
            "Pending"
        );
        let ds = defaulted(
            "apps",
            "daemonsets",
            json!({"metadata": {"name": "d"}, "spec": {}}),
        );
        assert_eq!(
            ds["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
        assert_eq!(ds["spec"]["revisionHistoryLimit"], 10);
    }

    // Reference: core/v1 SetDefaults_Service plus the registry's IP family defaulting.
    #[test]
    fn service_defaults() {
        let svc = defaulted(
            "",
            "services",
            json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}, {"port": 443, "targetPort": "https"}]}
            }),
        );
        assert_eq!(
            svc["spec"],
            json!({
                "selector": {"app": "web"},
                "ports": [
                    {"port": 80, "protocol": "TCP", "targetPort": 80},
                    {"port": 443, "protocol": "TCP", "targetPort": "https"}
                ],
                "type": "ClusterIP",
                "sessionAffinity": "None",
                "internalTrafficPolicy": "Cluster",
                "ipFamilyPolicy": "SingleStack",
                "ipFamilies": ["IPv4"]
            })
        );
        let headless = defaulted(
            "",
            "services",
            json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None"}}),
        );
        assert_eq!(headless["spec"]["ipFamilyPolicy"], "RequireDualStack");
        assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));
        let lb = defaulted(
            "",
            "services",
            json!({"metadata": {"name": "l"}, "spec": {"type": "LoadBalancer", "sessionAffinity": "ClientIP"}}),
        );
        assert_eq!(lb["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(lb["spec"]["allocateLoadBalancerNodePorts"], true);
        assert_eq!(
            lb["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"],
            10_800
        );
    }

    #[test]
    fn namespace_secret_and_rbac_defaults() {
        let ns = defaulted("", "namespaces", json!({"metadata": {"name": "team-a"}}));
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "team-a"
        );
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        let secret = defaulted(
            "",
            "secrets",
            json!({"metadata": {"name": "s"}, "stringData": {"user": "admin"}}),
        );
        assert_eq!(secret["type"], "Opaque");
        assert_eq!(secret["data"]["user"], "YWRtaW4=");
        assert!(secret.get("stringData").is_none());
        let info = lookup("rbac.authorization.k8s.io", "v1", "rolebindings").expect("served");
        let mut binding = json!({
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "User", "name": "u"}, {"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]
        });
        apply_defaults(info, &mut binding);
        assert_eq!(binding["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
        assert_eq!(
            binding["subjects"][0]["apiGroup"],
            "rbac.authorization.k8s.io"
        );
        assert!(binding["subjects"][1].get("apiGroup").is_none());
    }

    #[test]
    fn priority_class_preempts_lower_priority_unless_told_otherwise() {
        let info = lookup("scheduling.k8s.io", "v1", "priorityclasses").expect("served");
        let mut class = json!({"metadata": {"name": "high"}, "value": 1000});
        apply_defaults(info, &mut class);
        assert_eq!(class["preemptionPolicy"], "PreemptLowerPriority");
        let mut never =
            json!({"metadata": {"name": "batch"}, "value": 1, "preemptionPolicy": "Never"});
        apply_defaults(info, &mut never);
        assert_eq!(never["preemptionPolicy"], "Never");
        // A PDB has no defaults: what the user wrote is what is stored.
        let pdb_info = lookup("policy", "v1", "poddisruptionbudgets").expect("served");
        let written = json!({"metadata": {"name": "p"}, "spec": {"minAvailable": 1}});
        let mut pdb = written.clone();
        apply_defaults(pdb_info, &mut pdb);
        assert_eq!(pdb, written);
    }

    #[test]
    fn pod_nested_defaults() {
        let pod = defaulted(
            "",
            "pods",
            json!({
                "metadata": {"name": "p"},
                "spec": {
                    "hostNetwork": true,
                    "containers": [{
                        "name": "c", "image": "registry.local:5000/app@sha256:abc",
                        "ports": [{"containerPort": 8080}],
                        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                        "livenessProbe": {"httpGet": {"port": 8080}},
                        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
                    }],
                    "volumes": [{"name": "scratch"}, {"name": "cfg", "configMap": {"name": "cfg"}}]
                }
            }),
        );
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["ports"][0]["hostPort"], 8080);
        assert_eq!(
            c["resources"]["requests"],
            json!({"cpu": "1", "memory": "1Gi"})
        );
        assert_eq!(
            c["livenessProbe"],
            json!({
                "httpGet": {"port": 8080, "path": "/", "scheme": "HTTP"},
                "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3
            })
        );
        assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
        assert_eq!(pod["spec"]["volumes"][0]["emptyDir"], json!({}));
        assert_eq!(pod["spec"]["volumes"][1]["configMap"]["defaultMode"], 420);
        assert_eq!(qos_class(&pod), "Guaranteed");
    }

    #[test]
    fn image_pull_policies() {
        assert_eq!(image_pull_policy("nginx"), "Always");
        assert_eq!(image_pull_policy("nginx:latest"), "Always");
        assert_eq!(image_pull_policy("nginx:1.27"), "IfNotPresent");
        assert_eq!(image_pull_policy("localhost:5000/nginx"), "Always");
        assert_eq!(image_pull_policy("nginx@sha256:abc"), "IfNotPresent");
        assert_eq!(image_pull_policy("Nginx"), "IfNotPresent");
        assert_eq!(image_pull_policy(""), "IfNotPresent");
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        // Reference: RFC 4648 section 10.
        for (input, output) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(input.as_bytes()), output);
        }
    }
}
