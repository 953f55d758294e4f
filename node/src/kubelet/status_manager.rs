//! Writes pod statuses to the API (upstream `pkg/kubelet/status/status_manager.go`): a status
//! is patched on the `status` subresource only when it differs from the last one written
//! (or, before any write, from the one the pod carries), and a pod the kubelet has finished
//! with is deleted with grace 0 and a UID precondition, so a new pod of the same name is
//! never touched.
//!
//! The patch is a JSON merge patch of the whole status, with `null` for the top-level fields
//! the new status no longer has: lists (conditions, container statuses) are replaced whole,
//! which is what the kubelet means.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::Value;
use skerry_client::{Api, Client, DeleteParams, Patch, PatchParams};
use tracing::debug;

/// The kubelet's field manager on its status writes.
pub const FIELD_MANAGER: &str = "kubelet";

/// The status writer.
pub struct StatusManager {
    client: Client,
    /// By pod UID: the UID of the object written to (a static pod's mirror, else the pod
    /// itself) and the status last written there.
    last: Mutex<HashMap<String, (String, Value)>>,
}

/// The merge patch turning `old` into `new` (top-level removals as `null`).
pub fn status_patch(old: &Value, new: &Value) -> Value {
    let mut patch = new.clone();
    if let (Some(old), Some(p)) = (old.as_object(), patch.as_object_mut()) {
        for key in old.keys() {
            if !p.contains_key(key) {
                p.insert(key.clone(), Value::Null);
            }
        }
    }
    serde_json::json!({ "status": patch })
}

impl StatusManager {
    /// A writer over `client` (the node's credentials).
    pub fn new(client: Client) -> StatusManager {
        StatusManager {
            client,
            last: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Value)>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `status` for `pod` if it changed; returns whether it wrote.
    pub async fn set(&self, pod: &Pod, status: &PodStatus) -> Result<bool, skerry_client::Error> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.set_on(&uid, pod, status).await
    }

    /// Writes `status` of the pod `uid` on `target` (the pod itself, or a static pod's mirror,
    /// `crate::kubelet::static_pods`) if it differs from what `target` last got: a new mirror
    /// gets the status again.
    pub async fn set_on(
        &self,
        uid: &str,
        target: &Pod,
        status: &PodStatus,
    ) -> Result<bool, skerry_client::Error> {
        let target_uid = target.metadata.uid.clone().unwrap_or_default();
        let new = serde_json::to_value(status).expect("a PodStatus serializes");
        let old = self
            .lock()
            .get(uid)
            .filter(|(to, _)| *to == target_uid)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| {
                target
                    .status
                    .as_ref()
                    .map(|s| serde_json::to_value(s).expect("a PodStatus serializes"))
                    .unwrap_or(Value::Null)
            });
        if old == new {
            return Ok(false);
        }
        let api: Api<Pod> = self.client.api(target.metadata.namespace.as_deref());
        let name = target.metadata.name.as_deref().unwrap_or_default();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..Default::default()
        };
        api.patch_status(name, &params, &Patch::Merge(status_patch(&old, &new)))
            .await?;
        debug!(pod = name, "status written");
        self.lock().insert(uid.to_string(), (target_uid, new));
        Ok(true)
    }

    /// Deletes a terminated pod from the API: grace 0, precondition on its UID
    /// (`status_manager.go` `syncPod` once `canBeDeleted`). Already gone is success.
    pub async fn delete(&self, pod: &Pod) -> Result<(), skerry_client::Error> {
        let api: Api<Pod> = self.client.api(pod.metadata.namespace.as_deref());
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            precondition_uid: pod.metadata.uid.clone(),
            ..Default::default()
        };
        match api
            .delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Forgets a pod.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_fields_are_nulled_lists_replaced() {
        let old =
            serde_json::json!({"phase": "Pending", "reason": "X", "conditions": [{"type": "A"}]});
        let new = serde_json::json!({"phase": "Running", "conditions": [{"type": "B"}]});
        assert_eq!(
            status_patch(&old, &new),
            serde_json::json!({"status": {"phase": "Running", "reason": null, "conditions": [{"type": "B"}]}})
        );
    }
}
