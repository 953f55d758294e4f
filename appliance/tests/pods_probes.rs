//! Probes that really run (`node/src/kubelet/prober/`): the real `skerry server` with its
//! node agent and containerd, the real kubectl, a busybox image built by the test. A failing
//! readiness probe keeps a pod out of Ready, a liveness probe that starts failing restarts the
//! container, an httpGet readiness probe against busybox httpd makes a pod Ready.
//!
//! Host-network pods; the node harness (its own cgroup root, the image import, the clean-up)
//! is `common::node`.

mod common;

use std::time::{Duration, Instant};

use common::free_port;
use common::node::{IMAGE, Node, POD_TIMEOUT, events, missing_prerequisite, ready, running};
use serde_json::Value;

const NODE: &str = "probes-node";

/// Creates a host-network pod from a JSON spec.
fn create(node: &Node, name: &str, containers: Value) {
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 2,
            "containers": containers,
        }
    });
    node.kube
        .ok_in(&["create", "-f", "-"], Some(&pod.to_string()));
}

fn wait_event(node: &Node, name: &str, prefix: &str) -> String {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let all = events(node, name);
        if let Some(e) = all.iter().find(|e| e.starts_with(prefix)) {
            return e.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no event {prefix:?} for {name}: {all:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn condition(p: &Value, type_: &str) -> String {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn probes_gate_readiness_and_restart_unhealthy_containers() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    let port = free_port();

    // A readiness probe that always fails: the pod runs but never becomes Ready.
    create(
        &node,
        "unready",
        serde_json::json!([{
            "name": "c",
            "image": IMAGE,
            "command": ["sleep", "3600"],
            "readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1},
        }]),
    );
    // A liveness probe that passes for a few seconds, then fails: the container restarts.
    create(
        &node,
        "liveness",
        serde_json::json!([{
            "name": "c",
            "image": IMAGE,
            "command": ["sh", "-c", "touch /tmp/healthy; sleep 4; rm /tmp/healthy; exec sleep 3600"],
            "livenessProbe": {
                "exec": {"command": ["cat", "/tmp/healthy"]},
                "periodSeconds": 1,
                "failureThreshold": 2,
            },
        }]),
    );
    // busybox httpd behind an httpGet readiness probe by port name: Ready once it serves.
    create(
        &node,
        "web",
        serde_json::json!([{
            "name": "c",
            "image": IMAGE,
            "command": ["sh", "-c", format!("mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p {port} -h /www")],
            "ports": [{"name": "http", "containerPort": port}],
            "readinessProbe": {
                "httpGet": {"port": "http", "path": "/index.html"},
                "periodSeconds": 1,
            },
        }]),
    );

    let web = node.wait_pod("web", "Ready", ready);
    assert_eq!(web["status"]["containerStatuses"][0]["ready"], true);
    assert_eq!(web["status"]["containerStatuses"][0]["started"], true);

    node.wait_pod("unready", "Running", running);
    // Several probe periods later it is still not Ready, and says why.
    wait_event(&node, "unready", "Unhealthy: Readiness probe failed");
    std::thread::sleep(Duration::from_secs(3));
    let unready = node.pod("unready");
    assert_eq!(unready["status"]["phase"], "Running");
    assert_eq!(condition(&unready, "Ready"), "False", "{unready:#}");
    assert_eq!(condition(&unready, "ContainersReady"), "False");
    let cs = &unready["status"]["containerStatuses"][0];
    assert_eq!(cs["ready"], false, "{cs}");
    assert_eq!(
        cs["restartCount"], 0,
        "a readiness failure restarts nothing"
    );

    let restarted = node.wait_pod("liveness", "restarted", |p| {
        p["status"]["containerStatuses"][0]["restartCount"]
            .as_i64()
            .is_some_and(|n| n >= 1)
    });
    let cs = &restarted["status"]["containerStatuses"][0];
    assert_eq!(
        cs["lastState"]["terminated"]["exitCode"], 137,
        "killed, not exited: {cs}"
    );
    let unhealthy = wait_event(&node, "liveness", "Unhealthy: Liveness probe failed: ");
    assert!(unhealthy.contains("/tmp/healthy"), "{unhealthy}");
    wait_event(
        &node,
        "liveness",
        "Killing: Container c failed liveness probe, will be restarted",
    );
    // The new instance runs and is probed afresh (alive again for its first seconds).
    node.wait_pod("liveness", "running again", |p| {
        running(p) && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    });
}

#[test]
fn a_pod_bound_past_the_scheduler_that_asks_too_much_is_rejected() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    let n: Value = serde_json::from_str(&node.kube.ok(&["get", "node", NODE, "-o", "json"]))
        .expect("node JSON");
    let allocatable = n["status"]["allocatable"]["cpu"]
        .as_str()
        .expect("allocatable cpu")
        .to_string();
    // More CPUs than the node has, bound by name: the scheduler never sees it.
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "greedy"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "containers": [{
                "name": "c",
                "image": IMAGE,
                "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "1000"}},
            }],
        }
    });
    node.kube
        .ok_in(&["create", "-f", "-"], Some(&pod.to_string()));
    let rejected = node.wait_pod("greedy", "Failed", |p| p["status"]["phase"] == "Failed");
    assert_eq!(rejected["status"]["reason"], "OutOfcpu", "{rejected:#}");
    let millis = if let Some(m) = allocatable.strip_suffix('m') {
        m.parse::<i64>().expect("millicores")
    } else {
        allocatable.parse::<i64>().expect("cores") * 1000
    };
    assert_eq!(
        rejected["status"]["message"],
        format!(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000000, used: 0, capacity: {millis}"
        )
    );
    wait_event(
        &node,
        "greedy",
        "OutOfcpu: Node didn't have enough resource: cpu",
    );
    // Nothing of it ever ran.
    assert!(
        rejected["status"]["containerStatuses"].is_null(),
        "{rejected:#}"
    );
}
