//! The garbage collector's writes, as patch bodies built without I/O.
//!
//! Owner references are edited with strategic merge patches keyed by owner UID (Kubernetes'
//! `GenerateDeleteOwnerRefStrategicMergeBytes` and `unblockOwnerReferencesStrategicMergePatch`):
//! removing or unblocking the reference to one owner is idempotent and cannot clobber a
//! concurrent change to another reference, so these need no precondition. Finalizers are a
//! plain list, so their removal is a JSON patch that `test`s the UID and the exact list read
//! and fails (422) if either changed meanwhile — optimistic concurrency without a
//! resourceVersion (skerry's PATCH, unlike Kubernetes', ignores a resourceVersion in a merge
//! patch body).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};

use super::graph::is_blocking;

/// Removes the references to `owner_uids` from the object `item_uid`.
pub fn remove_owner_references(item_uid: &str, owner_uids: &[String]) -> Value {
    let deletes: Vec<Value> = owner_uids
        .iter()
        .map(|uid| json!({"$patch": "delete", "uid": uid}))
        .collect();
    json!({"metadata": {"ownerReferences": deletes, "uid": item_uid}})
}

/// Sets `blockOwnerDeletion: false` on the blocking references of `references` whose owner
/// UID `select` accepts; `None` if there are none.
pub fn unblock_owner_references(
    item_uid: &str,
    references: &[OwnerReference],
    select: impl Fn(&str) -> bool,
) -> Option<Value> {
    let unblocked: Vec<OwnerReference> = references
        .iter()
        .filter(|r| is_blocking(r) && select(&r.uid))
        .map(|r| OwnerReference {
            block_owner_deletion: Some(false),
            ..r.clone()
        })
        .collect();
    if unblocked.is_empty() {
        return None;
    }
    Some(json!({"metadata": {"ownerReferences": unblocked, "uid": item_uid}}))
}

/// Removes `finalizer` from the object `uid` whose finalizers were read as `current`;
/// `None` if it is not among them.
pub fn remove_finalizer(uid: &str, current: &[String], finalizer: &str) -> Option<Value> {
    if !current.iter().any(|f| f == finalizer) {
        return None;
    }
    let remaining: Vec<&String> = current.iter().filter(|f| *f != finalizer).collect();
    Some(json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/metadata/finalizers", "value": current},
        {"op": "replace", "path": "/metadata/finalizers", "value": remaining},
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(uid: &str, blocking: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: uid.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: blocking,
        }
    }

    #[test]
    fn owner_reference_removal_is_keyed_by_uid() {
        assert_eq!(
            remove_owner_references("me", &["a".into(), "b".into()]),
            json!({"metadata": {
                "ownerReferences": [{"$patch": "delete", "uid": "a"}, {"$patch": "delete", "uid": "b"}],
                "uid": "me",
            }})
        );
    }

    #[test]
    fn unblocking_touches_only_selected_blocking_references() {
        let refs = [
            reference("a", Some(true)),
            reference("b", Some(false)),
            reference("c", Some(true)),
            reference("d", None),
        ];
        let patch = unblock_owner_references("me", &refs, |uid| uid != "c").expect("a patch");
        let patched = &patch["metadata"]["ownerReferences"];
        assert_eq!(patched.as_array().map(Vec::len), Some(1));
        assert_eq!(patched[0]["uid"], "a");
        assert_eq!(patched[0]["blockOwnerDeletion"], false);
        assert_eq!(
            patched[0]["controller"], true,
            "the rest of the reference is kept"
        );
        assert!(unblock_owner_references("me", &refs[1..2], |_| true).is_none());
    }

    #[test]
    fn finalizer_removal_tests_what_it_read() {
        let current = vec!["a".to_string(), "foregroundDeletion".to_string()];
        let patch = remove_finalizer("u", &current, "foregroundDeletion").expect("patch");
        assert_eq!(
            patch[0],
            json!({"op": "test", "path": "/metadata/uid", "value": "u"})
        );
        assert_eq!(patch[1]["value"], json!(["a", "foregroundDeletion"]));
        assert_eq!(patch[2]["value"], json!(["a"]));
        assert!(remove_finalizer("u", &current, "orphan").is_none());
    }
}
