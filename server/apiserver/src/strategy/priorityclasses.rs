//! PriorityClasses (`pkg/registry/scheduling/priorityclass/storage`): the two built-in
//! classes cannot be deleted — every node's critical pods name them, and only a restart of
//! kube-apiserver would bring them back. Their generation (1, never bumped) is the
//! `CreateOnly` policy of `skerry_api::meta`, their admission the Priority plugin
//! ([`crate::admission`]).

use skerry_api::catalogue::ResourceInfo;
use skerry_api::validation::scheduling::SYSTEM_PRIORITY_CLASSES;
use skerry_api::{ApiError, status};

use super::Strategy;

/// Kubernetes' reason for refusing to delete a built-in PriorityClass.
const SYSTEM_PRIORITY_CLASS_UNDELETABLE: &str =
    "this is a system priority class and cannot be deleted";

/// The PriorityClass strategy.
pub struct PriorityClasses;

impl Strategy for PriorityClasses {
    /// Checked on the name before the object is read, as Kubernetes does (a dry run is
    /// refused too). DELETE of the collection does not pass here, as in Kubernetes, whose
    /// `DeleteCollection` calls the generic store's `Delete` and not this override.
    fn before_delete(&self, resource: &ResourceInfo, name: &str) -> Result<(), ApiError> {
        if !SYSTEM_PRIORITY_CLASSES.iter().any(|c| c.name == name) {
            return Ok(());
        }
        let mut e = ApiError::forbidden(format!(
            "{} {name:?} is forbidden: {SYSTEM_PRIORITY_CLASS_UNDELETABLE}",
            status::qualified(resource.group, resource.resource)
        ));
        e.group = Some(resource.group.to_string());
        e.kind = Some(resource.resource.to_string());
        e.name = Some(name.to_string());
        Err(e)
    }
}
