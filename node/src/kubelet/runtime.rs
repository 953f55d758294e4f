//! A pod as the runtime has it (upstream `kubecontainer.PodStatus`, built by
//! `kuberuntime_manager.go` `GetPodStatus`): its sandboxes and containers, found by the labels
//! the kubelet put on them ([`LABEL_POD_UID`]), newest first, with what the annotations
//! remember (restart count, spec hash, termination-message path).

use std::collections::HashMap;

use crate::cri::api::{self, ContainerState as CriState, PodSandboxState};
use crate::cri::{Cri, CriError};

/// The pod's name on every sandbox and container (`types.KubernetesPodNameLabel`).
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// The pod's namespace (`types.KubernetesPodNamespaceLabel`).
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// The pod's UID: what the kubelet finds a pod's sandboxes and containers by.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// The container's name in the pod spec (`types.KubernetesContainerNameLabel`).
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Annotation: the hash of the container's spec when it was created.
pub const ANNOTATION_HASH: &str = "io.kubernetes.container.hash";
/// Annotation: the container's restart count when it was created.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation: where in the container the termination message is written.
pub const ANNOTATION_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
/// Annotation: `File` or `FallbackToLogsOnError`.
pub const ANNOTATION_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// Annotation: the pod's `terminationGracePeriodSeconds` when the container was created.
pub const ANNOTATION_TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Annotation: the container's preStop handler as JSON, so a pod deleted from the API can
/// still be stopped with its hook.
pub const ANNOTATION_PRE_STOP: &str = "io.kubernetes.container.preStopHandler";

/// A container's state as the runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// One container instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeContainer {
    /// The runtime's id.
    pub id: String,
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// The container's name in the spec.
    pub name: String,
    /// Its restart count (its CRI attempt).
    pub restart_count: i32,
    /// The spec hash it was created from.
    pub hash: String,
    /// Its state.
    pub state: Option<State>,
    /// Creation, start and finish times, in nanoseconds since the epoch (0: not yet).
    pub created_at: i64,
    /// See `created_at`.
    pub started_at: i64,
    /// See `created_at`.
    pub finished_at: i64,
    /// Exit code (when exited).
    pub exit_code: i32,
    /// The runtime's reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// The runtime's message.
    pub message: String,
    /// The image as the spec named it.
    pub image: String,
    /// The image's id or digest reference.
    pub image_ref: String,
    /// Where the termination message is written on the node, if mounted.
    pub termination_message_host_path: Option<String>,
    /// The termination message policy.
    pub termination_message_policy: String,
    /// The container's log file.
    pub log_path: String,
    /// The pod's grace period when this container was created.
    pub grace_seconds: Option<i64>,
    /// The preStop handler (JSON of `LifecycleHandler`), if any.
    pub pre_stop: Option<String>,
}

impl RuntimeContainer {
    /// Whether it is running.
    pub fn running(&self) -> bool {
        self.state == Some(State::Running)
    }
    /// Whether it has exited.
    pub fn exited(&self) -> bool {
        self.state == Some(State::Exited)
    }
}

/// One sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeSandbox {
    /// The runtime's id.
    pub id: String,
    /// Its attempt (0 for the pod's first).
    pub attempt: u32,
    /// `SANDBOX_READY`.
    pub ready: bool,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
    /// Its IPs, the primary first (empty for host network or before networking).
    pub ips: Vec<String>,
}

/// A pod's sandboxes and containers, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimePod {
    /// Sandboxes, newest first.
    pub sandboxes: Vec<RuntimeSandbox>,
    /// Containers, newest first.
    pub containers: Vec<RuntimeContainer>,
}

impl RuntimePod {
    /// The newest instance of the container `name`.
    pub fn latest(&self, name: &str) -> Option<&RuntimeContainer> {
        self.containers.iter().find(|c| c.name == name)
    }
    /// The instance before the newest one of `name` (its `lastState`).
    pub fn previous(&self, name: &str) -> Option<&RuntimeContainer> {
        self.containers.iter().filter(|c| c.name == name).nth(1)
    }
    /// The running containers.
    pub fn running(&self) -> impl Iterator<Item = &RuntimeContainer> {
        self.containers.iter().filter(|c| c.running())
    }
    /// Whether the runtime has nothing of this pod.
    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }
}

fn uid_filter(uid: &str) -> HashMap<String, String> {
    HashMap::from([(LABEL_POD_UID.to_string(), uid.to_string())])
}

/// Reads the pod `uid` from the runtime: its sandboxes (with their IPs) and its containers
/// (each with its full status).
pub async fn pod_status(cri: &Cri, uid: &str) -> Result<RuntimePod, CriError> {
    let sandboxes = cri
        .list_pod_sandbox(Some(api::PodSandboxFilter {
            label_selector: uid_filter(uid),
            ..Default::default()
        }))
        .await?;
    let mut pod = RuntimePod::default();
    for s in sandboxes {
        let mut sandbox = RuntimeSandbox {
            id: s.id.clone(),
            attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            ready: s.state == PodSandboxState::SandboxReady as i32,
            created_at: s.created_at,
            ips: Vec::new(),
        };
        if sandbox.ready {
            match cri.pod_sandbox_status(&s.id, false).await {
                Ok(resp) => {
                    if let Some(net) = resp.status.and_then(|st| st.network) {
                        if !net.ip.is_empty() {
                            sandbox.ips.push(net.ip);
                        }
                        sandbox
                            .ips
                            .extend(net.additional_ips.into_iter().map(|i| i.ip));
                    }
                }
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            }
        }
        pod.sandboxes.push(sandbox);
    }
    pod.sandboxes
        .sort_by_key(|s| std::cmp::Reverse((s.created_at, s.attempt)));

    let containers = cri
        .list_containers(Some(api::ContainerFilter {
            label_selector: uid_filter(uid),
            ..Default::default()
        }))
        .await?;
    for c in containers {
        let status = match cri.container_status(&c.id, false).await {
            Ok(resp) => resp
                .status
                .expect("Cri::container_status checks it is there"),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        pod.containers.push(from_status(c.pod_sandbox_id, status));
    }
    pod.containers
        .sort_by_key(|c| std::cmp::Reverse((c.created_at, c.restart_count)));
    Ok(pod)
}

/// A container instance from its CRI status.
pub fn from_status(sandbox_id: String, s: api::ContainerStatus) -> RuntimeContainer {
    let state = match CriState::try_from(s.state) {
        Ok(CriState::ContainerCreated) => State::Created,
        Ok(CriState::ContainerRunning) => State::Running,
        Ok(CriState::ContainerExited) => State::Exited,
        _ => State::Unknown,
    };
    let annotation = |k: &str| s.annotations.get(k).cloned();
    let message_path = annotation(ANNOTATION_TERMINATION_MESSAGE_PATH);
    let host_path = message_path.as_ref().and_then(|p| {
        s.mounts
            .iter()
            .find(|m| &m.container_path == p)
            .map(|m| m.host_path.clone())
    });
    RuntimeContainer {
        id: s.id,
        sandbox_id,
        name: s
            .labels
            .get(LABEL_CONTAINER_NAME)
            .cloned()
            .or_else(|| s.metadata.as_ref().map(|m| m.name.clone()))
            .unwrap_or_default(),
        restart_count: annotation(ANNOTATION_RESTART_COUNT)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| s.metadata.as_ref().map_or(0, |m| m.attempt as i32)),
        hash: annotation(ANNOTATION_HASH).unwrap_or_default(),
        state: Some(state),
        created_at: s.created_at,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason,
        message: s.message,
        image: s
            .image
            .map(|i| {
                if i.user_specified_image.is_empty() {
                    i.image
                } else {
                    i.user_specified_image
                }
            })
            .unwrap_or_default(),
        image_ref: s.image_ref,
        termination_message_host_path: host_path,
        termination_message_policy: annotation(ANNOTATION_TERMINATION_MESSAGE_POLICY)
            .unwrap_or_default(),
        log_path: s.log_path,
        grace_seconds: annotation(ANNOTATION_TERMINATION_GRACE).and_then(|v| v.parse().ok()),
        pre_stop: annotation(ANNOTATION_PRE_STOP),
    }
}
