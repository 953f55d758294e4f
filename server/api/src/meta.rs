//! Object metadata the server owns: what a create fills in (uid, creationTimestamp,
//! generateName, generation) and what an update may not change, as Kubernetes'
//! `BeforeCreate`/`BeforeUpdate` and the per-kind strategies do it.
//!
//! `metadata.generation` follows each kind's Kubernetes strategy ([`generation_policy`]):
//! `PrepareForCreate` sets 1 and `PrepareForUpdate` decides what counts as a change of the
//! desired state. Controllers compare it with their `status.observedGeneration` (the
//! disruption controller, `kubectl rollout status`), so a kind must bump it exactly when
//! Kubernetes does — no more (a status write must not look like a new spec), no less.

use rand::Rng;
use serde_json::{Map, Value, json};

use crate::catalogue::ResourceInfo;
use crate::status::{ApiError, Cause};

/// Characters of a generated name suffix: Kubernetes' alphabet without vowels (no words)
/// and without look-alikes (0/o, 1/l, 3/e).
const GENERATE_NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Random characters appended to `generateName` (Kubernetes: 5, ~14 million names).
const GENERATE_NAME_SUFFIX_LEN: usize = 5;
/// `generateName` prefixes are cut so the whole name stays within 63 characters
/// (Kubernetes' `maxGeneratedNameLength = 63 - 5`).
const GENERATE_NAME_PREFIX_MAX: usize = 63 - GENERATE_NAME_SUFFIX_LEN;

/// Five random characters of [`GENERATE_NAME_ALPHABET`], as Kubernetes'
/// `names.SimpleNameGenerator` appends to a `generateName` prefix (admission plugins name
/// what they add with it too: the `kube-api-access-` volume).
pub fn random_suffix() -> String {
    let mut rng = rand::rng();
    (0..GENERATE_NAME_SUFFIX_LEN)
        .map(|_| GENERATE_NAME_ALPHABET[rng.random_range(0..GENERATE_NAME_ALPHABET.len())] as char)
        .collect()
}

/// Now, as Kubernetes writes timestamps (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    let now = jiff::Timestamp::now();
    let secs = jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    secs.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// ObjectMeta's list and map fields Kubernetes serializes with `omitempty`: an empty one is
/// absent from every answer, so `ownerReferences: []` left by a patch that removed the last
/// owner reads back as no field at all, as clients expect.
const OMIT_WHEN_EMPTY: [&str; 5] = [
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Removes the [`OMIT_WHEN_EMPTY`] fields that are empty (or null).
fn drop_empty_fields(meta: &mut Map<String, Value>) {
    meta.retain(|key, value| {
        !OMIT_WHEN_EMPTY.contains(&key.as_str())
            || match value {
                Value::Null => false,
                Value::Array(a) => !a.is_empty(),
                Value::Object(o) => !o.is_empty(),
                _ => true,
            }
    });
}

fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata was just made an object")
}

/// The object's name (empty if it has none).
pub fn name(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn namespace(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/namespace").and_then(Value::as_str)
}

/// Fills what a create owns: namespace from the URL, a generated name, uid,
/// creationTimestamp, generation 1; drops resourceVersion, deletion fields and (for kinds
/// with a status subresource, but Namespace and Node) the status the client sent.
pub fn prepare_create(
    resource: &ResourceInfo,
    obj: &mut Value,
    url_namespace: Option<&str>,
) -> Result<(), ApiError> {
    let meta = metadata_mut(obj);
    drop_empty_fields(meta);
    if resource.namespaced {
        let ns = url_namespace.unwrap_or("");
        match meta.get("namespace").and_then(Value::as_str) {
            Some(body_ns) if !body_ns.is_empty() && body_ns != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(ns));
            }
        }
    } else {
        meta.remove("namespace");
    }
    let has_name = meta
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !has_name {
        match meta.get("generateName").and_then(Value::as_str) {
            Some(prefix) if !prefix.is_empty() => {
                let prefix: String = prefix.chars().take(GENERATE_NAME_PREFIX_MAX).collect();
                meta.insert("name".into(), json!(format!("{prefix}{}", random_suffix())));
            }
            _ => {
                return Err(ApiError::invalid(
                    resource.group,
                    resource.kind,
                    "",
                    vec![Cause::new(
                        "FieldValueRequired",
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
        }
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    meta.remove("resourceVersion");
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    meta.remove("selfLink");
    if tracks_generation(resource) {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    // Kubernetes' create strategies reset the status of every kind with a status subresource,
    // except two: a Namespace (it starts Active) and a Node, whose strategy keeps the status
    // sent on create because a kubelet registers its node with capacity, addresses and
    // conditions in one request.
    if resource.subresource("status").is_some()
        && !matches!(resource.resource, "namespaces" | "nodes")
        && let Some(o) = obj.as_object_mut()
    {
        o.remove("status");
    }
    Ok(())
}

/// How a kind's `metadata.generation` moves, as its Kubernetes strategy
/// (`pkg/registry/<group>/<kind>/strategy.go`, 1.32) moves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationPolicy {
    /// Never set: the strategy leaves it alone (pods in 1.32, services, config maps, RBAC,
    /// leases, ...).
    Untracked,
    /// 1 on create and never bumped by an update: PriorityClass, whose `PrepareForUpdate` is
    /// empty.
    CreateOnly,
    /// Bumped when `spec` changes: Deployment (see [`generation_policy`] for its
    /// annotations), ReplicaSet, StatefulSet, DaemonSet, PodDisruptionBudget, Job, CronJob,
    /// Ingress, IngressClass, NetworkPolicy.
    Spec,
    /// Bumped when anything but metadata changes, or the labels do: EndpointSlice, whose
    /// data sits at the top level beside `metadata` and which has no status.
    ContentOrLabels,
}

/// The generation policy of `resource` (kinds skerry does not serve yet are listed too, so
/// serving them later gets their Kubernetes behaviour with no change here).
///
/// Known gap: Kubernetes' Deployment strategy also bumps on a change of
/// `metadata.annotations` (they are copied onto the ReplicaSets). Its controller writes its
/// own `deployment.kubernetes.io/revision` annotation through `/status`, whose strategy keeps
/// the new annotations without a bump; skerry's `/status` keeps nothing but the status (see
/// [`prepare_update`]), so skerry's controller writes that annotation with a main-resource
/// update, and counting annotations here would bump the generation on every rollout step.
/// Deployments count their spec only until `/status` keeps metadata as Kubernetes' status
/// strategies do and the controller moves its annotation write there.
pub fn generation_policy(resource: &ResourceInfo) -> GenerationPolicy {
    match (resource.group, resource.resource) {
        ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets")
        | ("policy", "poddisruptionbudgets")
        | ("batch", "jobs" | "cronjobs")
        | ("networking.k8s.io", "ingresses" | "ingressclasses" | "networkpolicies") => {
            GenerationPolicy::Spec
        }
        ("discovery.k8s.io", "endpointslices") => GenerationPolicy::ContentOrLabels,
        ("scheduling.k8s.io", "priorityclasses") => GenerationPolicy::CreateOnly,
        _ => GenerationPolicy::Untracked,
    }
}

/// Kinds that carry a `metadata.generation` at all (set to 1 on create).
pub fn tracks_generation(resource: &ResourceInfo) -> bool {
    generation_policy(resource) != GenerationPolicy::Untracked
}

/// Builds the object an update stores from the old one and what the client sent:
/// identity and server-owned metadata stay, a main-resource update keeps the old status and
/// a status update keeps everything but the status; generation moves on spec changes.
pub fn prepare_update(
    resource: &ResourceInfo,
    old: &Value,
    new: &mut Value,
    subresource: Option<&str>,
) {
    if subresource == Some("status") {
        let status = new.get("status").cloned();
        let mut merged = old.clone();
        match status {
            Some(s) => merged["status"] = s,
            None => {
                if let Some(o) = merged.as_object_mut() {
                    o.remove("status");
                }
            }
        }
        *new = merged;
        return;
    }
    if resource.subresource("status").is_some() {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let meta = metadata_mut(new);
    drop_empty_fields(meta);
    for key in [
        "uid",
        "creationTimestamp",
        "name",
        "namespace",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old_meta.get(key) {
            Some(v) => meta.insert(key.into(), v.clone()),
            None => meta.remove(key),
        };
    }
    meta.remove("resourceVersion");
    if desired_state_changed(generation_policy(resource), old, new) {
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        metadata_mut(new).insert("generation".into(), json!(generation + 1));
    }
}

/// Whether `new` changes what `policy` counts as the desired state of `old`.
fn desired_state_changed(policy: GenerationPolicy, old: &Value, new: &Value) -> bool {
    let field = |v: &Value, pointer: &str| {
        let found = semantic(v.pointer(pointer).unwrap_or(&Value::Null));
        if is_empty_value(&found) {
            Value::Null
        } else {
            found
        }
    };
    let spec = || field(old, "/spec") != field(new, "/spec");
    match policy {
        GenerationPolicy::Untracked | GenerationPolicy::CreateOnly => false,
        GenerationPolicy::Spec => spec(),
        GenerationPolicy::ContentOrLabels => {
            // The strategy blanks `ObjectMeta` on both sides and compares the rest; the type
            // meta is not part of the stored object's content.
            let content = |v: &Value| {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    for key in ["metadata", "apiVersion", "kind"] {
                        o.remove(key);
                    }
                }
                let v = semantic(&v);
                if is_empty_value(&v) { Value::Null } else { v }
            };
            content(old) != content(new)
                || field(old, "/metadata/labels") != field(new, "/metadata/labels")
        }
    }
}

/// `value` as Kubernetes' `apiequality.Semantic.DeepEqual` sees it after decoding into Go
/// types: a `null` field is an absent one, and so is an empty list (a nil slice equals an
/// empty one) or an empty map. (A pointer to an empty struct, which Go tells apart from nil,
/// is the one case this cannot see from JSON; it is treated as absent too.)
fn semantic(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), semantic(v)))
                .filter(|(_, v)| !is_empty_value(v))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(semantic).collect()),
        other => other.clone(),
    }
}

fn is_empty_value(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::lookup;

    #[test]
    fn create_fills_server_owned_metadata() {
        let pods = lookup("", "v1", "pods").expect("pods");
        let mut pod = json!({"metadata": {"generateName": "web-", "resourceVersion": "9"}, "status": {"phase": "Running"}});
        prepare_create(pods, &mut pod, Some("default")).expect("create");
        let name = name(&pod);
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        assert_eq!(pod["metadata"]["namespace"], "default");
        assert!(
            pod["metadata"]["uid"]
                .as_str()
                .is_some_and(|u| u.len() == 36)
        );
        assert!(pod["metadata"].get("resourceVersion").is_none());
        assert!(pod.get("status").is_none());
        let mut other = json!({"metadata": {"name": "x", "namespace": "other"}});
        assert_eq!(
            prepare_create(pods, &mut other, Some("default")).map_err(|e| e.code),
            Err(400)
        );
        let mut nameless = json!({"metadata": {}});
        assert_eq!(
            prepare_create(pods, &mut nameless, Some("default")).map_err(|e| e.code),
            Err(422)
        );
    }

    #[test]
    fn updates_keep_identity_status_and_count_generations() {
        let deploy = lookup("apps", "v1", "deployments").expect("deployments");
        let old = json!({"metadata": {"name": "d", "uid": "u1", "generation": 3, "creationTimestamp": "t"},
            "spec": {"replicas": 1}, "status": {"replicas": 1}});
        let mut new = json!({"metadata": {"name": "d", "uid": "forged", "labels": {"a": "b"}},
            "spec": {"replicas": 2}, "status": {"replicas": 9}});
        prepare_update(deploy, &old, &mut new, None);
        assert_eq!(new["metadata"]["uid"], "u1");
        assert_eq!(new["metadata"]["generation"], 4);
        assert_eq!(new["metadata"]["labels"]["a"], "b");
        assert_eq!(new["status"]["replicas"], 1);
        let mut status = json!({"spec": {"replicas": 7}, "status": {"replicas": 2}});
        prepare_update(deploy, &old, &mut status, Some("status"));
        assert_eq!(status["spec"]["replicas"], 1);
        assert_eq!(status["status"]["replicas"], 2);
        assert_eq!(status["metadata"]["generation"], 3);
        let mut same = old.clone();
        prepare_update(deploy, &old, &mut same, None);
        assert_eq!(same["metadata"]["generation"], 3);
    }

    /// The generation an update of `old` to `new` leaves on `resource`.
    fn generation_after(resource: &ResourceInfo, old: &Value, mut new: Value) -> Value {
        prepare_update(resource, old, &mut new, None);
        new["metadata"]
            .get("generation")
            .cloned()
            .unwrap_or(Value::Null)
    }

    // Reference: Kubernetes 1.32 pkg/registry/core/node/strategy.go (PrepareForCreate keeps
    // the status) against pod/strategy.go (resets it).
    #[test]
    fn a_node_keeps_the_status_it_is_created_with_and_a_pod_does_not() {
        let nodes = lookup("", "v1", "nodes").expect("nodes");
        let status = json!({"capacity": {"cpu": "4", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]});
        let mut node = json!({"metadata": {"name": "n1"}, "status": status.clone()});
        prepare_create(nodes, &mut node, None).expect("create");
        assert_eq!(
            node["status"], status,
            "a kubelet registers its node with its status"
        );

        let pods = lookup("", "v1", "pods").expect("pods");
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": []},
            "status": {"phase": "Running"}});
        prepare_create(pods, &mut pod, Some("default")).expect("create");
        assert!(
            pod.get("status").is_none(),
            "a pod's create may not set its status"
        );
    }

    // Reference: Kubernetes 1.32 pkg/registry/policy/poddisruptionbudget/strategy.go.
    #[test]
    fn a_pdb_counts_spec_changes_only() {
        let pdbs = lookup("policy", "v1", "poddisruptionbudgets").expect("pdbs");
        let mut created = json!({"metadata": {"name": "web"}, "spec": {"maxUnavailable": 1},
            "status": {"disruptionsAllowed": 5}});
        prepare_create(pdbs, &mut created, Some("default")).expect("create");
        assert_eq!(created["metadata"]["generation"], 1);
        assert!(
            created.get("status").is_none(),
            "a create may not set status"
        );
        let old =
            json!({"metadata": {"name": "web", "generation": 1}, "spec": {"maxUnavailable": 1}});
        let mut spec = old.clone();
        spec["spec"]["maxUnavailable"] = json!(2);
        assert_eq!(generation_after(pdbs, &old, spec), 2);
        let mut labels = old.clone();
        labels["metadata"]["labels"] = json!({"tier": "web"});
        assert_eq!(generation_after(pdbs, &old, labels), 1);
        // The disruption controller's status write leaves the generation alone, so its
        // observedGeneration can catch up.
        let mut status = old.clone();
        status["status"] = json!({"observedGeneration": 1, "disruptionsAllowed": 1});
        prepare_update(pdbs, &old, &mut status, Some("status"));
        assert_eq!(status["metadata"]["generation"], 1);
    }

    #[test]
    fn workloads_count_spec_changes_not_metadata() {
        for resource in ["deployments", "replicasets", "statefulsets", "daemonsets"] {
            let workloads = lookup("apps", "v1", resource).expect("served");
            let old = json!({"metadata": {"name": "d", "generation": 2, "labels": {"a": "b"}},
                "spec": {"replicas": 1, "template": {"spec": {"tolerations": []}}}});
            let mut scaled = old.clone();
            scaled["spec"]["replicas"] = json!(2);
            assert_eq!(generation_after(workloads, &old, scaled), 3, "{resource}");
            let mut relabelled = old.clone();
            relabelled["metadata"]["labels"] = json!({"a": "c"});
            relabelled["metadata"]["annotations"] =
                json!({"deployment.kubernetes.io/revision": "2"});
            assert_eq!(
                generation_after(workloads, &old, relabelled),
                2,
                "{resource}"
            );
            // An empty list is no list at all (Go's nil slice equals an empty one).
            let mut no_tolerations = old.clone();
            no_tolerations["spec"]["template"]["spec"] = json!({});
            assert_eq!(
                generation_after(workloads, &old, no_tolerations),
                2,
                "{resource}"
            );
        }
    }

    // Reference: Kubernetes 1.32 pkg/registry/discovery/endpointslice/strategy.go.
    #[test]
    fn an_endpoint_slice_counts_everything_but_metadata_and_its_labels() {
        let slices = lookup("discovery.k8s.io", "v1", "endpointslices").expect("slices");
        let mut created =
            json!({"metadata": {"name": "s"}, "addressType": "IPv4", "endpoints": []});
        prepare_create(slices, &mut created, Some("default")).expect("create");
        assert_eq!(created["metadata"]["generation"], 1);
        let old = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "s", "generation": 1, "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]});
        let mut endpoints = old.clone();
        endpoints["endpoints"] = json!([{"addresses": ["10.0.0.2"]}]);
        assert_eq!(generation_after(slices, &old, endpoints), 2);
        let mut labels = old.clone();
        labels["metadata"]["labels"]["extra"] = json!("x");
        assert_eq!(generation_after(slices, &old, labels), 2);
        let mut annotations = old.clone();
        annotations["metadata"]["annotations"] = json!({"note": "x"});
        assert_eq!(generation_after(slices, &old, annotations), 1);
        // `ports: null` is no ports, as in Go.
        let mut null_ports = old.clone();
        null_ports["ports"] = Value::Null;
        assert_eq!(generation_after(slices, &old, null_ports), 1);
    }

    // Reference: Kubernetes 1.32 pkg/registry/scheduling/priorityclass/strategy.go.
    #[test]
    fn a_priority_class_starts_at_one_and_stays_there() {
        let classes = lookup("scheduling.k8s.io", "v1", "priorityclasses").expect("classes");
        let mut created = json!({"metadata": {"name": "high"}, "value": 1000});
        prepare_create(classes, &mut created, None).expect("create");
        assert_eq!(created["metadata"]["generation"], 1);
        let mut described = created.clone();
        described["description"] = json!("for the web tier");
        assert_eq!(generation_after(classes, &created, described), 1);
    }

    #[test]
    fn untracked_kinds_carry_no_generation() {
        let pods = lookup("", "v1", "pods").expect("pods");
        let mut pod = json!({"metadata": {"name": "p", "generation": 7}, "spec": {}});
        prepare_create(pods, &mut pod, Some("default")).expect("create");
        assert!(pod["metadata"].get("generation").is_none());
        let old = json!({"metadata": {"name": "p"}, "spec": {"activeDeadlineSeconds": 5}});
        let mut new = old.clone();
        new["spec"]["activeDeadlineSeconds"] = json!(4);
        assert_eq!(generation_after(pods, &old, new), Value::Null);
    }
}
