//! The rolling-update arithmetic (Kubernetes' `deployment/rolling.go` and the fencepost and
//! proportion helpers of `deployment/util`), as pure functions over ReplicaSets: how far the
//! new ReplicaSet may grow, how far the old ones may shrink, and how a Deployment scaled in
//! the middle of a rollout spreads the difference over its ReplicaSets. The loop that applies
//! these decisions lives in `sync.rs`.
//!
//! Invariants the arithmetic keeps (checked by the tests and by the simulation in
//! `tests/deployment.rs`): during a rollout the ReplicaSets together never ask for more than
//! `replicas + maxSurge` pods, and old pods are only taken away while at least
//! `replicas - maxUnavailable` pods stay available.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::sync::{Run, Sets, SyncError, Writes};

use super::progress::deployment_complete;
use super::spec::{
    MAX_REPLICAS_ANNOTATION, available_replicas, by_creation, by_size_newer, by_size_older,
    desired_replicas, int_annotation, is_active, is_recreate, is_rolling_update, replicas,
    rolling_parameters, sum_replicas,
};

/// maxSurge or maxUnavailable that is neither an integer nor `N%`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for IntOrString: {0:?} is not an integer or a percentage")]
pub struct InvalidIntOrPercent(pub String);

/// apimachinery `intstr.GetScaledValueFromIntOrPercent`: an integer as is, `N%` as N % of
/// `total`, rounded up or down.
pub fn scaled_value(
    value: &IntOrString,
    total: i32,
    round_up: bool,
) -> Result<i32, InvalidIntOrPercent> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| InvalidIntOrPercent(s.clone()))?;
            let scaled = percent * i64::from(total);
            let v = if round_up {
                scaled.div_euclid(100) + i64::from(scaled.rem_euclid(100) != 0)
            } else {
                scaled.div_euclid(100)
            };
            i32::try_from(v).map_err(|_| InvalidIntOrPercent(s.clone()))
        }
    }
}

/// Kubernetes' `ResolveFenceposts`: (maxSurge, maxUnavailable) for `desired` replicas. Surge
/// rounds up and unavailability rounds down, so percentages err on the side of availability.
/// If both come out zero (e.g. 25 % of 3 rounds unavailability down to 0 and surge is 0),
/// unavailability becomes 1: validation forbids both being zero explicitly, so a zero here is
/// a rounding artefact, and a rollout that may neither add nor remove a pod never progresses.
pub fn resolve_fenceposts(
    max_surge: &IntOrString,
    max_unavailable: &IntOrString,
    desired: i32,
) -> Result<(i32, i32), InvalidIntOrPercent> {
    let surge = scaled_value(max_surge, desired, true)?;
    let mut unavailable = scaled_value(max_unavailable, desired, false)?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok((surge, unavailable))
}

/// The Deployment's maxSurge in pods; 0 for Recreate or an invalid value (Kubernetes'
/// `MaxSurge`, which ignores the error: validation keeps invalid values out).
pub fn max_surge(d: &Deployment) -> i32 {
    if !is_rolling_update(d) {
        return 0;
    }
    let (surge, unavailable) = rolling_parameters(d);
    resolve_fenceposts(&surge, &unavailable, desired_replicas(d))
        .map(|(s, _)| s)
        .unwrap_or(0)
}

/// The Deployment's maxUnavailable in pods, never more than its replicas; 0 for Recreate, for
/// zero replicas or an invalid value (Kubernetes' `MaxUnavailable`).
pub fn max_unavailable(d: &Deployment) -> i32 {
    let desired = desired_replicas(d);
    if !is_rolling_update(d) || desired == 0 {
        return 0;
    }
    let (surge, unavailable) = rolling_parameters(d);
    let (_, unavailable) = resolve_fenceposts(&surge, &unavailable, desired).unwrap_or((0, 0));
    unavailable.min(desired)
}

/// The size the new ReplicaSet may grow to now (Kubernetes' `NewRSNewReplicas`): for a
/// rolling update, as far as `replicas + maxSurge` pods in total allow but never past
/// `replicas`; for Recreate, `replicas` at once (the old pods are gone by then).
pub fn new_rs_new_replicas(
    d: &Deployment,
    all: &[&ReplicaSet],
    new_rs: &ReplicaSet,
) -> Result<i32, InvalidIntOrPercent> {
    let desired = desired_replicas(d);
    if is_recreate(d) {
        return Ok(desired);
    }
    let (surge, unavailable) = rolling_parameters(d);
    let (surge, _) = resolve_fenceposts(&surge, &unavailable, desired)?;
    let current = sum_replicas(all.iter().copied());
    let max_total = desired + surge;
    if current >= max_total {
        // Cannot scale up.
        return Ok(replicas(new_rs));
    }
    let scale_up = (max_total - current).min(desired - replicas(new_rs));
    Ok(replicas(new_rs) + scale_up)
}

/// How many pods `rs` should gain (or lose) for the Deployment's new size, in proportion to
/// its share of the size the Deployment had when it last scaled `rs` (the `max-replicas`
/// annotation, else the Deployment's `status.replicas`) — Kubernetes'
/// `getReplicaSetFraction`. A zero denominator yields 0: the leftover pass gives the
/// difference to the largest ReplicaSet instead of dividing by zero.
pub fn replica_set_fraction(rs: &ReplicaSet, d: &Deployment, status_replicas: i32) -> i32 {
    let desired = desired_replicas(d);
    if desired == 0 {
        return -replicas(rs);
    }
    let deployment_replicas = desired + max_surge(d);
    let annotated = int_annotation(rs, MAX_REPLICAS_ANNOTATION).unwrap_or(status_replicas);
    if annotated <= 0 {
        return 0;
    }
    let size = f64::from(replicas(rs)) * f64::from(deployment_replicas) / f64::from(annotated);
    // Go's math.Round and f64::round both round half away from zero.
    size.round() as i32 - replicas(rs)
}

/// Kubernetes' `GetProportion`: `rs`'s fraction, capped by what is still left to add (or to
/// remove) after the ReplicaSets before it.
pub fn proportion(
    rs: &ReplicaSet,
    d: &Deployment,
    status_replicas: i32,
    to_add: i32,
    added: i32,
) -> i32 {
    if replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = replica_set_fraction(rs, d, status_replicas);
    let allowed = to_add - added;
    if to_add > 0 {
        fraction.min(allowed)
    } else {
        fraction.max(allowed)
    }
}

/// Proportional scaling of a rolling Deployment whose replicas changed mid-rollout (the
/// RollingUpdate branch of Kubernetes' `scale`). `active` are the ReplicaSets with replicas
/// above 0; returns them in the order they should be scaled, each with its new size. The
/// ReplicaSets together get `replicas + maxSurge` (0 for a Deployment scaled to 0), each in
/// proportion to its current size, and the rounding leftover goes to the first: the largest,
/// the newest on ties when growing and the oldest when shrinking.
pub fn proportional_sizes<'a>(
    d: &Deployment,
    status_replicas: i32,
    active: &[&'a ReplicaSet],
) -> Vec<(&'a ReplicaSet, i32)> {
    let desired = desired_replicas(d);
    let current = sum_replicas(active.iter().copied());
    let allowed = if desired > 0 {
        desired + max_surge(d)
    } else {
        0
    };
    let to_add = allowed - current;
    let mut sorted: Vec<&ReplicaSet> = active.to_vec();
    if to_add > 0 {
        sorted.sort_by(|a, b| by_size_newer(a, b));
    } else if to_add < 0 {
        sorted.sort_by(|a, b| by_size_older(a, b));
    }
    let mut added = 0;
    let mut sizes: Vec<(&ReplicaSet, i32)> = Vec::with_capacity(sorted.len());
    for rs in sorted {
        if to_add != 0 {
            let p = proportion(rs, d, status_replicas, to_add, added);
            sizes.push((rs, replicas(rs) + p));
            added += p;
        } else {
            sizes.push((rs, replicas(rs)));
        }
    }
    if to_add != 0
        && let Some(first) = sizes.first_mut()
    {
        first.1 = (first.1 + to_add - added).max(0);
    }
    sizes
}

/// How many old pods a rolling update may remove now (the first half of Kubernetes'
/// `reconcileOldReplicaSets`): everything above `replicas - maxUnavailable`, less the new
/// ReplicaSet's pods that are not available yet (they may never become so; removing old
/// pods on their account could take availability below the floor).
pub fn max_scaled_down(d: &Deployment, all: &[&ReplicaSet], new_rs: &ReplicaSet) -> i32 {
    let all_pods = sum_replicas(all.iter().copied());
    let min_available = desired_replicas(d) - max_unavailable(d);
    let new_unavailable = replicas(new_rs) - available_replicas(new_rs);
    all_pods - min_available - new_unavailable
}

/// Kubernetes' `cleanupUnhealthyReplicas`: `old` sorted oldest first; takes away each old
/// ReplicaSet's unavailable pods first (they serve nothing, so removing them costs no
/// availability), at most `max_cleanup` in all. Returns (index in `old`, new size).
pub fn cleanup_unhealthy_plan(old: &[&ReplicaSet], max_cleanup: i32) -> Vec<(usize, i32)> {
    let mut plan = Vec::new();
    let mut total = 0;
    for (i, rs) in old.iter().enumerate() {
        if total >= max_cleanup {
            break;
        }
        let size = replicas(rs);
        let available = available_replicas(rs);
        if size == 0 || size == available {
            continue;
        }
        let count = (max_cleanup - total).min(size - available).max(0);
        if count == 0 {
            continue;
        }
        plan.push((i, size - count));
        total += count;
    }
    plan
}

/// Kubernetes' `scaleDownOldReplicaSetsForRollingUpdate`: `old` sorted oldest first; removes
/// available old pods down to `replicas - maxUnavailable` available in all. Returns (index in
/// `old`, new size).
pub fn scale_down_old_plan(
    d: &Deployment,
    all: &[&ReplicaSet],
    old: &[&ReplicaSet],
) -> Vec<(usize, i32)> {
    let min_available = desired_replicas(d) - max_unavailable(d);
    let available: i32 = all.iter().map(|rs| available_replicas(rs)).sum();
    if available <= min_available {
        return Vec::new();
    }
    let total_to_remove = available - min_available;
    let mut plan = Vec::new();
    let mut removed = 0;
    for (i, rs) in old.iter().enumerate() {
        if removed >= total_to_remove {
            break;
        }
        let size = replicas(rs);
        if size == 0 {
            continue;
        }
        let count = size.min(total_to_remove - removed);
        plan.push((i, size - count));
        removed += count;
    }
    plan
}

impl<W: Writes> Run<'_, W> {
    /// A rolling update (Kubernetes' `rolloutRolling`): create the new ReplicaSet if needed,
    /// grow it within maxSurge, else shrink the old ones within maxUnavailable; once complete,
    /// clean up old revisions.
    pub(super) async fn rollout_rolling(&mut self) -> Result<(), SyncError> {
        let sets = self.get_all_and_sync_revision(true).await?;
        let Some(new) = sets.new else {
            return self.sync_rollout_status(&sets).await;
        };
        if self.reconcile_new_replica_set(&sets, new).await? {
            return self.sync_rollout_status(&sets).await;
        }
        if self.reconcile_old_replica_sets(&sets, new).await? {
            return self.sync_rollout_status(&sets).await;
        }
        let status = self.d.status.clone().unwrap_or_default();
        if deployment_complete(&self.d, &status) {
            self.cleanup(&sets.old).await?;
        }
        self.sync_rollout_status(&sets).await
    }

    /// Kubernetes' `reconcileNewReplicaSet`: returns whether the new ReplicaSet was scaled.
    async fn reconcile_new_replica_set(
        &mut self,
        sets: &Sets,
        new: usize,
    ) -> Result<bool, SyncError> {
        let desired = desired_replicas(&self.d);
        let size = replicas(&self.rss[new]);
        if size == desired {
            return Ok(false);
        }
        if size > desired {
            return self.scale_replica_set(new, desired).await;
        }
        let target = new_rs_new_replicas(&self.d, &self.refs(&sets.all()), &self.rss[new])?;
        self.scale_replica_set(new, target).await
    }

    /// Kubernetes' `reconcileOldReplicaSets`: within the budget of [`max_scaled_down`], first
    /// the old ReplicaSets' unavailable pods, then available ones down to the availability
    /// floor. Returns whether any old ReplicaSet was scaled down.
    async fn reconcile_old_replica_sets(
        &mut self,
        sets: &Sets,
        new: usize,
    ) -> Result<bool, SyncError> {
        let mut old: Vec<usize> = sets
            .old
            .iter()
            .copied()
            .filter(|&i| is_active(&self.rss[i]))
            .collect();
        if sum_replicas(self.refs(&old)) == 0 {
            return Ok(false);
        }
        let budget = max_scaled_down(&self.d, &self.refs(&sets.all()), &self.rss[new]);
        if budget <= 0 {
            return Ok(false);
        }
        old.sort_by(|&a, &b| by_creation(&self.rss[a], &self.rss[b]));
        let mut removed = 0;
        for (j, size) in cleanup_unhealthy_plan(&self.refs(&old), budget) {
            removed += replicas(&self.rss[old[j]]) - size;
            self.scale_replica_set(old[j], size).await?;
        }
        for (j, size) in scale_down_old_plan(&self.d, &self.refs(&sets.all()), &self.refs(&old)) {
            removed += replicas(&self.rss[old[j]]) - size;
            self.scale_replica_set(old[j], size).await?;
        }
        Ok(removed > 0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use crate::deployment::spec::set_replicas;
    use k8s_openapi::api::apps::v1::{
        DeploymentSpec, DeploymentStrategy, ReplicaSetStatus, RollingUpdateDeployment,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    fn deployment(replicas: i32, surge: IntOrString, unavailable: IntOrString) -> Deployment {
        Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(surge),
                        max_unavailable: Some(unavailable),
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn rs(name: &str, age_s: i64, size: i32, available: i32) -> ReplicaSet {
        let mut rs = ReplicaSet::default();
        rs.metadata.name = Some(name.into());
        rs.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 - age_s).unwrap(),
        ));
        set_replicas(&mut rs, size);
        rs.status = Some(ReplicaSetStatus {
            replicas: size,
            available_replicas: Some(available),
            ..Default::default()
        });
        rs
    }

    fn with_max(mut rs: ReplicaSet, max: i32) -> ReplicaSet {
        rs.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(MAX_REPLICAS_ANNOTATION.into(), max.to_string());
        rs
    }

    // Reference: apimachinery intstr GetScaledValueFromIntOrPercent.
    #[test]
    fn percentages_round_as_asked() {
        assert_eq!(scaled_value(&pct("25%"), 10, true), Ok(3));
        assert_eq!(scaled_value(&pct("25%"), 10, false), Ok(2));
        assert_eq!(scaled_value(&pct("100%"), 7, false), Ok(7));
        assert_eq!(scaled_value(&IntOrString::Int(4), 10, true), Ok(4));
        assert!(scaled_value(&pct("25"), 10, true).is_err());
        assert!(scaled_value(&pct("x%"), 10, true).is_err());
    }

    #[test]
    fn fenceposts_surge_up_unavailable_down_and_never_both_zero() {
        // 25 % of 10: surge 2.5 -> 3, unavailable 2.5 -> 2.
        assert_eq!(resolve_fenceposts(&pct("25%"), &pct("25%"), 10), Ok((3, 2)));
        // 25 % of 1: surge 1, unavailable 0.
        assert_eq!(resolve_fenceposts(&pct("25%"), &pct("25%"), 1), Ok((1, 0)));
        // surge 0 and 25 % of 3 rounding to 0: unavailable becomes 1 so the rollout moves.
        assert_eq!(
            resolve_fenceposts(&IntOrString::Int(0), &pct("25%"), 3),
            Ok((0, 1))
        );
        assert_eq!(
            resolve_fenceposts(&IntOrString::Int(0), &IntOrString::Int(0), 5),
            Ok((0, 1))
        );
    }

    #[test]
    fn max_unavailable_is_capped_by_replicas_and_zero_for_recreate() {
        let d = deployment(2, IntOrString::Int(1), IntOrString::Int(5));
        assert_eq!(max_unavailable(&d), 2);
        assert_eq!(max_surge(&d), 1);
        let mut recreate = d.clone();
        recreate.spec.as_mut().unwrap().strategy = Some(DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        });
        assert_eq!(max_unavailable(&recreate), 0);
        assert_eq!(max_surge(&recreate), 0);
        assert_eq!(max_unavailable(&deployment(0, pct("25%"), pct("25%"))), 0);
    }

    #[test]
    fn new_replica_set_grows_within_max_surge() {
        // 10 replicas, surge 3: old at 10, new at 0 -> new may have 3.
        let d = deployment(10, pct("25%"), pct("25%"));
        let old = rs("old", 100, 10, 10);
        let new = rs("new", 0, 0, 0);
        assert_eq!(new_rs_new_replicas(&d, &[&old, &new], &new), Ok(3));
        // Old already down to 8 and new at 3 (11 total): may grow by 2 to 5.
        let old = rs("old", 100, 8, 8);
        let new = rs("new", 0, 3, 0);
        assert_eq!(new_rs_new_replicas(&d, &[&old, &new], &new), Ok(5));
        // At the surge limit: no growth.
        let old = rs("old", 100, 10, 10);
        let new = rs("new", 0, 3, 0);
        assert_eq!(new_rs_new_replicas(&d, &[&old, &new], &new), Ok(3));
        // Never beyond replicas, however much room there is.
        let new = rs("new", 0, 9, 9);
        assert_eq!(new_rs_new_replicas(&d, &[&new], &new), Ok(10));
    }

    #[test]
    fn old_replica_sets_shrink_within_max_unavailable() {
        // 10 replicas, unavailable 2: old 10 available, new 3 not yet available.
        let d = deployment(10, pct("25%"), pct("25%"));
        let old = rs("old", 100, 10, 10);
        let new = rs("new", 0, 3, 0);
        // 13 pods - min available 8 - 3 unavailable new = 2 may go.
        assert_eq!(max_scaled_down(&d, &[&old, &new], &new), 2);
        // Available 10 > 8: two old pods go.
        assert_eq!(
            scale_down_old_plan(&d, &[&old, &new], &[&old]),
            vec![(0, 8)]
        );
        // Once available is at the floor, nothing more goes.
        let old = rs("old", 100, 8, 8);
        assert_eq!(scale_down_old_plan(&d, &[&old, &new], &[&old]), vec![]);
    }

    #[test]
    fn unhealthy_old_pods_are_removed_first_oldest_first() {
        let oldest = rs("a", 300, 3, 1);
        let older = rs("b", 200, 4, 4);
        let old = rs("c", 100, 5, 2);
        // Budget 4: a loses its 2 unavailable, b is healthy, c loses 2 of its 3.
        assert_eq!(
            cleanup_unhealthy_plan(&[&oldest, &older, &old], 4),
            vec![(0, 1), (2, 3)]
        );
        assert_eq!(cleanup_unhealthy_plan(&[&oldest, &older, &old], 0), vec![]);
    }

    #[test]
    fn proportional_scaling_spreads_a_scale_up_mid_rollout() {
        // A rollout of 10 (surge 3) was scaled to 20 (surge 5): old 8 + new 5 = 13 of an
        // allowed 25. Each grows by its share of 25/13.
        let d = deployment(20, pct("25%"), pct("25%"));
        let old = with_max(rs("old", 100, 8, 8), 13);
        let new = with_max(rs("new", 0, 5, 0), 13);
        let sizes = proportional_sizes(&d, 13, &[&old, &new]);
        let total: i32 = sizes.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 25, "{sizes:?}");
        let size_of = |name: &str| {
            sizes
                .iter()
                .find(|(rs, _)| rs.metadata.name.as_deref() == Some(name))
                .unwrap()
                .1
        };
        // old: 8 * 25 / 13 = 15.38 -> 15; new: 5 * 25 / 13 = 9.6 -> 10.
        assert_eq!(size_of("old"), 15);
        assert_eq!(size_of("new"), 10);
    }

    #[test]
    fn proportional_scaling_shrinks_the_largest_and_oldest_first() {
        let d = deployment(5, IntOrString::Int(1), IntOrString::Int(0));
        let a = with_max(rs("a", 200, 4, 4), 11);
        let b = with_max(rs("b", 100, 4, 4), 11);
        let c = with_max(rs("c", 50, 2, 2), 11);
        let sizes = proportional_sizes(&d, 10, &[&c, &b, &a]);
        // Largest first, older first on ties.
        let order: Vec<&str> = sizes
            .iter()
            .map(|(rs, _)| rs.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(order, ["a", "b", "c"]);
        let total: i32 = sizes.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 6, "replicas 5 + surge 1: {sizes:?}");
        assert!(sizes.iter().all(|(_, n)| *n >= 0));
    }

    #[test]
    fn scaling_to_zero_empties_every_replica_set() {
        let d = deployment(0, pct("25%"), pct("25%"));
        let a = rs("a", 200, 4, 4);
        let b = rs("b", 100, 3, 0);
        let sizes = proportional_sizes(&d, 7, &[&a, &b]);
        assert!(sizes.iter().all(|(_, n)| *n == 0), "{sizes:?}");
    }
}
