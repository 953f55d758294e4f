//! Claiming ReplicaSets (Kubernetes' `ControllerRefManager.ClaimReplicaSets`): a Deployment
//! acts only on the ReplicaSets whose controller reference is its own, adopts orphans its
//! selector matches, and releases ones it owns that no longer match.
//!
//! Adoption is a write on another object decided from a cache, so before the first adoption
//! of a sync the Deployment is re-read live: if it was deleted (or deleted and recreated with
//! a new uid) since the cache saw it, adopting would hand the orphan to a ghost. Adoption and
//! release are PUTs with the cached resourceVersion, so a concurrent change to the ReplicaSet
//! makes them fail with 409 and the sync is retried, instead of overwriting someone else's
//! owner references.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::spec::{checked_selector, name, selector, selects, uid};
use super::sync::{Run, SyncError, Writes};
use crate::util::{controller_of, controller_ref};

/// What a Deployment does with one ReplicaSet of its namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Its controller is this Deployment and the selector matches.
    Owned,
    /// An orphan the selector matches: take it.
    Adopt,
    /// Controlled by this Deployment but no longer matching: let it go.
    Release,
    /// Someone else's, or nothing to do with us.
    Ignore,
}

/// Kubernetes' `ClaimObject` decision for `rs`.
pub fn claim_decision(d: &Deployment, sel: &LabelSelector, rs: &ReplicaSet) -> Claim {
    if rs.metadata.namespace != d.metadata.namespace {
        return Claim::Ignore;
    }
    let deleting = d.metadata.deletion_timestamp.is_some();
    match controller_of(&rs.metadata) {
        Some(owner) if owner.uid != uid(&d.metadata) => Claim::Ignore,
        Some(_) if selects(sel, &rs.metadata) => Claim::Owned,
        Some(_) if deleting => Claim::Ignore,
        Some(_) => Claim::Release,
        None if deleting || rs.metadata.deletion_timestamp.is_some() => Claim::Ignore,
        None if selects(sel, &rs.metadata) => Claim::Adopt,
        None => Claim::Ignore,
    }
}

impl<W: Writes> Run<'_, W> {
    /// The ReplicaSets of `in_namespace` this Deployment controls, after adopting and
    /// releasing. The first failed adoption or release fails the sync (after the others were
    /// tried), as in Kubernetes.
    pub(super) async fn claim(
        &mut self,
        in_namespace: Vec<ReplicaSet>,
    ) -> Result<Vec<ReplicaSet>, SyncError> {
        checked_selector(&self.d).map_err(SyncError::InvalidSelector)?;
        let sel = selector(&self.d).cloned().unwrap_or_default();
        let mut claimed = Vec::new();
        let mut first_error: Option<SyncError> = None;
        let mut may_adopt: Option<bool> = None;
        for rs in in_namespace {
            match claim_decision(&self.d, &sel, &rs) {
                Claim::Owned => claimed.push(rs),
                Claim::Ignore => {}
                Claim::Release => match self.release(&rs).await {
                    Ok(()) => {}
                    Err(SyncError::Api(e)) if e.is_not_found() => {}
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                },
                Claim::Adopt => {
                    if may_adopt.is_none() {
                        let recheck = self.recheck_for_adoption().await;
                        may_adopt = Some(recheck.is_ok());
                        if let Err(e) = recheck {
                            first_error.get_or_insert(e);
                        }
                    }
                    if may_adopt != Some(true) {
                        continue;
                    }
                    match self.adopt(&rs).await {
                        Ok(adopted) => claimed.push(adopted),
                        Err(SyncError::Api(e)) if e.is_not_found() => {}
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(claimed),
        }
    }

    /// Kubernetes' `RecheckDeletionTimestamp`: the Deployment, read live, is still the one we
    /// hold and is not being deleted.
    async fn recheck_for_adoption(&self) -> Result<(), SyncError> {
        let key = crate::util::key(&self.d.metadata);
        let namespace = self.d.metadata.namespace.as_deref().unwrap_or_default();
        let fresh = self
            .w
            .get_deployment(namespace, name(&self.d.metadata))
            .await?
            .ok_or_else(|| SyncError::CannotAdopt(key.clone(), "it is gone"))?;
        if uid(&fresh.metadata) != uid(&self.d.metadata) {
            return Err(SyncError::CannotAdopt(key, "it was replaced (uid changed)"));
        }
        if fresh.metadata.deletion_timestamp.is_some() {
            return Err(SyncError::CannotAdopt(key, "it is being deleted"));
        }
        Ok(())
    }

    async fn adopt(&self, rs: &ReplicaSet) -> Result<ReplicaSet, SyncError> {
        let mut copy = rs.clone();
        copy.metadata
            .owner_references
            .get_or_insert_with(Vec::new)
            .push(controller_ref("apps/v1", "Deployment", &self.d.metadata));
        let adopted = self.w.update_replica_set(&copy).await?;
        tracing::info!(deployment = %crate::util::key(&self.d.metadata), replica_set = %name(&rs.metadata), "adopted orphan replica set");
        Ok(adopted)
    }

    async fn release(&self, rs: &ReplicaSet) -> Result<(), SyncError> {
        let mut copy = rs.clone();
        let ours = uid(&self.d.metadata).to_string();
        if let Some(refs) = copy.metadata.owner_references.as_mut() {
            refs.retain(|r| r.uid != ours);
            if refs.is_empty() {
                copy.metadata.owner_references = None;
            }
        }
        self.w.update_replica_set(&copy).await?;
        tracing::info!(deployment = %crate::util::key(&self.d.metadata), replica_set = %name(&rs.metadata), "released replica set that no longer matches");
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn d() -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("d-uid".into()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                selector: LabelSelector {
                    match_labels: Some([("app".to_string(), "web".to_string())].into()),
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn rs(app: &str, owner: Option<&str>) -> ReplicaSet {
        let mut rs = ReplicaSet::default();
        rs.metadata.namespace = Some("ns".into());
        rs.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        if let Some(owner) = owner {
            let mut owner_meta = d().metadata;
            owner_meta.uid = Some(owner.into());
            rs.metadata.owner_references =
                Some(vec![controller_ref("apps/v1", "Deployment", &owner_meta)]);
        }
        rs
    }

    #[test]
    fn claims_follow_controller_ref_and_selector() {
        let d = d();
        let sel = selector(&d).cloned().unwrap();
        assert_eq!(
            claim_decision(&d, &sel, &rs("web", Some("d-uid"))),
            Claim::Owned
        );
        assert_eq!(
            claim_decision(&d, &sel, &rs("api", Some("d-uid"))),
            Claim::Release
        );
        assert_eq!(
            claim_decision(&d, &sel, &rs("web", Some("other"))),
            Claim::Ignore
        );
        assert_eq!(claim_decision(&d, &sel, &rs("web", None)), Claim::Adopt);
        assert_eq!(claim_decision(&d, &sel, &rs("api", None)), Claim::Ignore);
        let mut elsewhere = rs("web", None);
        elsewhere.metadata.namespace = Some("other".into());
        assert_eq!(claim_decision(&d, &sel, &elsewhere), Claim::Ignore);
        // A deleting Deployment neither adopts nor releases.
        let mut deleting = d.clone();
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            claim_decision(&deleting, &sel, &rs("web", None)),
            Claim::Ignore
        );
        assert_eq!(
            claim_decision(&deleting, &sel, &rs("api", Some("d-uid"))),
            Claim::Ignore
        );
    }
}
