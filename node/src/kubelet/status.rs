//! The pod's API status from the runtime's view (upstream `kubelet_pods.go`
//! `generateAPIPodStatus`, `getPhase`, `convertToAPIContainerStatuses`;
//! `pkg/kubelet/status/generate.go` for the conditions), a pure function of the pod (its spec
//! and the status it has), what the runtime reports, and the reasons the last sync left
//! (`CrashLoopBackOff`, `ErrImagePull`...; upstream's `ReasonCache`).
//!
//! Times come in as an argument, and a condition keeps its `lastTransitionTime` while its
//! status does not change, so generating twice from the same facts gives the same status and
//! the status manager ([`super::status_manager`]) writes only real changes.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::actions::{RESTART_ALWAYS, RESTART_NEVER, is_sidecar, restart_policy};
use super::runtime::{RuntimeContainer, RuntimePod};
use super::sandbox::{host_network, qos_class};

/// `v1.PodPending` and the other phases.
pub const PHASE_PENDING: &str = "Pending";
/// See [`PHASE_PENDING`].
pub const PHASE_RUNNING: &str = "Running";
/// See [`PHASE_PENDING`].
pub const PHASE_SUCCEEDED: &str = "Succeeded";
/// See [`PHASE_PENDING`].
pub const PHASE_FAILED: &str = "Failed";

/// The conditions the kubelet owns (`kubetypes.PodConditionsByKubelet` and
/// `PodReadyToStartContainers`); others in the old status are kept as they are.
pub const KUBELET_CONDITIONS: [&str; 4] = [
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
];
/// The waiting reason of a container not created yet.
pub const REASON_CONTAINER_CREATING: &str = "ContainerCreating";
/// The waiting reason of a regular container while init containers run.
pub const REASON_POD_INITIALIZING: &str = "PodInitializing";
/// The reason of a phase `Failed` by `activeDeadlineSeconds`.
pub const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Its message (upstream's exact text, `active_deadline.go`).
pub const MESSAGE_DEADLINE_EXCEEDED: &str =
    "Pod was active on the node longer than the specified deadline";
/// The prefix of a container id in the API (`containerd://<id>`).
pub const CONTAINER_ID_SCHEME: &str = "containerd";

/// What the last sync could not do for a container: its waiting reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    /// `CrashLoopBackOff`, `ErrImagePull`, `ImagePullBackOff`, `CreateContainerConfigError`...
    pub reason: String,
    /// The message.
    pub message: String,
}

/// What the probes say of a running container instance (`prober_manager.go`
/// `UpdatePodStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probed {
    /// Started, and its readiness probe (if any) passed.
    pub ready: bool,
    /// No startup probe, or it passed.
    pub started: bool,
}

/// The facts [`generate`] needs besides the pod and the runtime.
#[derive(Clone, Debug, Default)]
pub struct StatusInput {
    /// The probes' view of running instances, by container id (absent: none known yet).
    pub probed: HashMap<String, Probed>,
    /// The node's IPs, the primary first.
    pub host_ips: Vec<String>,
    /// Waiting reasons by container name.
    pub reasons: HashMap<String, Reason>,
    /// Termination messages by container id (read from the termination-message files).
    pub messages: HashMap<String, String>,
    /// The pod was stopped for good (deleted, done, or failed by its deadline): every
    /// container is reported terminated and the phase is final.
    pub terminal: bool,
    /// The pod ran past `activeDeadlineSeconds`.
    pub deadline_exceeded: bool,
    /// Now.
    pub now: Timestamp,
}

fn time_ns(ns: i64) -> Option<Time> {
    (ns > 0)
        .then(|| Timestamp::from_second(ns / 1_000_000_000).ok())
        .flatten()
        .map(Time)
}

fn secs(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).expect("seconds of a valid timestamp"))
}

fn container_id(c: &RuntimeContainer) -> String {
    format!("{CONTAINER_ID_SCHEME}://{}", c.id)
}

fn terminated(c: &RuntimeContainer, input: &StatusInput) -> ContainerStateTerminated {
    let reason = if !c.reason.is_empty() {
        c.reason.clone()
    } else if c.exit_code == 0 {
        "Completed".to_string()
    } else {
        "Error".to_string()
    };
    let message = input
        .messages
        .get(&c.id)
        .cloned()
        .or_else(|| (!c.message.is_empty()).then(|| c.message.clone()));
    ContainerStateTerminated {
        exit_code: c.exit_code,
        reason: Some(reason),
        message,
        started_at: time_ns(c.started_at),
        finished_at: time_ns(c.finished_at),
        container_id: Some(container_id(c)),
        ..Default::default()
    }
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message,
        }),
        ..Default::default()
    }
}

/// One container's status (`convertToAPIContainerStatuses`).
fn container_status(
    spec: &Container,
    rt: &RuntimePod,
    input: &StatusInput,
    default_waiting: &str,
) -> ContainerStatus {
    let mut status = ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        ..Default::default()
    };
    let reason = input.reasons.get(&spec.name);
    let Some(latest) = rt.latest(&spec.name) else {
        let r = reason.map_or(default_waiting, |r| r.reason.as_str());
        status.state = Some(waiting(r, reason.map(|r| r.message.clone())));
        return status;
    };
    status.restart_count = latest.restart_count;
    status.container_id = Some(container_id(latest));
    status.image_id = latest.image_ref.clone();
    let previous = rt.previous(&spec.name).filter(|p| p.exited());
    if let Some(p) = previous {
        status.last_state = Some(ContainerState {
            terminated: Some(terminated(p, input)),
            ..Default::default()
        });
    }
    if latest.running() && !input.terminal {
        status.state = Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time_ns(latest.started_at),
            }),
            ..Default::default()
        });
        // As the probes say; before they said anything: ready when it has neither a
        // readiness nor a startup probe, started when it has no startup probe.
        let probed = input.probed.get(&latest.id).copied().unwrap_or(Probed {
            ready: spec.readiness_probe.is_none() && spec.startup_probe.is_none(),
            started: spec.startup_probe.is_none(),
        });
        status.ready = probed.ready;
        status.started = Some(probed.started);
    } else if latest.exited() || latest.running() {
        let t = terminated(latest, input);
        match reason.filter(|_| !input.terminal) {
            // Waiting to be started again: the exited instance is the last state.
            Some(r) => {
                status.state = Some(waiting(&r.reason, Some(r.message.clone())));
                status.last_state = Some(ContainerState {
                    terminated: Some(t),
                    ..Default::default()
                });
            }
            None => {
                status.state = Some(ContainerState {
                    terminated: Some(t),
                    ..Default::default()
                });
            }
        }
        status.started = Some(false);
    } else {
        let r = reason.map_or(default_waiting, |r| r.reason.as_str());
        status.state = Some(waiting(r, reason.map(|r| r.message.clone())));
        status.started = Some(false);
    }
    status
}

fn is_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.state.as_ref().and_then(|st| st.terminated.as_ref())
}

fn last_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|st| st.terminated.as_ref())
}

fn is_running(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.running.is_some())
}

/// The pod's phase (`getPhase`).
pub fn phase(
    pod: &Pod,
    inits: &[ContainerStatus],
    regulars: &[ContainerStatus],
    terminal: bool,
) -> &'static str {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = restart_policy(pod);
    let mut pending_init = 0;
    let mut failed_init = 0;
    for (c, s) in spec.init_containers.iter().flatten().zip(inits) {
        if is_sidecar(c) {
            if !is_running(s) && !terminal {
                pending_init += 1;
            }
            continue;
        }
        if is_running(s) {
            pending_init += 1;
        } else if let Some(t) = is_terminated(s) {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if let Some(t) = last_terminated(s) {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else {
            pending_init += 1;
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for s in regulars {
        if is_running(s) {
            running += 1;
        } else if let Some(t) = is_terminated(s) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s.state.as_ref().is_some_and(|st| st.waiting.is_some()) {
            if last_terminated(s).is_some() {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == RESTART_NEVER {
        return PHASE_FAILED;
    }
    let regular_started = regulars.iter().any(|s| s.container_id.is_some());
    if (pending_init > 0 && !regular_started) || waiting > 0 {
        return PHASE_PENDING;
    }
    if running > 0 && unknown == 0 {
        return PHASE_RUNNING;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if terminal {
            return if stopped == succeeded {
                PHASE_SUCCEEDED
            } else {
                PHASE_FAILED
            };
        }
        if policy == RESTART_ALWAYS {
            return PHASE_RUNNING;
        }
        if stopped == succeeded {
            return PHASE_SUCCEEDED;
        }
        if policy == RESTART_NEVER {
            return PHASE_FAILED;
        }
        return PHASE_RUNNING;
    }
    PHASE_PENDING
}

/// Whether a phase is final.
pub fn is_terminal_phase(phase: &str) -> bool {
    phase == PHASE_SUCCEEDED || phase == PHASE_FAILED
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: if ok { None } else { reason.map(str::to_string) },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

/// Whether an init container has done its part: a sidecar runs (or ran, for a stopped
/// pod); a regular one exited 0.
fn init_done(c: &Container, s: &ContainerStatus, terminal: bool) -> bool {
    if is_sidecar(c) {
        is_running(s) || s.container_id.is_some() && terminal
    } else {
        is_terminated(s).is_some_and(|t| t.exit_code == 0)
            || last_terminated(s).is_some_and(|t| t.exit_code == 0) && !is_running(s)
    }
}

/// The pod's status (`generateAPIPodStatus`).
pub fn generate(pod: &Pod, rt: &RuntimePod, input: &StatusInput) -> PodStatus {
    let old = pod.status.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let inits = spec.init_containers.clone().unwrap_or_default();
    let init_statuses: Vec<ContainerStatus> = inits
        .iter()
        .map(|c| container_status(c, rt, input, REASON_POD_INITIALIZING))
        .collect();
    let initialized = inits
        .iter()
        .zip(&init_statuses)
        .all(|(c, s)| init_done(c, s, input.terminal));
    let default_waiting = if initialized {
        REASON_CONTAINER_CREATING
    } else {
        REASON_POD_INITIALIZING
    };
    let statuses: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(c, rt, input, default_waiting))
        .collect();

    let mut phase = phase(pod, &init_statuses, &statuses, input.terminal);
    let old_phase = old.phase.as_deref().unwrap_or(PHASE_PENDING);
    let (mut reason, mut message) = (old.reason.clone(), old.message.clone());
    if is_terminal_phase(old_phase) {
        // A phase never goes back from Succeeded or Failed.
        phase = if old_phase == PHASE_SUCCEEDED {
            PHASE_SUCCEEDED
        } else {
            PHASE_FAILED
        };
    }
    if input.deadline_exceeded {
        phase = PHASE_FAILED;
        reason = Some(REASON_DEADLINE_EXCEEDED.to_string());
        message = Some(MESSAGE_DEADLINE_EXCEEDED.to_string());
    }
    let done = is_terminal_phase(phase);

    let host_net = host_network(pod);
    let sandbox = rt.sandboxes.first().filter(|s| s.ready);
    let mut pod_ips: Vec<String> = if host_net {
        input.host_ips.clone()
    } else {
        sandbox.map(|s| s.ips.clone()).unwrap_or_default()
    };
    if pod_ips.is_empty() {
        // Keep the IPs a stopped pod had (upstream keeps them for terminal pods too).
        pod_ips = old.pod_ips.iter().flatten().map(|p| p.ip.clone()).collect();
    }
    let ready_to_start = sandbox.is_some_and(|s| host_net || !s.ips.is_empty()) && !done;

    let names = |pred: &dyn Fn(&ContainerStatus) -> bool, list: &[ContainerStatus]| {
        list.iter()
            .filter(|s| pred(s))
            .map(|s| s.name.clone())
            .collect::<Vec<_>>()
    };
    let not_initialized: Vec<String> = inits
        .iter()
        .zip(&init_statuses)
        .filter(|(c, s)| !init_done(c, s, input.terminal))
        .map(|(c, _)| c.name.clone())
        .collect();
    let unready = names(&|s: &ContainerStatus| !s.ready, &statuses);
    let containers_ready = unready.is_empty() && !statuses.is_empty();
    let (ready_reason, ready_message) = if done {
        ("PodCompleted", None)
    } else {
        (
            "ContainersNotReady",
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let gates_unmet: Vec<String> = spec
        .readiness_gates
        .iter()
        .flatten()
        .filter(|g| {
            !old.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == g.condition_type && c.status == "True")
        })
        .map(|g| g.condition_type.clone())
        .collect();
    let mut new_conditions = vec![
        condition("PodReadyToStartContainers", ready_to_start, None, None),
        condition(
            "Initialized",
            not_initialized.is_empty(),
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                not_initialized.join(" ")
            )),
        ),
        condition(
            "ContainersReady",
            containers_ready && !done,
            Some(ready_reason),
            ready_message.clone(),
        ),
        condition(
            "Ready",
            containers_ready && !done && gates_unmet.is_empty(),
            Some(if containers_ready && !done {
                "ReadinessGatesNotReady"
            } else {
                ready_reason
            }),
            if containers_ready && !done {
                Some(format!(
                    "corresponding condition of pod readiness gate \"{}\" does not exist.",
                    gates_unmet.first().cloned().unwrap_or_default()
                ))
            } else {
                ready_message
            },
        ),
    ];
    let old_conditions: BTreeMap<String, PodCondition> = old
        .conditions
        .iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.clone()))
        .collect();
    for c in &mut new_conditions {
        c.last_transition_time = match old_conditions.get(&c.type_) {
            Some(o) if o.status == c.status => o.last_transition_time.clone(),
            _ => Some(secs(input.now)),
        };
    }
    // Conditions others own (PodScheduled, DisruptionTarget, readiness gates) stay, first.
    let mut conditions: Vec<PodCondition> = old
        .conditions
        .iter()
        .flatten()
        .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    conditions.extend(new_conditions);

    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        message,
        reason,
        host_ip: input.host_ips.first().cloned(),
        host_ips: (!input.host_ips.is_empty()).then(|| {
            input
                .host_ips
                .iter()
                .map(|ip| HostIP { ip: ip.clone() })
                .collect()
        }),
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty())
            .then(|| pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: old.start_time.clone().or_else(|| Some(secs(input.now))),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        qos_class: Some(qos_class(pod)),
        nominated_node_name: old.nominated_node_name.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::actions::container_hash;
    use super::super::runtime::{RuntimeSandbox, State};
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).expect("ts")
    }

    fn input() -> StatusInput {
        StatusInput {
            host_ips: vec!["192.0.2.10".into()],
            now: now(),
            ..Default::default()
        }
    }

    fn rc(
        name: &str,
        id: &str,
        state: State,
        exit: i32,
        restarts: i32,
        created: i64,
    ) -> RuntimeContainer {
        RuntimeContainer {
            id: id.into(),
            sandbox_id: "s".into(),
            name: name.into(),
            restart_count: restarts,
            hash: String::new(),
            state: Some(state),
            created_at: created,
            started_at: 1_700_000_001_000_000_000,
            finished_at: if state == State::Exited {
                1_700_000_002_000_000_000
            } else {
                0
            },
            exit_code: exit,
            image_ref: "sha256:img".into(),
            ..Default::default()
        }
    }

    fn sandbox() -> RuntimeSandbox {
        RuntimeSandbox {
            id: "s".into(),
            ready: true,
            created_at: 1,
            ips: vec!["10.42.0.9".into()],
            ..Default::default()
        }
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .expect(t)
    }

    #[test]
    fn a_running_pod_is_ready_with_its_ips_and_container_ids() {
        let p = pod(serde_json::json!({"metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "a", "image": "busybox"}]},
            "status": {"phase": "Pending", "qosClass": "BestEffort",
                "conditions": [{"type": "PodScheduled", "status": "True"}]}}));
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![rc("a", "c1", State::Running, 0, 0, 5)],
        };
        let s = generate(&p, &rt, &input());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.42.0.9"));
        assert_eq!(s.host_ip.as_deref(), Some("192.0.2.10"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        let types: Vec<&str> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            [
                "PodScheduled",
                "PodReadyToStartContainers",
                "Initialized",
                "ContainersReady",
                "Ready"
            ]
        );
        assert_eq!(cond(&s, "Ready").status, "True");
        let cs = &s.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(cs.container_id.as_deref(), Some("containerd://c1"));
        assert_eq!(cs.image_id, "sha256:img");
        assert!(cs.ready);
        assert_eq!(cs.started, Some(true));
        assert!(cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some());

        // Same facts later: same status (transition times kept).
        let mut p2 = p.clone();
        p2.status = Some(s.clone());
        let later = StatusInput {
            now: Timestamp::from_second(1_700_000_100).expect("ts"),
            ..input()
        };
        assert_eq!(generate(&p2, &rt, &later), s);
    }

    #[test]
    fn crash_loop_is_waiting_with_the_last_state_and_the_pod_stays_running() {
        let p = pod(serde_json::json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "a", "image": "busybox"}]}}));
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![
                rc("a", "c2", State::Exited, 1, 2, 6),
                rc("a", "c1", State::Exited, 1, 1, 5),
            ],
        };
        let mut i = input();
        i.reasons.insert(
            "a".into(),
            Reason {
                reason: "CrashLoopBackOff".into(),
                message: "back-off 20s restarting failed container=a pod=p_(u)".into(),
            },
        );
        let s = generate(&p, &rt, &i);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        let cs = &s.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(cs.restart_count, 2);
        let w = cs
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .expect("waiting");
        assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
        let last = cs
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("last");
        assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
        assert_eq!(cs.container_id.as_deref(), Some("containerd://c2"));
        assert_eq!(cond(&s, "Ready").status, "False");
        assert_eq!(
            cond(&s, "Ready").message.as_deref(),
            Some("containers with unready status: [a]")
        );
    }

    #[test]
    fn init_containers_gate_initialized_and_the_phase() {
        let p = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "i1", "image": "b"}, {"name": "i2", "image": "b"}],
            "containers": [{"name": "a", "image": "b"}]}}));
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![rc("i1", "c1", State::Running, 0, 0, 5)],
        };
        let s = generate(&p, &rt, &input());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let init = cond(&s, "Initialized");
        assert_eq!(init.status, "False");
        assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
        assert_eq!(
            init.message.as_deref(),
            Some("containers with incomplete status: [i1 i2]")
        );
        let cs = &s.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(
            cs.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref()),
            Some("PodInitializing")
        );
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![
                rc("a", "c3", State::Running, 0, 0, 7),
                rc("i2", "c2", State::Exited, 0, 0, 6),
                rc("i1", "c1", State::Exited, 0, 0, 5),
            ],
        };
        let s = generate(&p, &rt, &input());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Initialized").status, "True");
        let i1 = &s.init_container_statuses.as_ref().expect("inits")[0];
        let t = i1
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("terminated");
        assert_eq!(t.reason.as_deref(), Some("Completed"));
        // A failed init container under Never fails the pod.
        let never = pod(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"restartPolicy": "Never",
            "initContainers": [{"name": "i1", "image": "b"}], "containers": [{"name": "a", "image": "b"}]}}),
        );
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![rc("i1", "c1", State::Exited, 3, 0, 5)],
        };
        assert_eq!(
            generate(&never, &rt, &input()).phase.as_deref(),
            Some("Failed")
        );
    }

    #[test]
    fn finished_pods_by_restart_policy_and_deadline() {
        for (policy, exit, phase) in [
            ("Never", 0, "Succeeded"),
            ("Never", 1, "Failed"),
            ("OnFailure", 0, "Succeeded"),
            ("OnFailure", 1, "Running"),
            ("Always", 0, "Running"),
        ] {
            let p = pod(serde_json::json!({"metadata": {"name": "p"},
                "spec": {"restartPolicy": policy, "containers": [{"name": "a", "image": "b"}]}}));
            let rt = RuntimePod {
                sandboxes: vec![sandbox()],
                containers: vec![rc("a", "c1", State::Exited, exit, 0, 5)],
            };
            let s = generate(&p, &rt, &input());
            assert_eq!(s.phase.as_deref(), Some(phase), "{policy} {exit}");
        }
        let p = pod(serde_json::json!({"metadata": {"name": "p"},
            "spec": {"activeDeadlineSeconds": 1, "containers": [{"name": "a", "image": "b"}]}}));
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![rc("a", "c1", State::Exited, 137, 0, 5)],
        };
        let mut i = input();
        i.deadline_exceeded = true;
        i.terminal = true;
        let s = generate(&p, &rt, &i);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
        // The hash is not part of the status.
        let _ = container_hash(&p.spec.as_ref().expect("spec").containers[0]);
    }

    #[test]
    fn host_network_pods_report_the_node_ip() {
        let p = pod(serde_json::json!({"metadata": {"name": "p"},
            "spec": {"hostNetwork": true, "containers": [{"name": "a", "image": "b"}]}}));
        let mut sb = sandbox();
        sb.ips.clear();
        let rt = RuntimePod {
            sandboxes: vec![sb],
            containers: vec![rc("a", "c1", State::Running, 0, 0, 5)],
        };
        let s = generate(&p, &rt, &input());
        assert_eq!(s.pod_ip.as_deref(), Some("192.0.2.10"));
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "True");
    }

    #[test]
    fn probes_decide_ready_and_started() {
        let p = pod(serde_json::json!({"metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "a", "image": "busybox",
                "readinessProbe": {"exec": {"command": ["true"]}},
                "startupProbe": {"exec": {"command": ["true"]}}}]},
            "status": {"phase": "Pending"}}));
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![rc("a", "c1", State::Running, 0, 0, 5)],
        };
        let status_of = |probed: Option<Probed>| {
            let mut i = input();
            if let Some(pr) = probed {
                i.probed.insert("c1".into(), pr);
            }
            let s = generate(&p, &rt, &i);
            let cs = s.container_statuses.clone().expect("statuses")[0].clone();
            (
                cond(&s, "Ready").status.clone(),
                cond(&s, "ContainersReady").status.clone(),
                cs.ready,
                cs.started,
            )
        };
        // Before any probe ran: neither started nor ready.
        assert_eq!(
            status_of(None),
            ("False".into(), "False".into(), false, Some(false))
        );
        let started_only = Probed {
            ready: false,
            started: true,
        };
        assert_eq!(
            status_of(Some(started_only)),
            ("False".into(), "False".into(), false, Some(true))
        );
        let both = Probed {
            ready: true,
            started: true,
        };
        assert_eq!(
            status_of(Some(both)),
            ("True".into(), "True".into(), true, Some(true))
        );
    }
}
