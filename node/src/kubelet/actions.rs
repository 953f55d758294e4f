//! What a sync must do to bring the runtime to the pod's spec: upstream `kuberuntime_manager.go`
//! `computePodActions` (with `computeInitContainerActions` for sidecars), a pure function of
//! the spec and the runtime's state so it is tested as a table.
//!
//! The rules, in order:
//! - a pod needs a new sandbox when it has none ready (or the newest lost its network); a
//!   new sandbox means every container starts over, init containers first. A `Never` pod
//!   whose containers already ran gets no second sandbox;
//! - init containers run one at a time, in order: the next one starts only when the one
//!   before exited 0. A failed one is restarted unless the pod's `restartPolicy` is `Never`,
//!   which fails the pod. A sidecar (an init container with `restartPolicy: Always`) counts
//!   as done once it runs, and is restarted whenever it is not running;
//! - once initialized, every regular container that is not running starts, unless the
//!   restart policy says an exited one stays down (`Never`; `OnFailure` after exit 0);
//! - a container whose spec hash changed is killed and started again;
//! - when nothing runs and nothing is to start, the sandbox is stopped (the pod is done).

use k8s_openapi::api::core::v1::{Container, Pod};

use super::runtime::{RuntimeContainer, RuntimePod};

/// `v1.RestartPolicyAlways`.
pub const RESTART_ALWAYS: &str = "Always";
/// `v1.RestartPolicyOnFailure`.
pub const RESTART_ON_FAILURE: &str = "OnFailure";
/// `v1.RestartPolicyNever`.
pub const RESTART_NEVER: &str = "Never";

/// Which list a container is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `spec.initContainers`.
    Init,
    /// `spec.containers`.
    Regular,
}

/// A container of the spec: its list and index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContainerRef {
    /// Its list.
    pub kind: Kind,
    /// Its index there.
    pub index: usize,
}

/// Why a container is killed (the `Killing` event's message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    /// The runtime id.
    pub id: String,
    /// The container's name.
    pub name: String,
    /// Why.
    pub message: String,
}

/// What a sync does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandboxes (before a new sandbox, or because the pod is
    /// done).
    pub kill_pod: bool,
    /// Create a new sandbox (attempt [`Self::attempt`]).
    pub create_sandbox: bool,
    /// The sandbox to start containers in (when not creating one).
    pub sandbox_id: Option<String>,
    /// The attempt of the new sandbox.
    pub attempt: u32,
    /// Containers to start, in order.
    pub start: Vec<ContainerRef>,
    /// Containers to kill first.
    pub kill: Vec<Kill>,
    /// An init container failed under `restartPolicy: Never`: the pod fails.
    pub init_failed: bool,
}

/// The restart policy (`Always` when unset, the API's default).
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or(RESTART_ALWAYS)
}

/// Whether an init container is a sidecar (`restartPolicy: Always`).
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some(RESTART_ALWAYS)
}

/// Whether an exited regular container is started again (`ShouldContainerBeRestarted`).
pub fn should_restart(policy: &str, exited: &RuntimeContainer) -> bool {
    match policy {
        RESTART_NEVER => false,
        RESTART_ON_FAILURE => exited.exit_code != 0,
        _ => true,
    }
}

/// The spec hash the kubelet labels a container with: a change restarts it. The first 16
/// hex digits of the SHA-256 of its JSON (upstream hashes the spec with FNV; any stable hash
/// of the whole spec serves).
pub fn container_hash(c: &Container) -> String {
    use sha2::Digest as _;
    let json = serde_json::to_vec(c).expect("a Container serializes");
    let digest = sha2::Sha256::digest(&json);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Computes the actions (`computePodActions`).
pub fn compute_pod_actions(pod: &Pod, rt: &RuntimePod) -> PodActions {
    let empty = Vec::new();
    let spec = pod.spec.as_ref();
    let inits = spec
        .and_then(|s| s.init_containers.as_ref())
        .unwrap_or(&empty);
    let regulars = spec.map(|s| &s.containers).unwrap_or(&empty);
    let policy = restart_policy(pod);
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);

    let mut actions = PodActions::default();
    let newest = rt.sandboxes.first();
    let sandbox_ok = newest.is_some_and(|s| s.ready && (host_network || !s.ips.is_empty()));
    if !sandbox_ok {
        actions.attempt = newest.map_or(0, |s| s.attempt + 1);
        // A Never pod whose containers ran does not start over in a new sandbox
        // (upstream: "No ready sandbox for pod can be found. Need to start a new one" only
        // when restartPolicy != Never or nothing ran yet).
        let ran = !rt.containers.is_empty();
        if policy == RESTART_NEVER && ran {
            actions.kill_pod = rt.sandboxes.iter().any(|s| s.ready) || rt.running().count() > 0;
            return actions;
        }
        actions.kill_pod = !rt.sandboxes.is_empty() || !rt.containers.is_empty();
        actions.create_sandbox = true;
        // Everything starts over: the first init container (and so on), or every container.
        if inits.is_empty() {
            actions.start = (0..regulars.len())
                .map(|index| ContainerRef {
                    kind: Kind::Regular,
                    index,
                })
                .collect();
        } else {
            let mut i = 0;
            while i < inits.len() {
                actions.start.push(ContainerRef {
                    kind: Kind::Init,
                    index: i,
                });
                if !is_sidecar(&inits[i]) {
                    break;
                }
                i += 1;
            }
            if i == inits.len() {
                actions
                    .start
                    .extend((0..regulars.len()).map(|index| ContainerRef {
                        kind: Kind::Regular,
                        index,
                    }));
            }
        }
        return actions;
    }
    let sandbox = newest.expect("checked above");
    actions.sandbox_id = Some(sandbox.id.clone());
    // Only containers of the current sandbox count.
    let current = |name: &str| {
        rt.containers
            .iter()
            .find(|c| c.name == name && c.sandbox_id == sandbox.id)
    };

    // Init containers.
    let mut initialized = true;
    for (index, c) in inits.iter().enumerate() {
        let r = ContainerRef {
            kind: Kind::Init,
            index,
        };
        let latest = current(&c.name);
        if is_sidecar(c) {
            match latest {
                Some(l) if l.running() => {
                    if l.hash != container_hash(c) {
                        actions.kill.push(kill(l, "changed"));
                        actions.start.push(r);
                    }
                }
                _ => actions.start.push(r),
            }
            continue;
        }
        match latest {
            None => {
                actions.start.push(r);
                initialized = false;
                break;
            }
            Some(l) if l.exited() && l.exit_code == 0 => continue,
            Some(l) if l.exited() => {
                if policy == RESTART_NEVER {
                    actions.init_failed = true;
                    actions.kill_pod = true;
                    return actions;
                }
                actions.start.push(r);
                initialized = false;
                break;
            }
            Some(_) => {
                // Created or running: wait for it to finish.
                initialized = false;
                break;
            }
        }
    }
    if !initialized {
        return actions;
    }

    // Regular containers.
    let mut keep = 0;
    for (index, c) in regulars.iter().enumerate() {
        let r = ContainerRef {
            kind: Kind::Regular,
            index,
        };
        match current(&c.name) {
            None => actions.start.push(r),
            Some(l) if l.running() => {
                if l.hash != container_hash(c) {
                    actions
                        .kill
                        .push(kill(l, &format!("Container {} definition changed", c.name)));
                    actions.start.push(r);
                } else {
                    keep += 1;
                }
            }
            Some(l) if l.exited() || l.state == Some(super::runtime::State::Unknown) => {
                if should_restart(policy, l) {
                    actions.start.push(r);
                }
            }
            Some(_) => {
                // Created but not started (a start that failed half-way): start anew.
                actions.start.push(r);
            }
        }
    }
    let sidecars_running = inits
        .iter()
        .filter(|c| is_sidecar(c))
        .filter_map(|c| current(&c.name))
        .any(|l| l.running());
    if keep == 0 && actions.start.iter().all(|r| r.kind == Kind::Init) && !regulars.is_empty() {
        let any_regular_to_start = actions.start.iter().any(|r| r.kind == Kind::Regular);
        if !any_regular_to_start {
            // Nothing of the pod's own work runs or will: the pod is done; sidecars and the
            // sandbox go (upstream: `keepCount == 0 && len(ContainersToStart) == 0`).
            actions.start.clear();
            actions.kill_pod = sandbox.ready || sidecars_running;
        }
    }
    actions
}

/// Adds the kills a failed liveness or startup probe asks for (`computePodActions`: the
/// container is killed, and started again unless the pod's `restartPolicy` is `Never`).
/// `failed(name, id)` gives the reason for a running instance whose probe failed.
pub fn add_probe_kills(
    pod: &Pod,
    rt: &RuntimePod,
    actions: &mut PodActions,
    failed: impl Fn(&str, &str) -> Option<String>,
) {
    if actions.kill_pod || actions.create_sandbox {
        return;
    }
    let Some(sandbox) = actions.sandbox_id.as_deref() else {
        return;
    };
    let restart = restart_policy(pod) != RESTART_NEVER;
    let regulars = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    for (index, c) in regulars.iter().enumerate() {
        let Some(l) = rt
            .containers
            .iter()
            .find(|l| l.name == c.name && l.sandbox_id == sandbox)
            .filter(|l| l.running())
        else {
            continue;
        };
        if actions.kill.iter().any(|k| k.id == l.id) {
            continue;
        }
        let Some(message) = failed(&c.name, &l.id) else {
            continue;
        };
        actions.kill.push(kill(l, &message));
        let r = ContainerRef {
            kind: Kind::Regular,
            index,
        };
        if restart && !actions.start.contains(&r) {
            actions.start.push(r);
        }
    }
}

fn kill(c: &RuntimeContainer, message: &str) -> Kill {
    Kill {
        id: c.id.clone(),
        name: c.name.clone(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::runtime::{RuntimeSandbox, State};
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}),
        )
        .expect("pod")
    }

    fn sandbox(ready: bool) -> RuntimeSandbox {
        RuntimeSandbox {
            id: "s1".into(),
            attempt: 0,
            ready,
            created_at: 1,
            ips: vec!["10.0.0.5".into()],
        }
    }

    fn container(p: &Pod, kind: Kind, name: &str, state: State, exit: i32) -> RuntimeContainer {
        let spec = p.spec.as_ref().expect("spec");
        let list = match kind {
            Kind::Init => spec.init_containers.as_ref().expect("inits"),
            Kind::Regular => &spec.containers,
        };
        let c = list.iter().find(|c| c.name == name).expect("container");
        RuntimeContainer {
            id: format!("id-{name}"),
            sandbox_id: "s1".into(),
            name: name.into(),
            hash: container_hash(c),
            state: Some(state),
            exit_code: exit,
            created_at: 10,
            ..Default::default()
        }
    }

    fn regular(index: usize) -> ContainerRef {
        ContainerRef {
            kind: Kind::Regular,
            index,
        }
    }
    fn init(index: usize) -> ContainerRef {
        ContainerRef {
            kind: Kind::Init,
            index,
        }
    }

    #[test]
    fn a_new_pod_gets_a_sandbox_and_all_its_containers() {
        let p = pod(
            serde_json::json!({"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}),
        );
        let a = compute_pod_actions(&p, &RuntimePod::default());
        assert!(a.create_sandbox && !a.kill_pod);
        assert_eq!(a.attempt, 0);
        assert_eq!(a.start, vec![regular(0), regular(1)]);
    }

    #[test]
    fn init_containers_run_one_at_a_time_sidecars_keep_running() {
        let p = pod(serde_json::json!({
            "initContainers": [
                {"name": "i1", "image": "i"},
                {"name": "side", "image": "i", "restartPolicy": "Always"},
                {"name": "i2", "image": "i"}],
            "containers": [{"name": "a", "image": "i"}]}));
        let fresh = compute_pod_actions(&p, &RuntimePod::default());
        assert_eq!(fresh.start, vec![init(0)], "only the first init container");

        let mut rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![container(&p, Kind::Init, "i1", State::Running, 0)],
        };
        assert_eq!(compute_pod_actions(&p, &rt).start, vec![], "i1 still runs");

        rt.containers = vec![container(&p, Kind::Init, "i1", State::Exited, 0)];
        assert_eq!(
            compute_pod_actions(&p, &rt).start,
            vec![init(1), init(2)],
            "the sidecar starts and the next init container with it"
        );

        rt.containers = vec![
            container(&p, Kind::Init, "i1", State::Exited, 0),
            container(&p, Kind::Init, "side", State::Running, 0),
            container(&p, Kind::Init, "i2", State::Exited, 0),
        ];
        assert_eq!(compute_pod_actions(&p, &rt).start, vec![regular(0)]);

        // The sidecar died: restarted, the app goes on.
        rt.containers[1].state = Some(State::Exited);
        rt.containers
            .push(container(&p, Kind::Regular, "a", State::Running, 0));
        assert_eq!(compute_pod_actions(&p, &rt).start, vec![init(1)]);
    }

    #[test]
    fn a_failed_init_container_restarts_or_fails_the_pod() {
        let spec = |policy: &str| {
            pod(serde_json::json!({"restartPolicy": policy,
                "initContainers": [{"name": "i1", "image": "i"}],
                "containers": [{"name": "a", "image": "i"}]}))
        };
        for (policy, failed) in [("Always", false), ("OnFailure", false), ("Never", true)] {
            let p = spec(policy);
            let rt = RuntimePod {
                sandboxes: vec![sandbox(true)],
                containers: vec![container(&p, Kind::Init, "i1", State::Exited, 1)],
            };
            let a = compute_pod_actions(&p, &rt);
            assert_eq!(a.init_failed, failed, "{policy}");
            assert_eq!(a.kill_pod, failed, "{policy}");
            assert_eq!(a.start.is_empty(), failed, "{policy}");
        }
    }

    #[test]
    fn exited_containers_follow_the_restart_policy() {
        for (policy, exit, restarts) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 1, false),
            ("Never", 0, false),
        ] {
            let p = pod(serde_json::json!({"restartPolicy": policy,
                "containers": [{"name": "a", "image": "i"}]}));
            let rt = RuntimePod {
                sandboxes: vec![sandbox(true)],
                containers: vec![container(&p, Kind::Regular, "a", State::Exited, exit)],
            };
            let a = compute_pod_actions(&p, &rt);
            assert_eq!(
                a.start == vec![regular(0)],
                restarts,
                "{policy} exit {exit}"
            );
            // A pod that will not run anything again has its sandbox stopped.
            assert_eq!(a.kill_pod, !restarts, "{policy} exit {exit}");
        }
    }

    #[test]
    fn a_changed_container_is_replaced_and_a_lost_sandbox_restarts_everything() {
        let p = pod(
            serde_json::json!({"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}),
        );
        let mut a_old = container(&p, Kind::Regular, "a", State::Running, 0);
        a_old.hash = "old".into();
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![a_old, container(&p, Kind::Regular, "b", State::Running, 0)],
        };
        let a = compute_pod_actions(&p, &rt);
        assert_eq!(a.kill.len(), 1);
        assert_eq!(a.kill[0].name, "a");
        assert_eq!(a.start, vec![regular(0)]);

        let mut lost = rt.clone();
        lost.sandboxes[0].ready = false;
        let a = compute_pod_actions(&p, &lost);
        assert!(a.kill_pod && a.create_sandbox);
        assert_eq!(a.attempt, 1);
        assert_eq!(a.start, vec![regular(0), regular(1)]);

        // Never: no second sandbox once containers ran.
        let never = pod(
            serde_json::json!({"restartPolicy": "Never", "containers": [{"name": "a", "image": "i"}]}),
        );
        let rt = RuntimePod {
            sandboxes: vec![sandbox(false)],
            containers: vec![container(&never, Kind::Regular, "a", State::Exited, 0)],
        };
        let a = compute_pod_actions(&never, &rt);
        assert!(!a.create_sandbox && a.start.is_empty());
    }

    #[test]
    fn a_pod_network_sandbox_without_an_ip_is_replaced_host_network_is_not() {
        let p = pod(serde_json::json!({"containers": [{"name": "a", "image": "i"}]}));
        let mut s = sandbox(true);
        s.ips.clear();
        let rt = RuntimePod {
            sandboxes: vec![s],
            containers: vec![],
        };
        assert!(compute_pod_actions(&p, &rt).create_sandbox);
        let host = pod(
            serde_json::json!({"hostNetwork": true, "containers": [{"name": "a", "image": "i"}]}),
        );
        let a = compute_pod_actions(&host, &rt);
        assert!(!a.create_sandbox);
        assert_eq!(a.start, vec![regular(0)]);
    }

    #[test]
    fn a_failed_liveness_probe_kills_and_restarts_unless_never() {
        for (policy, restarts) in [("Always", true), ("OnFailure", true), ("Never", false)] {
            let p = pod(serde_json::json!({
                "restartPolicy": policy,
                "containers": [{"name": "a"}, {"name": "b"}]
            }));
            let rt = RuntimePod {
                sandboxes: vec![sandbox(true)],
                containers: vec![
                    container(&p, Kind::Regular, "a", State::Running, 0),
                    container(&p, Kind::Regular, "b", State::Running, 0),
                ],
            };
            let mut actions = compute_pod_actions(&p, &rt);
            assert_eq!(actions.kill, vec![]);
            add_probe_kills(&p, &rt, &mut actions, |name, id| {
                (name == "b" && id == "id-b").then(|| "Container b failed liveness probe".into())
            });
            assert_eq!(
                actions.kill,
                vec![Kill {
                    id: "id-b".into(),
                    name: "b".into(),
                    message: "Container b failed liveness probe".into()
                }],
                "{policy}"
            );
            let expected = if restarts { vec![regular(1)] } else { vec![] };
            assert_eq!(actions.start, expected, "{policy}");
        }
    }
}
