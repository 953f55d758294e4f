//! Creating, deleting, adopting and releasing pods on behalf of an owner (kube-controller-
//! manager's `PodControlInterface`, `GetPodFromTemplate`, `slowStartBatch` and the
//! `PodControllerRefManager` patches from `pkg/controller/controller_utils.go` and
//! `controller_ref_manager.go`), shared by the ReplicaSet controller and later the DaemonSet
//! and StatefulSet controllers.
//!
//! The writes go through the [`PodControl`] trait so a controller's `sync` can be tested over a
//! fake that records them — and, for the expectations test (`docs/tricks.md` #27), a fake whose
//! creations never come back through a watch. [`Client`] implements it for real.
//!
//! [`slow_start_batch`] is the other half of the write discipline of `docs/tricks.md` #27: a
//! controller that must create 500 pods into a namespace whose quota allows none learns so from one
//! failed request, not five hundred.
//!
//! The events `kubectl describe` shows for those writes (`SuccessfulCreate`, `FailedCreate`,
//! `SuccessfulDelete`, `FailedDelete`, with `RealPodControl`'s messages) are recorded by
//! [`record_pod_create`] and [`record_pod_delete`] into an [`EventSink`]: an
//! [`EventRecorder`] in production (best-effort, never blocking a sync), a recording fake in
//! unit tests, [`NoEvents`] when a controller is built without one.

use std::collections::BTreeMap;
use std::future::Future;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ObjectReference, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Value, json};
use skerry_client::events::{EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING, EventRecorder};
use skerry_client::{Client, DeleteParams, Error, Patch, PatchParams, PostParams};

/// The size of the first batch of a slow start: one request probes whether writes succeed at
/// all before the controller commits to more (Kubernetes' `SlowStartInitialBatchSize`).
pub const SLOW_START_INITIAL_BATCH_SIZE: usize = 1;

/// The longest valid pod name (a DNS subdomain). `<owner>-` is used as the `generateName`
/// prefix only while it fits; a longer owner name is its own prefix (Kubernetes'
/// `getPodsPrefix`, which checks the prefix with `ValidatePodName(prefix, true)`). The
/// apiserver shortens the prefix further when it appends its random suffix.
pub const POD_NAME_PREFIX_MAX: usize = 253;

/// The `StatusCause` reason the apiserver attaches to a create refused because the namespace
/// is terminating: the pod will never exist, so it is neither a failure nor retried.
pub const NAMESPACE_TERMINATING_CAUSE: &str = "NamespaceTerminating";

/// The event reason of a pod created for its owner (Kubernetes' `SuccessfulCreatePodReason`).
pub const SUCCESSFUL_CREATE_POD_REASON: &str = "SuccessfulCreate";
/// The event reason of a pod create the apiserver refused (`FailedCreatePodReason`).
pub const FAILED_CREATE_POD_REASON: &str = "FailedCreate";
/// The event reason of a pod deleted by its owner (`SuccessfulDeletePodReason`).
pub const SUCCESSFUL_DELETE_POD_REASON: &str = "SuccessfulDelete";
/// The event reason of a pod delete that failed (`FailedDeletePodReason`).
pub const FAILED_DELETE_POD_REASON: &str = "FailedDelete";

/// Where a controller's events go. Object-safe so a controller holds an `Arc<dyn EventSink>`
/// and unit tests substitute a fake that records them; [`EventRecorder`] implements it.
pub trait EventSink: Send + Sync + 'static {
    /// Records an event about `object`; never blocks and never fails (events are
    /// best-effort diagnostics, never a reason to stall or fail a sync).
    fn event(&self, object: &ObjectReference, type_: &str, reason: &str, message: &str);

    /// Waits until the events recorded so far are written (tests and shutdown only).
    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

impl EventSink for EventRecorder {
    fn event(&self, object: &ObjectReference, type_: &str, reason: &str, message: &str) {
        EventRecorder::event(self, object, type_, reason, message);
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(EventRecorder::flush(self))
    }
}

/// An [`EventSink`] that drops everything: for controllers built without a recorder.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoEvents;

impl EventSink for NoEvents {
    fn event(&self, _object: &ObjectReference, _type_: &str, _reason: &str, _message: &str) {}
}

/// A recorder for `component` (`replicaset-controller`, ...) writing with `client`, the
/// controller's own identity, whose bootstrap role may create and patch events. `None`
/// (logged) outside a tokio runtime, where the recorder's writer task cannot be spawned: a
/// controller without events still does its job.
pub fn event_recorder(client: &Client, component: &str) -> Option<EventRecorder> {
    if tokio::runtime::Handle::try_current().is_err() {
        tracing::warn!(
            component,
            "no tokio runtime: this controller records no events"
        );
        return None;
    }
    Some(EventRecorder::new(client.clone(), component))
}

/// What an event says about a failed request: the API `Status` message alone when the server
/// gave one, as Kubernetes prints a `StatusError` (`pods "web-x" is forbidden: exceeded
/// quota: ...`), otherwise the error itself.
pub fn error_message(err: &Error) -> String {
    match err {
        Error::Api(status) => match status.message.as_deref() {
            Some(message) if !message.is_empty() => message.to_string(),
            _ => err.to_string(),
        },
        other => other.to_string(),
    }
}

/// Records the outcome of creating a pod for `owner` as Kubernetes' `RealPodControl` does:
/// `SuccessfulCreate` "Created pod: <name>"; a refusal is a `FailedCreate` warning "Error
/// creating: <error>", except when the namespace is terminating (every create there fails,
/// and says nothing a user can act on). A template without labels never reached the
/// apiserver and records nothing.
pub fn record_pod_create(
    events: &dyn EventSink,
    owner: &ObjectReference,
    result: &Result<Pod, CreatePodError>,
) {
    match result {
        Ok(pod) => {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            events.event(
                owner,
                EVENT_TYPE_NORMAL,
                SUCCESSFUL_CREATE_POD_REASON,
                &format!("Created pod: {name}"),
            );
        }
        Err(CreatePodError::Api(e)) if !is_namespace_terminating(e) => events.event(
            owner,
            EVENT_TYPE_WARNING,
            FAILED_CREATE_POD_REASON,
            &format!("Error creating: {}", error_message(e)),
        ),
        Err(_) => {}
    }
}

/// Records the outcome of deleting the pod `pod_name` of `owner` as `RealPodControl.DeletePod`
/// does: `SuccessfulDelete` "Deleted pod: <name>"; a failure other than 404 (the pod is already
/// gone, which is what was wanted) is a `FailedDelete` warning "Error deleting: <error>".
pub fn record_pod_delete(
    events: &dyn EventSink,
    owner: &ObjectReference,
    pod_name: &str,
    result: &Result<(), Error>,
) {
    match result {
        Ok(()) => events.event(
            owner,
            EVENT_TYPE_NORMAL,
            SUCCESSFUL_DELETE_POD_REASON,
            &format!("Deleted pod: {pod_name}"),
        ),
        Err(e) if e.is_not_found() => {}
        Err(e) => events.event(
            owner,
            EVENT_TYPE_WARNING,
            FAILED_DELETE_POD_REASON,
            &format!("Error deleting: {}", error_message(e)),
        ),
    }
}

/// Why creating a pod from a template failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreatePodError {
    /// The template has no labels, so the pod could never be selected by its owner.
    #[error("unable to create pods, no labels")]
    NoLabels,
    /// The apiserver refused (quota, admission, validation) or could not be reached.
    #[error(transparent)]
    Api(#[from] Error),
}

/// The pod writes a controller makes. Object-safe (boxed futures) so a controller holds an
/// `Arc<dyn PodControl>` and tests substitute a fake.
pub trait PodControl: Send + Sync + 'static {
    /// Creates `pod` in `namespace`.
    fn create_pod<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a Pod,
    ) -> BoxFuture<'a, Result<Pod, Error>>;

    /// Deletes the pod `namespace/name`.
    fn delete_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Applies a strategic merge patch to the pod `namespace/name` (adoption and release).
    fn patch_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: &'a Value,
    ) -> BoxFuture<'a, Result<Pod, Error>>;
}

impl PodControl for Client {
    fn create_pod<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a Pod,
    ) -> BoxFuture<'a, Result<Pod, Error>> {
        Box::pin(async move {
            self.api::<Pod>(Some(namespace))
                .create(&PostParams::default(), pod)
                .await
        })
    }

    fn delete_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.api::<Pod>(Some(namespace))
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ())
        })
    }

    fn patch_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: &'a Value,
    ) -> BoxFuture<'a, Result<Pod, Error>> {
        Box::pin(async move {
            self.api::<Pod>(Some(namespace))
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Strategic(patch.clone()),
                )
                .await
        })
    }
}

/// Builds the pod an owner creates from its template (Kubernetes' `GetPodFromTemplate`):
/// the template's labels, annotations, finalizers and spec, `generateName` `<owner>-`, the
/// owner's namespace, and `controller_ref` as its only owner reference.
pub fn pod_from_template(
    template: &PodTemplateSpec,
    owner: &ObjectMeta,
    controller_ref: Option<OwnerReference>,
) -> Result<Pod, CreatePodError> {
    let template_meta = template.metadata.clone().unwrap_or_default();
    if template_meta.labels.as_ref().is_none_or(BTreeMap::is_empty) {
        return Err(CreatePodError::NoLabels);
    }
    let owner_name = owner.name.as_deref().unwrap_or_default();
    Ok(Pod {
        metadata: ObjectMeta {
            namespace: owner.namespace.clone(),
            generate_name: Some(pod_name_prefix(owner_name)),
            labels: template_meta.labels,
            annotations: template_meta.annotations,
            finalizers: template_meta.finalizers,
            owner_references: controller_ref.map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: Some(template.spec.clone().unwrap_or_default()),
        status: None,
    })
}

/// `<owner>-`, unless that is too long to be a valid name prefix.
pub fn pod_name_prefix(owner_name: &str) -> String {
    if owner_name.len() < POD_NAME_PREFIX_MAX {
        format!("{owner_name}-")
    } else {
        owner_name.to_string()
    }
}

/// Creates a pod for `owner` from `template` (Kubernetes' `CreatePodsWithControllerRef`).
pub async fn create_pod_from_template(
    control: &dyn PodControl,
    namespace: &str,
    template: &PodTemplateSpec,
    owner: &ObjectMeta,
    controller_ref: OwnerReference,
) -> Result<Pod, CreatePodError> {
    let pod = pod_from_template(template, owner, Some(controller_ref))?;
    let created = control.create_pod(namespace, &pod).await?;
    tracing::debug!(
        namespace,
        pod = created.metadata.name.as_deref().unwrap_or_default(),
        owner = owner.name.as_deref().unwrap_or_default(),
        "created pod"
    );
    Ok(created)
}

/// Whether `err` is the apiserver refusing a create because the namespace is terminating.
pub fn is_namespace_terminating(err: &Error) -> bool {
    match err {
        Error::Api(status) => status
            .details
            .as_ref()
            .and_then(|d| d.causes.as_deref())
            .is_some_and(|causes| {
                causes
                    .iter()
                    .any(|c| c.reason.as_deref() == Some(NAMESPACE_TERMINATING_CAUSE))
            }),
        _ => false,
    }
}

/// The batch sizes of a slow start of `count` calls beginning at `initial`: 1, 2, 4, 8, ...
/// with the last batch cut to what remains.
pub fn slow_start_batch_sizes(count: usize, initial: usize) -> impl Iterator<Item = usize> {
    let mut remaining = count;
    let mut next = initial.max(1);
    std::iter::from_fn(move || {
        if remaining == 0 {
            return None;
        }
        let size = next.min(remaining);
        remaining -= size;
        next = size.saturating_mul(2);
        Some(size)
    })
}

/// What a [`slow_start_batch`] did.
#[derive(Debug)]
pub struct BatchOutcome<E> {
    /// Calls that succeeded.
    pub successes: usize,
    /// Calls made (successes and failures); `count - calls` were never attempted.
    pub calls: usize,
    /// The first error of the batch that failed, if one did.
    pub error: Option<E>,
}

/// Calls `f` `count` times in batches of growing size (1, 2, 4, ...), the calls of a batch
/// concurrently, and stops after the first batch with a failure (Kubernetes'
/// `slowStartBatch`). A request that is going to fail (quota, admission, a terminating
/// namespace) then fails once instead of `count` times, while a healthy one reaches full
/// parallelism after log2(count) round trips.
pub async fn slow_start_batch<E, F, Fut>(count: usize, initial: usize, f: F) -> BatchOutcome<E>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut outcome = BatchOutcome {
        successes: 0,
        calls: 0,
        error: None,
    };
    for size in slow_start_batch_sizes(count, initial) {
        let results = futures::future::join_all((0..size).map(|_| f())).await;
        outcome.calls += size;
        for r in results {
            match r {
                Ok(()) => outcome.successes += 1,
                Err(e) => {
                    if outcome.error.is_none() {
                        outcome.error = Some(e);
                    }
                }
            }
        }
        if outcome.error.is_some() {
            break;
        }
    }
    outcome
}

/// The strategic merge patch that makes `owner` (a controller reference) the controller of the
/// pod with `pod_uid`. The pod's UID in the patch makes it fail if the pod was replaced by
/// another of the same name (Kubernetes' `ownerRefControllerPatch`).
pub fn adopt_patch(controller_ref: &OwnerReference, pod_uid: &str) -> Value {
    json!({
        "metadata": {
            "ownerReferences": [controller_ref],
            "uid": pod_uid,
        }
    })
}

/// The strategic merge patch that removes the owner reference to `owner_uid` from the pod
/// with `pod_uid` (Kubernetes' `GenerateDeleteOwnerRefStrategicMergeBytes`).
pub fn release_patch(owner_uid: &str, pod_uid: &str) -> Value {
    json!({
        "metadata": {
            "ownerReferences": [{"$patch": "delete", "uid": owner_uid}],
            "uid": pod_uid,
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn batch_sizes_double_from_one() {
        let sizes: Vec<usize> = slow_start_batch_sizes(20, SLOW_START_INITIAL_BATCH_SIZE).collect();
        assert_eq!(sizes, vec![1, 2, 4, 8, 5]);
        assert_eq!(slow_start_batch_sizes(0, 1).count(), 0);
        let sizes: Vec<usize> = slow_start_batch_sizes(500, 1).collect();
        assert_eq!(sizes, vec![1, 2, 4, 8, 16, 32, 64, 128, 245]);
        assert_eq!(sizes.iter().sum::<usize>(), 500);
    }

    #[tokio::test]
    async fn slow_start_stops_at_the_first_failed_batch() {
        // Calls 1..=3 (batches of 1 and 2) succeed; the 5th call fails, inside the third batch
        // (calls 4..=7). The batch is finished, nothing after it is attempted.
        let calls = AtomicUsize::new(0);
        let outcome = slow_start_batch(20, 1, || {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move { if n == 5 { Err("quota") } else { Ok(()) } }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 7);
        assert_eq!(outcome.calls, 7);
        assert_eq!(outcome.successes, 6);
        assert_eq!(outcome.error, Some("quota"));
    }

    #[tokio::test]
    async fn slow_start_all_succeed() {
        let calls = AtomicUsize::new(0);
        let outcome: BatchOutcome<()> = slow_start_batch(10, 1, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        })
        .await;
        assert_eq!(outcome.successes, 10);
        assert_eq!(calls.load(Ordering::SeqCst), 10);
        assert!(outcome.error.is_none());
    }

    #[tokio::test]
    async fn slow_start_first_call_fails() {
        let calls = AtomicUsize::new(0);
        let outcome = slow_start_batch(500, 1, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>("forbidden") }
        })
        .await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "one probe, not 500 requests"
        );
        assert_eq!(outcome.successes, 0);
    }

    #[test]
    fn pod_from_template_copies_labels_and_sets_owner() {
        let template = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels(&[("app", "web")])),
                annotations: Some(labels(&[("a", "b")])),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    image: Some("nginx".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
        };
        let owner = ObjectMeta {
            name: Some("web-abc".into()),
            namespace: Some("ns".into()),
            uid: Some("u1".into()),
            ..ObjectMeta::default()
        };
        let r = crate::util::controller_ref("apps/v1", "ReplicaSet", &owner);
        let pod = pod_from_template(&template, &owner, Some(r.clone())).unwrap();
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("web-abc-"));
        assert_eq!(pod.metadata.name, None);
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(pod.metadata.labels, Some(labels(&[("app", "web")])));
        assert_eq!(pod.metadata.annotations, Some(labels(&[("a", "b")])));
        assert_eq!(pod.metadata.owner_references, Some(vec![r]));
        assert_eq!(pod.spec.unwrap().containers[0].name, "c");
    }

    #[test]
    fn pod_from_template_needs_labels() {
        let err = pod_from_template(&PodTemplateSpec::default(), &ObjectMeta::default(), None);
        assert!(matches!(err, Err(CreatePodError::NoLabels)));
    }

    #[test]
    fn long_owner_names_are_their_own_prefix() {
        assert_eq!(pod_name_prefix("a"), "a-");
        let long = "x".repeat(POD_NAME_PREFIX_MAX);
        assert_eq!(pod_name_prefix(&long), long);
    }

    #[test]
    fn patches_have_the_upstream_shape() {
        let owner = ObjectMeta {
            name: Some("rs".into()),
            uid: Some("ru".into()),
            ..ObjectMeta::default()
        };
        let r = crate::util::controller_ref("apps/v1", "ReplicaSet", &owner);
        let p = adopt_patch(&r, "pu");
        assert_eq!(p["metadata"]["uid"], "pu");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "ru");
        assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
        let p = release_patch("ru", "pu");
        assert_eq!(p["metadata"]["ownerReferences"][0]["$patch"], "delete");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "ru");
    }

    /// Records events as (type, reason, message).
    #[derive(Default)]
    struct Recorded(parking_lot::Mutex<Vec<(String, String, String)>>);

    impl EventSink for Recorded {
        fn event(&self, object: &ObjectReference, type_: &str, reason: &str, message: &str) {
            assert_eq!(object.name.as_deref(), Some("web"));
            self.0
                .lock()
                .push((type_.into(), reason.into(), message.into()));
        }
    }

    fn status_error(code: i32, message: &str, cause: Option<&str>) -> Error {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
        Error::Api(Box::new(Status {
            code: Some(code),
            reason: Some("Forbidden".into()),
            message: Some(message.into()),
            details: cause.map(|c| StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some(c.into()),
                    ..StatusCause::default()
                }]),
                ..StatusDetails::default()
            }),
            ..Status::default()
        }))
    }

    #[test]
    fn pod_write_events_use_real_pod_controls_wording() {
        let events = Recorded::default();
        let owner = ObjectReference {
            kind: Some("ReplicaSet".into()),
            name: Some("web".into()),
            ..ObjectReference::default()
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some("web-x7k2p".into());
        record_pod_create(&events, &owner, &Ok(pod));
        let quota = "pods \"web-abcde\" is forbidden: exceeded quota: q";
        record_pod_create(
            &events,
            &owner,
            &Err(CreatePodError::Api(status_error(403, quota, None))),
        );
        // Neither a terminating namespace nor a template without labels is worth an event.
        let terminating = status_error(403, "being terminated", Some(NAMESPACE_TERMINATING_CAUSE));
        record_pod_create(&events, &owner, &Err(CreatePodError::Api(terminating)));
        record_pod_create(&events, &owner, &Err(CreatePodError::NoLabels));
        record_pod_delete(&events, &owner, "web-a", &Ok(()));
        // A pod already gone is what a delete wanted.
        let gone = Err(status_error(404, "pods \"web-b\" not found", None));
        record_pod_delete(&events, &owner, "web-b", &gone);
        let unreachable = Err(Error::Transport("connection refused".into()));
        record_pod_delete(&events, &owner, "web-c", &unreachable);
        let owned = |t: &str, r: &str, m: &str| (t.to_string(), r.to_string(), m.to_string());
        assert_eq!(
            *events.0.lock(),
            vec![
                owned("Normal", "SuccessfulCreate", "Created pod: web-x7k2p"),
                owned(
                    "Warning",
                    "FailedCreate",
                    &format!("Error creating: {quota}")
                ),
                owned("Normal", "SuccessfulDelete", "Deleted pod: web-a"),
                owned(
                    "Warning",
                    "FailedDelete",
                    "Error deleting: transport: connection refused"
                ),
            ]
        );
    }

    #[test]
    fn namespace_terminating_is_recognised() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
        let err = Error::Api(Box::new(Status {
            code: Some(403),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some(NAMESPACE_TERMINATING_CAUSE.into()),
                    ..StatusCause::default()
                }]),
                ..StatusDetails::default()
            }),
            ..Status::default()
        }));
        assert!(is_namespace_terminating(&err));
        assert!(!is_namespace_terminating(&Error::Transport("x".into())));
    }
}
