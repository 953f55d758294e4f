//! Store leases for objects with a time to live (Events), shared between objects: Kubernetes'
//! lease manager.
//!
//! A lease per Event would mean one lease grant (a Raft round) per Event and a lease table
//! as large as the Event count. Instead an Event joins the lease granted for an earlier one
//! when that lease still outlives the Event's TTL by no more than the reuse window: leases are
//! granted with the TTL plus that window, and reused until their remaining life drops below
//! the TTL. An Event so lives between TTL and TTL + window. A lease also carries at most
//! [`LEASE_OBJECTS_MAX`] objects, so an expiry never deletes an unbounded batch at once.

use std::time::{Duration, Instant};

use skerry_api::ApiError;
use skerry_store::Store;

use crate::storage::store_error;

/// How long an Event lives (kube-apiserver's `--event-ttl` default, 1 h): long enough to
/// explain what happened to a pod in the last hour, short enough that a busy cluster's
/// Events do not fill the store.
pub const EVENT_TTL: Duration = Duration::from_secs(3600);

/// The reuse window as a fraction of the TTL, and its ceiling (Kubernetes'
/// `leaseReuseDurationPercent = 0.05` and `leaseReuseDurationSeconds = 60`): for the 1 h
/// Event TTL, objects created within a minute share a lease and live at most a minute
/// longer than asked.
const LEASE_REUSE_FRACTION: f64 = 0.05;
const LEASE_REUSE_MAX: Duration = Duration::from_secs(60);

/// Objects attached to one lease at most (Kubernetes' `leaseMaxObjectCount` default).
pub const LEASE_OBJECTS_MAX: u64 = 1000;

struct Current {
    id: i64,
    expires: Instant,
    objects: u64,
}

/// Hands out leases for one TTL.
pub struct LeaseManager {
    ttl: Duration,
    /// The lease being reused. A tokio mutex held across the grant: concurrent writers wait
    /// for the one grant instead of each granting a lease of their own.
    current: tokio::sync::Mutex<Option<Current>>,
}

impl LeaseManager {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            current: tokio::sync::Mutex::new(None),
        }
    }

    fn reuse_window(&self) -> Duration {
        self.ttl.mul_f64(LEASE_REUSE_FRACTION).min(LEASE_REUSE_MAX)
    }

    /// A lease that outlives `ttl` from now: the current one while it can be reused,
    /// otherwise a new grant of `ttl` + the reuse window.
    pub async fn lease(&self, store: &Store) -> Result<i64, ApiError> {
        let now = Instant::now();
        let window = self.reuse_window();
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_mut() {
            let outlives_ttl = now + self.ttl < c.expires;
            let within_window = now + self.ttl + window > c.expires;
            if outlives_ttl && within_window && c.objects < LEASE_OBJECTS_MAX {
                c.objects += 1;
                return Ok(c.id);
            }
        }
        let granted_ttl = (self.ttl + window).as_secs() as i64;
        let (id, ttl) = store
            .lease_grant(granted_ttl, 0)
            .await
            .map_err(store_error)?;
        *current = Some(Current {
            id,
            expires: now + Duration::from_secs(ttl.max(0) as u64),
            objects: 1,
        });
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skerry_store::StoreConfig;

    #[tokio::test]
    async fn objects_share_a_lease_until_it_would_not_outlive_their_ttl() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(StoreConfig::new(dir.path())).expect("open");
        let manager = LeaseManager::new(EVENT_TTL);
        let first = manager.lease(&store).await.expect("lease");
        for _ in 1..LEASE_OBJECTS_MAX {
            assert_eq!(manager.lease(&store).await.expect("lease"), first);
        }
        let (_, ttl, _) = store.lease_time_to_live(first, false).expect("granted");
        assert_eq!(ttl, (EVENT_TTL + LEASE_REUSE_MAX).as_secs() as i64);
        // The object cap moves on to a new lease.
        let second = manager.lease(&store).await.expect("lease");
        assert_ne!(second, first);
        // A lease that no longer outlives the TTL is not reused.
        manager
            .current
            .lock()
            .await
            .as_mut()
            .expect("current")
            .expires = Instant::now() + EVENT_TTL;
        let third = manager.lease(&store).await.expect("lease");
        assert_ne!(third, second);
    }
}
