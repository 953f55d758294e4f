//! Admission: the checks that run after decoding and validation and before the store write.
//!
//! - NamespaceLifecycle — no new content in a namespace that does not exist or is being
//!   deleted (`admit_namespace`).
//! - NodeRestriction — what a node's kubelet may write ([`crate::noderestriction`]).
//! - OwnerReferencesPermissionEnforcement — setting `blockOwnerDeletion` on an owner
//!   reference needs `update` on the owner's `finalizers`, decided with a single wildcard
//!   probe first (`docs/tricks.md` #12, one wildcard RBAC probe for owner-reference
//!   finalizers, [`crate::auth::rbac::can_set_blocking_owner_finalizers`]).
//! - Priority (Kubernetes' `plugin/pkg/admission/priority`) — a new pod's
//!   `spec.priorityClassName` becomes `spec.priority` and `spec.preemptionPolicy`, so the
//!   scheduler's queue and preemption read one integer and never a PriorityClass; a pod
//!   naming no class gets the global default class, else priority 0. A PriorityClass may be
//!   the global default only while no other class is.
//! - ServiceAccount (between the two, as upstream orders them) — `crate::serviceaccount_admission`,
//!   whose mirror-pod rules (no service account, secrets, configmaps or token projections) run
//!   before NodeRestriction's (`crate::noderestriction`), as upstream's plugin order has it.
//!
//! The Priority plugin reads classes from the `priorityclasses` watch cache, as
//! kube-apiserver's plugin reads its informer: a pod create costs a map lookup, not a store
//! read. Invariant: a class name is refused only after the store, read linearizably, agrees
//! that it does not exist — the cache may trail a class created a moment before its pods
//! (one manifest applying both), and that must not turn into a 403.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;
use skerry_api::catalogue::RESOURCES;
use skerry_api::defaults::PREEMPT_LOWER_PRIORITY;
use skerry_api::{ApiError, ResourceInfo};

use crate::auth::UserInfo;
use crate::auth::rbac::{can_set_blocking_owner_finalizers, new_blocking_owner_refs};
use crate::handler::ApiServer;

fn owner_refs(object: &Value) -> Vec<OwnerReference> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

fn check_owner_refs(
    server: &ApiServer,
    resource: &ResourceInfo,
    old: Option<&Value>,
    new: &Value,
    user: &UserInfo,
) -> Result<(), ApiError> {
    let new_refs = owner_refs(new);
    if new_refs.is_empty() {
        return Ok(());
    }
    let old_refs = old.map(owner_refs);
    let blocking = new_blocking_owner_refs(&new_refs, old_refs.as_deref());
    if blocking.is_empty() {
        return Ok(());
    }
    let namespace = new
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut resolve = |owner: &OwnerReference| -> Result<Vec<String>, String> {
        let found: Vec<String> = RESOURCES
            .iter()
            .filter(|r| r.kind == owner.kind && r.api_version() == owner.api_version)
            .map(|r| r.resource.to_string())
            .collect();
        if found.is_empty() {
            Err("no matches for kind".to_string())
        } else {
            Ok(found)
        }
    };
    let decision = can_set_blocking_owner_finalizers(
        user,
        namespace,
        &blocking,
        &mut resolve,
        server.rbac.as_ref(),
    );
    if decision.allowed {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "{} {:?} is forbidden: {}",
            skerry_api::status::qualified(resource.group, resource.resource),
            new.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            decision.reason
        )))
    }
}

/// Refuses writes into a namespace that does not exist or is being deleted (Kubernetes'
/// NamespaceLifecycle admission).
async fn admit_namespace(
    server: &ApiServer,
    resource: &ResourceInfo,
    namespace: Option<&str>,
) -> Result<(), ApiError> {
    let Some(ns) = namespace.filter(|_| resource.namespaced) else {
        return Ok(());
    };
    let namespaces =
        skerry_api::catalogue::lookup("", "v1", "namespaces").expect("namespaces are served");
    let found = match server
        .caches
        .get("namespaces")
        .and_then(|c| c.get(None, ns))
    {
        Some(o) => Some(o),
        None => {
            server
                .timed(
                    "get",
                    namespaces,
                    crate::storage::get(&server.store, namespaces, None, ns),
                )
                .await?
        }
    };
    match found {
        None => Err(ApiError::not_found("", "namespaces", ns)),
        Some(o)
            if o.value()
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null()) =>
        {
            let message = format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            );
            // Kubernetes' NamespaceLifecycle admission adds this cause; controllers (and
            // client-go's `HasStatusCause`) recognise a terminating namespace by it.
            let mut err = ApiError::forbidden(message.clone());
            err.causes.push(skerry_api::Cause::new(
                "NamespaceTerminating",
                "metadata.namespace",
                message,
            ));
            Err(err)
        }
        Some(_) => Ok(()),
    }
}

/// Admission for a create of `object` in `namespace` (the path's), plugins in Kubernetes'
/// order: NamespaceLifecycle first, so that a refused namespace is reported before anything
/// about the object. Each plugin picks the resources it handles, as Kubernetes' plugins do:
/// a resource without a plugin of its own passes through the generic ones only.
pub async fn admit_create(
    server: &ApiServer,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    object: &mut Value,
    user: &UserInfo,
) -> Result<(), ApiError> {
    admit_namespace(server, resource, namespace).await?;
    crate::serviceaccount_admission::admit_create(server, resource, namespace, object).await?;
    crate::noderestriction::admit(
        server,
        &crate::noderestriction::Request {
            resource,
            subresource: None,
            operation: crate::noderestriction::Operation::Create,
            name: "",
            namespace,
            object: Some(object),
            old: None,
            user,
        },
    )
    .await?;
    priority_admit_create(server, resource, object).await?;
    check_owner_refs(server, resource, None, object, user)
}

/// Admission for an update of the object or of its `subresource`.
pub async fn admit_update(
    server: &ApiServer,
    resource: &ResourceInfo,
    subresource: Option<&str>,
    old: &Value,
    new: &mut Value,
    user: &UserInfo,
) -> Result<(), ApiError> {
    crate::serviceaccount_admission::admit_update(server, resource, new);
    crate::noderestriction::admit(
        server,
        &crate::noderestriction::Request {
            resource,
            subresource,
            operation: crate::noderestriction::Operation::Update,
            name: old
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            namespace: old.pointer("/metadata/namespace").and_then(Value::as_str),
            object: Some(new),
            old: Some(old),
            user,
        },
    )
    .await?;
    priority_admit_update(server, resource, old, new).await?;
    check_owner_refs(server, resource, Some(old), new, user)
}

// ----- Priority -----

/// The Priority plugin on a create: a pod's class resolved into its priority, a class's
/// single-default rule (the plugin's `Admit` and `Validate`, which switch on the resource).
async fn priority_admit_create(
    server: &ApiServer,
    resource: &ResourceInfo,
    object: &mut Value,
) -> Result<(), ApiError> {
    match (resource.group, resource.resource) {
        ("", "pods") => admit_pod_priority(server, resource, object).await,
        ("scheduling.k8s.io", PRIORITY_CLASSES) => {
            admit_priority_class(server, resource, object, false).await
        }
        _ => Ok(()),
    }
}

/// The Priority plugin on an update: a pod keeps its priority, a class the single-default
/// rule.
async fn priority_admit_update(
    server: &ApiServer,
    resource: &ResourceInfo,
    old: &Value,
    new: &mut Value,
) -> Result<(), ApiError> {
    match (resource.group, resource.resource) {
        ("", "pods") => {
            keep_pod_priority(old, new);
            Ok(())
        }
        ("scheduling.k8s.io", PRIORITY_CLASSES) => {
            admit_priority_class(server, resource, new, true).await
        }
        _ => Ok(()),
    }
}

/// The resource the Priority plugin reads classes from.
const PRIORITY_CLASSES: &str = "priorityclasses";

/// A pod's priority when it names no class and no class is the global default
/// (scheduling `DefaultPriorityWhenNoDefaultClassExists`).
pub const DEFAULT_PRIORITY_WHEN_NO_DEFAULT_CLASS_EXISTS: i64 = 0;

/// What a pod's class resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPriority {
    /// The class the pod ends up naming; `None` when it named none and no default exists.
    pub class_name: Option<String>,
    pub value: i64,
    pub preemption_policy: Option<String>,
}

impl ResolvedPriority {
    /// The priority of a class object.
    pub fn of_class(class: &Value) -> ResolvedPriority {
        ResolvedPriority {
            class_name: class
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string),
            value: class.get("value").and_then(Value::as_i64).unwrap_or(0),
            preemption_policy: class
                .get("preemptionPolicy")
                .and_then(Value::as_str)
                .map(str::to_string),
        }
    }

    /// No class: priority 0, preempting lower priorities (the plugin's `getDefaultPriority`).
    pub fn none() -> ResolvedPriority {
        ResolvedPriority {
            class_name: None,
            value: DEFAULT_PRIORITY_WHEN_NO_DEFAULT_CLASS_EXISTS,
            preemption_policy: Some(PREEMPT_LOWER_PRIORITY.to_string()),
        }
    }
}

/// The global default among `classes`: the lowest-valued one marked `globalDefault`, as
/// Kubernetes picks when a race left two defaults behind.
pub fn global_default<'a>(classes: impl IntoIterator<Item = &'a Value>) -> Option<&'a Value> {
    classes
        .into_iter()
        .filter(|c| c.get("globalDefault").and_then(Value::as_bool) == Some(true))
        .min_by_key(|c| c.get("value").and_then(Value::as_i64).unwrap_or(0))
}

/// Writes `resolved` into `pod`'s spec. A pod that already carries a priority or preemption
/// policy must agree with the class: `Err` holds the plugin's message for the 403.
pub fn apply_priority(pod: &mut Value, resolved: &ResolvedPriority) -> Result<(), String> {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        // Validation reports a pod without a spec; nothing to resolve here.
        return Ok(());
    };
    if let Some(given) = spec.get("priority").filter(|v| !v.is_null())
        && given.as_i64() != Some(resolved.value)
    {
        return Err(format!(
            "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {} from the given PriorityClass name",
            resolved.value
        ));
    }
    if let Some(policy) = &resolved.preemption_policy {
        if let Some(given) = spec.get("preemptionPolicy").and_then(Value::as_str)
            && given != policy
        {
            return Err(format!(
                "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
            ));
        }
        spec.insert("preemptionPolicy".into(), Value::from(policy.as_str()));
    }
    spec.insert("priority".into(), Value::from(resolved.value));
    if let Some(name) = &resolved.class_name {
        spec.insert("priorityClassName".into(), Value::from(name.as_str()));
    }
    Ok(())
}

/// The `priorityclasses` watch cache, once it has listed (for at most the cache's own
/// wait; then the 429 or 504 it answers, as a LIST would).
async fn priority_class_cache(
    server: &ApiServer,
) -> Result<&crate::watch_cache::WatchCache, ApiError> {
    let cache = server
        .caches
        .get(PRIORITY_CLASSES)
        .ok_or_else(|| ApiError::internal("the priorityclasses watch cache is not running"))?;
    cache.wait_fresh(0).await?;
    Ok(cache)
}

/// A class by name: from the cache, or on a miss from the store (see the module invariant).
async fn priority_class(server: &ApiServer, name: &str) -> Result<Option<Value>, ApiError> {
    let cache = priority_class_cache(server).await?;
    if let Some(found) = cache.get(None, name) {
        return Ok(Some(found.value().clone()));
    }
    let stored = crate::storage::get(&server.store, cache.resource(), None, name).await?;
    Ok(stored.map(|o| o.value().clone()))
}

/// A 403 about one object, worded as admission's `NewForbidden`.
pub(crate) fn admission_forbidden(
    resource: &ResourceInfo,
    object: &Value,
    reason: &str,
) -> ApiError {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut e = ApiError::forbidden(format!(
        "{} {name:?} is forbidden: {reason}",
        skerry_api::status::qualified(resource.group, resource.resource),
    ));
    e.group = Some(resource.group.to_string());
    e.kind = Some(resource.resource.to_string());
    e.name = Some(name.to_string());
    e
}

/// The plugin's `admitPod` for a create.
async fn admit_pod_priority(
    server: &ApiServer,
    resource: &ResourceInfo,
    pod: &mut Value,
) -> Result<(), ApiError> {
    let class_name = pod
        .pointer("/spec/priorityClassName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let resolved = if class_name.is_empty() {
        let cache = priority_class_cache(server).await?;
        let items = cache.items();
        global_default(items.iter().map(|o| o.value()))
            .map_or_else(ResolvedPriority::none, ResolvedPriority::of_class)
    } else {
        match priority_class(server, &class_name).await? {
            Some(class) => ResolvedPriority::of_class(&class),
            None => {
                return Err(admission_forbidden(
                    resource,
                    pod,
                    &format!("no PriorityClass with name {class_name} was found"),
                ));
            }
        }
    };
    apply_priority(pod, &resolved).map_err(|reason| admission_forbidden(resource, pod, &reason))
}

/// The plugin's `admitPod` for an update: a replacement that leaves the resolved fields out
/// keeps them (validation forbids changing them, not omitting them).
fn keep_pod_priority(old: &Value, new: &mut Value) {
    for field in ["priority", "preemptionPolicy"] {
        let missing = new
            .pointer(&format!("/spec/{field}"))
            .is_none_or(Value::is_null);
        if missing
            && let Some(value) = old.pointer(&format!("/spec/{field}"))
            && let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut)
        {
            spec.insert(field.to_string(), value.clone());
        }
    }
}

/// The plugin's `validatePriorityClass`: at most one global default.
async fn admit_priority_class(
    server: &ApiServer,
    resource: &ResourceInfo,
    class: &Value,
    update: bool,
) -> Result<(), ApiError> {
    if class.get("globalDefault").and_then(Value::as_bool) != Some(true) {
        return Ok(());
    }
    let cache = priority_class_cache(server).await?;
    let items = cache.items();
    let Some(existing) = global_default(items.iter().map(|o| o.value())) else {
        return Ok(());
    };
    let existing_name = existing
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let own_name = class
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    // Re-saving the current default is fine; a second default is not.
    if update && existing_name == own_name {
        return Ok(());
    }
    Err(admission_forbidden(
        resource,
        class,
        &format!(
            "PriorityClass {existing_name} is already marked as default. Only one default can exist"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn class(name: &str, value: i64, global_default: bool) -> Value {
        json!({"metadata": {"name": name}, "value": value, "globalDefault": global_default,
               "preemptionPolicy": "PreemptLowerPriority"})
    }

    #[test]
    fn the_lowest_global_default_wins() {
        let classes = [
            class("a", 10, false),
            class("b", 500, true),
            class("c", 100, true),
        ];
        let found = global_default(&classes).expect("two defaults exist");
        assert_eq!(found["metadata"]["name"], "c");
        assert!(global_default(&classes[..1]).is_none());
    }

    #[test]
    fn a_class_sets_priority_policy_and_name() {
        let mut pod = json!({"spec": {"containers": []}});
        let mut never = class("batch", 7, true);
        never["preemptionPolicy"] = json!("Never");
        apply_priority(&mut pod, &ResolvedPriority::of_class(&never)).expect("no conflict");
        assert_eq!(pod["spec"]["priority"], 7);
        assert_eq!(pod["spec"]["preemptionPolicy"], "Never");
        assert_eq!(pod["spec"]["priorityClassName"], "batch");
    }

    #[test]
    fn no_class_means_zero_and_no_name() {
        let mut pod = json!({"spec": {}});
        apply_priority(&mut pod, &ResolvedPriority::none()).expect("no conflict");
        assert_eq!(
            pod["spec"],
            json!({"priority": 0, "preemptionPolicy": "PreemptLowerPriority"})
        );
    }

    #[test]
    fn a_pod_may_repeat_its_priority_but_not_contradict_it() {
        let high = ResolvedPriority::of_class(&class("high", 1000, false));
        let mut agreeing = json!({"spec": {"priority": 1000, "priorityClassName": "high"}});
        assert_eq!(apply_priority(&mut agreeing, &high), Ok(()));
        let mut disagreeing = json!({"spec": {"priority": 5, "priorityClassName": "high"}});
        assert_eq!(
            apply_priority(&mut disagreeing, &high),
            Err("the integer value of priority (5) must not be provided in pod spec; priority admission controller computed 1000 from the given PriorityClass name".to_string())
        );
        let mut other_policy = json!({"spec": {"preemptionPolicy": "Never"}});
        assert_eq!(
            apply_priority(&mut other_policy, &high),
            Err("the string value of PreemptionPolicy (Never) must not be provided in pod spec; priority admission controller computed PreemptLowerPriority from the given PriorityClass name".to_string())
        );
    }

    #[test]
    fn an_update_keeps_the_resolved_fields() {
        let old = json!({"spec": {"priority": 1000, "preemptionPolicy": "Never"}});
        let mut new = json!({"spec": {"containers": []}});
        keep_pod_priority(&old, &mut new);
        assert_eq!(new["spec"]["priority"], 1000);
        assert_eq!(new["spec"]["preemptionPolicy"], "Never");
        let mut changed = json!({"spec": {"priority": 3}});
        keep_pod_priority(&old, &mut changed);
        assert_eq!(
            changed["spec"]["priority"], 3,
            "validation judges a change, not admission"
        );
    }
}
