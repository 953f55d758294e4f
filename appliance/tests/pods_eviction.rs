//! The eviction manager under real memory pressure (issue 19, seed trick 23): the real binary
//! with its containerd and runc on this machine's cgroups. `--system-reserved` takes all of
//! the machine's memory but [`KUBEPODS`], so `kubepods` (capped at allocatable with `pods`
//! enforced) is a small cgroup of its own and the machine is never in danger; the hard
//! `memory.available` threshold is copied to `allocatableMemory.available`, measured on
//! that cgroup. Two Burstable pods fill tmpfs (memory-backed emptyDirs, charged to their
//! cgroups and never reclaimable): `large` stays within its 250 MiB request with 200 MiB,
//! `culprit` requests 10 MiB and fills 180 MiB. Together they cross the threshold; the
//! culprit is evicted (Failed, Evicted, DisruptionTarget, upstream's message) and the
//! larger pod keeps running. The node reports MemoryPressure (and the node lifecycle
//! controller taints it), a BestEffort pod is refused meanwhile, and both clear after the
//! short transition period. The harness is `common::node`.

mod common;

use std::time::{Duration, Instant};

use common::node::{IMAGE, Node, client_cert, curl_kubelet, missing_prerequisite, running};
use serde_json::Value;

const NODE: &str = "eviction-node";
/// What `kubepods` may hold: both pods' fills fit below it, so no OOM kill interferes.
const KUBEPODS: u64 = 600 << 20;
/// `--eviction-hard memory.available<...`: crossed when the pods' working set passes
/// KUBEPODS minus this (350 MiB), which only both fills together do.
const THRESHOLD: &str = "250Mi";
/// `--eviction-pressure-transition-period`, short so the test sees MemoryPressure clear.
const TRANSITION: &str = "20s";
/// How long the eviction and the clearing may take.
const TIMEOUT: Duration = Duration::from_secs(120);

fn mem_total() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    kib * 1024
}

fn filler(name: &str, request: &str, fill_mib: u64, delay_s: u64) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "300Mi"}}],
            "containers": [{"name": "fill", "image": IMAGE,
                "resources": {"requests": {"memory": request}},
                "volumeMounts": [{"name": "ram", "mountPath": "/ram"}],
                "command": ["sh", "-c", format!(
                    "sleep {delay_s}; dd if=/dev/zero of=/ram/fill bs=1048576 count={fill_mib}; \
                     echo filled; exec sleep 3600")]}]}})
}

fn condition(node: &Node, type_: &str) -> String {
    let out = node.kube.ok(&["get", "node", &node.name, "-o", "json"]);
    let n: Value = serde_json::from_str(&out).expect("node JSON");
    n["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn taints(node: &Node) -> String {
    node.kube.ok(&[
        "get",
        "node",
        &node.name,
        "-o",
        "jsonpath={.spec.taints[*].key}",
    ])
}

fn wait(what: &str, node: &Node, ok: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !ok() {
        assert!(
            started.elapsed() < TIMEOUT,
            "{what} not seen in {TIMEOUT:?}\n{}",
            common::kube::tail(&node.kube.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    started.elapsed()
}

#[test]
fn the_pod_exceeding_its_request_is_evicted_before_the_larger_one_within_it() {
    if missing_prerequisite() {
        return;
    }
    let reserved = format!("memory={}Ki", (mem_total() - KUBEPODS) / 1024);
    // The tests' 1 % disk floor kept (the build machine's disk may be past the default).
    let hard = format!("memory.available<{THRESHOLD},nodefs.available<1%,imagefs.available<1%");
    let node = Node::start_with(
        NODE,
        &[
            "--system-reserved",
            &reserved,
            "--eviction-hard",
            &hard,
            "--eviction-pressure-transition-period",
            TRANSITION,
        ],
    );
    node.import_busybox();
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(&filler("large", "250Mi", 200, 0).to_string()),
    );
    node.wait_pod("large", "Running", running);
    // The culprit fills once both run; it crosses the threshold.
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(&filler("culprit", "10Mi", 180, 3).to_string()),
    );
    node.wait_pod("culprit", "Running", running);
    let started = Instant::now();
    let evicted = node.wait_pod("culprit", "evicted", |p| {
        p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Evicted"
    });
    println!(
        "culprit evicted {:?} after it started running (3 s sleep + its fill): {:#}",
        started.elapsed(),
        evicted["status"]
    );
    let message = evicted["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "The node was low on resource: memory. Threshold quantity: {THRESHOLD}, available: "
        )),
        "{message}"
    );
    assert!(
        message.contains("Container fill was using ")
            && message.ends_with(", request is 10Mi, has larger consumption of memory. "),
        "{message}"
    );
    let disruption = evicted["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionTarget"))
        .cloned()
        .expect("a DisruptionTarget condition");
    assert_eq!(disruption["status"], "True");
    assert_eq!(disruption["reason"], "TerminationByKubelet");
    // `kubelet_evictions{eviction_signal}` counts it (`kubelet_evictions_total` in the
    // OpenMetrics text, as client_golang writes a counter there), on the signal that acted (the hard
    // `memory.available` threshold copied to `allocatableMemory.available` is the one
    // `kubepods` crosses; the root's available memory is the machine's).
    let admin = client_cert(&node, &node.kube.kubeconfig, "admin");
    let (code, metrics) = curl_kubelet(&node, "/metrics", Some(&admin));
    assert_eq!(code, "200", "{metrics}");
    let evictions: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("kubelet_evictions"))
        .filter(|l| {
            l.contains(r#"eviction_signal="allocatableMemory.available""#)
                || l.contains(r#"eviction_signal="memory.available""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        evictions,
        1.0,
        "one memory eviction counted: {:?}",
        metrics
            .lines()
            .filter(|l| l.contains("kubelet_evictions"))
            .collect::<Vec<_>>()
    );
    // The larger pod within its request still runs.
    let large = node.pod("large");
    assert_eq!(large["status"]["phase"], "Running", "{:#}", large["status"]);

    // The node reports MemoryPressure and the node lifecycle controller taints it.
    wait("MemoryPressure=True", &node, || {
        condition(&node, "MemoryPressure") == "True"
    });
    wait("the memory-pressure taint", &node, || {
        taints(&node).contains("node.kubernetes.io/memory-pressure")
    });
    // A BestEffort pod bound to the node meanwhile is refused by the kubelet.
    let best_effort = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "latecomer"},
        "spec": {"nodeName": NODE, "hostNetwork": true,
            "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"]}]}});
    node.kube
        .ok_in(&["apply", "-f", "-"], Some(&best_effort.to_string()));
    let refused = node.wait_pod("latecomer", "refused", |p| p["status"]["phase"] == "Failed");
    assert_eq!(refused["status"]["reason"], "Evicted");
    assert_eq!(
        refused["status"]["message"],
        "Pod was rejected: The node had condition: [MemoryPressure]. "
    );

    // The pressure is gone with the culprit: after the transition period both clear.
    let cleared = wait("MemoryPressure=False", &node, || {
        condition(&node, "MemoryPressure") == "False"
    });
    println!("MemoryPressure cleared {cleared:?} after the refusal");
    wait("no memory-pressure taint", &node, || {
        !taints(&node).contains("node.kubernetes.io/memory-pressure")
    });
    assert_eq!(node.pod("large")["status"]["phase"], "Running");
    let events = common::node::events(&node, "culprit");
    assert!(events.iter().any(|e| e.contains("Evicted")), "{events:?}");
}
