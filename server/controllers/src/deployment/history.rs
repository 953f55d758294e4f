//! Revisions: which ReplicaSet is the Deployment's "new" one, which are old, the revision
//! numbers and the revision history `kubectl rollout history` / `rollout undo` read, and which
//! old ReplicaSets `revisionHistoryLimit` lets the controller delete (Kubernetes'
//! `deploymentutil` revision helpers and `cleanupDeployment`).
//!
//! Invariant: the new ReplicaSet is found by template equality ignoring the hash label, never
//! by name or hash, so a rolled-back template finds the old ReplicaSet that ran it; it then
//! gets revision max(old) + 1 and remembers its earlier revisions in
//! `deployment.kubernetes.io/revision-history`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};

use super::spec::{
    ANNOTATIONS_TO_SKIP, DESIRED_REPLICAS_ANNOTATION, MAX_REPLICAS_ANNOTATION, REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION, by_creation, replicas, rs_template, status_replicas, template,
};
use crate::hash::equal_ignore_hash;

/// The longest `revision-history` annotation kept, in characters; older revisions drop off
/// the front past it (Kubernetes' `maxRevHistoryLengthInChars`: annotations share a 256 KiB
/// budget per object, and a Deployment rolled back and forth forever must not exhaust it).
pub const REVISION_HISTORY_LENGTH_CHARS_MAX: usize = 2000;

/// A ReplicaSet's revision; 0 when missing or unparsable (Kubernetes' `MaxRevision` skips
/// such a ReplicaSet, which counts the same).
pub fn revision(rs: &ReplicaSet) -> i64 {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION_ANNOTATION))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The highest revision among `rss`.
pub fn max_revision<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i64 {
    rss.into_iter().map(revision).max().unwrap_or(0)
}

/// The index of the Deployment's new ReplicaSet in `rss`: the oldest whose template equals the
/// Deployment's, ignoring the hash label (Kubernetes' `FindNewReplicaSet`; oldest because two
/// equal ones can exist after a hash-function change, and the older one has the pods).
pub fn find_new_replica_set(d: &Deployment, rss: &[ReplicaSet]) -> Option<usize> {
    let wanted = template(d);
    let mut candidates: Vec<usize> = (0..rss.len())
        .filter(|&i| equal_ignore_hash(&rs_template(&rss[i]), &wanted))
        .collect();
    candidates.sort_by(|&a, &b| by_creation(&rss[a], &rss[b]));
    candidates.first().copied()
}

/// Copies the Deployment's annotations onto the ReplicaSet, except the bookkeeping ones
/// (Kubernetes' `copyDeploymentAnnotationsToReplicaSet`). Returns whether anything changed.
fn copy_deployment_annotations(d: &Deployment, rs: &mut ReplicaSet) -> bool {
    let mut changed = false;
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if ANNOTATIONS_TO_SKIP.contains(&k.as_str()) || annotations.get(k) == Some(v) {
            continue;
        }
        annotations.insert(k.clone(), v.clone());
        changed = true;
    }
    changed
}

/// Kubernetes' `SetNewReplicaSetAnnotations`: copies the Deployment's annotations, raises the
/// revision to `new_revision` if it is higher — recording the revision it had in
/// `revision-history` when there was one (a rollback to this ReplicaSet) — and, for a
/// ReplicaSet about to be created, sets the replicas annotations. Returns whether anything
/// changed.
pub fn set_new_replica_set_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
    desired: i32,
    max_replicas: i32,
) -> bool {
    let mut changed = copy_deployment_annotations(d, rs);
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let old_text = annotations.get(REVISION_ANNOTATION).cloned();
    let old_revision = match old_text.as_deref() {
        None | Some("") => 0,
        Some(text) => match text.parse::<i64>() {
            Ok(v) => v,
            Err(_) => {
                tracing::warn!(
                    revision = text,
                    "replica set has an unparsable revision; left as is"
                );
                return changed;
            }
        },
    };
    if old_revision < new_revision {
        annotations.insert(REVISION_ANNOTATION.into(), new_revision.to_string());
        changed = true;
        if let Some(old_text) = old_text.filter(|t| !t.is_empty()) {
            let history = annotations
                .get(REVISION_HISTORY_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            match append_revision_history(&history, &old_text) {
                Some(updated) => {
                    annotations.insert(REVISION_HISTORY_ANNOTATION.into(), updated);
                }
                None => tracing::warn!(
                    revision = old_text,
                    "revision history annotation is full; revision not recorded"
                ),
            }
        }
    }
    if !exists && set_replicas_annotations(rs, desired, max_replicas) {
        changed = true;
    }
    changed
}

/// `history` with `revision` appended, dropping the oldest entries while the result would be
/// longer than [`REVISION_HISTORY_LENGTH_CHARS_MAX`]; `None` if even the revision alone is too
/// long.
pub fn append_revision_history(history: &str, revision: &str) -> Option<String> {
    if history.is_empty() {
        return Some(revision.to_string());
    }
    let mut entries: Vec<&str> = history.split(',').collect();
    let mut total = history.len() + revision.len() + 1;
    let mut start = 0;
    while total > REVISION_HISTORY_LENGTH_CHARS_MAX && start < entries.len() {
        total -= entries[start].len() + 1;
        start += 1;
    }
    if total > REVISION_HISTORY_LENGTH_CHARS_MAX {
        return None;
    }
    entries.drain(..start);
    entries.push(revision);
    Some(entries.join(","))
}

/// Whether the replicas annotations differ from (`desired`, `max_replicas`).
pub fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max_replicas: i32) -> bool {
    let Some(annotations) = rs.metadata.annotations.as_ref() else {
        return true;
    };
    annotations.get(DESIRED_REPLICAS_ANNOTATION) != Some(&desired.to_string())
        || annotations.get(MAX_REPLICAS_ANNOTATION) != Some(&max_replicas.to_string())
}

/// Sets the replicas annotations; returns whether they changed.
pub fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max_replicas: i32) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (key, value) in [
        (DESIRED_REPLICAS_ANNOTATION, desired.to_string()),
        (MAX_REPLICAS_ANNOTATION, max_replicas.to_string()),
    ] {
        if annotations.get(key) != Some(&value) {
            annotations.insert(key.into(), value);
            changed = true;
        }
    }
    changed
}

/// The old ReplicaSets `revisionHistoryLimit` lets go (Kubernetes' `cleanupDeployment`): of
/// those not already being deleted, the lowest revisions beyond the limit — but only ones
/// with no pods asked for or present and a status that has caught up with their spec, so a
/// ReplicaSet still draining is never deleted (its pods would be orphaned mid-scale-down).
/// Returns indexes into `old`.
pub fn cleanup_plan(old: &[ReplicaSet], limit: i32) -> Vec<usize> {
    let mut alive: Vec<usize> = (0..old.len())
        .filter(|&i| old[i].metadata.deletion_timestamp.is_none())
        .collect();
    let limit = usize::try_from(limit.max(0)).unwrap_or(0);
    if alive.len() <= limit {
        return Vec::new();
    }
    let excess = alive.len() - limit;
    alive.sort_by(|&a, &b| {
        revision(&old[a])
            .cmp(&revision(&old[b]))
            .then_with(|| by_creation(&old[a], &old[b]))
    });
    alive
        .into_iter()
        .take(excess)
        .filter(|&i| {
            let rs = &old[i];
            let observed = rs.status.as_ref().and_then(|s| s.observed_generation);
            status_replicas(rs) == 0
                && replicas(rs) == 0
                && rs.metadata.generation.unwrap_or(0) <= observed.unwrap_or(0)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use crate::deployment::spec::set_replicas;
    use k8s_openapi::api::apps::v1::{ReplicaSetSpec, ReplicaSetStatus};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn rs_with_revision(name: &str, rev: Option<&str>) -> ReplicaSet {
        let mut rs = ReplicaSet::default();
        rs.metadata.name = Some(name.into());
        if let Some(rev) = rev {
            rs.metadata.annotations =
                Some([(REVISION_ANNOTATION.to_string(), rev.to_string())].into());
        }
        rs
    }

    #[test]
    fn new_revision_is_max_plus_one_and_rollback_keeps_history() {
        let d = Deployment::default();
        let old = [
            rs_with_revision("a", Some("1")),
            rs_with_revision("b", Some("2")),
        ];
        assert_eq!(max_revision(&old), 2);
        // A brand-new ReplicaSet gets revision 3 and the replicas annotations.
        let mut fresh = rs_with_revision("c", None);
        assert!(set_new_replica_set_annotations(
            &d, &mut fresh, 3, false, 3, 4
        ));
        let a = fresh.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[REVISION_ANNOTATION], "3");
        assert!(!a.contains_key(REVISION_HISTORY_ANNOTATION));
        assert_eq!(a[DESIRED_REPLICAS_ANNOTATION], "3");
        assert_eq!(a[MAX_REPLICAS_ANNOTATION], "4");
        // Rolling back to revision 1: it becomes 4 and remembers 1; again later, 6 remembers 1,4.
        let mut back = rs_with_revision("a", Some("1"));
        assert!(set_new_replica_set_annotations(
            &d, &mut back, 4, true, 3, 4
        ));
        let a = back.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[REVISION_ANNOTATION], "4");
        assert_eq!(a[REVISION_HISTORY_ANNOTATION], "1");
        assert!(
            !a.contains_key(DESIRED_REPLICAS_ANNOTATION),
            "existing: not set here"
        );
        assert!(set_new_replica_set_annotations(
            &d, &mut back, 6, true, 3, 4
        ));
        let a = back.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[REVISION_HISTORY_ANNOTATION], "1,4");
        // Already at or above: nothing changes.
        assert!(!set_new_replica_set_annotations(
            &d, &mut back, 6, true, 3, 4
        ));
    }

    #[test]
    fn deployment_annotations_are_copied_except_bookkeeping() {
        let mut d = Deployment::default();
        d.metadata.annotations = Some(
            [
                ("team".to_string(), "web".to_string()),
                (REVISION_ANNOTATION.to_string(), "9".to_string()),
            ]
            .into(),
        );
        let mut rs = rs_with_revision("a", Some("1"));
        set_new_replica_set_annotations(&d, &mut rs, 1, true, 1, 1);
        let a = rs.metadata.annotations.unwrap();
        assert_eq!(a["team"], "web");
        assert_eq!(a[REVISION_ANNOTATION], "1");
    }

    #[test]
    fn revision_history_drops_oldest_past_the_limit() {
        // 500 four-digit revisions: 2,499 characters, over the limit.
        let long: Vec<String> = (1000..1500).map(|i| i.to_string()).collect();
        let history = long.join(",");
        let updated = append_revision_history(&history, "99999").unwrap();
        assert!(updated.len() <= REVISION_HISTORY_LENGTH_CHARS_MAX);
        assert!(updated.ends_with(",1499,99999"));
        assert!(!updated.starts_with("1000,"), "the oldest went first");
        assert_eq!(append_revision_history("", "3").unwrap(), "3");
        assert_eq!(append_revision_history("1,2", "3").unwrap(), "1,2,3");
    }

    fn template(image: &str, hash: Option<&str>) -> PodTemplateSpec {
        let mut labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
        if let Some(h) = hash {
            labels.insert("pod-template-hash".into(), h.into());
        }
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "web".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn new_replica_set_is_found_by_template_not_hash() {
        let mut d = Deployment::default();
        d.spec.get_or_insert_with(Default::default).template = template("v1", None);
        let mut rss = vec![];
        for (name, image, hash) in [("x", "v2", "h2"), ("y", "v1", "h1")] {
            let mut rs = rs_with_revision(name, Some("1"));
            rs.spec = Some(ReplicaSetSpec {
                template: Some(template(image, Some(hash))),
                ..Default::default()
            });
            rss.push(rs);
        }
        assert_eq!(find_new_replica_set(&d, &rss), Some(1));
        d.spec.as_mut().unwrap().template = template("v3", None);
        assert_eq!(find_new_replica_set(&d, &rss), None);
    }

    #[test]
    fn cleanup_deletes_lowest_revisions_with_no_pods_only() {
        let mut old = vec![];
        for (rev, size, pods) in [(1, 0, 0), (2, 0, 1), (3, 0, 0), (4, 2, 2), (5, 0, 0)] {
            let mut rs = rs_with_revision(&format!("r{rev}"), Some(&rev.to_string()));
            set_replicas(&mut rs, size);
            rs.status = Some(ReplicaSetStatus {
                replicas: pods,
                ..Default::default()
            });
            old.push(rs);
        }
        // Limit 2: the three lowest revisions are candidates; r2 still has a pod.
        let plan: Vec<&str> = cleanup_plan(&old, 2)
            .into_iter()
            .map(|i| old[i].metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(plan, ["r1", "r3"]);
        assert!(cleanup_plan(&old, 10).is_empty());
        assert_eq!(cleanup_plan(&old, 0).len(), 3, "r1, r3, r5");
    }
}
