//! `kubectl logs` for real: the real kubectl asks the apiserver for `pods/log`, which
//! proxies the kubelet's `/containerLogs` on the node's `--kubelet-port` with its
//! `apiserver-kubelet-client` certificate; the kubelet reads the CRI log files its
//! containers write (real containerd, a busybox image built by the test, host-network pods
//! as in `pods.rs`). Then who may not: a user without `pods/log` at the apiserver, and at
//! the kubelet's port a caller without credentials or without `nodes/proxy`.
//! The node harness is `common::node`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::kube::tail;
use common::node::{IMAGE, Node, POD_TIMEOUT, client_cert, curl_kubelet, missing_prerequisite};
use serde_json::Value;

const NODE: &str = "logs-node";
/// How long `kubectl logs -f` gets to show a line the container printed after it started
/// (the pod prints one a second).
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(30);

impl Node {
    /// Applies a host-network pod of `containers` (name, shell script).
    fn apply_pod(&self, name: &str, containers: &[(&str, &str)]) {
        let containers: Vec<Value> = containers
            .iter()
            .map(|(n, script)| {
                serde_json::json!({"name": n, "image": IMAGE, "command": ["sh", "-c", script]})
            })
            .collect();
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                     "containers": containers}});
        self.kube
            .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    }

    /// `kubectl logs` until its output satisfies `ok` (a container's first lines reach its
    /// log file a moment after it runs); returns the output.
    fn logs_until(&self, args: &[&str], ok: impl Fn(&str) -> bool) -> String {
        let mut all = vec!["logs"];
        all.extend(args);
        let deadline = Instant::now() + POD_TIMEOUT;
        loop {
            let out = self.kube.kubectl_output(&all, None);
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && ok(&stdout) {
                return stdout;
            }
            assert!(
                Instant::now() < deadline,
                "kubectl {all:?}: {stdout:?}\nstderr: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                tail(&self.kube.log())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
}

/// The number in a `tick N` line.
fn tick(line: &str) -> Option<u64> {
    line.trim().strip_prefix("tick ")?.parse().ok()
}

#[test]
fn kubectl_logs_reads_the_containers_output_through_the_kubelet() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();

    // The Node publishes the port its kubelet serves.
    let n: Value = serde_json::from_str(&node.kube.ok(&["get", "node", NODE, "-o", "json"]))
        .expect("node JSON");
    assert_eq!(
        n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
        node.kubelet_port
    );

    node.apply_pod(
        "printer",
        &[("printer", "echo one; echo two; echo three; exec sleep 3600")],
    );
    node.apply_pod(
        "ticker",
        &[(
            "ticker",
            "i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done",
        )],
    );
    node.apply_pod(
        "two",
        &[
            ("first", "echo from first; exec sleep 3600"),
            ("second", "echo from second; exec sleep 3600"),
        ],
    );
    node.wait_pod("printer", "Running", running);

    // The whole log, its last line, and with timestamps.
    let all = node.logs_until(&["printer"], |o| o.contains("three"));
    assert_eq!(all, "one\ntwo\nthree\n");
    assert_eq!(node.kube.ok(&["logs", "printer", "--tail=1"]), "three\n");
    let stamped = node.kube.ok(&["logs", "printer", "--timestamps"]);
    let lines: Vec<&str> = stamped.lines().collect();
    assert_eq!(lines.len(), 3, "{stamped}");
    for (line, text) in lines.iter().zip(["one", "two", "three"]) {
        let (ts, rest) = line.split_once(' ').unwrap_or_default();
        assert_eq!(rest, text, "{line}");
        assert!(
            ts.parse::<jiff::Timestamp>().is_ok() && ts.ends_with('Z'),
            "RFC 3339 timestamp: {line}"
        );
    }

    // Two containers: -c picks one; without it the apiserver names the choices (kubectl
    // itself picks the first container and says so).
    node.wait_pod("two", "Running", running);
    let second = node.logs_until(&["two", "-c", "second"], |o| !o.is_empty());
    assert_eq!(second, "from second\n");
    let out = node.kube.kubectl_output(
        &["get", "--raw", "/api/v1/namespaces/default/pods/two/log"],
        None,
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "a container name must be specified for pod two, choose one of: [first second]"
        ),
        "{stderr}"
    );
    node.logs_until(&["two", "-c", "first"], |o| !o.is_empty());
    let out = node.kube.kubectl_output(&["logs", "two"], None);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from first\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Defaulted container \"first\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = node.kube.fails(&["logs", "two", "-c", "third"], None);
    assert!(
        stderr.contains("container third is not valid for pod two"),
        "{stderr}"
    );

    // -f: the lines the container prints after kubectl started arrive while it follows.
    node.wait_pod("ticker", "Running", running);
    node.logs_until(&["ticker"], |o| o.lines().any(|l| tick(l).is_some()));
    let mut follower = node
        .kube
        .command(&["logs", "-f", "ticker", "--tail=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let stdout = follower.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(FOLLOW_TIMEOUT).expect("a first line");
    let first = tick(&first).unwrap_or_else(|| panic!("a tick line: {first:?}"));
    let deadline = Instant::now() + FOLLOW_TIMEOUT;
    let mut last = first;
    while last < first + 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("kubectl logs -f stopped at tick {last}"));
        let n = tick(&line).unwrap_or_else(|| panic!("a tick line: {line:?}"));
        assert_eq!(n, last + 1, "lines in order, none lost");
        last = n;
    }
    assert!(
        follower.try_wait().expect("wait").is_none(),
        "kubectl logs -f still follows"
    );
    let _ = follower.kill();
    let _ = follower.wait();

    // --previous: the log of the run before the restart.
    node.apply_pod(
        "restarter",
        &[(
            "restarter",
            "echo run at $(cat /proc/uptime); sleep 1; exit 1",
        )],
    );
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = node.kube.ok(&[
            "get",
            "pod",
            "restarter",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ]);
        if out.trim().parse::<u32>().unwrap_or(0) >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never restarted\n{}",
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let previous = node.logs_until(&["restarter", "--previous"], |o| o.starts_with("run at "));
    let current = node.logs_until(&["restarter"], |o| o.starts_with("run at "));
    assert_eq!(previous.lines().count(), 1, "{previous}");
    assert_ne!(previous, current, "a different run's output");
}

#[test]
fn logs_need_pods_log_at_the_apiserver_and_credentials_at_the_kubelet() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    node.apply_pod("printer", &[("printer", "echo secret; exec sleep 3600")]);
    node.wait_pod("printer", "Running", running);
    node.logs_until(&["printer"], |o| o == "secret\n");

    // alice may read pods but not their logs.
    let server = node.kube.ok(&[
        "config",
        "view",
        "--raw",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let alice = node.kube.path("alice.kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(["kubeconfig", "--data-dir"])
        .arg(node.data())
        .args(["--server", &server, "--user", "alice", "--out"])
        .arg(&alice)
        .output()
        .expect("skerry kubeconfig");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    node.kube.ok(&[
        "create",
        "role",
        "pod-reader",
        "--verb=get,list",
        "--resource=pods",
    ]);
    node.kube.ok(&[
        "create",
        "rolebinding",
        "alice-reads-pods",
        "--role=pod-reader",
        "--user=alice",
    ]);
    let as_alice = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", alice.to_str().expect("UTF-8 path")];
        all.extend(args);
        node.kube.kubectl_output(&all, None)
    };
    let deadline = Instant::now() + POD_TIMEOUT;
    while !as_alice(&["get", "pod", "printer"]).status.success() {
        assert!(Instant::now() < deadline, "alice never could read pods");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = as_alice(&["logs", "printer"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing of the log leaks");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "pods \"printer\" is forbidden: User \"alice\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"default\""
        ),
        "{stderr}"
    );
    let out = as_alice(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/pods/printer/log",
        "-v=6",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("403 Forbidden"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The kubelet's port: no credentials is 401; alice's certificate (no nodes/proxy) 403;
    // the admin's (system:masters) reads the log.
    let path = "/containerLogs/default/printer/printer";
    assert_eq!(
        curl_kubelet(&node, path, None),
        ("401".to_string(), "Unauthorized".to_string())
    );
    let alice_cert = client_cert(&node, &alice, "alice");
    assert_eq!(
        curl_kubelet(&node, path, Some(&alice_cert)),
        (
            "403".to_string(),
            "Forbidden (user=alice, verb=get, resource=nodes, subresource=proxy)".to_string()
        )
    );
    let admin_cert = client_cert(&node, &node.kube.kubeconfig, "admin");
    assert_eq!(
        curl_kubelet(&node, path, Some(&admin_cert)),
        ("200".to_string(), "secret\n".to_string())
    );
    let (code, body) = curl_kubelet(&node, "/pods", Some(&admin_cert));
    assert_eq!(code, "200");
    let pods: Value = serde_json::from_str(&body).expect("PodList JSON");
    assert_eq!(pods["kind"], "PodList");
    assert!(
        pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["metadata"]["name"] == "printer"),
        "{body}"
    );
}
