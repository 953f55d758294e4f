//! Pods that really run: the real `skerry server` with its node agent (its own supervised
//! containerd, runc, the pause image it builds), the real kubectl, a busybox image built by
//! the test and imported with `skerry images import`.
//!
//! The pods here use the host network; `pods_network.rs` runs them on the pod network. The
//! node harness (start, image import, clean-up) is `common::node`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::free_port;
use common::kube::tail;
use common::node::{
    IMAGE, Node, POD_TIMEOUT, cri_containers, missing_prerequisite, ready, running,
};
use serde_json::Value;

const NODE: &str = "pods-node";

impl Node {
    fn run(&self, name: &str, command: &[&str]) {
        let mut args = vec![
            "run",
            name,
            "--image",
            IMAGE,
            "--restart",
            "Always",
            "--overrides",
            r#"{"spec":{"hostNetwork":true,"terminationGracePeriodSeconds":5}}"#,
            "--command",
            "--",
        ];
        args.extend(command);
        self.kube.ok(&args);
    }
}

fn log_file(node: &Node, pod: &Value, container: &str, restart: u32) -> PathBuf {
    let m = &pod["metadata"];
    node.data().join(format!(
        "agent/kubelet/pods-logs/{}_{}_{}/{container}/{restart}.log",
        m["namespace"].as_str().unwrap_or_default(),
        m["name"].as_str().unwrap_or_default(),
        m["uid"].as_str().unwrap_or_default()
    ))
}

/// Waits until the log file has a line with `text`; returns the file.
fn wait_log(path: &Path, text: &str) -> String {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.contains(text) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "{} never had {text:?}: {log:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One CRI log line: `<RFC 3339 nanos> <stream> <P|F> <text>`.
fn assert_cri_line(line: &str, stream: &str, text: &str) {
    let mut parts = line.splitn(4, ' ');
    let ts = parts.next().unwrap_or_default();
    assert!(
        ts.len() >= 20 && ts.contains('T') && ts.ends_with('Z'),
        "timestamp of {line:?}"
    );
    assert_eq!(parts.next(), Some(stream), "{line:?}");
    assert_eq!(parts.next(), Some("F"), "{line:?}");
    assert_eq!(parts.next(), Some(text), "{line:?}");
}

#[test]
fn pods_run_log_and_stop_for_real() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();

    // A pod that prints and sleeps: Running with the node's IP, its output in a CRI log file.
    let created = Instant::now();
    node.run(
        "printer",
        &["sh", "-c", "echo hello from skerry; exec sleep 3600"],
    );
    node.wait_pod("printer", "Running", running);
    let to_running = created.elapsed();
    let pod = node.wait_pod("printer", "Ready", ready);
    eprintln!("pod creation to Running (kubectl run to phase Running seen): {to_running:?}");
    assert_eq!(pod["spec"]["nodeName"], NODE);
    assert_eq!(
        pod["status"]["podIP"], pod["status"]["hostIP"],
        "host network"
    );
    let cs = &pod["status"]["containerStatuses"][0];
    assert!(
        cs["containerID"]
            .as_str()
            .unwrap_or_default()
            .starts_with("containerd://"),
        "{cs}"
    );
    assert!(cs["state"]["running"]["startedAt"].is_string(), "{cs}");
    assert_eq!(cs["ready"], true);
    assert_eq!(cs["restartCount"], 0);
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    assert!(pod["status"]["startTime"].is_string());
    let log = wait_log(&log_file(&node, &pod, "printer", 0), "hello from skerry");
    assert_cri_line(
        log.lines().next().unwrap_or_default(),
        "stdout",
        "hello from skerry",
    );

    // busybox httpd serving the pod's managed /etc directory on a host port.
    let port = free_port().to_string();
    node.run(
        "web",
        &["busybox", "httpd", "-f", "-p", &port, "-h", "/etc"],
    );
    node.wait_pod("web", "Ready", ready);
    let deadline = Instant::now() + POD_TIMEOUT;
    let body = loop {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{port}/hosts")])
            .output()
            .expect("curl");
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(Instant::now() < deadline, "httpd never answered");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        body.starts_with("# Kubernetes-managed hosts file (host network)."),
        "{body}"
    );

    // kubectl delete: the containers stop and leave CRI, the pod leaves the API.
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!cri_containers(&node.socket(), &uid).is_empty());
    let started = Instant::now();
    node.kube.ok(&["delete", "pod", "printer", "--timeout=60s"]);
    let took = started.elapsed();
    eprintln!("kubectl delete pod: {took:?}");
    // `sleep` as the container's PID 1 has no SIGTERM handler, so the signal from outside its
    // PID namespace is ignored: the stop waits out the 5 s grace period, then SIGKILL.
    assert!(
        took >= Duration::from_secs(4),
        "the grace period was not honoured: {took:?}"
    );
    let out = node.kube.kubectl_output(&["get", "pod", "printer"], None);
    assert!(!out.status.success(), "the pod is gone");
    let deadline = Instant::now() + POD_TIMEOUT;
    while !cri_containers(&node.socket(), &uid).is_empty() {
        assert!(
            Instant::now() < deadline,
            "containers of the deleted pod stay in CRI"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A Deployment of two replicas reaches 2/2 available.
    let manifest = node.kube.ok(&[
        "create",
        "deployment",
        "sleepers",
        "--image",
        IMAGE,
        "--replicas",
        "2",
        "--dry-run=client",
        "-o",
        "json",
        "--",
        "sleep",
        "3600",
    ]);
    let mut dep: Value = serde_json::from_str(&manifest).expect("deployment JSON");
    dep["spec"]["template"]["spec"]["hostNetwork"] = Value::Bool(true);
    dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 2.into();
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&dep.to_string()));
    node.kube
        .ok(&["rollout", "status", "deployment/sleepers", "--timeout=120s"]);
    node.kube
        .ok(&["delete", "deployment", "sleepers", "--timeout=60s"]);
}

#[test]
fn init_containers_run_in_order_and_crashes_back_off() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();

    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ordered"},
        "spec": {
            "hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "initContainers": [
                {"name": "first", "image": IMAGE, "command": ["sh", "-c", "echo one >> /shared/order"],
                 "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]},
                {"name": "second", "image": IMAGE, "command": ["sh", "-c", "echo two >> /shared/order"],
                 "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}],
            "containers": [{"name": "main", "image": IMAGE,
                "command": ["sh", "-c", "tr '\\n' ' ' < /shared/order; echo; exec sleep 3600"],
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    let pod = node.wait_pod("ordered", "Ready", ready);
    for (i, name) in ["first", "second"].iter().enumerate() {
        let s = &pod["status"]["initContainerStatuses"][i];
        assert_eq!(s["name"], *name);
        assert_eq!(s["state"]["terminated"]["exitCode"], 0, "{s}");
        assert_eq!(s["state"]["terminated"]["reason"], "Completed", "{s}");
    }
    let first_done =
        pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["finishedAt"].clone();
    let second_start =
        pod["status"]["initContainerStatuses"][1]["state"]["terminated"]["startedAt"].clone();
    assert!(
        first_done.as_str() <= second_start.as_str(),
        "{first_done} then {second_start}"
    );
    let log = wait_log(&log_file(&node, &pod, "main", 0), "one two");
    assert_cri_line(log.lines().next().unwrap_or_default(), "stdout", "one two ");

    // A crashing container: restarted, then CrashLoopBackOff with growing delays.
    node.run("crasher", &["sh", "-c", "echo boom; exit 3"]);
    let mut seen: Vec<(i64, Instant)> = Vec::new();
    let mut crash_loop_seen = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.last().is_none_or(|(n, _)| *n < 3) {
        assert!(
            Instant::now() < deadline,
            "restarts seen: {seen:?}\n{}",
            tail(&node.kube.log())
        );
        let p = node.pod("crasher");
        let cs = &p["status"]["containerStatuses"][0];
        let n = cs["restartCount"].as_i64().unwrap_or(0);
        if seen.last().is_none_or(|(last, _)| *last != n) {
            seen.push((n, Instant::now()));
        }
        if cs["state"]["waiting"]["reason"] == "CrashLoopBackOff" {
            crash_loop_seen = true;
            assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3, "{cs}");
            assert!(
                cs["state"]["waiting"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("back-off "),
                "{cs}"
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(crash_loop_seen, "CrashLoopBackOff never reported");
    let at = |n: i64| {
        seen.iter()
            .find(|(c, _)| *c == n)
            .map(|(_, t)| *t)
            .expect("seen")
    };
    let gap2 = at(2) - at(1);
    let gap3 = at(3) - at(2);
    eprintln!("restart gaps: 1->2 {gap2:?}, 2->3 {gap3:?}");
    assert!(
        gap2 >= Duration::from_secs(9),
        "second restart after the 10 s backoff: {gap2:?}"
    );
    assert!(
        gap3 >= Duration::from_secs(19),
        "third restart after the 20 s backoff: {gap3:?}"
    );
    assert!(gap3 > gap2, "delays grow");
    let p = node.pod("crasher");
    assert_eq!(
        p["status"]["phase"], "Running",
        "restartPolicy Always keeps the phase"
    );
}
