//! `nodes/proxy` and `kubectl auth whoami` for real: the real kubectl asks the apiserver for
//! `/api/v1/nodes/<node>/proxy/...`, which passes the request to the node's kubelet (its
//! `--kubelet-port`, the apiserver's `apiserver-kubelet-client` certificate) and streams the
//! kubelet's answer back: `/pods`, `/healthz`, `/containerLogs/...` and a followed log that
//! keeps arriving. A user without `nodes/proxy` gets the apiserver's 403. Then
//! `kubectl auth whoami` (SelfSubjectReview) for the admin, a client-certificate user and a
//! service-account token. The node harness is `common::node` (root, containerd).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::kube::tail;
use common::node::{IMAGE, Node, POD_TIMEOUT, missing_prerequisite, running};
use serde_json::Value;

const NODE: &str = "proxy-node";
/// How long a followed log gets to show lines printed after the request started (the pod
/// prints one a second).
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(30);

/// A kubeconfig for `user` with a client certificate from the cluster CA (`skerry kubeconfig`).
fn user_kubeconfig(node: &Node, user: &str) -> PathBuf {
    let server = node.kube.ok(&[
        "config",
        "view",
        "--raw",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let path = node.kube.path(&format!("{user}.kubeconfig"));
    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(["kubeconfig", "--data-dir"])
        .arg(node.data())
        .args(["--server", &server, "--user", user, "--out"])
        .arg(&path)
        .output()
        .expect("skerry kubeconfig");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// A kubeconfig holding only the server, its CA and a bearer token (no certificate).
fn token_kubeconfig(node: &Node, token: &str) -> PathBuf {
    let field = |jsonpath: &str| node.kube.ok(&["config", "view", "--raw", "-o", jsonpath]);
    let server = field("jsonpath={.clusters[0].cluster.server}");
    let ca = field("jsonpath={.clusters[0].cluster.certificate-authority-data}");
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
    });
    let path = node.kube.path("sa.kubeconfig");
    std::fs::write(&path, config.to_string()).expect("write the token kubeconfig");
    path
}

#[test]
fn kubectl_reaches_the_kubelet_through_nodes_proxy() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ticker"},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "ticker", "image": IMAGE, "command": ["sh", "-c",
                    "i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done"]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    node.wait_pod("ticker", "Running", running);
    let base = format!("/api/v1/nodes/{NODE}/proxy");

    // The kubelet's own pod list, through the apiserver.
    let pods: Value =
        serde_json::from_str(&node.kube.ok(&["get", "--raw", &format!("{base}/pods")]))
            .expect("the kubelet's /pods is JSON");
    assert_eq!(pods["kind"], "PodList");
    assert!(
        pods["items"]
            .as_array()
            .expect("items")
            .iter()
            .any(|p| p["metadata"]["name"] == "ticker"),
        "{pods}"
    );
    assert_eq!(
        node.kube.ok(&["get", "--raw", &format!("{base}/healthz")]),
        "ok"
    );

    // A log: whole, then followed (lines printed after the request started keep coming).
    let log_path = format!("{base}/containerLogs/default/ticker/ticker");
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = node.kube.kubectl_output(&["get", "--raw", &log_path], None);
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("tick 2\n") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no log through nodes/proxy: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let started = Instant::now();
    let mut child = node
        .kube
        .command(&[
            "get",
            "--raw",
            &format!("{log_path}?follow=true&tailLines=1"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get --raw follow");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let tick = |l: &str| -> Option<u64> { l.trim().strip_prefix("tick ")?.parse().ok() };
    let first = rx
        .recv_timeout(FOLLOW_TIMEOUT)
        .ok()
        .and_then(|l| tick(&l))
        .expect("the followed log's last line");
    let mut later = Vec::new();
    while later.len() < 3 {
        match rx.recv_timeout(FOLLOW_TIMEOUT) {
            Ok(line) => later.extend(tick(&line)),
            Err(e) => panic!("the followed log stopped after {later:?}: {e}"),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(later, [first + 1, first + 2, first + 3], "lines in order");
    eprintln!(
        "followed through nodes/proxy: 3 new lines {:?} after the request",
        started.elapsed()
    );

    // Without nodes/proxy: the apiserver's 403, nothing of the kubelet's answer.
    let alice = user_kubeconfig(&node, "alice");
    let alice_str = alice.to_str().expect("UTF-8 path");
    let out = node.kube.kubectl_output(
        &[
            "--kubeconfig",
            alice_str,
            "get",
            "--raw",
            &format!("{base}/pods"),
        ],
        None,
    );
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing leaks");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "nodes \"{NODE}\" is forbidden: User \"alice\" cannot get resource \"nodes/proxy\" in API group \"\" at the cluster scope"
        )),
        "{stderr}"
    );
    // A node that does not exist.
    let stderr = node
        .kube
        .fails(&["get", "--raw", "/api/v1/nodes/nope/proxy/pods"], None);
    assert!(stderr.contains("nodes \"nope\" not found"), "{stderr}");

    // kubectl auth whoami: the admin, alice, a service account's token.
    let admin = node.kube.ok(&["auth", "whoami"]);
    assert!(admin.contains("Username"), "{admin}");
    assert!(admin.contains("system:masters"), "{admin}");
    let out = node
        .kube
        .ok(&["--kubeconfig", alice_str, "auth", "whoami", "-o", "yaml"]);
    assert!(out.contains("kind: SelfSubjectReview\n"), "{out}");
    assert!(out.contains("    username: alice\n"), "{out}");
    let token = node.kube.ok(&["create", "token", "default"]);
    let sa = token_kubeconfig(&node, token.trim());
    let out = node.kube.ok(&[
        "--kubeconfig",
        sa.to_str().expect("UTF-8 path"),
        "auth",
        "whoami",
        "-o",
        "json",
    ]);
    let review: Value = serde_json::from_str(&out).expect("whoami JSON");
    let user = &review["status"]["userInfo"];
    assert_eq!(
        user["username"], "system:serviceaccount:default:default",
        "{out}"
    );
    assert!(user["uid"].as_str().is_some_and(|u| !u.is_empty()), "{out}");
    let groups: Vec<&str> = user["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        groups.contains(&"system:serviceaccounts")
            && groups.contains(&"system:serviceaccounts:default"),
        "{out}"
    );
}
