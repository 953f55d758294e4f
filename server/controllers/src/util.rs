//! Small facts about pods and owners every controller needs (client-go's `podutil` and
//! `metav1.GetControllerOf`).

use std::sync::{Arc, Weak};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use skerry_client::Object;
use skerry_client::cache::Indexer;
use skerry_client::informer::{Deleted, EventHandler};

/// The owner reference with `controller: true`, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// An owner reference making `owner` the controller of a dependent, with
/// `blockOwnerDeletion` so foreground deletion waits for the dependent.
pub fn controller_ref(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A pod that counts towards its owner's replicas: not finished and not being deleted.
pub fn is_pod_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed")) && pod.metadata.deletion_timestamp.is_none()
}

/// The pod's `Ready` condition, if it has one.
pub fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// Whether the pod's `Ready` condition is `True`.
pub fn is_pod_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// Whether the pod has been ready for at least `min_ready_seconds` at `now`.
pub fn is_pod_available(pod: &Pod, min_ready_seconds: i32, now: Time) -> bool {
    let Some(c) = ready_condition(pod) else {
        return false;
    };
    if c.status != "True" {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    match &c.last_transition_time {
        Some(t) => {
            let ready_for = now.0.duration_since(t.0);
            ready_for.as_secs() >= i64::from(min_ready_seconds)
        }
        None => false,
    }
}

/// The current time as an API `Time`.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The `namespace/name` key of an object from its metadata.
pub fn key(meta: &ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// Splits a `namespace/name` key.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// The objects of `list` whose controller is the owner with `uid`.
pub fn owned_by<'a, K: k8s_openapi::Metadata<Ty = ObjectMeta>>(
    list: &'a [Arc<K>],
    uid: &'a str,
) -> impl Iterator<Item = &'a Arc<K>> + 'a {
    list.iter()
        .filter(move |o| controller_of(o.metadata()).is_some_and(|r| r.uid == uid))
}

/// The cached object a controller reference points at, if it is still that object
/// (Kubernetes' `resolveControllerRef`): the reference's kind and API group must be `K`'s,
/// and the uid must match the cached object of that name — a different uid is a deleted
/// predecessor with the same name.
pub fn resolve_controller_ref<K>(
    store: &Indexer<K>,
    namespace: &str,
    r: &OwnerReference,
) -> Option<Arc<K>>
where
    K: Object + k8s_openapi::Resource,
{
    if r.kind != K::KIND || r.api_version.split('/').next() != Some(K::GROUP) {
        return None;
    }
    let obj = store.get_by(namespace, &r.name)?;
    (obj.metadata().uid.as_deref() == Some(r.uid.as_str())).then_some(obj)
}

/// Forwards an informer's notifications to a controller it holds weakly (the informer
/// outlives the controller): each notification calls one of three plain functions on the
/// controller, if it is still alive. Tombstones are handed over as their last known state.
pub struct Forward<C, K> {
    controller: Weak<C>,
    add: fn(&C, &Arc<K>),
    update: fn(&C, &Arc<K>, &Arc<K>),
    delete: fn(&C, &Arc<K>),
}

impl<C, K> Forward<C, K> {
    /// A handler calling `add`, `update` and `delete` on `controller`.
    pub fn new(
        controller: &Arc<C>,
        add: fn(&C, &Arc<K>),
        update: fn(&C, &Arc<K>, &Arc<K>),
        delete: fn(&C, &Arc<K>),
    ) -> Forward<C, K> {
        Forward {
            controller: Arc::downgrade(controller),
            add,
            update,
            delete,
        }
    }
}

impl<C: Send + Sync + 'static, K: Object> EventHandler<K> for Forward<C, K> {
    fn on_add(&self, obj: &Arc<K>, _is_initial_list: bool) {
        if let Some(c) = self.controller.upgrade() {
            (self.add)(&c, obj);
        }
    }
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        if let Some(c) = self.controller.upgrade() {
            (self.update)(&c, old, new);
        }
    }
    fn on_delete(&self, obj: &Deleted<K>) {
        if let Some(c) = self.controller.upgrade() {
            (self.delete)(&c, obj.object());
        }
    }
}
