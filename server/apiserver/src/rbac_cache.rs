//! RBAC decisions over the watch caches: the four RBAC resources are read from memory, never
//! from the store, and decoded into one [`RbacSnapshot`] that is rebuilt only when one of
//! their caches has moved (its resourceVersion changed), so an authorization costs a few
//! map lookups.

use std::ops::ControlFlow;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;

use crate::auth::rbac::{RbacSnapshot, RbacSource, aggregate_cluster_roles};
use crate::watch_cache::WatchCache;

/// The caches of clusterroles, clusterrolebindings, roles and rolebindings.
pub struct CacheRbac {
    caches: [Arc<WatchCache>; 4],
    /// The snapshot and the cache versions it was built at. A mutex, not a lock-free swap:
    /// rebuilding is rare (RBAC objects change rarely) and the critical section is a clone
    /// of an `Arc`.
    current: Mutex<Option<([i64; 4], Arc<RbacSnapshot>)>>,
    /// The bootstrap policy, decoded and aggregated once, for the moments before the caches
    /// have loaded.
    bootstrap: Arc<RbacSnapshot>,
}

impl CacheRbac {
    pub fn new(
        cluster_roles: Arc<WatchCache>,
        cluster_role_bindings: Arc<WatchCache>,
        roles: Arc<WatchCache>,
        role_bindings: Arc<WatchCache>,
    ) -> Self {
        Self {
            caches: [cluster_roles, cluster_role_bindings, roles, role_bindings],
            current: Mutex::new(None),
            bootstrap: Arc::new(RbacSnapshot::bootstrap()),
        }
    }

    fn snapshot(&self) -> Arc<RbacSnapshot> {
        let versions = self.caches.each_ref().map(|c| c.resource_version());
        if !self.caches.iter().all(|c| c.is_ready()) {
            // Before the caches have loaded, the bootstrap policy decides (it is what the
            // store is seeded with).
            return self.bootstrap.clone();
        }
        let mut current = self.current.lock();
        if let Some((at, snapshot)) = current.as_ref()
            && *at == versions
        {
            return snapshot.clone();
        }
        let mut snapshot = RbacSnapshot::default();
        let mut cluster_roles: Vec<ClusterRole> = decode_all(&self.caches[0]);
        aggregate_cluster_roles(&mut cluster_roles);
        for r in cluster_roles {
            snapshot.insert_cluster_role(r);
        }
        for b in decode_all::<ClusterRoleBinding>(&self.caches[1]) {
            snapshot.insert_cluster_role_binding(b);
        }
        for r in decode_all::<Role>(&self.caches[2]) {
            snapshot.insert_role(r);
        }
        for b in decode_all::<RoleBinding>(&self.caches[3]) {
            snapshot.insert_role_binding(b);
        }
        let snapshot = Arc::new(snapshot);
        *current = Some((versions, snapshot.clone()));
        snapshot
    }
}

fn decode_all<T: DeserializeOwned>(cache: &WatchCache) -> Vec<T> {
    cache
        .items()
        .into_iter()
        .filter_map(|o| match serde_json::from_value::<T>(o.value().clone()) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(object = o.name(), error = %e, "skipping an RBAC object that does not decode");
                None
            }
        })
        .collect()
}

impl RbacSource for CacheRbac {
    fn cluster_role(&self, name: &str) -> Option<Arc<ClusterRole>> {
        self.snapshot().cluster_role(name)
    }

    fn role(&self, namespace: &str, name: &str) -> Option<Arc<Role>> {
        self.snapshot().role(namespace, name)
    }

    fn for_each_cluster_role_binding(
        &self,
        visit: &mut dyn FnMut(&ClusterRoleBinding) -> ControlFlow<()>,
    ) {
        self.snapshot().for_each_cluster_role_binding(visit)
    }

    fn for_each_role_binding(
        &self,
        namespace: &str,
        visit: &mut dyn FnMut(&RoleBinding) -> ControlFlow<()>,
    ) {
        self.snapshot().for_each_role_binding(namespace, visit)
    }
}
