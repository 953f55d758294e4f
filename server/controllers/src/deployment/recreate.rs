//! The Recreate strategy (Kubernetes' `deployment/recreate.go`): scale every old ReplicaSet to
//! 0, wait until none of their pods is left running, and only then create (or scale up) the
//! new ReplicaSet — for applications that cannot run two versions at once.
//!
//! Invariant: the new ReplicaSet is not even created while an old pod may still run. "Gone"
//! is judged from the pod cache, and a pod in phase `Unknown` counts as running (its node is
//! unreachable, so it may well be).

use std::collections::HashSet;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;

use super::progress::deployment_complete;
use super::spec::{desired_replicas, is_active, selector, selects, uid};
use super::sync::{Run, SyncError, Writes, sum_status_replicas};
use crate::util::controller_of;

/// Whether any pod of an old ReplicaSet may still be running (Kubernetes' `oldPodsRunning`):
/// an old ReplicaSet still reports pods, or the cache holds a pod of one that has not
/// finished.
pub fn old_pods_running(
    d: &Deployment,
    new_rs: Option<&ReplicaSet>,
    old: &[&ReplicaSet],
    pods: &[Pod],
) -> bool {
    if sum_status_replicas(old) > 0 {
        return true;
    }
    let new_uid = new_rs.map(|rs| uid(&rs.metadata));
    let old_uids: HashSet<&str> = old
        .iter()
        .map(|rs| uid(&rs.metadata))
        .filter(|u| Some(*u) != new_uid && !u.is_empty())
        .collect();
    let Some(sel) = selector(d) else {
        return false;
    };
    pods.iter()
        .filter(|p| selects(sel, &p.metadata))
        .filter(|p| controller_of(&p.metadata).is_some_and(|r| old_uids.contains(r.uid.as_str())))
        .any(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Failed" | "Succeeded"))
        })
}

impl<W: Writes> Run<'_, W> {
    /// Kubernetes' `rolloutRecreate`.
    pub(super) async fn rollout_recreate(&mut self, pods: &[Pod]) -> Result<(), SyncError> {
        // Do not create the new ReplicaSet yet: that would scale up before scaling down.
        let sets = self.get_all_and_sync_revision(false).await?;
        let mut scaled_down = false;
        for &i in &sets.old {
            if is_active(&self.rss[i]) && self.scale_replica_set(i, 0).await? {
                scaled_down = true;
            }
        }
        if scaled_down {
            return self.sync_rollout_status(&sets).await;
        }
        let new_rs = sets.new.map(|i| &self.rss[i]);
        if old_pods_running(&self.d, new_rs, &self.refs(&sets.old), pods) {
            return self.sync_rollout_status(&sets).await;
        }
        let sets = if sets.new.is_none() {
            self.get_all_and_sync_revision(true).await?
        } else {
            sets
        };
        if let Some(new) = sets.new {
            self.scale_replica_set(new, desired_replicas(&self.d))
                .await?;
        }
        let status = self.d.status.clone().unwrap_or_default();
        if deployment_complete(&self.d, &status) {
            self.cleanup(&sets.old).await?;
        }
        self.sync_rollout_status(&sets).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, ReplicaSetStatus};
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};

    fn labelled() -> std::collections::BTreeMap<String, String> {
        [("app".to_string(), "web".to_string())].into()
    }

    fn rs(uid: &str, pods: i32) -> ReplicaSet {
        let mut rs = ReplicaSet::default();
        rs.metadata.uid = Some(uid.into());
        rs.status = Some(ReplicaSetStatus {
            replicas: pods,
            ..Default::default()
        });
        rs
    }

    fn pod(owner: &str, phase: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.labels = Some(labelled());
        p.metadata.owner_references = Some(vec![OwnerReference {
            uid: owner.into(),
            controller: Some(true),
            kind: "ReplicaSet".into(),
            ..Default::default()
        }]);
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn old_pods_count_until_finished() {
        let d = Deployment {
            spec: Some(DeploymentSpec {
                selector: LabelSelector {
                    match_labels: Some(labelled()),
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..Default::default()
        };
        let old = rs("old", 0);
        let new = rs("new", 0);
        assert!(!old_pods_running(&d, Some(&new), &[&old], &[]));
        assert!(
            old_pods_running(&d, Some(&new), &[&rs("old", 1)], &[]),
            "status still counts one"
        );
        assert!(old_pods_running(
            &d,
            Some(&new),
            &[&old],
            &[pod("old", "Running")]
        ));
        assert!(old_pods_running(
            &d,
            Some(&new),
            &[&old],
            &[pod("old", "Unknown")]
        ));
        assert!(!old_pods_running(
            &d,
            Some(&new),
            &[&old],
            &[pod("old", "Succeeded"), pod("old", "Failed")]
        ));
        assert!(
            !old_pods_running(&d, Some(&new), &[&old], &[pod("new", "Running")]),
            "new pods do not count"
        );
    }
}
