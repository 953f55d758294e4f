//! A Deployment's life on a real node, as the first scene asks: the real `skerry
//! server` with its node agent and default flags (the pod network), the real kubectl, a busybox
//! image the test builds.
//!
//! What it shows:
//! - `kubectl create deployment` of three busybox httpd replicas with a readiness probe
//!   reaches 3/3 Ready, `kubectl rollout status` returns, and each pod answers on its pod IP;
//! - a rolling update (`kubectl set env`) replaces the pods one at a time, as the default
//!   strategy of three replicas says (maxSurge 25 % rounds up to 1, maxUnavailable 25 % rounds
//!   down to 0): never more than four pods asked for, never fewer than three available, and the
//!   new ReplicaSet grows 1, 2, 3;
//! - bad input gets a clear answer and loses nothing: a command that does not exist fails its
//!   container with the runtime's reason; a configMap volume and a secret env that do not exist
//!   hold their pods with upstream's reasons (`FailedMount`, `CreateContainerConfigError`)
//!   until the objects are created, and then the pods run.
//!
//! Needs root, containerd, runc, catatonit, busybox-static and the CNI plugins: a failure under
//! `CI=true`, a skip otherwise.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::kube::tail;
use common::node::{
    IMAGE, Node, POD_TIMEOUT, PluginLeftovers, events, missing, missing_prerequisite, ready,
    running,
};
use serde_json::{Value, json};
use skerry_node::cni;
use skerry_node::containerd::config::cni_bin_dir;

const NODE: &str = "deploy-node";
/// The port the pods' httpd listens on in its own network namespace.
const HTTPD_PORT: u16 = 8080;
/// The Deployment's size, the three.
const REPLICAS: i64 = 3;
/// How often the rollout is sampled: well under the time one new pod takes to become ready
/// (a sandbox, a container, a readiness probe of period 1 s), so every step is seen.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// The `app=web` pods, by name.
fn web_pods(node: &Node) -> Vec<Value> {
    let out = node
        .kube
        .ok(&["get", "pods", "-l", "app=web", "-o", "json"]);
    let list: Value = serde_json::from_str(&out).expect("pod list");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn name(v: &Value) -> String {
    v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// GETs `url` with curl until it answers.
fn curl_until(url: &str) -> String {
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "5", url])
            .output()
            .expect("curl");
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One sample of the rollout: the replicas the ReplicaSets ask for together, the
/// Deployment's available replicas, and the replicas asked of the ReplicaSet whose template
/// carries `VERSION=2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    asked: i64,
    available: i64,
    new: i64,
}

fn sample(node: &Node) -> Option<Sample> {
    let out = node
        .kube
        .kubectl_output(&["get", "deploy,rs", "-l", "app=web", "-o", "json"], None);
    if !out.status.success() {
        return None;
    }
    let list: Value = serde_json::from_slice(&out.stdout).ok()?;
    let items = list["items"].as_array()?;
    let mut s = Sample {
        asked: 0,
        available: 0,
        new: 0,
    };
    for item in items {
        match item["kind"].as_str() {
            Some("Deployment") => {
                s.available = item["status"]["availableReplicas"].as_i64().unwrap_or(0)
            }
            Some("ReplicaSet") => {
                let replicas = item["spec"]["replicas"].as_i64().unwrap_or(0);
                s.asked += replicas;
                let env = &item["spec"]["template"]["spec"]["containers"][0]["env"];
                if env
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| e["name"] == "VERSION" && e["value"] == "2")
                {
                    s.new = replicas;
                }
            }
            _ => {}
        }
    }
    Some(s)
}

#[test]
fn a_deployment_rolls_out_updates_one_pod_at_a_time_and_bad_input_loses_nothing() {
    if missing_prerequisite()
        || missing(
            "pod network tests need containernetworking-plugins",
            cni::missing_plugins(&cni_bin_dir()).is_empty(),
        )
    {
        return;
    }
    // Declared before the node, so dropped after it.
    let _leftovers = PluginLeftovers;
    let node = Node::start(NODE);
    node.import_busybox();
    node.wait_pod_network();

    // 1. Three httpd replicas with a readiness probe reach 3/3 Ready.
    let manifest = node.kube.ok(&[
        "create",
        "deployment",
        "web",
        "--image",
        IMAGE,
        "--replicas",
        &REPLICAS.to_string(),
        "--port",
        &HTTPD_PORT.to_string(),
        "--dry-run=client",
        "-o",
        "json",
        "--",
        "busybox",
        "httpd",
        "-f",
        "-p",
        &HTTPD_PORT.to_string(),
        "-h",
        "/etc",
    ]);
    let mut dep: Value = serde_json::from_str(&manifest).expect("deployment JSON");
    let spec = &mut dep["spec"]["template"]["spec"];
    spec["terminationGracePeriodSeconds"] = 2.into();
    spec["containers"][0]["readinessProbe"] = json!({
        "httpGet": {"path": "/hostname", "port": HTTPD_PORT},
        "periodSeconds": 1,
    });
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&dep.to_string()));
    node.kube
        .ok(&["rollout", "status", "deployment/web", "--timeout=180s"]);
    let ready_out = node.kube.ok(&[
        "get",
        "deployment",
        "web",
        "-o",
        "jsonpath={.status.readyReplicas}/{.status.replicas}",
    ]);
    assert_eq!(ready_out, format!("{REPLICAS}/{REPLICAS}"));
    let first = web_pods(&node);
    assert_eq!(first.len() as i64, REPLICAS, "{first:#?}");
    for p in &first {
        assert!(ready(p), "{}", p["status"]);
        let ip = p["status"]["podIP"].as_str().expect("a pod IP");
        // Each pod's hostname file names the pod: three pods, three answers.
        let answer = curl_until(&format!("http://{ip}:{HTTPD_PORT}/hostname"));
        assert_eq!(answer.trim(), name(p));
    }
    let first_names: BTreeSet<String> = first.iter().map(name).collect();

    // 2. A rolling update replaces them one at a time.
    let stop = AtomicBool::new(false);
    let samples = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = sample(&node) {
                    samples.push(s);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
            samples
        });
        node.kube.ok(&["set", "env", "deployment/web", "VERSION=2"]);
        node.kube
            .ok(&["rollout", "status", "deployment/web", "--timeout=180s"]);
        stop.store(true, Ordering::Relaxed);
        sampler.join().expect("sampler")
    });
    for s in &samples {
        assert!(
            s.asked <= REPLICAS + 1,
            "more than one pod surged: {s:?} in {samples:?}"
        );
        assert!(
            s.available >= REPLICAS,
            "a pod went unavailable: {s:?} in {samples:?}"
        );
    }
    let steps: Vec<i64> = samples.iter().map(|s| s.new).fold(Vec::new(), |mut v, n| {
        if v.last() != Some(&n) {
            v.push(n);
        }
        v
    });
    // The first sample may come before or after the new ReplicaSet exists.
    let grown = steps.strip_prefix(&[0]).unwrap_or(&steps);
    assert_eq!(
        grown,
        [1, 2, 3],
        "the new ReplicaSet did not grow one pod at a time: {samples:?}"
    );
    let deadline = Instant::now() + POD_TIMEOUT;
    let second = loop {
        let pods = web_pods(&node);
        if pods.len() as i64 == REPLICAS && pods.iter().all(ready) {
            break pods;
        }
        assert!(
            Instant::now() < deadline,
            "old pods not gone: {:?}\n{}",
            pods.iter().map(name).collect::<Vec<_>>(),
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for p in &second {
        assert!(
            !first_names.contains(&name(p)),
            "{} was not replaced",
            name(p)
        );
        assert_eq!(
            p["spec"]["containers"][0]["env"],
            json!([{"name": "VERSION", "value": "2"}])
        );
    }

    // 3. A command that does not exist: the container fails with the runtime's reason, and
    // the event names the command.
    node.kube.ok(&[
        "run",
        "badcmd",
        "--image",
        IMAGE,
        "--restart",
        "Never",
        "--command",
        "--",
        "/no/such/binary",
    ]);
    let bad = node.wait_pod("badcmd", "Failed", |p| p["status"]["phase"] == "Failed");
    let state = &bad["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(state["reason"], "StartError", "{}", bad["status"]);
    assert!(
        state["message"]
            .as_str()
            .is_some_and(|m| m.contains("/no/such/binary")),
        "{}",
        bad["status"]
    );
    assert!(
        events(&node, "badcmd")
            .iter()
            .any(|e| e.starts_with("Failed: Error: ") && e.contains("/no/such/binary")),
        "{:?}",
        events(&node, "badcmd")
    );

    // 4. A configMap volume and a secret env that do not exist: the pods wait with upstream's
    // reasons and run once the objects exist.
    let waiting = json!({
    "apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "needs-config"},
         "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": "later-config"}}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "needs-secret"},
         "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"],
                "env": [{"name": "PASSWORD", "valueFrom":
                    {"secretKeyRef": {"name": "later-secret", "key": "password"}}}]}]}},
    ]});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&waiting.to_string()));
    let deadline = Instant::now() + POD_TIMEOUT;
    while !events(&node, "needs-config").iter().any(|e| {
        e.starts_with("FailedMount: ") && e.contains("configmap \"later-config\" not found")
    }) {
        assert!(
            Instant::now() < deadline,
            "no FailedMount: {:?}\n{}",
            events(&node, "needs-config"),
            tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let p = node.wait_pod("needs-secret", "CreateContainerConfigError", |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            == "CreateContainerConfigError"
    });
    assert_eq!(
        p["status"]["containerStatuses"][0]["state"]["waiting"]["message"],
        "secret \"later-secret\" not found"
    );
    assert_eq!(node.pod("needs-config")["status"]["phase"], "Pending");
    node.kube.ok(&[
        "create",
        "configmap",
        "later-config",
        "--from-literal=greeting=hello",
    ]);
    node.kube.ok(&[
        "create",
        "secret",
        "generic",
        "later-secret",
        "--from-literal=password=s3cret",
    ]);
    node.wait_pod("needs-config", "Running", running);
    node.wait_pod("needs-secret", "Running", running);
    let greeting = node
        .kube
        .ok(&["exec", "needs-config", "--", "cat", "/cfg/greeting"]);
    assert_eq!(greeting, "hello");
    let password = node.kube.ok(&[
        "exec",
        "needs-secret",
        "--",
        "sh",
        "-c",
        "echo -n $PASSWORD",
    ]);
    assert_eq!(password, "s3cret");
}
