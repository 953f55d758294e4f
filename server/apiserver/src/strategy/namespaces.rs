//! Namespaces (`pkg/registry/core/namespace/storage`): a deletion always marks the namespace
//! `Terminating` and leaves it to the namespace controller, which empties it and then
//! removes its `spec.finalizers` through `/finalize`; only then does the namespace go.

use serde_json::{Value, json};

use super::{Strategy, has_finalizers, is_deleting};

/// The Namespace strategy.
pub struct Namespaces;

impl Strategy for Namespaces {
    fn deletion_waits(&self) -> bool {
        true
    }

    fn prepare_for_deletion(&self, object: &mut Value) {
        object["status"]["phase"] = json!("Terminating");
    }

    /// A terminating namespace also waits for its `spec.finalizers` (Kubernetes'
    /// `ShouldDeleteNamespaceDuringUpdate`). Without this, any status write to a terminating
    /// namespace would remove it with its content still in place.
    fn should_delete_during_update(&self, object: &Value) -> bool {
        let spec_finalizers = object
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        is_deleting(object) && !has_finalizers(object) && !spec_finalizers
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_terminating_namespace_waits_for_its_spec_finalizers_too() {
        let waiting = json!({"metadata": {"deletionTimestamp": "t"},
            "spec": {"finalizers": ["kubernetes"]}});
        assert!(!Namespaces.should_delete_during_update(&waiting));
        let finalized = json!({"metadata": {"deletionTimestamp": "t"}, "spec": {"finalizers": []}});
        assert!(Namespaces.should_delete_during_update(&finalized));
        let mut marked = json!({"metadata": {}});
        Namespaces.prepare_for_deletion(&mut marked);
        assert_eq!(marked["status"]["phase"], "Terminating");
    }
}
