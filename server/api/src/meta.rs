//! Object metadata the server owns: what a create fills in (uid, creationTimestamp,
//! generateName, generation) and what an update may not change, as Kubernetes'
//! `BeforeCreate`/`BeforeUpdate` and the per-kind strategies do it.

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

/// Now, as Kubernetes writes timestamps (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    let now = jiff::Timestamp::now();
    let secs = jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    secs.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
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
/// with a status subresource) the status the client sent.
pub fn prepare_create(
    resource: &ResourceInfo,
    obj: &mut Value,
    url_namespace: Option<&str>,
) -> Result<(), ApiError> {
    let meta = metadata_mut(obj);
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
                let mut rng = rand::rng();
                let suffix: String = (0..GENERATE_NAME_SUFFIX_LEN)
                    .map(|_| {
                        GENERATE_NAME_ALPHABET[rng.random_range(0..GENERATE_NAME_ALPHABET.len())]
                            as char
                    })
                    .collect();
                meta.insert("name".into(), json!(format!("{prefix}{suffix}")));
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
    if resource.subresource("status").is_some()
        && resource.resource != "namespaces"
        && let Some(o) = obj.as_object_mut()
    {
        o.remove("status");
    }
    Ok(())
}

/// Kinds whose `metadata.generation` counts spec changes (controllers compare it with
/// `status.observedGeneration`; `kubectl rollout status` waits on it).
pub fn tracks_generation(resource: &ResourceInfo) -> bool {
    resource.group == "apps"
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
    if tracks_generation(resource) && spec_changed(old, new) {
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        metadata_mut(new).insert("generation".into(), json!(generation + 1));
    }
}

/// Whether anything but metadata and status differs.
fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("metadata");
            o.remove("status");
        }
        v
    };
    strip(old) != strip(new)
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
}
