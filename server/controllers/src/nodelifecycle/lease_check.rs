//! `docs/tricks.md` #30 (the node lifecycle controller re-reading the lease live): is the
//! informer's copy of a node's Lease behind the apiserver's?
//!
//! The controller decides from its caches. If the Lease informer stalls — a watch that hangs
//! without erroring, a relist stuck behind a slow apiserver — every Lease in the cache
//! stops renewing at once, and after the grace period every node looks dead: the controller
//! would mark them all `Unknown`, taint them and evict every pod in the cluster, for a
//! problem that is entirely on its own side. So before a pass acts, it reads the Lease of
//! each node it is about to act on *live* from the apiserver and compares it with the
//! cached copy. A live Lease that is newer proves the cache is stale, and the whole pass is
//! abandoned: nothing is written, and the next pass (one `node_monitor_period` later) tries
//! again, by which time the cache has usually caught up.
//!
//! Invariant: a Lease read live is only ever compared with the cached copy of *the same*
//! Lease (renewTime with renewTime, resourceVersion with resourceVersion) — never with the
//! controller's clock.

use k8s_openapi::api::coordination::v1::Lease;

use super::health::lease_renew_time;

/// Why the cached Lease is stale compared with the live one, or `None` when the cache is
/// as new as the apiserver (or newer: a live read can race a later watch event).
pub fn stale_reason(cached: Option<&Lease>, live: Option<&Lease>) -> Option<String> {
    match (cached, live) {
        (None, None) => None,
        (None, Some(l)) => Some(format!(
            "the apiserver has a lease (resourceVersion {}) the cache has never seen",
            resource_version(l)
        )),
        (Some(c), None) => Some(format!(
            "the cache holds a lease (resourceVersion {}) the apiserver has deleted",
            resource_version(c)
        )),
        (Some(c), Some(l)) => {
            let (cached_renew, live_renew) = (lease_renew_time(c), lease_renew_time(l));
            if live_renew > cached_renew {
                return Some(format!(
                    "the live lease was renewed at {} but the cache holds a renewal at {}",
                    show(live_renew),
                    show(cached_renew)
                ));
            }
            let (cached_rv, live_rv) = (resource_version(c), resource_version(l));
            let newer = match (cached_rv.parse::<u64>(), live_rv.parse::<u64>()) {
                (Ok(c), Ok(l)) => l > c,
                // resourceVersions are opaque to clients in general: unequal is all we know.
                _ => cached_rv != live_rv,
            };
            newer.then(|| {
                format!("the live lease is at resourceVersion {live_rv}, the cache at {cached_rv}")
            })
        }
    }
}

fn resource_version(lease: &Lease) -> &str {
    lease
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default()
}

fn show(t: Option<k8s_openapi::jiff::Timestamp>) -> String {
    t.map_or_else(|| "never".to_string(), |t| t.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::jiff::Timestamp;

    fn lease(rv: &str, renew: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::from_second(renew).unwrap())),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_newer_live_lease_means_a_stale_cache() {
        assert_eq!(stale_reason(None, None), None);
        assert_eq!(
            stale_reason(Some(&lease("7", 100)), Some(&lease("7", 100))),
            None
        );
        assert!(stale_reason(Some(&lease("7", 100)), Some(&lease("9", 140))).is_some());
        // Only the resourceVersion moved (say, a label): still a cache that is behind.
        assert!(stale_reason(Some(&lease("7", 100)), Some(&lease("9", 100))).is_some());
        // The cache is ahead of the live read: not stale.
        assert_eq!(
            stale_reason(Some(&lease("9", 140)), Some(&lease("7", 100))),
            None
        );
        assert!(stale_reason(None, Some(&lease("1", 1))).is_some());
        assert!(stale_reason(Some(&lease("1", 1)), None).is_some());
        // Opaque versions: unequal is stale.
        assert!(stale_reason(Some(&lease("a", 1)), Some(&lease("b", 1))).is_some());
    }
}
