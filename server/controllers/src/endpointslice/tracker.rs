//! The EndpointSlice controller's record of its own writes (Kubernetes'
//! `EndpointSliceTracker`) — the slice controller's form of expectations (`docs/tricks.md`
//! #27).
//!
//! After the controller writes a slice it remembers the version the apiserver returned.
//! Then:
//! - a slice event whose version is not newer than the remembered one is the controller's
//!   own write coming back and wakes nothing ([`EndpointSliceTracker::should_sync`]); a newer
//!   one is someone else's edit and is reconciled back;
//! - a sync whose cache holds an *older* version of a tracked slice, a slice the controller
//!   has deleted, or misses a slice it created, acts on a stale cache: it would re-create or
//!   re-fill what it just wrote. [`EndpointSliceTracker::stale_slices`] says so and the sync
//!   is retried with backoff until the watch catches up.
//!
//! The version is `metadata.generation` when the apiserver counts it for EndpointSlices (as
//! Kubernetes does), else the `resourceVersion` as a number: skerry's resource versions are
//! Raft-ordered integers, so "older" is well defined either way.

use std::collections::HashMap;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use parking_lot::Mutex;

use super::SERVICE_NAME_LABEL;

/// What the tracker remembers of one slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracked {
    /// The version of the controller's last write.
    Version(u64),
    /// The controller deleted it; its DELETE event has not come back yet.
    DeletionExpected,
}

/// The version by which slices are ordered (see the module docs); 0 when unknown.
pub fn slice_version(slice: &EndpointSlice) -> u64 {
    match slice.metadata.generation {
        Some(g) if g > 0 => u64::try_from(g).unwrap_or(0),
        _ => slice
            .metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0),
    }
}

/// The `namespace/name` of the Service a slice belongs to (by its service-name label).
pub fn service_key_of(slice: &EndpointSlice) -> Option<String> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
    Some(format!("{namespace}/{name}"))
}

/// The controller's writes, per Service, per slice UID.
#[derive(Default)]
pub struct EndpointSliceTracker {
    /// Short critical sections (map lookups and inserts), shared by the workers and the slice
    /// event handler; never held across an `.await`.
    by_service: Mutex<HashMap<String, HashMap<String, Tracked>>>,
}

impl EndpointSliceTracker {
    /// An empty tracker.
    pub fn new() -> EndpointSliceTracker {
        EndpointSliceTracker::default()
    }

    /// Remembers a slice the controller just created or updated (the apiserver's answer).
    pub fn update(&self, slice: &EndpointSlice) {
        let (Some(service), Some(uid)) = (service_key_of(slice), slice.metadata.uid.clone()) else {
            return;
        };
        self.by_service
            .lock()
            .entry(service)
            .or_default()
            .insert(uid, Tracked::Version(slice_version(slice)));
    }

    /// Remembers that the controller deleted `slice`.
    pub fn expect_deletion(&self, slice: &EndpointSlice) {
        let (Some(service), Some(uid)) = (service_key_of(slice), slice.metadata.uid.clone()) else {
            return;
        };
        self.by_service
            .lock()
            .entry(service)
            .or_default()
            .insert(uid, Tracked::DeletionExpected);
    }

    /// Whether an add/update event of `slice` should wake its Service: it is not tracked, or
    /// it is newer than the controller's own last write.
    pub fn should_sync(&self, slice: &EndpointSlice) -> bool {
        let Some(service) = service_key_of(slice) else {
            return true;
        };
        let by_service = self.by_service.lock();
        let tracked = by_service
            .get(&service)
            .and_then(|m| slice.metadata.uid.as_ref().and_then(|u| m.get(u)));
        match tracked {
            None => true,
            Some(Tracked::Version(v)) => slice_version(slice) > *v,
            // Something changed a slice we deleted; the delete event will settle it.
            Some(Tracked::DeletionExpected) => false,
        }
    }

    /// Whether the cache's `slices` of `service_key` are older than what the controller knows
    /// it wrote (see the module docs). Slices pending deletion must already be filtered out.
    pub fn stale_slices(&self, service_key: &str, slices: &[&EndpointSlice]) -> bool {
        let by_service = self.by_service.lock();
        let Some(tracked) = by_service.get(service_key) else {
            return false;
        };
        let mut provided = std::collections::HashSet::new();
        for slice in slices {
            let Some(uid) = slice.metadata.uid.as_deref() else {
                continue;
            };
            provided.insert(uid);
            match tracked.get(uid) {
                Some(Tracked::DeletionExpected) => return true,
                Some(Tracked::Version(v)) if *v > slice_version(slice) => return true,
                _ => {}
            }
        }
        tracked
            .iter()
            .any(|(uid, t)| matches!(t, Tracked::Version(_)) && !provided.contains(uid.as_str()))
    }

    /// Forgets a slice whose DELETE event arrived; returns whether the deletion was someone
    /// else's (and so the Service should be synced to replace it).
    pub fn handle_deleted_slice(&self, slice: &EndpointSlice) -> bool {
        let Some(service) = service_key_of(slice) else {
            return true;
        };
        let mut by_service = self.by_service.lock();
        let Some(tracked) = by_service.get_mut(&service) else {
            return true;
        };
        let expected = slice.metadata.uid.as_ref().and_then(|u| tracked.remove(u))
            == Some(Tracked::DeletionExpected);
        if tracked.is_empty() {
            by_service.remove(&service);
        }
        !expected
    }

    /// Forgets a deleted Service.
    pub fn delete_service(&self, service_key: &str) {
        self.by_service.lock().remove(service_key);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn slice(uid: &str, rv: u64) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Vec::new(),
            metadata: ObjectMeta {
                name: Some(format!("web-{uid}")),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.to_string()),
                labels: Some(BTreeMap::from([(SERVICE_NAME_LABEL.into(), "web".into())])),
                ..ObjectMeta::default()
            },
            ports: None,
        }
    }

    #[test]
    fn own_writes_coming_back_wake_nothing_but_foreign_edits_do() {
        let t = EndpointSliceTracker::new();
        assert!(t.should_sync(&slice("a", 5)), "untracked");
        t.update(&slice("a", 7));
        assert!(!t.should_sync(&slice("a", 7)), "our write");
        assert!(!t.should_sync(&slice("a", 6)), "older");
        assert!(t.should_sync(&slice("a", 9)), "someone else's edit");
    }

    #[test]
    fn a_cache_older_than_our_writes_is_stale() {
        let t = EndpointSliceTracker::new();
        t.update(&slice("a", 7));
        assert!(t.stale_slices("ns/web", &[&slice("a", 6)]), "older version");
        assert!(t.stale_slices("ns/web", &[]), "created slice not yet seen");
        assert!(!t.stale_slices("ns/web", &[&slice("a", 7)]));
        assert!(
            !t.stale_slices("ns/web", &[&slice("a", 8)]),
            "newer is fine"
        );
        t.expect_deletion(&slice("a", 7));
        assert!(
            t.stale_slices("ns/web", &[&slice("a", 7)]),
            "deleted slice still cached"
        );
        assert!(!t.stale_slices("ns/web", &[]));
        assert!(!t.stale_slices("ns/other", &[]), "untracked service");
    }

    #[test]
    fn our_deletions_are_expected_and_others_are_not() {
        let t = EndpointSliceTracker::new();
        t.update(&slice("a", 7));
        t.update(&slice("b", 8));
        t.expect_deletion(&slice("a", 7));
        assert!(!t.handle_deleted_slice(&slice("a", 7)));
        assert!(
            t.handle_deleted_slice(&slice("b", 8)),
            "someone deleted our slice"
        );
        assert!(!t.stale_slices("ns/web", &[]), "nothing tracked any more");
    }
}
