//! The ServiceAccount admission plugin (Kubernetes' `plugin/pkg/admission/serviceaccount`,
//! `Admit` and `Validate`): what makes the in-cluster configuration work in every pod.
//!
//! On a pod create it
//! - names the `default` ServiceAccount when the pod names none (and keeps the deprecated
//!   `spec.serviceAccount` equal to `spec.serviceAccountName`, as the v1 conversion does);
//! - refuses the pod when that ServiceAccount does not exist (403,
//!   `error looking up service account ns/name: serviceaccount "name" not found`);
//! - unless `automountServiceAccountToken` says no (the pod's field wins, then the
//!   ServiceAccount's), adds the projected volume `kube-api-access-<5 chars>` (a bound token,
//!   the `kube-root-ca.crt` ConfigMap's `ca.crt`, the namespace) and mounts it read-only at
//!   [`DEFAULT_API_TOKEN_MOUNT_PATH`] in every init and regular container that has nothing
//!   mounted there (ephemeral containers are added later, through their own subresource, and
//!   get nothing, as upstream);
//! - copies the ServiceAccount's `imagePullSecrets` into a pod that names none, so the kubelet
//!   never reads ServiceAccounts (the Node authorizer does not let it).
//!
//! A mirror pod (annotation [`MIRROR_POD_ANNOTATION`]) is the kubelet's reflection of a static
//! pod: its spec is never changed (the kubelet would see a different pod and delete it), and it
//! may not reference a ServiceAccount, a Secret or a projected token (ConfigMaps are NodeRestriction's rule) — a node must
//! not reach another identity's credentials by writing a pod.
//!
//! The trick is in the lookup ([`service_account`]): the `serviceaccounts` watch cache first,
//! as upstream's informer lister — a pod create costs a map lookup — then, on a miss, the store
//! read linearizably (a ServiceAccount created a moment before its pod, one manifest applying
//! both, may not be in the cache yet). For `default` the store is asked up to
//! [`DEFAULT_LOOKUP_ATTEMPTS`] times: the serviceaccount controller creates it a moment after
//! its namespace, and a pod created right after the namespace should wait that moment out, not
//! fail.

use std::time::Duration;

use rand::Rng;
use serde_json::{Value, json};
use skerry_api::{ApiError, ResourceInfo};

use crate::admission::admission_forbidden;
use crate::handler::ApiServer;

/// The ServiceAccount a pod naming none runs as (upstream `DefaultServiceAccountName`).
pub const DEFAULT_SERVICE_ACCOUNT_NAME: &str = "default";

/// Where the token, CA and namespace are mounted in every container (upstream
/// `DefaultAPITokenMountPath`); client libraries' in-cluster configuration reads this path.
pub const DEFAULT_API_TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The prefix of the projected volume's name (upstream `ServiceAccountVolumeName`); a volume
/// already named `kube-api-access-*` is taken as the token volume and not added twice.
pub const SERVICE_ACCOUNT_VOLUME_NAME: &str = "kube-api-access";

/// The ConfigMap the root CA publisher keeps in every namespace, and its key (upstream
/// `rootcacertpublisher`'s `RootCACertConfigMapName` and the admission's `ca.crt` item).
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
/// See [`ROOT_CA_CONFIG_MAP`].
pub const ROOT_CA_KEY: &str = "ca.crt";

/// The token's requested lifetime: upstream `serviceaccount.WarnOnlyBoundTokenExpirationSeconds`
/// (one hour and 7 s, a lifetime the token issuer recognises as an admission-made token). The
/// kubelet refreshes the token at 80 % of it.
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;

/// The projected volume's file mode, set explicitly as upstream does since kubernetes#104464
/// (`ProjectedVolumeSourceDefaultMode`, 0644): admission runs after defaulting.
pub const PROJECTED_DEFAULT_MODE: i64 = 0o644;

/// The annotation the kubelet puts on a mirror pod (upstream `MirrorPodAnnotationKey`).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Store reads of a missing `default` ServiceAccount before the pod is refused (upstream
/// `getServiceAccount`'s `numAttempts` of 10 for `default`; 1 for any other name). With
/// [`LOOKUP_RETRY_BASE`] this waits at most about 2 s, which covers the controller's delay
/// after a namespace is created; more would hold a doomed request longer.
pub const DEFAULT_LOOKUP_ATTEMPTS: usize = 10;

/// The pause between those reads: 100 ms plus a random 0-99 ms, chosen once per request
/// (upstream `getServiceAccount`'s `retryInterval`), so concurrent creates do not read in step.
pub const LOOKUP_RETRY_BASE: Duration = Duration::from_millis(100);

/// The resource the plugin reads ServiceAccounts from.
const SERVICE_ACCOUNTS: &str = "serviceaccounts";

/// Mirror-pod refusals, upstream's texts (the plugin's `Validate`).
pub const MIRROR_SERVICE_ACCOUNT: &str = "a mirror pod may not reference service accounts";
/// See [`MIRROR_SERVICE_ACCOUNT`].
pub const MIRROR_SECRETS: &str = "a mirror pod may not reference secrets";
/// See [`MIRROR_SERVICE_ACCOUNT`].
pub const MIRROR_TOKEN_PROJECTION: &str =
    "a mirror pod may not use ServiceAccountToken volume projections";

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn array_at<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Whether `pod` is a mirror pod.
pub fn is_mirror_pod(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// Keeps `spec.serviceAccountName` and the deprecated `spec.serviceAccount` in step, as
/// upstream's v1 conversion does on every write: an empty name takes the deprecated field's
/// value, and the deprecated field then repeats the name.
pub fn sync_deprecated_service_account(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let name = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let deprecated = spec
        .get("serviceAccount")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let effective = if name.is_empty() { deprecated } else { name };
    if effective.is_empty() {
        return;
    }
    spec.insert("serviceAccountName".into(), Value::from(effective.clone()));
    spec.insert("serviceAccount".into(), Value::from(effective));
}

/// Every container of the pod: init, regular and ephemeral (upstream `podutil.AllContainers`).
fn all_containers(pod: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |list| array_at(pod, &format!("/spec/{list}")))
}

/// Whether the pod names any Secret (upstream `podutil.VisitPodSecretNames`): pull secrets,
/// env and envFrom, secret and projected-secret volumes, and the `secretRef` /
/// `nodePublishSecretRef` / `secretName` of the other volume plugins.
pub fn references_secrets(pod: &Value) -> bool {
    let named = |v: Option<&Value>| {
        v.and_then(|v| v.get("name"))
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
    };
    if array_at(pod, "/spec/imagePullSecrets")
        .iter()
        .any(|r| named(Some(r)))
    {
        return true;
    }
    for c in all_containers(pod) {
        if array_at(c, "/envFrom")
            .iter()
            .any(|e| named(e.get("secretRef")))
            || array_at(c, "/env")
                .iter()
                .any(|e| named(e.pointer("/valueFrom/secretKeyRef")))
        {
            return true;
        }
    }
    for volume in array_at(pod, "/spec/volumes") {
        let Some(sources) = volume.as_object() else {
            continue;
        };
        if !str_at(volume, "/secret/secretName").is_empty()
            || !str_at(volume, "/azureFile/secretName").is_empty()
            || named(volume.pointer("/csi/nodePublishSecretRef"))
            || sources.values().any(|s| named(s.get("secretRef")))
            || array_at(volume, "/projected/sources")
                .iter()
                .any(|s| named(s.get("secret")))
        {
            return true;
        }
    }
    false
}

/// Why a mirror pod is refused, if it is (the plugin's `Validate`, in its order).
pub fn mirror_pod_refusal(pod: &Value) -> Option<&'static str> {
    if !str_at(pod, "/spec/serviceAccountName").is_empty() {
        return Some(MIRROR_SERVICE_ACCOUNT);
    }
    if references_secrets(pod) {
        return Some(MIRROR_SECRETS);
    }
    let projects_token = array_at(pod, "/spec/volumes").iter().any(|v| {
        array_at(v, "/projected/sources")
            .iter()
            .any(|s| s.get("serviceAccountToken").is_some_and(|t| !t.is_null()))
    });
    projects_token.then_some(MIRROR_TOKEN_PROJECTION)
}

/// Whether the token is mounted: the pod's `automountServiceAccountToken` wins, then the
/// ServiceAccount's, else yes (upstream `shouldAutomount`).
pub fn should_automount(service_account: &Value, pod: &Value) -> bool {
    pod.pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            service_account
                .get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true)
}

/// The projected volume `name`: a bound token at `token`, the root CA at `ca.crt`, the
/// namespace at `namespace` (upstream `TokenVolumeSource`), written out in full because
/// defaulting has already run.
pub fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": PROJECTED_DEFAULT_MODE,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
                {"configMap": {"name": ROOT_CA_CONFIG_MAP, "items": [{"key": ROOT_CA_KEY, "path": ROOT_CA_KEY}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]
        }
    })
}

/// Mounts the token volume in every init and regular container without a mount at
/// [`DEFAULT_API_TOKEN_MOUNT_PATH`], adding the volume when a container needs it and the pod
/// has no `kube-api-access-*` volume yet (upstream `mountServiceAccountToken`). `suffix` names
/// a new volume.
pub fn mount_token(pod: &mut Value, suffix: impl FnOnce() -> String) {
    let prefix = format!("{SERVICE_ACCOUNT_VOLUME_NAME}-");
    let existing = array_at(pod, "/spec/volumes")
        .iter()
        .map(|v| str_at(v, "/name"))
        .find(|n| n.starts_with(&prefix))
        .map(str::to_string);
    let has_volume = existing.is_some();
    let volume_name = existing.unwrap_or_else(|| format!("{prefix}{}", suffix()));
    let mount = json!({
        "name": volume_name,
        "readOnly": true,
        "mountPath": DEFAULT_API_TOKEN_MOUNT_PATH,
    });
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let mut needs_volume = false;
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for container in containers.iter_mut().filter_map(Value::as_object_mut) {
            let mounts = container
                .entry("volumeMounts")
                .or_insert_with(|| Value::Array(Vec::new()));
            if !mounts.is_array() {
                // Validation refuses it; nothing to add to.
                continue;
            }
            let taken = mounts
                .as_array()
                .expect("checked to be an array")
                .iter()
                .any(|m| str_at(m, "/mountPath") == DEFAULT_API_TOKEN_MOUNT_PATH);
            if !taken {
                mounts
                    .as_array_mut()
                    .expect("checked to be an array")
                    .push(mount.clone());
                needs_volume = true;
            }
        }
    }
    if needs_volume && !has_volume {
        let volumes = spec
            .entry("volumes")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(volumes) = volumes.as_array_mut() {
            volumes.push(token_volume(&volume_name));
        }
    }
}

/// Gives a pod naming no `imagePullSecrets` its ServiceAccount's (names only, as upstream).
pub fn copy_image_pull_secrets(service_account: &Value, pod: &mut Value) {
    if !array_at(pod, "/spec/imagePullSecrets").is_empty() {
        return;
    }
    let secrets: Vec<Value> = array_at(service_account, "/imagePullSecrets")
        .iter()
        .map(|r| json!({"name": str_at(r, "/name")}))
        .collect();
    if secrets.is_empty() {
        return;
    }
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("imagePullSecrets".into(), Value::Array(secrets));
    }
}

/// What the plugin does to a non-mirror pod once its ServiceAccount is found.
pub fn apply(service_account: &Value, pod: &mut Value, suffix: impl FnOnce() -> String) {
    if should_automount(service_account, pod) {
        mount_token(pod, suffix);
    }
    copy_image_pull_secrets(service_account, pod);
}

/// Names the default ServiceAccount in a pod naming none; returns the name the pod runs as.
pub fn default_service_account(pod: &mut Value) -> String {
    sync_deprecated_service_account(pod);
    let name = str_at(pod, "/spec/serviceAccountName").to_string();
    if !name.is_empty() {
        return name;
    }
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert(
            "serviceAccountName".into(),
            Value::from(DEFAULT_SERVICE_ACCOUNT_NAME),
        );
        spec.insert(
            "serviceAccount".into(),
            Value::from(DEFAULT_SERVICE_ACCOUNT_NAME),
        );
    }
    DEFAULT_SERVICE_ACCOUNT_NAME.to_string()
}

/// The ServiceAccount `namespace/name`: the watch cache, then the store (see the module doc).
async fn service_account(
    server: &ApiServer,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, ApiError> {
    let cache = server
        .caches
        .get(SERVICE_ACCOUNTS)
        .ok_or_else(|| ApiError::internal("the serviceaccounts watch cache is not running"))?;
    cache.wait_fresh(0).await?;
    if let Some(found) = cache.get(Some(namespace), name) {
        return Ok(Some(found.value().clone()));
    }
    let attempts = if name == DEFAULT_SERVICE_ACCOUNT_NAME {
        DEFAULT_LOOKUP_ATTEMPTS
    } else {
        1
    };
    let pause = LOOKUP_RETRY_BASE + Duration::from_millis(rand::rng().random_range(0..100));
    for attempt in 0..attempts {
        if attempt > 0 {
            tokio::time::sleep(pause).await;
        }
        let stored = server
            .timed(
                "get",
                cache.resource(),
                crate::storage::get(&server.store, cache.resource(), Some(namespace), name),
            )
            .await?;
        if let Some(found) = stored {
            return Ok(Some(found.value().clone()));
        }
    }
    Ok(None)
}

/// The plugin on a pod create (`Admit`, then `Validate`). Other resources pass.
pub async fn admit_create(
    server: &ApiServer,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    pod: &mut Value,
) -> Result<(), ApiError> {
    if !server.service_account_admission || (resource.group, resource.resource) != ("", "pods") {
        return Ok(());
    }
    if is_mirror_pod(pod) {
        sync_deprecated_service_account(pod);
        return match mirror_pod_refusal(pod) {
            Some(reason) => Err(admission_forbidden(resource, pod, reason)),
            None => Ok(()),
        };
    }
    let namespace = namespace.unwrap_or("");
    let name = default_service_account(pod);
    let Some(account) = service_account(server, namespace, &name).await? else {
        return Err(admission_forbidden(
            resource,
            pod,
            &format!(
                "error looking up service account {namespace}/{name}: serviceaccount {name:?} not found"
            ),
        ));
    };
    apply(&account, pod, skerry_api::meta::random_suffix);
    Ok(())
}

/// The plugin on a pod update: only the conversion's field sync (the plugin mutates creates
/// only; validation keeps `serviceAccountName` as it was).
pub fn admit_update(server: &ApiServer, resource: &ResourceInfo, pod: &mut Value) {
    if server.service_account_admission && (resource.group, resource.resource) == ("", "pods") {
        sync_deprecated_service_account(pod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    }

    fn sa(extra: Value) -> Value {
        let mut sa = json!({"metadata": {"name": "default", "namespace": "ns"}});
        if let (Some(o), Some(e)) = (sa.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        sa
    }

    fn fixed() -> String {
        "abcde".to_string()
    }

    #[test]
    fn a_pod_naming_none_runs_as_default_in_both_fields() {
        let mut p = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(default_service_account(&mut p), "default");
        assert_eq!(p["spec"]["serviceAccountName"], "default");
        assert_eq!(p["spec"]["serviceAccount"], "default");
        let mut deprecated_only = pod(json!({"serviceAccount": "builder", "containers": []}));
        assert_eq!(default_service_account(&mut deprecated_only), "builder");
        assert_eq!(deprecated_only["spec"]["serviceAccountName"], "builder");
        let mut named = pod(json!({"serviceAccountName": "web", "containers": []}));
        assert_eq!(default_service_account(&mut named), "web");
        assert_eq!(named["spec"]["serviceAccount"], "web");
    }

    #[test]
    fn the_token_volume_is_mounted_everywhere() {
        let mut p = pod(json!({
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "a", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}, {"name": "b"}],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }));
        apply(&sa(json!({})), &mut p, fixed);
        let expected_mount = json!({"name": "kube-api-access-abcde", "readOnly": true,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
        assert_eq!(
            p["spec"]["initContainers"][0]["volumeMounts"],
            json!([expected_mount])
        );
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"][1],
            expected_mount
        );
        assert_eq!(
            p["spec"]["containers"][1]["volumeMounts"],
            json!([expected_mount])
        );
        let volumes = p["spec"]["volumes"].as_array().expect("volumes");
        assert_eq!(volumes.len(), 2);
        assert_eq!(
            volumes[1],
            json!({"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}})
        );
    }

    #[test]
    fn a_generated_name_has_five_safe_characters() {
        let mut p = pod(json!({"containers": [{"name": "c"}]}));
        apply(&sa(json!({})), &mut p, skerry_api::meta::random_suffix);
        let name = p["spec"]["volumes"][0]["name"].as_str().expect("a name");
        let suffix = name.strip_prefix("kube-api-access-").expect("the prefix");
        assert_eq!(suffix.len(), 5);
        assert!(
            suffix
                .chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
        );
    }

    #[test]
    fn opting_out_at_pod_or_account_level() {
        let mut pod_says_no =
            pod(json!({"automountServiceAccountToken": false, "containers": [{"name": "c"}]}));
        apply(&sa(json!({})), &mut pod_says_no, fixed);
        assert!(pod_says_no["spec"].get("volumes").is_none());
        assert!(
            pod_says_no["spec"]["containers"][0]
                .get("volumeMounts")
                .is_none()
        );

        let no_account = sa(json!({"automountServiceAccountToken": false}));
        let mut account_says_no = pod(json!({"containers": [{"name": "c"}]}));
        apply(&no_account, &mut account_says_no, fixed);
        assert!(account_says_no["spec"].get("volumes").is_none());

        // The pod's own choice wins over the account's.
        let mut pod_says_yes =
            pod(json!({"automountServiceAccountToken": true, "containers": [{"name": "c"}]}));
        apply(&no_account, &mut pod_says_yes, fixed);
        assert_eq!(
            pod_says_yes["spec"]["volumes"][0]["name"],
            "kube-api-access-abcde"
        );
    }

    #[test]
    fn an_existing_mount_is_kept() {
        let own =
            json!({"name": "mine", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
        let mut p = pod(json!({
            "containers": [{"name": "c", "volumeMounts": [own]}],
            "volumes": [{"name": "mine", "secret": {"secretName": "s"}}]
        }));
        let before = p.clone();
        apply(&sa(json!({})), &mut p, fixed);
        assert_eq!(
            p, before,
            "a container with its own mount there needs no token volume"
        );

        // A pod that already has a kube-api-access-* volume reuses it for the others.
        let mut reuse = pod(json!({
            "containers": [{"name": "c"}],
            "volumes": [{"name": "kube-api-access-zzzzz", "emptyDir": {}}]
        }));
        apply(&sa(json!({})), &mut reuse, fixed);
        assert_eq!(reuse["spec"]["volumes"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            reuse["spec"]["containers"][0]["volumeMounts"][0]["name"],
            "kube-api-access-zzzzz"
        );
    }

    #[test]
    fn image_pull_secrets_are_copied_into_a_pod_without_any() {
        let account = sa(json!({"imagePullSecrets": [{"name": "regcred"}, {"name": "other"}]}));
        let mut p = pod(json!({"containers": [{"name": "c"}]}));
        apply(&account, &mut p, fixed);
        assert_eq!(
            p["spec"]["imagePullSecrets"],
            json!([{"name": "regcred"}, {"name": "other"}])
        );
        let mut own =
            pod(json!({"imagePullSecrets": [{"name": "mine"}], "containers": [{"name": "c"}]}));
        apply(&account, &mut own, fixed);
        assert_eq!(own["spec"]["imagePullSecrets"], json!([{"name": "mine"}]));
    }

    fn mirror(spec: Value) -> Value {
        json!({"metadata": {"name": "m", "namespace": "ns",
            "annotations": {"kubernetes.io/config.mirror": "hash"}}, "spec": spec})
    }

    #[test]
    fn mirror_pods_may_reference_no_credentials() {
        assert!(is_mirror_pod(&mirror(json!({}))));
        assert!(!is_mirror_pod(&pod(json!({}))));
        let c = |extra: Value| {
            let mut c = json!({"name": "c", "image": "busybox"});
            if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            c
        };
        let cases = [
            (json!({"containers": [c(json!({}))]}), None),
            (
                json!({"serviceAccountName": "default", "containers": [c(json!({}))]}),
                Some(MIRROR_SERVICE_ACCOUNT),
            ),
            (
                json!({"imagePullSecrets": [{"name": "r"}], "containers": [c(json!({}))]}),
                Some(MIRROR_SECRETS),
            ),
            (
                json!({"containers": [c(json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}))]}),
                Some(MIRROR_SECRETS),
            ),
            (
                json!({"containers": [c(json!({}))], "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
                Some(MIRROR_SECRETS),
            ),
            (
                json!({"containers": [c(json!({}))], "volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "s"}}]}}]}),
                Some(MIRROR_SECRETS),
            ),
            (
                json!({"containers": [c(json!({"envFrom": [{"configMapRef": {"name": "cm"}}]}))]}),
                None, // configmaps are NodeRestriction's rule, not this plugin's
            ),
            (
                json!({"containers": [c(json!({}))], "volumes": [{"name": "v", "configMap": {"name": "cm"}}]}),
                None, // configmaps are NodeRestriction's rule, not this plugin's
            ),
            (
                json!({"containers": [c(json!({}))], "volumes": [{"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}),
                Some(MIRROR_TOKEN_PROJECTION),
            ),
            (
                json!({"containers": [c(json!({}))], "ephemeralContainers": [c(json!({"envFrom": [{"secretRef": {"name": "s"}}]}))]}),
                Some(MIRROR_SECRETS),
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(mirror_pod_refusal(&mirror(spec.clone())), want, "{spec}");
        }
        // The deprecated field counts as naming an account.
        let mut deprecated = mirror(json!({"serviceAccount": "x", "containers": []}));
        sync_deprecated_service_account(&mut deprecated);
        assert_eq!(
            mirror_pod_refusal(&deprecated),
            Some(MIRROR_SERVICE_ACCOUNT)
        );
    }
}
