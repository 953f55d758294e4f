//! The Deployment controller's sync against an in-memory cluster: a fake apiserver with
//! resourceVersions, 409 Conflict and AlreadyExists, and a fake ReplicaSet controller + kubelet
//! that turn `spec.replicas` into pods (first unavailable, then available on the next step).
//! Each test drives syncs the way the workqueue would — after every change, retrying on error
//! — and checks what `kubectl` would see: ReplicaSet names, labels, owners, revisions and the
//! Deployment's status — and the Events `kubectl describe deployment` would list.
//!
//! The rolling-update simulation also checks the strategy's two invariants after every step:
//! never more than `replicas + maxSurge` pods asked for, never fewer than
//! `replicas - maxUnavailable` available.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, ReplicaSet, ReplicaSetStatus,
    RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, Status, StatusCause, StatusDetails, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use skerry_client::Error;
use skerry_controllers::deployment::progress::get_condition;
use skerry_controllers::deployment::spec::{
    DESIRED_REPLICAS_ANNOTATION, MAX_REPLICAS_ANNOTATION, REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
};
use skerry_controllers::deployment::{Snapshot, SyncError, SyncOutcome, Writes, sync_deployment};
use skerry_controllers::hash::{POD_TEMPLATE_HASH_LABEL, compute_hash};
use skerry_controllers::util::controller_of;

const NS: &str = "default";
const NAME: &str = "web";
const DEPLOYMENT_UID: &str = "uid-web";
/// Syncs a test allows before declaring the controller stuck in a loop.
const SYNCS_MAX: usize = 200;

fn api_error(code: i32, reason: &str) -> Error {
    Error::Api(Box::new(Status {
        code: Some(code),
        reason: Some(reason.into()),
        message: Some(reason.into()),
        ..Default::default()
    }))
}

#[derive(Default)]
struct State {
    deployment: Deployment,
    rss: BTreeMap<String, ReplicaSet>,
    resource_version: u64,
    uids: u64,
    clock_s: i64,
    writes: usize,
    /// Events recorded on the Deployment: (type, reason, message).
    events: Vec<(String, String, String)>,
    /// The next ReplicaSet create fails with this (code, reason, message, status cause).
    fail_next_create: Option<(i32, &'static str, &'static str, Option<&'static str>)>,
}

impl State {
    fn next_rv(&mut self) -> Option<String> {
        self.resource_version += 1;
        self.writes += 1;
        Some(self.resource_version.to_string())
    }
    fn now(&self) -> Time {
        Time(Timestamp::from_second(1_700_000_000 + self.clock_s).unwrap())
    }
}

/// The fake apiserver.
struct Cluster(Mutex<State>);

impl Writes for Cluster {
    async fn create_replica_set(&self, rs: &ReplicaSet) -> Result<ReplicaSet, Error> {
        let mut s = self.0.lock().unwrap();
        if let Some((code, reason, message, cause)) = s.fail_next_create.take() {
            return Err(Error::Api(Box::new(Status {
                code: Some(code),
                reason: Some(reason.into()),
                message: Some(message.into()),
                details: cause.map(|c| StatusDetails {
                    causes: Some(vec![StatusCause {
                        reason: Some(c.into()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            })));
        }
        let name = rs.metadata.name.clone().unwrap();
        if s.rss.contains_key(&name) {
            return Err(api_error(409, "AlreadyExists"));
        }
        let mut rs = rs.clone();
        s.uids += 1;
        s.clock_s += 1;
        rs.metadata.uid = Some(format!("uid-rs-{}", s.uids));
        rs.metadata.creation_timestamp = Some(s.now());
        rs.metadata.generation = Some(1);
        rs.metadata.resource_version = s.next_rv();
        rs.status = None;
        s.rss.insert(name, rs.clone());
        Ok(rs)
    }

    async fn get_replica_set(&self, _ns: &str, name: &str) -> Result<Option<ReplicaSet>, Error> {
        Ok(self.0.lock().unwrap().rss.get(name).cloned())
    }

    async fn update_replica_set(&self, rs: &ReplicaSet) -> Result<ReplicaSet, Error> {
        let mut s = self.0.lock().unwrap();
        let name = rs.metadata.name.clone().unwrap();
        let Some(stored) = s.rss.get(&name).cloned() else {
            return Err(api_error(404, "NotFound"));
        };
        if stored.metadata.resource_version != rs.metadata.resource_version {
            return Err(api_error(409, "Conflict"));
        }
        let mut updated = rs.clone();
        updated.status = stored.status.clone();
        updated.metadata.generation = stored.metadata.generation;
        if updated.spec != stored.spec {
            updated.metadata.generation = stored.metadata.generation.map(|g| g + 1);
        }
        updated.metadata.resource_version = s.next_rv();
        s.rss.insert(name, updated.clone());
        Ok(updated)
    }

    async fn delete_replica_set(&self, rs: &ReplicaSet) -> Result<(), Error> {
        let mut s = self.0.lock().unwrap();
        let name = rs.metadata.name.clone().unwrap();
        match s.rss.get(&name) {
            Some(stored) if stored.metadata.uid == rs.metadata.uid => {
                s.rss.remove(&name);
                s.writes += 1;
                Ok(())
            }
            Some(_) => Err(api_error(409, "Conflict")),
            None => Err(api_error(404, "NotFound")),
        }
    }

    async fn get_deployment(&self, _ns: &str, _name: &str) -> Result<Option<Deployment>, Error> {
        Ok(Some(self.0.lock().unwrap().deployment.clone()))
    }

    async fn update_deployment_status(&self, d: &Deployment) -> Result<Deployment, Error> {
        let mut s = self.0.lock().unwrap();
        if s.deployment.metadata.resource_version != d.metadata.resource_version {
            return Err(api_error(409, "Conflict"));
        }
        s.deployment.status = d.status.clone();
        s.deployment.metadata.resource_version = s.next_rv();
        Ok(s.deployment.clone())
    }

    async fn set_deployment_annotation(
        &self,
        _d: &Deployment,
        key: &str,
        value: &str,
    ) -> Result<Deployment, Error> {
        let mut s = self.0.lock().unwrap();
        s.deployment
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        s.deployment.metadata.resource_version = s.next_rv();
        Ok(s.deployment.clone())
    }

    fn record_event(&self, d: &Deployment, type_: &str, reason: &str, message: &str) {
        assert_eq!(d.metadata.uid.as_deref(), Some(DEPLOYMENT_UID));
        self.0
            .lock()
            .unwrap()
            .events
            .push((type_.into(), reason.into(), message.into()));
    }
}

fn labels() -> BTreeMap<String, String> {
    [("app".to_string(), "web".to_string())].into()
}

fn pod_template(image: &str) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels()),
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

fn deployment(replicas: i32, image: &str) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            namespace: Some(NS.into()),
            uid: Some(DEPLOYMENT_UID.into()),
            generation: Some(1),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels()),
                ..Default::default()
            },
            template: pod_template(image),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::String("25%".into())),
                    max_unavailable: Some(IntOrString::String("25%".into())),
                }),
            }),
            revision_history_limit: Some(10),
            progress_deadline_seconds: Some(600),
            ..Default::default()
        }),
        status: None,
    }
}

impl Cluster {
    fn new(d: Deployment) -> Cluster {
        Cluster(Mutex::new(State {
            deployment: d,
            resource_version: 1,
            ..Default::default()
        }))
    }

    fn snapshot(&self) -> (Snapshot, Time) {
        let s = self.0.lock().unwrap();
        let snapshot = Snapshot {
            deployment: s.deployment.clone(),
            replica_sets: s.rss.values().cloned().collect(),
            pods: Vec::new(),
        };
        (snapshot, s.now())
    }

    /// One sync from the current state (a perfectly fresh cache).
    async fn sync_once(&self) -> Result<SyncOutcome, SyncError> {
        let (snapshot, now) = self.snapshot();
        sync_deployment(self, snapshot, now).await
    }

    /// Syncs until a sync writes nothing, retrying errors as the workqueue would.
    async fn sync(&self) {
        for _ in 0..SYNCS_MAX {
            let before = self.0.lock().unwrap().writes;
            let result = self.sync_once().await;
            let after = self.0.lock().unwrap().writes;
            if result.is_ok() && before == after {
                return;
            }
        }
        panic!("the deployment never settled in {SYNCS_MAX} syncs");
    }

    /// The user edits the spec (generation moves on, as the apiserver does).
    fn edit(&self, f: impl FnOnce(&mut DeploymentSpec)) {
        let mut s = self.0.lock().unwrap();
        f(s.deployment.spec.as_mut().unwrap());
        let generation = s.deployment.metadata.generation.unwrap_or(0) + 1;
        s.deployment.metadata.generation = Some(generation);
        s.deployment.metadata.resource_version = s.next_rv();
    }

    /// The ReplicaSet controller: pods follow `spec.replicas` at once; removed pods take
    /// their availability with them, new pods start unavailable.
    fn reconcile_pods(&self) {
        let mut s = self.0.lock().unwrap();
        let mut changed = false;
        for rs in s.rss.values_mut() {
            let want = rs.spec.as_ref().and_then(|sp| sp.replicas).unwrap_or(1);
            let status = rs.status.get_or_insert_with(ReplicaSetStatus::default);
            let available = status.available_replicas.unwrap_or(0).min(want);
            let observed = rs.metadata.generation;
            if status.replicas != want
                || status.available_replicas != Some(available)
                || status.observed_generation != observed
            {
                status.replicas = want;
                status.available_replicas = Some(available);
                status.ready_replicas = Some(available);
                status.observed_generation = observed;
                changed = true;
            }
        }
        if changed {
            for rs in s.rss.values_mut() {
                rs.metadata.resource_version = Some(format!(
                    "{}-pods",
                    rs.metadata.resource_version.clone().unwrap()
                ));
            }
            s.writes += 1;
        }
    }

    /// The kubelet: every existing pod becomes ready and available.
    fn pods_become_available(&self) {
        let mut s = self.0.lock().unwrap();
        for rs in s.rss.values_mut() {
            let status = rs.status.get_or_insert_with(ReplicaSetStatus::default);
            status.available_replicas = Some(status.replicas);
            status.ready_replicas = Some(status.replicas);
            rs.metadata.resource_version = Some(format!(
                "{}-ready",
                rs.metadata.resource_version.clone().unwrap()
            ));
        }
        s.clock_s += 5;
    }

    fn deployment(&self) -> Deployment {
        self.0.lock().unwrap().deployment.clone()
    }

    fn replica_sets(&self) -> Vec<ReplicaSet> {
        self.0.lock().unwrap().rss.values().cloned().collect()
    }

    fn events(&self) -> Vec<(String, String, String)> {
        self.0.lock().unwrap().events.clone()
    }

    /// The `ScalingReplicaSet` events as (direction, replica set, from, to), checking that
    /// each is a Normal event in Kubernetes' wording.
    fn scaling_events(&self) -> Vec<(String, String, i32, i32)> {
        self.events()
            .into_iter()
            .filter(|(_, reason, _)| reason == "ScalingReplicaSet")
            .map(|(type_, _, message)| {
                assert_eq!(type_, "Normal");
                let words: Vec<&str> = message.split(' ').collect();
                assert!(
                    matches!(
                        words[..],
                        ["Scaled", _, "replica", "set", _, "from", _, "to", _]
                    ),
                    "{message}"
                );
                (
                    words[1].to_string(),
                    words[4].to_string(),
                    words[6].parse().unwrap(),
                    words[8].parse().unwrap(),
                )
            })
            .collect()
    }

    fn rs_for_image(&self, image: &str) -> ReplicaSet {
        self.replica_sets()
            .into_iter()
            .find(|rs| {
                let t = rs.spec.as_ref().unwrap().template.as_ref().unwrap();
                t.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(image)
            })
            .unwrap_or_else(|| panic!("no replica set runs {image}"))
    }

    /// Runs the rollout to completion, checking the rolling-update invariants after every
    /// step: at most `max_total` pods asked for, at least `min_available` available.
    async fn roll_out(&self, max_total: i32, min_available: i32) {
        for _ in 0..SYNCS_MAX {
            self.sync().await;
            self.check_bounds(max_total, min_available);
            self.reconcile_pods();
            self.check_bounds(max_total, min_available);
            self.sync().await;
            self.pods_become_available();
            self.sync().await;
            let d = self.deployment();
            let status = d.status.clone().unwrap_or_default();
            let want = d.spec.as_ref().unwrap().replicas.unwrap();
            if status.updated_replicas == Some(want)
                && status.replicas == Some(want)
                && status.available_replicas == Some(want)
            {
                return;
            }
        }
        panic!("the rollout never completed");
    }

    fn check_bounds(&self, max_total: i32, min_available: i32) {
        let rss = self.replica_sets();
        let asked: i32 = rss
            .iter()
            .map(|rs| rs.spec.as_ref().unwrap().replicas.unwrap())
            .sum();
        let available: i32 = rss
            .iter()
            .map(|rs| {
                rs.status
                    .as_ref()
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0)
            })
            .sum();
        assert!(
            asked <= max_total,
            "{asked} pods asked for, surge bound {max_total}"
        );
        assert!(
            available >= min_available,
            "{available} available, floor {min_available}"
        );
    }
}

fn annotation(rs: &ReplicaSet, key: &str) -> Option<String> {
    rs.metadata.annotations.as_ref()?.get(key).cloned()
}

fn replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().unwrap().replicas.unwrap()
}

fn condition_reason(d: &Deployment, type_: &str) -> Option<String> {
    get_condition(d.status.as_ref()?, type_)?.reason.clone()
}

fn set_image(spec: &mut DeploymentSpec, image: &str) {
    spec.template = pod_template(image);
}

#[tokio::test]
async fn a_new_deployment_gets_one_replica_set_named_by_its_hash() {
    let cluster = Cluster::new(deployment(3, "nginx:1.27"));
    cluster.sync().await;
    let rss = cluster.replica_sets();
    assert_eq!(rss.len(), 1);
    let rs = &rss[0];
    let hash = compute_hash(&pod_template("nginx:1.27"), None);
    assert_eq!(
        rs.metadata.name.as_deref(),
        Some(format!("web-{hash}").as_str())
    );
    let label = |m: Option<&BTreeMap<String, String>>| {
        m.and_then(|l| l.get(POD_TEMPLATE_HASH_LABEL)).cloned()
    };
    assert_eq!(label(rs.metadata.labels.as_ref()), Some(hash.clone()));
    let spec = rs.spec.as_ref().unwrap();
    assert_eq!(
        label(spec.selector.match_labels.as_ref()),
        Some(hash.clone())
    );
    let template_labels = spec
        .template
        .as_ref()
        .unwrap()
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref();
    assert_eq!(label(template_labels), Some(hash.clone()));
    assert_eq!(template_labels.unwrap()["app"], "web");
    let owner = controller_of(&rs.metadata).unwrap();
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Deployment", DEPLOYMENT_UID)
    );
    assert_eq!(owner.block_owner_deletion, Some(true));
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(annotation(rs, REVISION_ANNOTATION).as_deref(), Some("1"));
    assert_eq!(
        annotation(rs, DESIRED_REPLICAS_ANNOTATION).as_deref(),
        Some("3")
    );
    // maxSurge 25 % of 3 rounds up to 1.
    assert_eq!(
        annotation(rs, MAX_REPLICAS_ANNOTATION).as_deref(),
        Some("4")
    );
    let d = cluster.deployment();
    assert_eq!(
        d.metadata.annotations.as_ref().unwrap()[REVISION_ANNOTATION],
        "1"
    );
    assert_eq!(
        condition_reason(&d, "Progressing").as_deref(),
        Some("NewReplicaSetCreated")
    );
    assert_eq!(d.status.as_ref().unwrap().observed_generation, Some(1));

    // Pods come up: the rollout completes, as `kubectl rollout status` sees it.
    cluster.roll_out(4, 0).await;
    let d = cluster.deployment();
    let status = d.status.as_ref().unwrap();
    assert_eq!(
        (
            status.replicas,
            status.updated_replicas,
            status.available_replicas
        ),
        (Some(3), Some(3), Some(3))
    );
    assert_eq!(status.unavailable_replicas, Some(0));
    assert_eq!(
        condition_reason(&d, "Available").as_deref(),
        Some("MinimumReplicasAvailable")
    );
    assert_eq!(
        condition_reason(&d, "Progressing").as_deref(),
        Some("NewReplicaSetAvailable")
    );
}

#[tokio::test]
async fn a_foreign_replica_set_holding_the_name_bumps_the_collision_count() {
    let cluster = Cluster::new(deployment(2, "nginx:1.27"));
    let hash = compute_hash(&pod_template("nginx:1.27"), None);
    let taken = format!("web-{hash}");
    // Someone else's ReplicaSet already has the name (another owner, another template).
    let mut foreign = ReplicaSet::default();
    foreign.metadata.name = Some(taken.clone());
    foreign.metadata.namespace = Some(NS.into());
    foreign.metadata.labels = Some([("app".to_string(), "other".to_string())].into());
    foreign.spec = Some(Default::default());
    cluster.create_replica_set(&foreign).await.unwrap();
    // The cache has not seen it yet: the create is what finds it.
    let (mut snapshot, now) = cluster.snapshot();
    snapshot.replica_sets.clear();
    let err = sync_deployment(&cluster, snapshot, now).await.unwrap_err();
    assert!(
        matches!(&err, SyncError::HashCollision { name, collision_count: 1 } if *name == taken),
        "{err}"
    );
    assert_eq!(
        cluster.deployment().status.unwrap().collision_count,
        Some(1)
    );

    // The retry uses the counter: a different, deterministic name.
    cluster.sync().await;
    let ours: Vec<ReplicaSet> = cluster
        .replica_sets()
        .into_iter()
        .filter(|rs| controller_of(&rs.metadata).is_some())
        .collect();
    assert_eq!(ours.len(), 1);
    let expected = format!("web-{}", compute_hash(&pod_template("nginx:1.27"), Some(1)));
    assert_ne!(expected, taken);
    assert_eq!(ours[0].metadata.name.as_deref(), Some(expected.as_str()));
    assert_eq!(
        cluster.deployment().status.unwrap().collision_count,
        Some(1)
    );
}

#[tokio::test]
async fn a_lagging_cache_finds_its_own_replica_set_instead_of_colliding() {
    let cluster = Cluster::new(deployment(2, "nginx:1.27"));
    cluster.sync().await;
    assert_eq!(cluster.replica_sets().len(), 1);
    // A sync whose cache has not seen the ReplicaSet it created: AlreadyExists, but it is ours.
    let (mut snapshot, now) = cluster.snapshot();
    snapshot.replica_sets.clear();
    sync_deployment(&cluster, snapshot, now).await.unwrap();
    assert_eq!(cluster.replica_sets().len(), 1, "no second replica set");
    assert_eq!(cluster.deployment().status.unwrap().collision_count, None);
}

#[tokio::test]
async fn a_rolling_update_stays_within_surge_and_unavailability() {
    let cluster = Cluster::new(deployment(10, "nginx:1.27"));
    cluster.roll_out(13, 0).await;
    let first = cluster.rs_for_image("nginx:1.27");

    cluster.edit(|s| set_image(s, "nginx:1.28"));
    // 10 replicas, 25 %: at most 13 pods, at least 8 available throughout.
    cluster.roll_out(13, 8).await;

    assert_eq!(cluster.replica_sets().len(), 2);
    let old = cluster.rs_for_image("nginx:1.27");
    let new = cluster.rs_for_image("nginx:1.28");
    assert_eq!(old.metadata.uid, first.metadata.uid);
    assert_eq!((replicas(&old), replicas(&new)), (0, 10));
    assert_eq!(annotation(&old, REVISION_ANNOTATION).as_deref(), Some("1"));
    assert_eq!(annotation(&new, REVISION_ANNOTATION).as_deref(), Some("2"));
    let d = cluster.deployment();
    assert_eq!(
        d.metadata.annotations.as_ref().unwrap()[REVISION_ANNOTATION],
        "2"
    );
    assert_eq!(d.status.as_ref().unwrap().observed_generation, Some(2));
    assert_eq!(
        condition_reason(&d, "Progressing").as_deref(),
        Some("NewReplicaSetAvailable")
    );
}

#[tokio::test]
async fn rollback_reuses_the_old_replica_set_with_a_new_revision() {
    let cluster = Cluster::new(deployment(4, "nginx:1.27"));
    cluster.roll_out(5, 0).await;
    cluster.edit(|s| set_image(s, "nginx:1.28"));
    cluster.roll_out(5, 3).await;
    let first = cluster.rs_for_image("nginx:1.27");

    // `kubectl rollout undo`: the old ReplicaSet's template, hash label removed, patched
    // into the Deployment.
    let mut restored = first.spec.as_ref().unwrap().template.clone().unwrap();
    restored
        .metadata
        .as_mut()
        .unwrap()
        .labels
        .as_mut()
        .unwrap()
        .remove(POD_TEMPLATE_HASH_LABEL);
    cluster.edit(|s| s.template = restored);
    cluster.roll_out(5, 3).await;

    assert_eq!(cluster.replica_sets().len(), 2, "no third replica set");
    let back = cluster.rs_for_image("nginx:1.27");
    assert_eq!(back.metadata.uid, first.metadata.uid);
    assert_eq!(back.metadata.name, first.metadata.name);
    assert_eq!(replicas(&back), 4);
    assert_eq!(annotation(&back, REVISION_ANNOTATION).as_deref(), Some("3"));
    assert_eq!(
        annotation(&back, REVISION_HISTORY_ANNOTATION).as_deref(),
        Some("1")
    );
    assert_eq!(replicas(&cluster.rs_for_image("nginx:1.28")), 0);
    let d = cluster.deployment();
    assert_eq!(
        d.metadata.annotations.as_ref().unwrap()[REVISION_ANNOTATION],
        "3"
    );
}

#[tokio::test]
async fn scaling_mid_rollout_is_proportional() {
    let cluster = Cluster::new(deployment(10, "nginx:1.27"));
    cluster.roll_out(13, 0).await;
    cluster.edit(|s| set_image(s, "nginx:1.28"));
    // The new ReplicaSet starts at the surge (3) and 2 old pods may go at once (8 must stay
    // available); that frees room within the surge, so the new one grows to 5. Its pods are
    // not available, so nothing more moves.
    cluster.sync().await;
    let sizes = || {
        (
            replicas(&cluster.rs_for_image("nginx:1.27")),
            replicas(&cluster.rs_for_image("nginx:1.28")),
        )
    };
    assert_eq!(sizes(), (8, 5));
    cluster.reconcile_pods();
    cluster.sync().await;
    assert_eq!(sizes(), (8, 5));

    // Scaled to 20 mid-rollout: 13 pods become 25 (20 + 25 % surge), split in proportion.
    cluster.edit(|s| s.replicas = Some(20));
    cluster.sync().await;
    // 8 * 25 / 13 = 15.4 -> 15; 5 * 25 / 13 = 9.6 -> 10.
    assert_eq!(sizes(), (15, 10));

    // The 8 available pods never drop while the rest of the rollout runs.
    cluster.roll_out(25, 8).await;
    assert_eq!(replicas(&cluster.rs_for_image("nginx:1.28")), 20);
    assert_eq!(replicas(&cluster.rs_for_image("nginx:1.27")), 0);
}

#[tokio::test]
async fn a_paused_deployment_scales_but_does_not_roll_out() {
    let cluster = Cluster::new(deployment(2, "nginx:1.27"));
    cluster.roll_out(3, 0).await;
    cluster.edit(|s| s.paused = Some(true));
    cluster.edit(|s| set_image(s, "nginx:1.28"));
    cluster.sync().await;
    assert_eq!(cluster.replica_sets().len(), 1, "no rollout while paused");
    let d = cluster.deployment();
    let progressing = get_condition(d.status.as_ref().unwrap(), "Progressing").unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_deref()),
        ("Unknown", Some("DeploymentPaused"))
    );

    cluster.edit(|s| s.replicas = Some(5));
    cluster.sync().await;
    assert_eq!(
        replicas(&cluster.rs_for_image("nginx:1.27")),
        5,
        "scaling still happens"
    );
    cluster.reconcile_pods();
    cluster.pods_become_available();

    // `kubectl rollout resume`.
    cluster.edit(|s| s.paused = Some(false));
    cluster.roll_out(7, 4).await;
    assert_eq!(replicas(&cluster.rs_for_image("nginx:1.28")), 5);
    assert_eq!(
        condition_reason(&cluster.deployment(), "Progressing").as_deref(),
        Some("NewReplicaSetAvailable")
    );
}

#[tokio::test]
async fn recreate_empties_the_old_replica_set_before_creating_the_new() {
    let mut d = deployment(3, "nginx:1.27");
    d.spec.as_mut().unwrap().strategy = Some(DeploymentStrategy {
        type_: Some("Recreate".into()),
        rolling_update: None,
    });
    let cluster = Cluster::new(d);
    cluster.roll_out(3, 0).await;
    cluster.edit(|s| set_image(s, "nginx:1.28"));
    cluster.sync().await;
    // Old scaled to 0, but its pods still exist: no new ReplicaSet yet.
    assert_eq!(cluster.replica_sets().len(), 1);
    assert_eq!(replicas(&cluster.rs_for_image("nginx:1.27")), 0);
    // The old pods go away; now the new ReplicaSet is created at full size.
    cluster.reconcile_pods();
    cluster.sync().await;
    assert_eq!(replicas(&cluster.rs_for_image("nginx:1.28")), 3);
    cluster.roll_out(3, 0).await;
}

#[tokio::test]
async fn revision_history_limit_deletes_the_oldest_empty_replica_sets() {
    let mut d = deployment(2, "v1");
    d.spec.as_mut().unwrap().revision_history_limit = Some(1);
    let cluster = Cluster::new(d);
    cluster.roll_out(3, 0).await;
    for image in ["v2", "v3", "v4"] {
        cluster.edit(|s| set_image(s, image));
        cluster.roll_out(3, 1).await;
        cluster.sync().await;
    }
    let mut images: Vec<String> = cluster
        .replica_sets()
        .iter()
        .map(|rs| {
            let t = rs.spec.as_ref().unwrap().template.as_ref().unwrap();
            t.spec.as_ref().unwrap().containers[0]
                .image
                .clone()
                .unwrap()
        })
        .collect();
    images.sort();
    assert_eq!(images, ["v3", "v4"], "the new one and one old revision");
}

#[tokio::test]
async fn no_progress_past_the_deadline_is_reported_and_requeued_for() {
    let mut d = deployment(2, "nginx:1.27");
    d.spec.as_mut().unwrap().progress_deadline_seconds = Some(60);
    let cluster = Cluster::new(d);
    cluster.sync().await;
    cluster.reconcile_pods();
    cluster.sync().await;
    // Pods never become available. The sync asks to be woken for the deadline.
    let outcome = cluster.sync_once().await.unwrap();
    let after = outcome.requeue_after.expect("a requeue for the deadline");
    assert!(after.as_secs() > 50 && after.as_secs() <= 61, "{after:?}");
    cluster.0.lock().unwrap().clock_s += 61;
    cluster.sync().await;
    let d = cluster.deployment();
    let progressing = get_condition(d.status.as_ref().unwrap(), "Progressing").unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_deref()),
        ("False", Some("ProgressDeadlineExceeded"))
    );
    assert_eq!(
        condition_reason(&d, "Available").as_deref(),
        Some("MinimumReplicasUnavailable")
    );
    assert_eq!(
        cluster.sync_once().await.unwrap().requeue_after,
        None,
        "timed out: no more checks"
    );
}

#[tokio::test]
async fn orphans_are_adopted_and_mismatches_released() {
    let cluster = Cluster::new(deployment(1, "nginx:1.27"));
    let mut orphan = ReplicaSet::default();
    orphan.metadata.name = Some("orphan".into());
    orphan.metadata.namespace = Some(NS.into());
    orphan.metadata.labels = Some(labels());
    orphan.spec = Some(k8s_openapi::api::apps::v1::ReplicaSetSpec {
        replicas: Some(0),
        template: Some(pod_template("nginx:1.26")),
        ..Default::default()
    });
    cluster.create_replica_set(&orphan).await.unwrap();
    cluster.sync().await;
    let adopted = cluster.0.lock().unwrap().rss["orphan"].clone();
    assert_eq!(
        controller_of(&adopted.metadata).map(|r| r.uid.as_str()),
        Some(DEPLOYMENT_UID)
    );

    // Its labels change so the selector no longer matches: released.
    {
        let mut s = cluster.0.lock().unwrap();
        let rs = s.rss.get_mut("orphan").unwrap();
        rs.metadata.labels = Some([("app".to_string(), "elsewhere".to_string())].into());
    }
    cluster.sync().await;
    let released = cluster.0.lock().unwrap().rss["orphan"].clone();
    assert!(controller_of(&released.metadata).is_none());
}

// ----- Events -----

#[tokio::test]
async fn every_resize_is_a_scaling_replica_set_event() {
    let cluster = Cluster::new(deployment(4, "nginx:1.27"));
    cluster.roll_out(5, 0).await;
    let first = cluster.rs_for_image("nginx:1.27");
    let first_name = first.metadata.name.clone().unwrap();
    assert_eq!(
        cluster.scaling_events(),
        vec![("up".to_string(), first_name.clone(), 0, 4)],
        "a new deployment is one scale-up from 0"
    );

    cluster.edit(|s| set_image(s, "nginx:1.28"));
    cluster.roll_out(5, 3).await;
    let second_name = cluster.rs_for_image("nginx:1.28").metadata.name.unwrap();
    let events = cluster.scaling_events();
    // Replaying the events reproduces every size the ReplicaSets went through: each
    // starts where the previous one about the same ReplicaSet ended, in the right direction.
    let mut sizes: BTreeMap<String, i32> = BTreeMap::new();
    for (direction, rs, from, to) in &events {
        assert_eq!(sizes.get(rs).copied().unwrap_or(0), *from, "{events:?}");
        assert_eq!(direction, if to > from { "up" } else { "down" });
        sizes.insert(rs.clone(), *to);
    }
    assert_eq!(sizes[&first_name], 0);
    assert_eq!(sizes[&second_name], 4);
    assert!(events.iter().any(|e| e.0 == "down"));
    // The rollout's first move is the surge: the new ReplicaSet created at 1 (25 % of 4).
    assert_eq!(events[1], ("up".to_string(), second_name, 0, 1));
    assert!(
        cluster.events().iter().all(|e| e.1 == "ScalingReplicaSet"),
        "{:?}",
        cluster.events()
    );
}

#[tokio::test]
async fn an_empty_selector_is_a_selecting_all_warning() {
    let mut d = deployment(2, "nginx:1.27");
    d.spec.as_mut().unwrap().selector = LabelSelector::default();
    let cluster = Cluster::new(d);
    cluster.sync().await;
    assert!(cluster.replica_sets().is_empty());
    let events = cluster.events();
    assert!(!events.is_empty());
    for e in events {
        assert_eq!(
            e,
            (
                "Warning".to_string(),
                "SelectingAll".to_string(),
                "This deployment is selecting all pods. A non-empty selector is required."
                    .to_string()
            )
        );
    }
}

#[tokio::test]
async fn a_refused_create_is_a_warning_unless_the_namespace_is_terminating() {
    let cluster = Cluster::new(deployment(2, "nginx:1.27"));
    let name = format!("web-{}", compute_hash(&pod_template("nginx:1.27"), None));
    cluster.0.lock().unwrap().fail_next_create = Some((
        403,
        "Forbidden",
        "replicasets.apps \"web\" is forbidden: exceeded quota",
        None,
    ));
    cluster.sync_once().await.unwrap_err();
    let message = format!(
        "Failed to create new replica set \"{name}\": replicasets.apps \"web\" is forbidden: exceeded quota"
    );
    assert_eq!(
        cluster.events(),
        vec![(
            "Warning".to_string(),
            "ReplicaSetCreateError".to_string(),
            message.clone()
        )]
    );
    let d = cluster.deployment();
    let progressing = get_condition(d.status.as_ref().unwrap(), "Progressing").unwrap();
    assert_eq!(progressing.message.as_deref(), Some(message.as_str()));

    // In a terminating namespace every create fails: no condition, no event.
    let cluster = Cluster::new(deployment(2, "nginx:1.27"));
    cluster.0.lock().unwrap().fail_next_create = Some((
        403,
        "Forbidden",
        "unable to create new content in namespace default because it is being terminated",
        Some("NamespaceTerminating"),
    ));
    cluster.sync_once().await.unwrap_err();
    assert!(cluster.events().is_empty(), "{:?}", cluster.events());
    assert!(cluster.deployment().status.is_none());
    // The retry, once the namespace is fine again, creates and reports it.
    cluster.sync().await;
    assert_eq!(
        cluster.scaling_events(),
        vec![("up".to_string(), name, 0, 2)]
    );
}

// ----- Against a real apiserver, with the real ReplicaSet controller -----
//
// There is no kubelet: pods stay Pending, so the tests play it, marking pods Running and
// Ready through the status subresource; the ReplicaSet controller then reports them
// available and the Deployment controller moves on.
//
// Each controller writes with its real identity, its `kube-system` service account (a client
// certificate the test server issues), so the bootstrap RBAC roles are exercised exactly as
// in `skerry server`; the shared informers read with the admin client.

mod live {
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    use k8s_openapi::api::core::v1::{Event, Pod};
    use serde_json::json;
    use skerry_apiserver::testing::TestServer;
    use skerry_client::{Client, ListParams, Patch, PatchParams, PostParams};
    use skerry_controllers::context::{Context, DEFAULT_RESYNC, InformerFactory};
    use skerry_controllers::deployment::progress::get_condition;
    use skerry_controllers::deployment::spec::{REVISION_ANNOTATION, REVISION_HISTORY_ANNOTATION};
    use skerry_controllers::deployment::{DeploymentController, EVENT_COMPONENT};
    use skerry_controllers::hash::{POD_TEMPLATE_HASH_LABEL, compute_hash};
    use skerry_controllers::replicaset::ReplicaSetController;
    use skerry_controllers::util::controller_of;
    use tokio_util::sync::CancellationToken;

    use super::common::{admin_client, controller_client};
    use super::{NS, deployment};

    /// How long a test waits for the controllers to converge. Generous: two cores shared
    /// with other builds; convergence itself takes about a second.
    const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

    struct Live {
        _server: TestServer,
        /// The admin: what the test itself reads and writes with.
        client: Client,
        deployments: Arc<DeploymentController>,
        replica_sets: Arc<ReplicaSetController>,
        stop: CancellationToken,
    }

    impl Drop for Live {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    async fn start() -> Live {
        let server = TestServer::start().await.unwrap();
        let client = admin_client(&server);
        let informers = InformerFactory::new(client.clone(), Some(DEFAULT_RESYNC));
        let ctx = |name: &str| Context {
            client: controller_client(&server, name),
            informers: informers.clone(),
        };
        let deployments = DeploymentController::new(&ctx("deployment-controller"));
        let replica_sets = ReplicaSetController::new(&ctx("replicaset-controller"));
        let stop = CancellationToken::new();
        informers.start(&stop);
        tokio::spawn(deployments.clone().run(2, stop.clone()));
        tokio::spawn(replica_sets.clone().run(2, stop.clone()));
        Live {
            _server: server,
            client,
            deployments,
            replica_sets,
            stop,
        }
    }

    impl Live {
        async fn replica_sets(&self) -> Vec<ReplicaSet> {
            self.client
                .api::<ReplicaSet>(Some(NS))
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
        }

        /// The events of [`NS`] about the `kind` named `name`, once both controllers'
        /// recorders have written everything they were given.
        async fn events_about(&self, kind: &str, name: &str) -> Vec<Event> {
            self.deployments.flush_events().await;
            self.replica_sets.flush_events().await;
            self.client
                .api::<Event>(Some(NS))
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| {
                    e.involved_object.kind.as_deref() == Some(kind)
                        && e.involved_object.name.as_deref() == Some(name)
                })
                .collect()
        }

        async fn deployment(&self) -> Deployment {
            self.client
                .api::<Deployment>(Some(NS))
                .get("web")
                .await
                .unwrap()
        }

        /// The kubelet's part: every pending pod becomes Running and Ready.
        async fn make_pods_ready(&self) {
            let pods = self.client.api::<Pod>(Some(NS));
            for pod in pods.list(&ListParams::default()).await.unwrap().items {
                let ready = skerry_controllers::util::is_pod_ready(&pod);
                if ready || pod.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let now = skerry_controllers::util::now();
                let patch = Patch::Merge(json!({"status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                }}));
                let name = pod.metadata.name.clone().unwrap();
                // A pod deleted meanwhile is fine.
                let _ = pods
                    .patch_status(&name, &PatchParams::default(), &patch)
                    .await;
            }
        }

        /// Plays the kubelet until the Deployment reports its rollout complete, as `kubectl
        /// rollout status` decides it.
        async fn wait_rolled_out(&self) -> Deployment {
            crate::common::eventually(CONVERGE_TIMEOUT, "the rollout to complete", || async {
                self.make_pods_ready().await;
                let d = self.deployment().await;
                let s = d.status.clone()?;
                let want = d.spec.as_ref()?.replicas?;
                let progressing = get_condition(&s, "Progressing")?.reason.clone();
                (s.observed_generation >= d.metadata.generation
                    && s.updated_replicas == Some(want)
                    && s.replicas == Some(want)
                    && s.available_replicas == Some(want)
                    && progressing.as_deref() == Some("NewReplicaSetAvailable"))
                .then_some(d)
            })
            .await
        }
    }

    fn image_of(rs: &ReplicaSet) -> String {
        let t = rs.spec.as_ref().unwrap().template.as_ref().unwrap();
        t.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    }

    fn revision_of(rs: &ReplicaSet) -> Option<String> {
        rs.metadata
            .annotations
            .as_ref()?
            .get(REVISION_ANNOTATION)
            .cloned()
    }

    fn new_deployment(replicas: i32, image: &str) -> Deployment {
        let mut d = deployment(replicas, image);
        d.metadata.uid = None;
        d.metadata.generation = None;
        d.metadata.resource_version = None;
        d
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn create_roll_out_and_roll_back() {
        let live = start().await;
        let created = live
            .client
            .api::<Deployment>(Some(NS))
            .create(&PostParams::default(), &new_deployment(3, "nginx:1.27"))
            .await
            .unwrap();
        // One ReplicaSet, `web-<hash>` of the (apiserver-defaulted) template, owned by it.
        let hash = compute_hash(&created.spec.as_ref().unwrap().template, None);
        let first =
            crate::common::eventually(CONVERGE_TIMEOUT, "the first replica set", || async {
                let rss = live.replica_sets().await;
                (rss.len() == 1).then(|| rss[0].clone())
            })
            .await;
        assert_eq!(first.metadata.name, Some(format!("web-{hash}")));
        assert_eq!(
            first.metadata.labels.as_ref().unwrap()[POD_TEMPLATE_HASH_LABEL],
            hash
        );
        let owner = controller_of(&first.metadata).unwrap();
        assert_eq!(owner.uid, created.metadata.uid.clone().unwrap());
        let d = live.wait_rolled_out().await;
        assert_eq!(
            get_condition(d.status.as_ref().unwrap(), "Available")
                .unwrap()
                .reason
                .as_deref(),
            Some("MinimumReplicasAvailable")
        );

        // `kubectl set image`: a second ReplicaSet takes over as its pods become ready.
        live.client
            .api::<Deployment>(Some(NS))
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "web", "image": "nginx:1.28"}
                ]}}}})),
            )
            .await
            .unwrap();
        let d = live.wait_rolled_out().await;
        assert_eq!(d.metadata.generation, Some(2));
        let rss = live.replica_sets().await;
        assert_eq!(rss.len(), 2);
        let old = rss.iter().find(|rs| image_of(rs) == "nginx:1.27").unwrap();
        let new = rss.iter().find(|rs| image_of(rs) == "nginx:1.28").unwrap();
        assert_eq!(old.spec.as_ref().unwrap().replicas, Some(0));
        assert_eq!(new.spec.as_ref().unwrap().replicas, Some(3));
        assert_eq!(revision_of(new).as_deref(), Some("2"));
        assert_eq!(
            d.metadata.annotations.as_ref().unwrap()[REVISION_ANNOTATION],
            "2"
        );

        // `kubectl rollout undo`: the old template (hash label removed) patched back in with
        // a JSON patch; the old ReplicaSet is reused with a new revision.
        let mut template = old.spec.as_ref().unwrap().template.clone().unwrap();
        template
            .metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .remove(POD_TEMPLATE_HASH_LABEL);
        live.client
            .api::<Deployment>(Some(NS))
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Json(
                    json!([{"op": "replace", "path": "/spec/template", "value": template}]),
                ),
            )
            .await
            .unwrap();
        let d = live.wait_rolled_out().await;
        let rss = live.replica_sets().await;
        assert_eq!(rss.len(), 2, "the rollback made no third replica set");
        let back = rss.iter().find(|rs| image_of(rs) == "nginx:1.27").unwrap();
        assert_eq!(back.metadata.uid, first.metadata.uid);
        assert_eq!(back.spec.as_ref().unwrap().replicas, Some(3));
        assert_eq!(revision_of(back).as_deref(), Some("3"));
        assert_eq!(
            back.metadata.annotations.as_ref().unwrap()[REVISION_HISTORY_ANNOTATION],
            "1"
        );
        assert_eq!(
            d.metadata.annotations.as_ref().unwrap()[REVISION_ANNOTATION],
            "3"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_taken_name_is_escaped_with_the_collision_count() {
        let live = start().await;
        // Paused, a new Deployment gets no ReplicaSet: time to plant a stranger on its name.
        let mut d = new_deployment(2, "nginx:1.27");
        d.spec.as_mut().unwrap().paused = Some(true);
        let created = live
            .client
            .api::<Deployment>(Some(NS))
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
        let template = created.spec.as_ref().unwrap().template.clone();
        let taken = format!("web-{}", compute_hash(&template, None));
        let mut foreign = ReplicaSet::default();
        foreign.metadata.name = Some(taken.clone());
        let other = std::collections::BTreeMap::from([("app".to_string(), "other".to_string())]);
        foreign.spec = Some(k8s_openapi::api::apps::v1::ReplicaSetSpec {
            replicas: Some(0),
            selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(other.clone()),
                ..Default::default()
            },
            template: Some(k8s_openapi::api::core::v1::PodTemplateSpec {
                metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    labels: Some(other),
                    ..Default::default()
                }),
                spec: template.spec.clone(),
            }),
            ..Default::default()
        });
        live.client
            .api::<ReplicaSet>(Some(NS))
            .create(&PostParams::default(), &foreign)
            .await
            .unwrap();

        // `kubectl rollout resume`.
        live.client
            .api::<Deployment>(Some(NS))
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": false}})),
            )
            .await
            .unwrap();
        let d = live.wait_rolled_out().await;
        assert_eq!(d.status.as_ref().unwrap().collision_count, Some(1));
        let expected = format!("web-{}", compute_hash(&template, Some(1)));
        let rss = live.replica_sets().await;
        let ours: Vec<&ReplicaSet> = rss
            .iter()
            .filter(|rs| controller_of(&rs.metadata).is_some())
            .collect();
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].metadata.name.as_deref(), Some(expected.as_str()));
        let stranger = rss
            .iter()
            .find(|rs| rs.metadata.name.as_deref() == Some(taken.as_str()));
        assert!(stranger.is_some_and(|rs| controller_of(&rs.metadata).is_none()));
    }

    /// The `ScalingReplicaSet` messages, oldest first, from a list of events.
    fn scaling_messages(events: &[Event]) -> Vec<String> {
        let mut scaling: Vec<&Event> = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ScalingReplicaSet"))
            .collect();
        scaling.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        scaling.iter().filter_map(|e| e.message.clone()).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubectl_describe_shows_the_controllers_events() {
        let live = start().await;
        let created = live
            .client
            .api::<Deployment>(Some(NS))
            .create(&PostParams::default(), &new_deployment(3, "nginx:1.27"))
            .await
            .unwrap();
        let rs_name = format!(
            "web-{}",
            compute_hash(&created.spec.as_ref().unwrap().template, None)
        );
        // `kubectl describe deployment web`.
        let scale_up = format!("Scaled up replica set {rs_name} from 0 to 3");
        let events =
            crate::common::eventually(CONVERGE_TIMEOUT, "the ScalingReplicaSet event", || async {
                let events = live.events_about("Deployment", "web").await;
                (scaling_messages(&events) == vec![scale_up.clone()]).then_some(events)
            })
            .await;
        let e = &events[0];
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.involved_object.uid, created.metadata.uid);
        assert_eq!(e.involved_object.api_version.as_deref(), Some("apps/v1"));
        assert_eq!(
            e.source.as_ref().and_then(|s| s.component.as_deref()),
            Some(EVENT_COMPONENT)
        );
        // `kubectl describe rs web-<hash>`: the ReplicaSet controller's three creations.
        crate::common::eventually(
            CONVERGE_TIMEOUT,
            "three SuccessfulCreate events",
            || async {
                let events = live.events_about("ReplicaSet", &rs_name).await;
                let creates = events
                    .iter()
                    .filter(|e| e.reason.as_deref() == Some("SuccessfulCreate"))
                    .filter(|e| {
                        e.source.as_ref().and_then(|s| s.component.as_deref())
                            == Some("replicaset-controller")
                    })
                    .count();
                (creates == 3).then_some(())
            },
        )
        .await;

        // `kubectl scale deployment web --replicas=1`: a scale-down, told in 1.32's words.
        live.wait_rolled_out().await;
        live.client
            .api::<Deployment>(Some(NS))
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 1}})),
            )
            .await
            .unwrap();
        let scale_down = format!("Scaled down replica set {rs_name} from 3 to 1");
        crate::common::eventually(CONVERGE_TIMEOUT, "the scale-down event", || async {
            let events = live.events_about("Deployment", "web").await;
            (scaling_messages(&events) == vec![scale_up.clone(), scale_down.clone()]).then_some(())
        })
        .await;
        let events = live.events_about("Deployment", "web").await;
        assert!(
            events.iter().all(|e| e.type_.as_deref() == Some("Normal")),
            "{events:?}"
        );
    }
}
