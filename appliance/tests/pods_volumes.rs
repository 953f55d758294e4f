//! Updates reach running pods: a configMap and a secret mounted into a running busybox pod
//! are edited with kubectl, and the files the container reads (through `kubectl exec`) change
//! within the kubelet's `--sync-frequency` (2 s here, 1 m by default) plus a pod worker's
//! resync, by the atomic writer's `..data` symlink swap: the new version lands in a new
//! timestamped directory and `..data` points at it. The real binary, kubectl and containerd.

mod common;

use std::time::{Duration, Instant};

use common::kube::tail;
use common::node::{IMAGE, Node, missing_prerequisite, running};

const NODE: &str = "volumes-node";
/// How long an update gets to show in the pod: the 2 s sync frequency plus the pod worker's
/// 10 s resync, with room for a loaded machine.
const UPDATE_TIMEOUT: Duration = Duration::from_secs(45);

fn exec(node: &Node, command: &[&str]) -> String {
    let mut args = vec!["exec", "reader", "--"];
    args.extend_from_slice(command);
    node.kube.ok(&args).trim().to_string()
}

fn wait_for(node: &Node, command: &[&str], want: &str) {
    let deadline = Instant::now() + UPDATE_TIMEOUT;
    loop {
        let got = exec(node, command);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{command:?} still says {got:?}, not {want:?}, after {UPDATE_TIMEOUT:?}\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn configmap_and_secret_updates_reach_a_running_pod() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start_with(NODE, &["--sync-frequency", "2s"]);
    node.import_busybox();
    node.kube.ok(&[
        "create",
        "configmap",
        "settings",
        "--from-literal=mode=first",
    ]);
    node.kube.ok(&[
        "create",
        "secret",
        "generic",
        "password",
        "--from-literal=value=one",
    ]);
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "reader"},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "volumeMounts": [
                                {"name": "settings", "mountPath": "/etc/settings"},
                                {"name": "password", "mountPath": "/etc/password"}]}],
            "volumes": [
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "password", "secret": {"secretName": "password"}}]
        }
    });
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    node.wait_pod("reader", "Running", running);
    assert_eq!(exec(&node, &["cat", "/etc/settings/mode"]), "first");
    assert_eq!(exec(&node, &["cat", "/etc/password/value"]), "one");
    let before = exec(&node, &["readlink", "/etc/settings/..data"]);

    node.kube.ok(&[
        "patch",
        "configmap",
        "settings",
        "--type=merge",
        "-p",
        r#"{"data":{"mode":"second"}}"#,
    ]);
    node.kube.ok(&[
        "patch",
        "secret",
        "password",
        "--type=merge",
        "-p",
        r#"{"stringData":{"value":"two"}}"#,
    ]);
    wait_for(&node, &["cat", "/etc/settings/mode"], "second");
    wait_for(&node, &["cat", "/etc/password/value"], "two");
    // The swap: `mode` is a link through `..data`, which now names another directory.
    let after = exec(&node, &["readlink", "/etc/settings/..data"]);
    assert_ne!(before, after, "the ..data link moved to the new version");
    assert_eq!(
        exec(&node, &["readlink", "/etc/settings/mode"]),
        "..data/mode"
    );
    // The container was not restarted for it.
    let pod = node.pod("reader");
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);
    node.kube
        .ok(&["delete", "pod", "reader", "--grace-period=1", "--wait=true"]);
}
