//! What a mirror pod may hold (the mirror-pod rules of Kubernetes' ServiceAccount admission
//! plugin, `plugin/pkg/admission/serviceaccount/admission.go` `Validate`).
//!
//! A mirror pod (annotation `kubernetes.io/config.mirror`) is the kubelet's window in the API
//! on a static pod that runs from a manifest on the node: nothing runs it, and nothing may
//! change it into something that would get the node credentials it should not have. So a
//! mirror pod may not name a service account, reference a secret anywhere (image pull
//! secrets, environment, volumes of every plugin) or project a service account token; and
//! nothing is added to it (the plugin returns before defaulting `serviceAccountName`, which
//! skerry does not default anyway). Only creates are checked, as upstream: an update may not
//! touch the annotation (pod validation) nor, for a pod, the volumes or environment.

use serde_json::Value;
use skerry_api::{ApiError, ResourceInfo};

use super::admission_forbidden;

/// The annotation marking a mirror pod (`core.MirrorPodAnnotationKey`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The volume sources that reference a secret, and the field that does
/// (`podutil.VisitPodSecretNames`).
const SECRET_VOLUME_FIELDS: &[(&str, &str)] = &[
    ("secret", "secretName"),
    ("azureFile", "secretName"),
    ("cephfs", "secretRef"),
    ("cinder", "secretRef"),
    ("flexVolume", "secretRef"),
    ("rbd", "secretRef"),
    ("scaleIO", "secretRef"),
    ("iscsi", "secretRef"),
    ("storageos", "secretRef"),
    ("csi", "nodePublishSecretRef"),
];

/// Refuses the create of a mirror pod that references service accounts or secrets
/// (403 `Forbidden`, upstream's messages); any other object passes.
pub fn admit_create(resource: &ResourceInfo, pod: &Value) -> Result<(), ApiError> {
    if (resource.group, resource.kind) != ("", "Pod") || !is_mirror(pod) {
        return Ok(());
    }
    let spec = pod.get("spec").unwrap_or(&Value::Null);
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
    if !text(spec.get("serviceAccountName")).is_empty() {
        return Err(admission_forbidden(
            resource,
            pod,
            "a mirror pod may not reference service accounts",
        ));
    }
    if references_secrets(spec) {
        return Err(admission_forbidden(
            resource,
            pod,
            "a mirror pod may not reference secrets",
        ));
    }
    let projects_token = volumes(spec).any(|v| {
        v.pointer("/projected/sources")
            .and_then(Value::as_array)
            .is_some_and(|s| s.iter().any(|s| present(s.get("serviceAccountToken"))))
    });
    if projects_token {
        return Err(admission_forbidden(
            resource,
            pod,
            "a mirror pod may not use ServiceAccountToken volume projections",
        ));
    }
    Ok(())
}

/// Whether `pod` carries the mirror annotation.
pub fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

fn present(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null())
}

fn list(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}

fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    list(spec.get("volumes"))
}

/// `VisitPodSecretNames` over every kind of container: image pull secrets, `envFrom`
/// secret refs, `secretKeyRef` env values, and the volumes' secrets (projected ones too).
fn references_secrets(spec: &Value) -> bool {
    if list(spec.get("imagePullSecrets")).next().is_some() {
        return true;
    }
    let containers = ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| list(spec.get(*k)));
    for c in containers {
        if list(c.get("envFrom")).any(|e| present(e.get("secretRef"))) {
            return true;
        }
        if list(c.get("env")).any(|e| present(e.pointer("/valueFrom/secretKeyRef"))) {
            return true;
        }
    }
    volumes(spec).any(|v| {
        SECRET_VOLUME_FIELDS
            .iter()
            .any(|(source, field)| present(v.get(*source).and_then(|s| s.get(*field))))
            || list(v.pointer("/projected/sources")).any(|s| present(s.get("secret")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pods() -> &'static ResourceInfo {
        skerry_api::catalogue::lookup("", "v1", "pods").expect("pods")
    }

    fn mirror(spec: Value) -> Value {
        json!({
            "metadata": {"name": "web-n", "annotations": {MIRROR_ANNOTATION: "abc"}},
            "spec": spec,
        })
    }

    fn refusal(spec: Value) -> Option<String> {
        admit_create(pods(), &mirror(spec)).err().map(|e| {
            assert_eq!(e.code, 403);
            e.message
        })
    }

    #[test]
    fn a_plain_mirror_passes() {
        let spec = json!({"containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]}],
            "volumes": [{"name": "v", "emptyDir": {}}, {"name": "p", "projected": {"sources": [{"configMap": {"name": "x"}}]}}]});
        assert_eq!(refusal(spec), None);
    }

    #[test]
    fn service_accounts_secrets_and_tokens_are_refused() {
        assert_eq!(
            refusal(json!({"serviceAccountName": "default", "containers": []})).as_deref(),
            Some("pods \"web-n\" is forbidden: a mirror pod may not reference service accounts")
        );
        let secrets = [
            json!({"imagePullSecrets": [{"name": "s"}]}),
            json!({"containers": [{"envFrom": [{"secretRef": {"name": "s"}}]}]}),
            json!({"initContainers": [{"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}),
            json!({"volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
            json!({"volumes": [{"name": "v", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}}}]}),
            json!({"volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "s"}}]}}]}),
        ];
        for spec in secrets {
            assert_eq!(
                refusal(spec.clone()).as_deref(),
                Some("pods \"web-n\" is forbidden: a mirror pod may not reference secrets"),
                "{spec}"
            );
        }
        let token = json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]});
        assert_eq!(
            refusal(token).as_deref(),
            Some(
                "pods \"web-n\" is forbidden: a mirror pod may not use ServiceAccountToken volume projections"
            )
        );
    }

    #[test]
    fn pods_that_are_not_mirrors_are_not_checked() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"serviceAccountName": "default",
            "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}});
        assert!(admit_create(pods(), &pod).is_ok());
    }
}
